"""Behaviour of the built-in compression techniques and of the pipeline that applies them."""

from __future__ import annotations

import copy
import warnings
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from pareto.compress import Config, Technique, apply, describe_techniques, get_technique, quantize, registry
from pareto.compress.base import CANONICAL_ORDER, Family, canonical_key
from pareto.compress.lowrank import LowRank
from pareto.compress.prune import StructuredPrune, UnstructuredPrune
from pareto.compress.quantize import Int8Dynamic
from pareto.errors import TechniqueError, UsageError
from pareto.task import Task


def _mlp(width: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.GELU(),
        nn.Dropout(0.1),
        nn.Linear(width, 8),
    ).eval()


def _task(model: nn.Module, features: int = 16) -> Task:
    return Task(name="tiny", model=model, example_input=lambda b: torch.randn(b, features), evaluate=lambda m: 0.0)


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear]


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.eval()(x)


@pytest.mark.parametrize(
    "technique",
    [
        UnstructuredPrune(sparsity=0.5),
        StructuredPrune(ratio=0.5),
        LowRank(rank_ratio=0.25),
        LowRank(energy=0.5),
        Int8Dynamic(),
        get_technique("fp16"),
        get_technique("bf16"),
    ],
    ids=lambda t: t.describe(),
)
def test_every_technique_keeps_the_output_shape(technique: Technique) -> None:
    model = _mlp()
    compressed = apply(model, Config(techniques=(technique,), batch_size=4), _task(model)).module
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
    pruned = StructuredPrune(ratio=1 / 3).apply(copy.deepcopy(model), _task(model, 8))
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


def test_structured_prune_of_a_model_whose_only_layer_is_its_output_raises() -> None:
    model = nn.Linear(16, 8)
    with pytest.raises(TechniqueError, match="no group of channels, units or heads that may shrink"):
        StructuredPrune(ratio=0.5).apply(model, _task(model))


@pytest.mark.parametrize("between", [nn.Softmax(dim=-1), nn.LayerNorm(32)], ids=["softmax", "layernorm"])
def test_structured_prune_narrows_through_a_softmax_or_a_layer_norm(between: nn.Module) -> None:
    # the units still pair up one to one (a layer norm loses the same features); the function
    # changes more than through a ReLU, which recovery fine-tuning is for
    model = nn.Sequential(nn.Linear(16, 32), between, nn.Linear(32, 8)).eval()
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model), _task(model))
    assert (pruned[0].out_features, pruned[2].in_features, pruned[2].out_features) == (16, 16, 8)
    assert _forward(pruned, torch.randn(2, 16)).shape == (2, 8)


# --- low rank -------------------------------------------------------------------------------------


def test_lowrank_replaces_layers_by_factor_pairs_of_the_right_rank() -> None:
    model = _mlp(64)
    factored = LowRank(rank_ratio=0.25, keep_head=False, min_rank=1).apply(copy.deepcopy(model), _task(model))
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
    factored = LowRank(rank_ratio=0.125, keep_head=False, min_rank=1).apply(copy.deepcopy(layer), _task(layer, 64))
    x = torch.randn(10, 64)
    torch.testing.assert_close(_forward(factored, x), _forward(layer, x), rtol=1e-4, atol=1e-4)


def test_lowrank_keeps_the_head_and_layers_under_the_rank_floor_by_default() -> None:
    model = _mlp(64)
    factored = LowRank(rank_ratio=0.25).apply(copy.deepcopy(model), _task(model))
    assert type(factored[0]) is nn.Linear  # rank 4 of 16 is under the floor of 8
    assert isinstance(factored[2], nn.Sequential) and factored[2][0].out_features == 16
    assert type(factored[5]) is nn.Linear  # the head: its output is the model's
    torch.testing.assert_close(factored[5].weight, model[5].weight)


