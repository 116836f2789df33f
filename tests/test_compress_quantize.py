"""Quantization techniques: fp16/bf16 casts, torchao weight-only variants and their availability."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from torch import nn

from pareto.compress import Config, apply, get_technique, quantize
from pareto.compress.quantize import Bf16, Fp16, HalfPrecision, Int4WeightOnly, Int8Dynamic, Int8WeightOnly
from pareto.errors import TechniqueError
from pareto.measure.compute import compute_dtype, count_flops
from pareto.measure.memory import activation_bytes, params_bytes
from pareto.task import Task

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.BatchNorm1d(64), nn.Linear(64, 8)).eval()


def _task(model: nn.Module) -> Task:
    return Task(name="tiny", model=model, example_input=lambda b: torch.randn(b, 16), evaluate=lambda m: 0.0)


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.eval()(x)


@pytest.fixture
def no_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "_torchao", lambda: (None, quantize.TORCHAO_HINT))


@pytest.mark.parametrize(("technique", "dtype"), [(Fp16(), torch.float16), (Bf16(), torch.bfloat16)])
def test_half_casts_parameters_and_keeps_float32_in_and_out(technique: Fp16 | Bf16, dtype: torch.dtype) -> None:
    model = _mlp()
    assert technique.available("cpu") is None  # both run on the CPU in this torch
    half = apply(model, Config(techniques=(technique,), batch_size=4), _task(model)).module
    assert isinstance(half, HalfPrecision)
    assert {p.dtype for p in half.parameters()} == {dtype}
    assert half.module[2].running_mean.dtype == dtype
    x = torch.randn(32, 16)
    out = _forward(half, x)
    assert out.dtype == torch.float32 and out.shape == (32, 8)
    reference = _forward(model, x)
    tolerance = 0.02 if dtype == torch.float16 else 0.1
    assert (out - reference).abs().max() < tolerance * reference.abs().max()
    assert params_bytes(half) * 2 == params_bytes(model) + 8  # the int64 num_batches_tracked stays 8 bytes


def test_half_casts_nested_inputs_and_outputs_but_not_integers() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.linear = nn.Linear(4, 4)

        def forward(self, ids: torch.Tensor, extra: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            assert extra["scale"].dtype == torch.bfloat16
            return self.linear(self.embed(ids)) * extra["scale"], ids

    model = TwoInputs()
    half = Bf16().apply(copy.deepcopy(model), _task(model))
    ids = torch.tensor([[1, 2, 3]])
    out, same_ids = half(ids, {"scale": torch.ones(1)})
    assert out.dtype == torch.float32 and same_ids.dtype == torch.int64


def test_two_casts_cannot_share_a_configuration() -> None:
    with pytest.raises(ValueError, match="bf16 and fp16 cannot share a configuration"):
        Config(techniques=(Fp16(), Bf16()), batch_size=1)
    model = _mlp()  # applied one after the other anyway, the second refuses
    with pytest.raises(TechniqueError, match="already cast; use one of fp16 and bf16"):
        Bf16().apply(Fp16().apply(model, _task(model)), _task(model))


def test_half_without_float_parameters_raises() -> None:
    model = nn.Sequential(nn.ReLU())
    with pytest.raises(TechniqueError, match="no floating-point parameter"):
        Fp16().apply(model, _task(model))
    assert Fp16().available("cpu", _task(model)) == "the model has no floating-point parameter to cast."


@pytest.mark.skipif(Int8Dynamic().available("cpu") is not None, reason="no int8 backend on this CPU")
def test_eager_int8_dynamic_refuses_a_half_model(no_torchao: None) -> None:
    model = _mlp()
    with pytest.raises(TechniqueError, match="needs float32 linear layers"):
        apply(model, Config(techniques=(Fp16(), Int8Dynamic()), batch_size=1), _task(model))


def test_weight_only_variants_need_torchao(no_torchao: None) -> None:
    assert Int8WeightOnly().available("cpu") == quantize.TORCHAO_HINT
    assert Int8WeightOnly().backend("cpu") is None
    model = _mlp()
    with pytest.raises(TechniqueError, match=r"int8_weight_only: needs torchao"):
        Int8WeightOnly().apply(model, _task(model))
    assert Int4WeightOnly().available("cuda:0") == quantize.TORCHAO_HINT


def test_int4_is_cuda_only() -> None:
    reason = Int4WeightOnly().available("cpu")
    assert reason == "int4 weight-only kernels need a CUDA GPU of compute capability 8.0 or newer; this device is cpu."
    model = _mlp()
    with pytest.raises(TechniqueError, match="need a CUDA GPU"):
        Int4WeightOnly().apply(model, _task(model))


def test_integer_quantization_needs_a_linear_layer() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    for technique in (Int8Dynamic(), Int8WeightOnly()):
        assert technique.available("cpu", _task(model)) == "the model has no nn.Linear layer to quantize."


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is an optional extra and is not installed")
@pytest.mark.parametrize("name", ["int8_dynamic", "int8_weight_only"])
def test_torchao_int8_on_the_cpu(name: str) -> None:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    technique = get_technique(name, {"kernels": "torchao"} if name == "int8_dynamic" else None)
    assert technique.available("cpu") is None and technique.backend("cpu") == "torchao"
    model = _mlp()
    served = apply(model, Config(techniques=(technique,), batch_size=4), _task(model))
    quantized = served.module
    # torchao decides per layer (0.17 leaves this model's 16-wide input layer in float, 0.18 does not)
    quantized_layers = [
        m for m in quantized.modules() if isinstance(m, nn.Linear) and is_traceable_wrapper_subclass(m.weight)
    ]
    assert quantized_layers
    x = torch.randn(32, 16)
    reference = _forward(model, x)
    assert (_forward(quantized, x) - reference).abs().max() < 0.05 * reference.abs().max()
    with pytest.raises(TechniqueError, match="already quantized"):
        technique.apply(quantized, _task(model))
    # the four axes see through torchao's weights: int8 bytes and scales, the float layer's FLOPs, activations
    weights = sum(m.in_features * m.out_features for m in quantized_layers)  # 3 of their 4 bytes saved,
    rows = sum(m.out_features for m in quantized_layers)  # less a scale (and zero point) per output row
    assert 3 * weights - 8 * rows <= params_bytes(model) - params_bytes(quantized) <= 3 * weights
    assert count_flops(quantized, x) == count_flops(model, x) > 0
    assert activation_bytes(quantized, x, "cpu") > 0
    # torchao's int8 weights report fp32: int8_dynamic declares what its matmuls compute in, weight-only does not
    assert served.compute_dtype == ("int8" if name == "int8_dynamic" else None)
    assert compute_dtype(quantized, served.compute_dtype) == ("int8" if name == "int8_dynamic" else "fp32")


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is an optional extra and is not installed")
def test_int8_dynamic_on_the_cpu_takes_torch_ao_kernels_unless_told_or_half() -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if Int8Dynamic(kernels="torch.ao").available("cpu") is not None:
        pytest.skip(str(Int8Dynamic(kernels="torch.ao").available("cpu")))
    assert Int8Dynamic().backend("cpu") == "torch.ao"  # unset: torch.ao's kernels on the CPU (faster here)
    assert Int8Dynamic().backend("cuda:0") == "torchao"
    assert Int8Dynamic(kernels="torchao").backend("cpu") == "torchao"
    model = _mlp()
    quantized = apply(model, Config(techniques=(Int8Dynamic(),), batch_size=4), _task(model)).module
    assert compute_dtype(quantized) == "int8"  # torch.ao's quantized Linear says qint8 itself
    assert sum(isinstance(m, DynamicQuantizedLinear) for m in quantized.modules()) == 2
    # a bf16 model: torch.ao cannot take it, so unset kernels go to torchao; asked for torch.ao, it says so
    config = Config(techniques=(get_technique("bf16"), Int8Dynamic()), batch_size=4)
    half = apply(model, config, _task(model)).module
    assert any(is_traceable_wrapper_subclass(m.weight) for m in half.modules() if isinstance(m, nn.Linear))
    told = Config(techniques=(get_technique("bf16"), Int8Dynamic(kernels="torch.ao")), batch_size=4)
    with pytest.raises(TechniqueError, match="needs float32 linear layers; with fp16 or bf16 use kernels=torchao"):
        apply(model, told, _task(model))


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TORCHAO, reason="int4 needs CUDA and torchao")
def test_int4_on_cuda() -> None:
    if Int4WeightOnly().available("cuda") is not None:
        pytest.skip(Int4WeightOnly().available("cuda") or "")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 128)).eval()
    quantized = apply(model, Config(techniques=(Int4WeightOnly(),), batch_size=4), _task(model), device="cuda").module
    x = torch.randn(4, 256, device="cuda")
    assert _forward(quantized, x).shape == (4, 128)
