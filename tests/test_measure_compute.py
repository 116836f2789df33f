from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from pareto.measure.compute import (
    arithmetic_intensity,
    bytes_moved,
    compute_cost,
    compute_dtype,
    count_flops,
    layer_costs,
)
from pareto.measure.memory import params_bytes


def _quantized(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 32))


def test_linear_flops_are_two_b_in_out_without_bias() -> None:
    # the counter counts addmm as its matmul, 2 FLOPs per multiply-accumulate; the bias add is not counted
    assert count_flops(nn.Linear(64, 32), torch.randn(8, 64)) == 2 * 8 * 64 * 32
    assert count_flops(nn.Linear(64, 32, bias=False), torch.randn(8, 64)) == 2 * 8 * 64 * 32
    assert count_flops(_mlp(), torch.randn(8, 64)) == 2 * 8 * (64 * 256 + 256 * 32)


def test_quantized_linear_flops_are_counted_like_float() -> None:
    x = torch.randn(8, 64)
    quantized = _quantized(_mlp())
    assert count_flops(quantized, x) == count_flops(_mlp(), x) == 2 * 8 * (64 * 256 + 256 * 32)
    # rows of a 3-d input are every leading index
    assert count_flops(_quantized(nn.Sequential(nn.Linear(64, 32))), torch.randn(2, 5, 64)) == 2 * 10 * 64 * 32


def test_attention_flops_are_counted_despite_the_fast_path() -> None:
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    x = torch.randn(2, 10, 64)
    projections = 2 * 20 * 64 * (3 * 64) + 2 * 20 * 64 * 64
    scores_and_values = 2 * (2 * 2 * 4 * 10 * 10 * 16)
    assert count_flops(_Attend(mha), (x,)) == projections + scores_and_values
    assert torch.backends.mha.get_fastpath_enabled()  # restored


class _Attend(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


def test_bytes_moved_is_weights_plus_inputs_plus_outputs() -> None:
    model, x = _mlp(), torch.randn(8, 64)
    expected = params_bytes(model) + 8 * 64 * 4 + 8 * 32 * 4
    assert bytes_moved(model, x) == expected
    assert bytes_moved(model, x, torch.empty(8, 32)) == expected
    quantized = _quantized(_mlp())
    assert bytes_moved(quantized, x) == params_bytes(quantized) + 8 * 64 * 4 + 8 * 32 * 4
    assert bytes_moved(quantized, x) < expected  # int8 weights: fewer bytes, same FLOPs


def test_arithmetic_intensity() -> None:
    assert arithmetic_intensity(100, 50) == 2.0
    assert arithmetic_intensity(0, 50) == 0.0
    assert arithmetic_intensity(0, 0) == 0.0
    assert arithmetic_intensity(10, 0) == math.inf
    with pytest.raises(ValueError):
        arithmetic_intensity(-1, 1)
    cost = compute_cost(_mlp(), torch.randn(8, 64))
    assert cost.flops == 2 * 8 * (64 * 256 + 256 * 32)
    assert cost.arithmetic_intensity == pytest.approx(cost.flops / cost.bytes_moved)
    assert "FlopCounterMode" in cost.method and "weights read once" in cost.method


def test_intensity_grows_with_batch() -> None:
    # weights are read once per batch, so a bigger batch has more FLOPs per byte
    small = compute_cost(nn.Linear(512, 512), torch.randn(1, 512)).arithmetic_intensity
    large = compute_cost(nn.Linear(512, 512), torch.randn(256, 512)).arithmetic_intensity
    assert small == pytest.approx(2 * 512 * 512 / (4 * (512 * 512 + 512) + 4 * 1024), rel=1e-9)
    assert large > 50 * small


def test_layer_costs_of_an_mlp() -> None:
    model, x = _mlp(), torch.randn(8, 64)
    layers = layer_costs(model, x)
    assert [(layer.name, layer.type) for layer in layers] == [("0", "Linear"), ("1", "ReLU"), ("2", "Linear")]
    first, relu, _last = layers
    assert first.flops == 2 * 8 * 64 * 256 and first.calls == 1
    assert first.weight_bytes == (64 * 256 + 256) * 4
    assert (first.input_bytes, first.output_bytes) == (8 * 64 * 4, 8 * 256 * 4)
    assert first.bytes_moved == first.weight_bytes + first.input_bytes + first.output_bytes
    assert first.arithmetic_intensity == pytest.approx(first.flops / first.bytes_moved)
    assert relu.flops == 0 and relu.weight_bytes == 0 and relu.arithmetic_intensity == 0.0
    assert sum(layer.flops for layer in layers) == count_flops(model, x)
    assert sum(layer.weight_bytes for layer in layers) == params_bytes(model)


def test_layer_costs_of_a_quantized_model_and_functional_work() -> None:
    layers = layer_costs(_quantized(_mlp()), torch.randn(8, 64))
    assert [layer.type for layer in layers] == ["Linear", "ReLU", "Linear"]
    assert layers[0].flops == 2 * 8 * 64 * 256
    assert layers[0].weight_bytes == 64 * 256 * 1 + 256 * 4  # int8 weight, fp32 bias

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
            self.norm = nn.LayerNorm(16)
            self.mix = nn.Parameter(torch.randn(16, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.mha(x, x, x)[0]) @ self.mix  # a matmul outside any submodule

    block, x = Block(), torch.randn(2, 5, 16)
    by_name = {layer.name: layer for layer in layer_costs(block, x)}
    assert set(by_name) == {"(model)", "mha", "norm"}
    assert by_name["(model)"].flops == 2 * 10 * 16 * 16
    assert by_name["(model)"].weight_bytes == 16 * 16 * 4  # its own parameter only
    assert by_name["mha"].weight_bytes == params_bytes(block.mha)  # out_proj runs functionally inside
    assert sum(layer.flops for layer in by_name.values()) == count_flops(block, x)


def test_layer_called_twice_counts_both_calls() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(self.layer(x))

    (layer,) = layer_costs(Twice(), torch.randn(4, 8))
    assert layer.calls == 2 and layer.flops == 2 * 2 * 4 * 8 * 8
    assert layer.weight_bytes == (64 + 8) * 4  # read once


def test_compute_dtype() -> None:
    assert compute_dtype(_mlp()) == "fp32"
    assert compute_dtype(_mlp().half()) == "fp16"
    assert compute_dtype(_mlp().to(torch.bfloat16)) == "bf16"
    assert compute_dtype(_quantized(_mlp())) == "int8"
    assert compute_dtype(nn.ReLU()) == "fp32"


def test_cpu_scaled_dot_product_attention_is_counted() -> None:
    class Sdpa(nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(q, q, q)

    q = torch.randn(2, 4, 10, 16)  # batch, heads, tokens, head dim
    assert count_flops(Sdpa(), q) == 2 * (2 * 2 * 4 * 10 * 10 * 16)  # QK^T and PV


def test_a_compiled_wrapper_is_counted_through_its_eager_module() -> None:
    class Wrapper(nn.Module):  # what torch.compile returns: the eager module as ``_orig_mod``
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._orig_mod = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._orig_mod(x)

    model, x = _mlp(), torch.randn(8, 64)
    assert [layer.name for layer in layer_costs(Wrapper(model), x)] == ["0", "1", "2"]
    assert count_flops(Wrapper(model), x) == count_flops(model, x)


def test_every_lazy_export_resolves() -> None:
    import pareto.measure

    for name in pareto.measure.__all__:
        assert getattr(pareto.measure, name) is not None
