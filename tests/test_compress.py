"""Behaviour of the built-in compression techniques and of the pipeline that applies them."""

from __future__ import annotations

import copy
import warnings
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from pareto.compress import Config, Technique, apply, get_technique
from pareto.compress.base import Family
from pareto.compress.lowrank import LowRank
from pareto.compress.prune import StructuredPrune, UnstructuredPrune
from pareto.compress.quantize import Int8Dynamic
from pareto.errors import TechniqueError, UsageError
from pareto.task import Task


def _mlp(width: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, width), nn.ReLU(),
        nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1),
        nn.Linear(width, 8),
    ).eval()


def _task(model: nn.Module) -> Task:
    return Task(name="tiny", model=model, example_input=lambda b: torch.randn(b, 16), evaluate=lambda m: 0.0)


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear]


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.eval()(x)


@pytest.mark.parametrize(
    "technique",
    [UnstructuredPrune(sparsity=0.5), StructuredPrune(ratio=0.5), LowRank(rank_ratio=0.25), Int8Dynamic()],
    ids=lambda t: t.describe(),
)
def test_every_technique_keeps_the_output_shape(technique: Technique) -> None:
    model = _mlp()
    compressed = apply(model, Config(techniques=(technique,), batch_size=4), _task(model))
    assert _forward(compressed, torch.randn(4, 16)).shape == (4, 8)


# --- unstructured pruning -------------------------------------------------------------------------


@pytest.mark.parametrize("sparsity", [0.3, 0.9])
def test_unstructured_prune_zeroes_the_requested_fraction_globally(sparsity: float) -> None:
    model = _mlp()
    pruned = UnstructuredPrune(sparsity=sparsity).apply(copy.deepcopy(model), _task(model))
    weights = torch.cat([m.weight.detach().flatten() for m in _linears(pruned)])
    assert (weights == 0).sum().item() == round(sparsity * weights.numel())
    # global ranking: every surviving weight is at least as large as every pruned original weight
    originals = torch.cat([m.weight.detach().flatten() for m in _linears(model)])
    assert originals[weights != 0].abs().min() >= originals[weights == 0].abs().max()


def test_unstructured_prune_leaves_plain_dense_weights() -> None:
    model = _mlp()
    pruned = UnstructuredPrune(sparsity=0.5).apply(copy.deepcopy(model), _task(model))
    for linear in _linears(pruned):
        assert not linear._forward_pre_hooks
        assert not parametrize.is_parametrized(linear)
        assert isinstance(linear.weight, nn.Parameter)
        assert linear.weight.layout == torch.strided
    names = {name for name, _ in pruned.named_parameters()} | {name for name, _ in pruned.named_buffers()}
    assert not any("orig" in name or "mask" in name for name in names)
    assert _n_params(pruned) == _n_params(model)  # sparsity in dense tensors is not a smaller model


# --- structured pruning ---------------------------------------------------------------------------


def test_structured_prune_shrinks_hidden_layers_but_not_the_outputs() -> None:
    model = _mlp(64)
    pruned = StructuredPrune(ratio=0.75).apply(copy.deepcopy(model), _task(model))
    first, middle, last = _linears(pruned)
    assert (first.in_features, first.out_features) == (16, 16)
    assert (middle.in_features, middle.out_features) == (16, 16)
    assert (last.in_features, last.out_features) == (16, 8)
    assert _n_params(pruned) < _n_params(model) / 4


def test_structured_prune_removes_exactly_the_weakest_units() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
    with torch.no_grad():
        model[0].weight[[1, 4]] *= 1e-3  # units 1 and 4 carry almost nothing
    pruned = StructuredPrune(ratio=1 / 3).apply(copy.deepcopy(model), _task(model))
    assert pruned[0].out_features == 4
    kept = [0, 2, 3, 5]
    torch.testing.assert_close(pruned[0].weight, model[0].weight[kept])
    torch.testing.assert_close(pruned[2].weight, model[2].weight[:, kept])
    # dropping a unit equals zeroing it in the original (ReLU(0) = 0)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference[0].weight[[1, 4]] = 0
        reference[0].bias[[1, 4]] = 0
    x = torch.randn(5, 8)
    torch.testing.assert_close(_forward(pruned, x), _forward(reference, x))


def test_structured_prune_keeps_at_least_one_unit_and_finds_nested_sequentials() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inner = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
            self.body = nn.Sequential(nn.Flatten(), inner)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    model = Net().eval()
    pruned = StructuredPrune(ratio=0.99).apply(copy.deepcopy(model), _task(model))
    hidden, out = _linears(pruned)
    assert (hidden.out_features, out.in_features, out.out_features) == (1, 1, 4)
    assert _forward(pruned, torch.randn(2, 16)).shape == (2, 4)


@pytest.mark.parametrize(
    "model",
    [
        nn.Linear(16, 8),
        nn.Sequential(nn.Linear(16, 32), nn.Softmax(dim=-1), nn.Linear(32, 8)),  # softmax mixes units
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 8)),
    ],
    ids=["bare-linear", "softmax-between", "layernorm-between"],
)
def test_structured_prune_without_a_pair_raises(model: nn.Module) -> None:
    with pytest.raises(TechniqueError, match="no Linear→activation→Linear pair to prune"):
        StructuredPrune(ratio=0.5).apply(model, _task(model))