def test_lowrank_finds_a_head_behind_a_view_and_not_one_behind_a_softmax() -> None:
    class Viewed(nn.Module):
        def __init__(self, then_softmax: bool) -> None:
            super().__init__()
            self.body, self.head, self.then_softmax = nn.Linear(64, 64), nn.Linear(64, 64), then_softmax

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.head(self.body(x).relu()).reshape(x.shape[0], 8, 8)
            return y.softmax(-1) if self.then_softmax else y

    for then_softmax, head_factored in [(False, False), (True, True)]:
        model = Viewed(then_softmax).eval()
        factored = LowRank(rank_ratio=0.25).apply(copy.deepcopy(model), _task(model, 64))
        assert isinstance(factored.head, nn.Sequential) is head_factored
        assert isinstance(factored.body, nn.Sequential)  # rank 16 of 64


def test_lowrank_on_a_model_that_is_only_its_head_says_so() -> None:
    model = nn.Linear(64, 64)
    assert LowRank(rank_ratio=0.25).available("cpu", _task(model, 64)) == (
        "the model's only nn.Linear layers are its head, which is kept (keep_head=false factorizes it)."
    )
    assert LowRank(rank_ratio=0.25, keep_head=False).available("cpu", _task(model, 64)) is None
    with pytest.raises(TechniqueError, match="the head is kept"):
        LowRank(rank_ratio=0.25).apply(model, _task(model, 64))


def test_lowrank_skips_layers_that_would_not_get_smaller() -> None:
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128))
    # r = 10 for the 16x128 layer (1440 < 2048 weights); r = 77 for the square one (19712 >= 16384)
    factored = LowRank(rank_ratio=0.6, keep_head=False).apply(copy.deepcopy(model), _task(model))
    assert isinstance(factored[0], nn.Sequential) and factored[0][0].out_features == 10
    assert type(factored[2]) is nn.Linear


def test_lowrank_at_full_rank_on_a_square_layer_raises() -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    with pytest.raises(TechniqueError, match="no nn.Linear layer gets smaller"):
        LowRank(rank_ratio=1.0).apply(model, _task(model, 32))


# --- int8 dynamic quantization --------------------------------------------------------------------


def test_int8_dynamic_without_torchao_is_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "_torchao", lambda: (None, quantize.TORCHAO_HINT))
    reason = Int8Dynamic().available("cuda:0")
    assert reason is not None and reason.startswith("int8 dynamic quantization runs on the CPU only without torchao")
    assert "pip install torchao" in reason
    if Int8Dynamic().available("cpu") is None:
        assert Int8Dynamic().backend("cpu") == "torch.ao"


def test_int8_dynamic_kernels_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Int8Dynamic().params() == {}  # unset: the key of every stored int8_dynamic is unchanged
    assert Int8Dynamic(kernels="torch.ao").describe() == "int8_dynamic(kernels=torch.ao)"
    monkeypatch.setattr(quantize, "_torchao", lambda: (None, quantize.TORCHAO_HINT))
    assert Int8Dynamic(kernels="torchao").backend("cpu") is None
    assert Int8Dynamic(kernels="torchao").available("cpu") == quantize.TORCHAO_HINT
    assert Int8Dynamic(kernels="torch.ao").available("cuda:0") == (
        "torch.ao's int8 dynamic kernels run on the CPU only; on CUDA use kernels=torchao."
    )
    if Int8Dynamic().available("cpu") is None:
        assert Int8Dynamic(kernels="torch.ao").backend("cpu") == "torch.ao"


