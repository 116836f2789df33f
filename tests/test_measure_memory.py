from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pareto.errors import UsageError
from pareto.measure.memory import (
    ACTIVATION_METHOD_CPU,
    MemoryBreakdown,
    activation_bytes,
    kv_cache_bytes,
    memory_breakdown,
    params_bytes,
    stored_bytes_by_module,
    theoretical_bytes,
)
from pareto.task import AttentionShape

LLAMA_7B = AttentionShape(layers=32, width=4096, sequence=4096, heads=32)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 32))


def test_kv_cache_of_llama_7b_is_two_gib() -> None:
    assert kv_cache_bytes(LLAMA_7B, batch_size=1, bytes_per_element=2) == 2 * 32 * 4096 * 4096 * 2
    assert kv_cache_bytes(LLAMA_7B, 1, 2) == 2_147_483_648  # about 2 GB on top of the weights
    assert kv_cache_bytes(LLAMA_7B, 4, 2) == 4 * 2_147_483_648  # linear in batch
    assert kv_cache_bytes(None, 8, 2) == 0


def test_kv_cache_bad_input() -> None:
    with pytest.raises(UsageError, match="Batch size"):
        kv_cache_bytes(LLAMA_7B, 0, 2)
    with pytest.raises(UsageError, match="Bytes per KV-cache element"):
        kv_cache_bytes(LLAMA_7B, 1, 0)


def test_activation_bytes_of_an_mlp_is_exact() -> None:
    # the first Linear's output and the ReLU's output (not in place) are alive together: 2 x B x 256 x 4
    assert activation_bytes(_mlp(), torch.randn(8, 64), "cpu") == 8 * (256 + 256) * 4


def test_activation_bytes_grows_about_linearly_with_batch() -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    small = activation_bytes(model, torch.randn(4, 32), "cpu")
    large = activation_bytes(model, torch.randn(64, 32), "cpu")
    assert 0 < small < large
    assert large / small == pytest.approx(16, rel=0.1)


def test_activation_bytes_of_an_in_place_model_and_a_quantized_one() -> None:
    in_place = nn.Sequential(nn.Linear(64, 256), nn.ReLU(inplace=True), nn.Linear(256, 32))
    assert activation_bytes(in_place, torch.randn(8, 64), "cpu") == 8 * (256 + 32) * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(_mlp(), {nn.Linear}, dtype=torch.qint8)
    # fp32 activations in and out of the int8 kernels: the same live tensors as the float model
    assert activation_bytes(quantized, torch.randn(8, 64), "cpu") == 8 * (256 + 256) * 4


def test_memory_breakdown_sums_and_says_how() -> None:
    model, x = _mlp(), torch.randn(8, 64)
    plain = memory_breakdown(model, x, device="cpu", batch_size=8)
    assert plain.params_bytes == params_bytes(model)
    assert plain.activation_bytes == 8 * 512 * 4
    assert plain.kv_cache_bytes == 0 and plain.optimizer_bytes == 0
    assert plain.total_bytes == plain.params_bytes + plain.activation_bytes
    assert ACTIVATION_METHOD_CPU in plain.method and "optimizer: 0 at inference" in plain.method
    shape = AttentionShape(layers=2, width=16, sequence=10)
    with_kv = memory_breakdown(model, x, device="cpu", batch_size=8, attention=shape)
    assert with_kv.kv_cache_bytes == 2 * 2 * 10 * 16 * 4 * 8  # fp32 model: 4 bytes per element
    assert with_kv.total_bytes == plain.total_bytes + with_kv.kv_cache_bytes
    half = memory_breakdown(model, x, device="cpu", batch_size=8, attention=shape, kv_bytes_per_element=2)
    assert half.kv_cache_bytes == with_kv.kv_cache_bytes // 2
    assert set(plain.to_dict()) == {
        "params_bytes", "activation_bytes", "kv_cache_bytes", "optimizer_bytes", "method", "total_bytes",
    }  # fmt: skip


