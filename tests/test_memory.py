from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pareto.measure.environment import KEY_FIELDS, environment_key, fingerprint
from pareto.measure.memory import params_bytes, theoretical_bytes


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


def test_fingerprint_keys_and_stable_key() -> None:
    fp = fingerprint("cpu", 2)
    assert set(fp) == {
        "device", "device_name", "driver", "torch_version", "python_version",
        "platform", "cpu_model", "cpu_count", "threads", "hostname",
    }  # fmt: skip
    assert fp["device"] == "cpu" and fp["threads"] == 2 and fp["driver"] is None
    assert fp["device_name"] == fp["cpu_model"] and fp["cpu_model"]
    assert fp["torch_version"] == torch.__version__
    key = environment_key(fp)
    assert key == environment_key(fingerprint("cpu", 2)) and len(key) == 16
    assert environment_key({**fp, "threads": 4}) != key
    assert environment_key({**fp, "python_version": "0.0"}) == key  # not a comparability field
    assert set(KEY_FIELDS) <= set(fp)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU fingerprint is untested")
def test_fingerprint_cuda() -> None:
    fp = fingerprint("cuda:0", 1)
    assert fp["device_name"] == torch.cuda.get_device_name(0)
    assert fp["driver"]