@pytest.mark.skipif(Int8Dynamic().available("cpu") is not None, reason="no quantized CPU engine")
def test_int8_dynamic_quantizes_every_linear_and_stays_close(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    monkeypatch.setattr(quantize, "_torchao", lambda: (None, quantize.TORCHAO_HINT))  # the eager backend

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
        ("lowrank", {}),
        ("lowrank", {"rank_ratio": 0.5, "energy": 0.9}),
        ("lowrank", {"energy": 0}),
        ("lowrank", {"energy": 1.5}),
        ("compile", {"mode": "turbo"}),
        ("distill", {"width_ratio": 0}),
        ("distill", {"alpha": 1.5}),
        ("distill", {"temperature": 0}),
        ("distill", {"steps": 0}),
        ("distill", {"depth": 0}),
        ("finetune", {"steps": 10**9}),
        ("finetune", {"lr": -1.0}),
        ("int4_weight_only", {"group_size": 100}),
        ("no_such_technique", {}),
    ],
)
def test_bad_technique_names_and_parameters_are_usage_errors(name: str, params: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        get_technique(name, params)


def test_usage_errors_are_one_sentence() -> None:
    message = r"^Technique 'lowrank': parameters: give exactly one of rank_ratio and energy\.$"
    with pytest.raises(UsageError, match=message):
        get_technique("lowrank", {"rank_ratio": 0.5, "energy": 0.9})
    with pytest.raises(UsageError, match=r"^Technique 'compile': mode: .*'default'"):
        get_technique("compile", {"mode": "turbo"})


def test_get_technique_builds_the_registered_class() -> None:
    assert get_technique("prune_structured", {"ratio": 0.5}) == StructuredPrune(ratio=0.5)
    assert get_technique("int8_dynamic") == Int8Dynamic()
    assert get_technique("lowrank", {"rank_ratio": 1.0}).describe() == "lowrank(rank_ratio=1,keep_head=True,min_rank=8)"
    assert get_technique("lowrank", {"energy": 0.9, "min_rank": 2}).describe() == (
        "lowrank(energy=0.9,keep_head=True,min_rank=2)"
    )
    assert get_technique("distill").describe() == (
        "distill(width_ratio=0.5,temperature=4,alpha=0.9,steps=200,lr=0.001)"
    )


def test_canonical_order_runs_finetune_between_lowrank_and_quantize() -> None:
    assert CANONICAL_ORDER == ("distill", "prune", "lowrank", "finetune", "quantize", "compile")
    techniques = tuple(
        get_technique(name, params)
        for name, params in [
            ("cuda_graphs", {}),
            ("fp8", {}),
            ("finetune", {}),
            ("prune_2_4", {}),
            ("lowrank", {"rank_ratio": 0.5}),
            ("prune_unstructured", {"sparsity": 0.5}),
            ("prune_structured", {"ratio": 0.5}),
            ("distill", {}),
            ("bf16", {}),
        ]
    )
    # fp8 and 2:4 cannot share a configuration: the order is read from the sort itself
    ordered = [t.name for t in sorted(techniques, key=canonical_key)]
    assert ordered == [
        "distill",
        "prune_structured",
        "prune_unstructured",
        "prune_2_4",
        "lowrank",
        "finetune",
        "bf16",
        "fp8",
        "cuda_graphs",
    ]
    assert [t.name for t in Config(techniques=techniques[:3], batch_size=1).techniques] == [
        "finetune",
        "fp8",
        "cuda_graphs",
    ]


def test_describe_techniques_lists_every_technique_with_its_availability() -> None:
    listing = describe_techniques("cpu")
    assert {t["name"] for t in listing} == set(registry())
    assert {"distill", "finetune", "compile", "prune_2_4", "fp16", "bf16", "int8_weight_only"} <= set(registry())
    families = [CANONICAL_ORDER.index(t["family"]) for t in listing]
    assert families == sorted(families)
    for entry in listing:
        assert set(entry) == {
            "name",
            "family",
            "summary",
            "parameters",
            "available",
            "reason",
            "backend",
            "backends",
            "judged_with",
            "on_this_cpu",
        }
        assert entry["summary"] and "\n" not in entry["summary"]
        assert entry["available"] is (entry["reason"] is None)
    by_name = {t["name"]: t for t in listing}
    assert by_name["prune_structured"]["parameters"] == {
        "ratio": "float in (0, 1)",
        "width_ratio": "float in (0, 1) or null, default null",
    }
    assert by_name["distill"]["parameters"]["steps"] == "int in [1, 100000], default 200"
    assert by_name["lowrank"]["parameters"]["energy"] == "float in (0, 1] or null, default null"
    assert by_name["compile"]["parameters"]["mode"].startswith("one of 'default', 'reduce-overhead'")
    assert by_name["prune_2_4"]["available"] is False
    assert by_name["prune_2_4"]["reason"].startswith("2:4 sparse kernels need a CUDA GPU of compute capability 8.0")
    assert by_name["int4_weight_only"]["available"] is False
    assert by_name["prune_unstructured"]["available"] is True


def test_describe_techniques_judges_the_task() -> None:
    model = _mlp()
    by_name = {t["name"]: t for t in describe_techniques("cpu", _task(model))}
    for name in ("distill", "finetune"):
        assert by_name[name]["available"] is False
        assert "train_data" in by_name[name]["reason"]
    assert by_name["prune_structured"]["available"] is True
    bare = nn.Sequential(nn.ReLU())
    by_name = {t["name"]: t for t in describe_techniques("cpu", _task(bare))}
    assert by_name["int8_dynamic"]["reason"] == "the model has no nn.Linear layer to quantize."
    assert by_name["prune_structured"]["reason"].startswith("the model has no group of channels")


def test_available_still_takes_the_device_alone() -> None:
    for cls in registry().values():
        cls(**cls.example).available("cpu")  # search.py calls it positionally, without a task


def test_apply_leaves_the_original_model_untouched() -> None:
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    techniques = (UnstructuredPrune(sparsity=0.5), StructuredPrune(ratio=0.5), LowRank(rank_ratio=0.25), Int8Dynamic())
    apply(model, Config(techniques=techniques, batch_size=2), _task(model))
    assert [type(m) for m in model] == [type(m) for m in _mlp()]
    after = model.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key


def test_apply_returns_the_served_model_with_what_its_techniques_declare() -> None:
    model = _mlp()
    plain = apply(model, Config(techniques=(LowRank(rank_ratio=0.25),), batch_size=2), _task(model))
    assert plain.module is plain.eager and plain.module is not model  # eager: nothing compiled, a copy
    assert (plain.compile_s, plain.compute_dtype, plain.requires, plain.notes) == (None, None, (), ())
    assert plain.source is None and plain.ready is None and plain.graph_pool_bytes == 0 and not plain.inductor_freezing
    if Int8Dynamic().available("cpu") is None:
        quantized = apply(model, Config(techniques=(Int8Dynamic(),), batch_size=2), _task(model))
        assert quantized.compute_dtype == "int8" == Int8Dynamic.compute_dtype  # declared by the technique


def test_apply_adds_up_the_seconds_of_every_serving_step() -> None:
    from pareto.compress import Served, Step

    class Wraps(Technique):  # a serving step (compile family) that took 0.25 s, then one that took 0.5 s
        name: ClassVar[str] = "test_wraps"
        family: ClassVar[Family] = "compile"

        def build(self, model: nn.Module, task: Task) -> Step:
            return Step(nn.Sequential(model), seconds=0.25, notes=("wrapped",))

    model = _mlp()
    served = Served(model, model).then(Wraps().build(model, _task(model)))
    again = served.then(Step(served.module, seconds=0.5, notes=("wrapped",), compute_dtype="int8"))
    assert again.compile_s == 0.75 and again.notes == ("wrapped",) and again.compute_dtype == "int8"
    assert again.eager is model and again.module[0] is model


def test_apply_reports_why_a_technique_failed() -> None:
    model = nn.Sequential(nn.Linear(16, 8))
    with pytest.raises(TechniqueError, match=r"^prune_structured\(ratio=0.5\): the model has no group"):
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


@pytest.mark.parametrize(
    ("name", "params"), [("lowrank", {"rank_ratio": 0.25}), ("int8_dynamic", {}), ("prune_structured", {"ratio": 0.5})]
)
def test_transformer_encoder_layers_run_after_their_linears_are_replaced(name: str, params: dict[str, float]) -> None:
    torch.manual_seed(0)
    # relu: the layer's fused inference kernel would read linear1.weight / linear2.weight directly
    model = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()
    task = Task(name="enc", model=model, example_input=lambda b: torch.randn(b, 5, 32), evaluate=lambda m: 0.0)
    technique = get_technique(name, params)
    if technique.available("cpu") is not None:
        pytest.skip(technique.available("cpu") or "")
    compressed = apply(model, Config(techniques=(technique,), batch_size=2), task).module
    assert _forward(compressed, torch.randn(2, 5, 32)).shape == (2, 5, 32)