def test_breakdown_total_is_derived() -> None:
    assert MemoryBreakdown(params_bytes=1, activation_bytes=2, kv_cache_bytes=3).total_bytes == 6


def test_stored_bytes_by_module_sums_to_params_bytes() -> None:
    model = nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False), nn.BatchNorm1d(16))
    model[1].weight = model[0].weight
    by_module = stored_bytes_by_module(model)
    assert by_module[model[0]] == 16 * 16 * 4 and model[1] not in by_module  # shared: counted at the first
    assert sum(by_module.values()) == params_bytes(model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: allocator-peak activations untested")
def test_activation_bytes_cuda() -> None:
    model = _mlp().to("cuda:0")
    small = activation_bytes(model, torch.randn(64, 64, device="cuda:0"), "cuda:0")
    large = activation_bytes(model, torch.randn(1024, 64, device="cuda:0"), "cuda:0")
    assert 0 < small < large


def _quantized(model: nn.Module, qconfig: object = None) -> nn.Module:
    spec = {nn.Linear: qconfig} if qconfig is not None else {nn.Linear}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        return torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)


def _nested() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 16), nn.LayerNorm(16)))


def test_params_bytes_of_linear() -> None:
    assert params_bytes(nn.Linear(10, 5)) == (10 * 5 + 5) * 4
    assert params_bytes(nn.Linear(10, 5).half()) == (10 * 5 + 5) * 2


def test_params_bytes_counts_buffers_and_nesting() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.Sequential(nn.BatchNorm1d(4)))
    # BatchNorm: weight, bias, running mean, running var (fp32) and num_batches_tracked (int64)
    assert params_bytes(model) == (8 * 4 + 4) * 4 + 4 * 4 * 4 + 8


def test_tied_weights_count_once() -> None:
    model = nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False))
    model[1].weight = model[0].weight
    assert params_bytes(model) == 16 * 16 * 4


def test_quantized_weights_are_about_four_times_smaller() -> None:
    model = _nested()
    quantized = _quantized(_nested())
    weights = 64 * 32 + 32 * 16
    float_rest = (32 + 16 + 16 + 16) * 4  # biases stay fp32, LayerNorm is not quantized
    assert params_bytes(model) == weights * 4 + float_rest
    assert params_bytes(quantized) == weights * 1 + float_rest
    assert (params_bytes(model) - float_rest) / (params_bytes(quantized) - float_rest) == 4


def test_per_channel_quantization_counts_scales() -> None:
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    quantized = _quantized(nn.Sequential(nn.Linear(64, 32)), qconfig)
    # int8 weights, fp32 bias, one float64 scale and one int64 zero point per output channel
    assert params_bytes(quantized) == 64 * 32 + 32 * 4 + 32 * (8 + 8)


def test_theoretical_bytes_halves_with_half_the_weights_zeroed() -> None:
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Sequential(nn.Linear(64, 64, bias=False)))
    dense = theoretical_bytes(model)
    assert dense == params_bytes(model)
    with torch.no_grad():
        for layer in (model[0], model[1][0]):
            layer.weight[:, :32] = 0
    assert theoretical_bytes(model) == dense // 2
    assert params_bytes(model) == dense  # zeros stored densely still take their bytes


def test_theoretical_bytes_of_a_pruned_quantized_model() -> None:
    model = nn.Sequential(nn.Linear(64, 32))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.0)  # far from zero, so int8 rounding adds no zeros
        model[0].weight[:16] = 0
    quantized = _quantized(model)
    assert theoretical_bytes(quantized) == 16 * 64 * 1 + 32 * 4
    assert params_bytes(quantized) == 32 * 64 * 1 + 32 * 4


def test_biases_and_buffers_count_in_full() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        model[0].bias.zero_()
    assert theoretical_bytes(model) == params_bytes(model)