# --- low rank -------------------------------------------------------------------------------------


def test_lowrank_replaces_layers_by_factor_pairs_of_the_right_rank() -> None:
    model = _mlp(64)
    factored = LowRank(rank_ratio=0.25).apply(copy.deepcopy(model), _task(model))
    expected = {0: (16, 4), 2: (64, 16), 5: (64, 2)}  # index -> (in, r) with r = round(0.25 * min(in, out))
    for index, (n_in, rank) in expected.items():
        pair = factored[index]
        assert isinstance(pair, nn.Sequential) and len(pair) == 2
        down, up = pair
        assert (down.in_features, down.out_features, down.bias) == (n_in, rank, None)
        assert up.in_features == rank and up.bias is not None
        assert up.out_features == model[index].out_features
    assert _n_params(factored) < _n_params(model)


def test_lowrank_is_exact_on_a_low_rank_weight() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 48)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 6) @ torch.randn(6, 64))
    factored = LowRank(rank_ratio=0.125).apply(copy.deepcopy(layer), _task(layer))  # r = 6
    x = torch.randn(10, 64)
    torch.testing.assert_close(_forward(factored, x), _forward(layer, x), rtol=1e-4, atol=1e-4)


def test_lowrank_skips_layers_that_would_not_get_smaller() -> None:
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128))
    # r = 10 for the 16x128 layer (1440 < 2048 weights); r = 77 for the square one (19712 >= 16384)
    factored = LowRank(rank_ratio=0.6).apply(copy.deepcopy(model), _task(model))
    assert isinstance(factored[0], nn.Sequential) and factored[0][0].out_features == 10
    assert type(factored[2]) is nn.Linear


def test_lowrank_at_full_rank_on_a_square_layer_raises() -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    with pytest.raises(TechniqueError, match="no nn.Linear layer gets smaller"):
        LowRank(rank_ratio=1.0).apply(model, _task(model))


# --- int8 dynamic quantization --------------------------------------------------------------------


def test_int8_dynamic_is_cpu_only() -> None:
    assert Int8Dynamic().available("cuda:0") == "int8 dynamic quantization runs on the CPU only."


@pytest.mark.skipif(Int8Dynamic().available("cpu") is not None, reason="no quantized CPU engine")
def test_int8_dynamic_quantizes_every_linear_and_stays_close() -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    model = _mlp(128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's deprecation warnings are silenced inside apply
        quantized = Int8Dynamic().apply(copy.deepcopy(model), _task(model))
    assert not _linears(quantized)
    assert sum(isinstance(m, DynamicQuantizedLinear) for m in quantized.modules()) == 3
    x = torch.randn(32, 16)
    reference = _forward(model, x)
    error = (_forward(quantized, x) - reference).abs().max()
    assert error < 0.05 * reference.abs().max()


def test_int8_dynamic_without_linear_raises() -> None:
    model = nn.Sequential(nn.ReLU())
    with pytest.raises(TechniqueError, match="no nn.Linear"):
        Int8Dynamic().apply(model, _task(model))


# --- registry and pipeline ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("prune_unstructured", {"sparsity": 1.5}),
        ("prune_unstructured", {"sparsity": 0}),
        ("prune_structured", {"ratio": 1.0}),
        ("lowrank", {"rank_ratio": 0}),
        ("lowrank", {"rank_ratio": 1.01}),
        ("lowrank", {"ratio": 0.5}),
        ("int8_dynamic", {"bits": 4}),
        ("no_such_technique", {}),
    ],
)
def test_bad_technique_names_and_parameters_are_usage_errors(name: str, params: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        get_technique(name, params)


def test_get_technique_builds_the_registered_class() -> None:
    assert get_technique("prune_structured", {"ratio": 0.5}) == StructuredPrune(ratio=0.5)
    assert get_technique("int8_dynamic") == Int8Dynamic()
    assert get_technique("lowrank", {"rank_ratio": 1.0}).describe() == "lowrank(rank_ratio=1)"


def test_apply_leaves_the_original_model_untouched() -> None:
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    techniques = (
        UnstructuredPrune(sparsity=0.5), StructuredPrune(ratio=0.5), LowRank(rank_ratio=0.25), Int8Dynamic()
    )
    apply(model, Config(techniques=techniques, batch_size=2), _task(model))
    assert [type(m) for m in model] == [type(m) for m in _mlp()]
    after = model.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key


def test_apply_reports_why_a_technique_failed() -> None:
    model = nn.Sequential(nn.Linear(16, 8))
    with pytest.raises(TechniqueError, match="no Linear→activation→Linear pair"):
        apply(model, Config(techniques=(StructuredPrune(ratio=0.5),), batch_size=1), _task(model))


def test_apply_wraps_an_unexpected_failure_with_its_reason() -> None:
    class Broken(Technique):
        name: ClassVar[str] = "broken"
        family: ClassVar[Family] = "compile"

        def apply(self, model: nn.Module, task: Task) -> nn.Module:
            raise RuntimeError("shape mismatch in layer 3")

    model = _mlp()
    with pytest.raises(TechniqueError, match="broken failed on this model: RuntimeError: shape mismatch"):
        apply(model, Config(techniques=(Broken(),), batch_size=1), _task(model))
