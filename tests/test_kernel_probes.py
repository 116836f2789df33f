"""Kernel probes on a GPU, run on any machine: the GPU's name, capability and driver patched, the
pipeline's apply replaced by a stub that fails the way the real kernels fail there."""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from torch import nn

from pareto import Task
from pareto.compress import get_technique, kernels, pipeline
from pareto.compress import quantize as quantize_module
from pareto.compress.base import install_conflicts
from pareto.errors import TechniqueError
from pareto.study.samplers import grid, suggest

GPU = "cuda:0"
COMPILE = "compile(mode=default)"
#: the default CUDA space's compile, fp8 and int4 (with a cast beside them)
SPACE: dict[str, dict[str, Any]] = {
    "compile": {"mode": ["default", "reduce-overhead"]},
    "bf16": {},
    "fp8": {},
    "int4_weight_only": {"group_size": [64, 128]},
}


class Unsupported(RuntimeError):
    """Stands for ``torch._dynamo.exc.Unsupported``."""


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """An H200 as the probe's key sees it, fp8 and int4 available on it, an empty probe cache in
    ``tmp_path``, and the probe's model left where it is; returns the probes run (technique names)."""
    from pareto import devices
    from pareto.measure import environment

    monkeypatch.setenv("PARETO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_memory", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(environment, "cuda_driver", lambda: "570.00")
    monkeypatch.setattr(quantize_module, "_torchao_reason", lambda name: None)
    monkeypatch.setattr(quantize_module, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(devices, "on_device", lambda task, device: task)
    return []


def _stub_apply(
    monkeypatch: pytest.MonkeyPatch, probes: list[tuple[str, ...]], fail: Callable[[set[str]], Exception | None]
) -> None:
    """The pipeline's apply as a stub: it records the techniques and raises ``fail(names)`` where that is
    an exception, else serves the model unchanged."""

    def apply(model: nn.Module, config: Any, task: Any, device: str | None = None) -> Any:
        names = [t.describe() for t in config.techniques]
        probes.append(tuple(names))
        error = fail({t.name for t in config.techniques})
        if error is not None:
            raise error
        return types.SimpleNamespace(module=model)

    monkeypatch.setattr(pipeline, "apply", apply)


def _dynamo_refuses_torchao(names: set[str]) -> Exception | None:
    """As torch 2.11 with torchao 0.17: compile of float8 or int4 weights fails in Dynamo (the pipeline wraps it)."""
    if "compile" in names and names & {"fp8", "int4_weight_only"}:
        try:
            raise Unsupported("Polyfill handler <function ...> does not have a traceable function")
        except Unsupported as exc:
            wrapped = TechniqueError(f"compile failed on this model: Unsupported: {exc}")
            wrapped.__cause__ = exc
            return wrapped
    return None


def _drawn_pairs(space: dict[str, dict[str, Any]], pairs: frozenset[frozenset[str]]) -> set[frozenset[str]]:
    """Every pair of techniques 80 random trials drew together."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn: set[frozenset[str]] = set()
    for _ in range(80):
        trial = study.ask()
        names = sorted(t.name for t in suggest(trial, [8], space, conflicts=pairs).techniques)
        drawn |= {frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1 :]}
        study.tell(trial, 0.0)
    return drawn


def test_fp8_and_int4_with_compile_are_probed_as_a_pair_and_never_drawn_where_it_fails(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]]
) -> None:
    _stub_apply(monkeypatch, gpu, _dynamo_refuses_torchao)
    found = install_conflicts(SPACE, GPU)
    assert {frozenset((a, b)) for a, b, _ in found} == {
        frozenset(("compile", "fp8")),
        frozenset(("compile", "int4_weight_only")),
    }
    for _, _, why in found:
        assert (
            why.startswith("a probe of ") and "with compile(mode=default) through their kernels failed on cuda:0" in why
        )
        assert "Polyfill handler" in why and not why.endswith(".")  # a clause: the search's notice ends it
    # each pair probed once, in the default compile mode, int4 with the space's first group size
    assert sorted(gpu) == [("fp8", COMPILE), ("int4_weight_only(group_size=64)", COMPILE)]
    pairs = frozenset(frozenset((a, b)) for a, b, _ in found)
    drawn = _drawn_pairs(SPACE, pairs)
    assert not drawn & pairs and frozenset(("bf16", "compile")) in drawn and frozenset(("bf16", "fp8")) in drawn
    assert not any(p["compile"] and (p["fp8"] or p["int4_weight_only"]) for p in grid([8], SPACE, conflicts=pairs))
    # cached: in this process, and for the next one in the probe file
    assert install_conflicts(SPACE, GPU) == found and len(gpu) == 2
    monkeypatch.setattr(kernels, "_memory", {})
    assert install_conflicts(SPACE, GPU) == found and len(gpu) == 2


def test_fp8_and_int4_are_kept_off_the_compile_backend_where_the_pair_probe_fails(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]]
) -> None:
    from pareto.study.samplers import space_size

    _stub_apply(monkeypatch, gpu, _dynamo_refuses_torchao)
    space = {"bf16": {}, "fp8": {}}
    found = install_conflicts(space, GPU, ("eager", "compile"))
    assert [(a, b) for a, b, _ in found] == [("fp8", "backend:compile")]
    pairs = frozenset(frozenset((a, b)) for a, b, _ in found)
    points = grid([8], space, backends=("eager", "compile"), conflicts=pairs)
    assert any(p["backend"] == "eager" and p.get("fp8") for p in points)
    assert not any(p["backend"] == "compile" and p.get("fp8") for p in points)
    assert space_size([8], space, ("eager", "compile"), pairs) == len(points) == 4 + 2
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    served = set()
    for _ in range(60):
        trial = study.ask()
        config = suggest(trial, [8], space, backends=("eager", "compile"), conflicts=pairs)
        served |= {(config.backend, t.name) for t in config.techniques}
        study.tell(trial, 0.0)
    assert ("eager", "fp8") in served and ("compile", "bf16") in served and ("compile", "fp8") not in served
    assert install_conflicts(space, GPU) == []  # eager alone: nothing to keep off


def test_fp8_and_int4_with_compile_are_offered_where_the_pair_probe_passes(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]]
) -> None:
    _stub_apply(monkeypatch, gpu, lambda names: None)
    assert install_conflicts(SPACE, GPU) == []
    assert len(gpu) == 2  # both pairs were probed
    drawn = _drawn_pairs(SPACE, frozenset())
    assert frozenset(("compile", "fp8")) in drawn and frozenset(("compile", "int4_weight_only")) in drawn


def test_no_pair_is_probed_off_cuda_or_where_fp8_cannot_run_alone(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]]
) -> None:
    _stub_apply(monkeypatch, gpu, _dynamo_refuses_torchao)
    assert install_conflicts(SPACE, "cpu") == [] and gpu == []
    monkeypatch.setattr(quantize_module, "cuda_capability", lambda device: (8, 0))  # an A100: no float8
    assert [(a, b) for a, b, _ in install_conflicts(SPACE, GPU)] == [("compile", "int4_weight_only")]
    assert gpu == [("int4_weight_only(group_size=64)", COMPILE)]


def test_out_of_memory_in_a_probe_is_the_reason_but_never_stored(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]], tmp_path: Path
) -> None:
    bf16 = get_technique("bf16")

    def out_of_memory(names: set[str]) -> Exception:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        except torch.OutOfMemoryError as exc:  # as the pipeline keeps it
            wrapped = TechniqueError(f"bf16 failed on this model: OutOfMemoryError: {exc}")
            wrapped.__cause__ = exc
            return wrapped

    _stub_apply(monkeypatch, gpu, out_of_memory)
    reason = kernels.kernel_reason(bf16, GPU)
    assert reason is not None and "CUDA out of memory" in reason
    assert kernels._memory == {} and not (tmp_path / kernels.CACHE_FILE).exists()
    assert kernels.kernel_reason(bf16, GPU) == reason and len(gpu) == 2  # probed again
    _stub_apply(monkeypatch, gpu, lambda names: None)  # the memory is back
    assert kernels.kernel_reason(bf16, GPU) is None and len(gpu) == 3
    assert kernels.kernel_reason(bf16, GPU) is None and len(gpu) == 3  # a result worth keeping is kept
    assert (tmp_path / kernels.CACHE_FILE).exists()


@pytest.mark.parametrize(
    ("error", "stored"),
    [
        (torch.AcceleratorError("CUDA error: unspecified launch failure"), False),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (RuntimeError("CUDA error: device-side assert triggered"), False),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"), False),
        (MemoryError(), False),
        (torch.AcceleratorError("CUDA error: no kernel image is available for execution on the device"), True),
        (RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmul`"), True),
        (Unsupported("Polyfill handler <function ...> does not have a traceable function"), True),
        (ValueError("Cannot use tinygemm int4 kernel with a device of compute capability (7, 5)"), True),
    ],
)
def test_a_cuda_runtime_error_in_a_probe_is_not_stored_but_a_missing_kernel_is(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]], error: Exception, stored: bool
) -> None:
    _stub_apply(monkeypatch, gpu, lambda names: error)
    reason = kernels.kernel_reason(get_technique("bf16"), GPU)
    assert reason is not None and reason.startswith("a probe through its kernels failed on cuda:0:")
    assert kernels.transient(error) is not stored
    assert list(kernels._memory.values()) == ([reason] if stored else [])
    assert list(kernels._read_cache().values()) == ([reason] if stored else [])


def test_the_probe_cache_is_keyed_by_pareto_version_and_the_probe_code(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]]
) -> None:
    bf16, fp8 = get_technique("bf16"), get_technique("fp8")
    key = kernels._key((bf16,), GPU)
    assert kernels._key((bf16,), GPU) == key and kernels._key((fp8,), GPU) != key
    assert kernels._key((fp8, get_technique("compile")), GPU) != kernels._key((fp8,), GPU)
    monkeypatch.setattr(kernels, "__version__", "99.0.0")  # pareto._version, as kernels reads it
    upgraded = kernels._key((bf16,), GPU)
    assert upgraded != key
    monkeypatch.setattr(kernels, "probe_code", lambda: "another probe")
    probed = kernels._key((bf16,), GPU)
    assert probed not in (key, upgraded)
    # a technique's own code (or the pipeline's) fixed: its old result is not read
    assert kernels.technique_code(type(bf16)) != kernels.technique_code(type(fp8))
    monkeypatch.setattr(kernels, "technique_code", lambda cls: "a fixed technique")
    assert kernels._key((bf16,), GPU) != probed


def test_a_cusparse_kernel_missing_for_this_gpu_is_kept_and_a_cusparse_failure_is_not() -> None:
    lasting = RuntimeError("CUDA error: CUSPARSE_STATUS_NOT_SUPPORTED when calling cusparseLtMatmul")
    passing = RuntimeError("CUDA error: CUSPARSE_STATUS_INTERNAL_ERROR when calling cusparseSpMM")
    assert not kernels.transient(lasting) and kernels.transient(passing)


def test_the_probe_code_digest_follows_the_probe_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels.probe_code.cache_clear()
    try:
        digest = kernels.probe_code()
        assert digest == kernels.probe_code() and len(digest) == 16
        monkeypatch.setattr(kernels, "_PROBE_CODE", (*kernels._PROBE_CODE, _stub_apply))
        kernels.probe_code.cache_clear()
        assert kernels.probe_code() != digest
    finally:
        monkeypatch.undo()
        kernels.probe_code.cache_clear()


def _task(width: int) -> Task:
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).eval()
    return Task("mlp", model, lambda b: torch.randn(b, width), lambda m: 1.0)


def test_int4_is_not_available_where_tile_packing_pads_the_weights_more_than_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    int4 = get_technique("int4_weight_only")
    monkeypatch.setattr(quantize_module, "_torchao_reason", lambda name: None)
    monkeypatch.setattr(quantize_module, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(quantize_module, "int4_packing", lambda: "tile_packed_to_4d")
    reason = int4.available(GPU, _task(128))
    assert reason is not None and "multiple of 1024" in reason and "padded 8.0x" in reason
    assert int4.available(GPU, _task(1024)) is None
    assert int4.available(GPU, _task(512)) is None  # padded 2x: half the weights' bytes still real
    assert int4.available(GPU) is None  # without a task: the device and the libraries only
    monkeypatch.setattr(quantize_module, "int4_packing", lambda: "plain")  # MSLK's layout does not pad
    assert int4.available(GPU, _task(128)) is None


def test_pareto_measure_refuses_fp8_with_compile_where_the_pair_probe_fails(
    monkeypatch: pytest.MonkeyPatch, gpu: list[tuple[str, ...]]
) -> None:
    from pareto.compress import Config, why_not_here
    from pareto.compress import compile as compile_module

    monkeypatch.setattr(compile_module, "_compile_reason", lambda device_type: None)  # triton there
    _stub_apply(monkeypatch, gpu, _dynamo_refuses_torchao)
    fp8 = get_technique("fp8")
    with_compile = why_not_here(Config(techniques=(fp8, get_technique("compile")), batch_size=8), None, GPU)
    assert with_compile is not None and with_compile.startswith("fp8 with compile: a probe of fp8 with compile")
    on_backend = why_not_here(Config(techniques=(fp8,), batch_size=8, backend="compile"), None, GPU)
    assert on_backend is not None and on_backend.startswith("fp8 on the compile backend: ")
    assert why_not_here(Config(techniques=(fp8, get_technique("bf16")), batch_size=8), None, GPU) is None
