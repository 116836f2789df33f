"""The GPU's levers: availability rules under patched capabilities (any machine), and the kernels
themselves where a GPU is present (each test skips with its reason elsewhere)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pareto import Task
from pareto.compress import Config, apply, get_technique, kernels
from pareto.compress import prune as prune_module
from pareto.compress import quantize as quantize_module
from pareto.compress.graphs import CudaGraphed
from pareto.errors import TechniqueError

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device: the GPU kernels are untested here")


def _capability(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int] | None) -> None:
    for module in (prune_module, quantize_module):
        monkeypatch.setattr(module, "cuda_capability", lambda device: capability)


def test_two_four_takes_cutlass_on_ampere_and_cusparselt_on_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    technique = get_technique("prune_2_4")
    _capability(monkeypatch, (8, 0))
    assert technique.available("cuda:0") is None
    _capability(monkeypatch, (9, 0))
    monkeypatch.setattr(prune_module, "_cusparselt", lambda: False)
    reason = technique.available("cuda:0")
    assert reason is not None and "cuSPARSELt" in reason and "8.x only" in reason
    monkeypatch.setattr(prune_module, "_cusparselt", lambda: True)
    assert technique.available("cuda:0") is None
    _capability(monkeypatch, (7, 0))
    assert "8.0 or newer" in (technique.available("cuda:0") or "")


def test_fp8_needs_ada_or_hopper_and_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    fp8 = get_technique("fp8")
    assert "this device is cpu" in (fp8.available("cpu") or "")
    monkeypatch.setattr(quantize_module, "_torchao_reason", lambda name: None)
    _capability(monkeypatch, (8, 0))
    assert "8.9 or newer; cuda:0 has 8.0" in (fp8.available("cuda:0") or "")
    _capability(monkeypatch, (9, 0))
    assert fp8.available("cuda:0") is None
    monkeypatch.setattr(quantize_module, "_torchao_reason", lambda name: "needs torchao")
    assert fp8.available("cuda:0") == "needs torchao"


def test_fp8_is_unavailable_for_a_model_no_float8_matmul_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    # resnet's only Linear is its 128 -> 10 head: the levers step read FAIL where it should skip
    from tests.tiny_task import make_conv_task, make_task

    fp8 = get_technique("fp8")
    monkeypatch.setattr(quantize_module, "_torchao_reason", lambda name: None)
    _capability(monkeypatch, (9, 0))
    assert "no nn.Linear whose widths are multiples of 16" in (fp8.available("cuda:0", make_conv_task()) or "")
    assert fp8.available("cuda:0", make_task()) is None  # the tiny MLP's 16 -> 64 -> 64 layers take it


def test_int4_packs_for_tinygemm_without_mslk(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "mslk" else real(name))
    assert quantize_module.int4_packing() == "tile_packed_to_4d"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "mslk" else real(name))
    assert quantize_module.int4_packing() == "plain"


def test_cuda_graphs_refuse_off_cuda_with_a_reason() -> None:
    technique = get_technique("cuda_graphs")
    assert technique.available("cpu") == "CUDA graphs record GPU kernels; this device is cpu."
    with pytest.raises(TechniqueError, match="CUDA graphs record GPU kernels"):
        technique.apply(nn.Linear(4, 4), Task("t", nn.Linear(4, 4), lambda b: torch.randn(b, 4), lambda m: 1.0))


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        (("int8_dynamic", "fp8"), "int8_dynamic and fp8 cannot share a configuration"),
        (("bf16", "fp16"), "bf16 and fp16 cannot share a configuration"),
        (("compile", "cuda_graphs"), "compile and cuda_graphs cannot share a configuration"),
        (("prune_2_4", "int4_weight_only"), "cannot share a configuration"),
    ],
)
def test_techniques_that_cannot_share_a_configuration_are_refused(pair: tuple[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config(techniques=tuple(get_technique(n) for n in pair), batch_size=1)


def test_the_samplers_never_draw_two_techniques_that_exclude_each_other() -> None:
    import optuna

    from pareto.study.samplers import grid, space_size, suggest

    space = {"bf16": {}, "fp16": {}, "int8_weight_only": {}, "fp8": {}}
    points = grid([1], space)
    assert len(points) == space_size([1], space) == 8  # of 16 on/off combinations, 8 can share
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        config = suggest(trial, [1], space)  # validation would raise on a conflicting pair
        study.tell(trial, 0.0)
        assert not {"bf16", "fp16"} <= {t.name for t in config.techniques}


def test_widths_round_to_tensor_core_tiles_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.compress import lowrank as lowrank_module
    from pareto.compress.base import width_multiple

    assert width_multiple("cuda:0") == 8 and width_multiple("cpu") == 1
    assert prune_module._exact_ratio(0.5, 100) == pytest.approx(1 - 50.5 / 100)
    assert prune_module._exact_ratio(0.5, 100, multiple=8) == pytest.approx(1 - 56.5 / 100)  # 50 -> 56 kept
    monkeypatch.setattr(lowrank_module, "width_multiple", lambda device: 8)
    layer = nn.Linear(100, 100)
    factored = get_technique("lowrank", {"rank_ratio": 0.3, "min_rank": 1})._factorize(layer)
    assert factored is not None and factored[0].out_features == 32  # rank 30 -> 32


def test_a_kernel_probe_that_fails_is_the_reason_and_is_cached(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PARETO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_memory", {})
    bf16 = get_technique("bf16")
    assert kernels.probe(bf16, "cpu") is None  # runs through the real pipeline on the probe MLP
    # on a second device: the probe's inputs must follow its model there (a CPU input fails on meta)
    assert kernels.probe(get_technique("lowrank", {"rank_ratio": 0.25, "keep_head": False}), "meta") is None
    assert kernels.kernel_reason(bf16, "cpu") is None  # the CPU: the techniques' own checks decide

    def broken(self, model, task):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(type(bf16), "apply", broken)
    reason = kernels.probe(bf16, "cpu")
    assert reason is not None and reason.startswith("a probe through its kernels failed on cpu:")
    assert "no kernel image" in reason
    calls = []
    monkeypatch.setattr(kernels, "_key", lambda techniques, device: "k1")
    monkeypatch.setattr(kernels, "probe", lambda technique, device: calls.append(device) or "refused")
    assert kernels.kernel_reason(bf16, "cuda:0") == "refused"
    monkeypatch.setattr(kernels, "_memory", {})  # a new process reads the file
    assert kernels.kernel_reason(bf16, "cuda:0") == "refused" and calls == ["cuda:0"]
    assert (tmp_path / kernels.CACHE_FILE).exists()


def _mlp_task(device: str, width: int = 256) -> Task:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).eval()
    x = torch.randn(64, width)
    return Task("mlp", model, lambda b: x[:b].clone(), lambda m: float((m(x).argmax(1) >= 0).float().mean()))


@needs_cuda
@pytest.mark.parametrize(
    "names",
    [
        ("cuda_graphs",),
        ("bf16", "cuda_graphs"),
        ("compile",),
        ("int8_dynamic",),
        ("prune_2_4",),
        ("fp8",),
        ("int4_weight_only",),
    ],
)
def test_gpu_levers_run_and_agree_with_the_float_model(names: tuple[str, ...]) -> None:
    from pareto.compress.availability import technique_reason

    # int4's tile-packed layout pads input widths to 1024: narrower, int4 is not offered (its padding reason)
    task = _mlp_task("cuda:0", 1024 if "int4_weight_only" in names else 256)
    techniques = tuple(get_technique(n) for n in names)
    for t in techniques:
        reason = technique_reason(t, "cuda:0", task)
        if reason is not None:
            pytest.skip(f"{t.name} is not available here: {reason}")
    model = apply(task.model, Config(techniques=techniques, batch_size=16), task, device="cuda:0").module
    x = task.example_input(16).to("cuda:0")
    with torch.inference_mode():
        want = task.model.to("cuda:0")(x).float()
        got = model(x).float()
        again = model(x).float()
    task.model.to("cpu")
    assert got.shape == want.shape and torch.equal(got, again)
    assert (got - want).abs().max() < 0.25 * want.abs().max() + 0.05


@needs_cuda
def test_cuda_graphs_replay_count_their_pool_and_capture_time() -> None:
    task = _mlp_task("cuda:0")
    served = apply(task.model, Config(techniques=(get_technique("cuda_graphs"),), batch_size=8), task, device="cuda:0")
    model = served.module
    assert isinstance(model, CudaGraphed) and served.compile_s is not None and served.compile_s > 0
    assert served.graph_pool is model.graph_pool and served.graph_pool_bytes >= 0 and model._orig_mod is served.eager
    x = torch.randn(8, 256, device="cuda:0")
    first = model(x)
    second = model(x * 2)
    assert not torch.equal(first, second)  # a clone per call: the next replay does not overwrite the last output
    pool = served.graph_pool_bytes
    model(torch.randn(3, 256, device="cuda:0"))  # a new batch shape records a second graph, into the same pool
    assert len(model._graphs) == 2 and served.graph_pool_bytes >= pool  # the record reads the pool as it grows


def test_structured_pruning_keeps_the_widths_the_configurations_quantizer_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # on CUDA "prune_structured + int4(gs64)" pruned to multiples of 8 and int4 then quantized only the
    # layers whose widths stayed multiples of 64, the rest ran in bf16 under an int4 label
    from pareto.compress import base
    from tests.tiny_task import _task

    techniques = {name: get_technique(name, {}) for name in ("fp8", "prune_2_4")}
    techniques["prune_structured"] = get_technique("prune_structured", {"ratio": 0.3})
    int4 = get_technique("int4_weight_only", {"group_size": 64})
    with base.needed_multiple([techniques["prune_structured"]]):
        assert base.width_multiple("cuda") == 8 and base.width_multiple("cpu") == 1
    with base.needed_multiple([techniques["prune_structured"], techniques["fp8"]]):
        assert base.width_multiple("cuda") == 16
    with base.needed_multiple([techniques["prune_structured"], int4]) as multiple:
        assert multiple == 64 and base.width_multiple("cuda") == 64
    with base.needed_multiple([techniques["prune_2_4"]]):
        assert base.width_multiple("cuda") == 64
    assert base.width_multiple("cuda") == 8  # outside a configuration: the tensor cores' tile
    # the CPU builds what a CUDA device would: widths rounded as on CUDA
    monkeypatch.setattr(prune_module, "width_multiple", lambda _device: base.width_multiple("cuda"))
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 192), nn.ReLU(), nn.Linear(192, 4))
    task = _task("wide", wide)
    with base.needed_multiple([techniques["prune_structured"], int4]):
        pruned = techniques["prune_structured"].apply(task.model, task)
    widths = [m.out_features for m in pruned.modules() if isinstance(m, nn.Linear)][:-1]
    assert widths != [256, 192] and all(w % 64 == 0 for w in widths), widths
