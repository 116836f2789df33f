"""Rebuild a stored trial's compressed model and serialize it: the artifact ``pareto.export.bundle`` writes.

torch.export first (the batch dimension dynamic where it allows), TorchScript when torch.export cannot
trace the model or holds torch.ao's eager int8 Linear, the ONNX graph itself for a configuration ONNX
Runtime serves. ``pareto.export.bundle``'s docstring says what each technique becomes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.errors import ParetoError, TechniqueError, UsageError, exception_line

if TYPE_CHECKING:
    from torch import nn

    from pareto.compress import Config, Served
    from pareto.front import Candidate
    from pareto.task import Task

TORCH_EXPORT = "torch.export"
TORCHSCRIPT = "torchscript"
ONNX = "onnx"
ARTIFACT_NAMES = {TORCH_EXPORT: "model.pt2", TORCHSCRIPT: "model.torchscript.pt", ONNX: "model.onnx"}

_WHY = {
    TORCH_EXPORT: (
        "torch.export ExportedProgram (the forward as an ATen graph with its weights), saved with "
        "torch.export.save; torch.export.load reads it in plain torch, and AOTInductor can compile it ahead of time"
    ),
    TORCHSCRIPT: (
        "TorchScript (torch.jit.trace, saved with torch.jit.save); torch.jit.load reads it in plain torch "
        "and torch::jit::load in libtorch (C++)"
    ),
    ONNX: (
        "the configuration is served by ONNX Runtime: the ONNX graph the measurement ran (torch.onnx's dynamo "
        "exporter, then any ONNX-level technique), opened with onnxruntime.InferenceSession; no torch needed"
    ),
}
_INT8_EAGER = (
    "torch.export cannot trace torch.ao's eager int8 Linear (its packed weights are a TorchScript object), "
    "so the artifact is TorchScript, which keeps quantized::linear_dynamic and the packed weights"
)


@dataclass
class Selection:
    """The stored measurement an export rebuilds: which study, task, trial, and how it was chosen."""

    study: str
    task: str
    trial: int
    candidate: Candidate
    chosen_by: dict[str, Any]


def rebuild(selection: Selection, task: Task, config: Config, device: str) -> Served:
    """The compressed model, built as the measurement built it (``pareto.study.assess.build``'s call)."""
    from pareto.compress import apply, why_not_here

    why = why_not_here(config, task, device)
    if why is not None:
        raise UsageError(
            f"Trial {selection.trial} ({selection.candidate.description}) cannot be exported here, on {device}: {why}."
        )
    try:
        return apply(task.model, config, task, device=device)
    except TechniqueError as exc:
        reason = str(exc).rstrip(".")
        raise ParetoError(
            f"Trial {selection.trial} ({selection.candidate.description}) cannot be rebuilt on {device} here, "
            f"so nothing was exported: {reason}."
        ) from exc


@dataclass
class Artifact:
    """A serialized model in the staging folder: its format, file name, what loading it imports, and why."""

    format: str
    file: str
    requires: list[str]
    why: str
    #: torch.export only: whether the batch dimension was exported dynamic (the reload check says whether it runs)
    dynamic_batch: bool | None = None
    #: compiled with Inductor's freezing and static shapes, as measured (int8_static's PT2E graph)
    inductor_freezing: bool = False


def serialize(selection: Selection, served: Served, task: Task, batch_size: int, device: str, folder: Path) -> Artifact:
    """Write ``model`` with torch.export, else TorchScript; torch.ao int8 models go to TorchScript directly.

    Raises:
        ParetoError: neither format can hold the model.
    """
    from pareto.devices import as_args

    model = served.module
    onnx_bytes = getattr(model, "onnx_bytes", None)  # served by ONNX Runtime: its graph is the artifact
    if isinstance(onnx_bytes, bytes):
        (folder / ARTIFACT_NAMES[ONNX]).write_bytes(onnx_bytes)
        return Artifact(ONNX, ARTIFACT_NAMES[ONNX], ["onnxruntime"], _WHY[ONNX], None)
    eager = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the compile is a run-time step
    requires = _requires(eager, served.requires)
    if _has_torch_ao_quantized(eager):
        return _torchscript(eager, as_args(task.example_input(batch_size)), folder, requires, _INT8_EAGER)
    freezing = served.inductor_freezing  # a PT2E graph, compiled as measured
    try:
        artifact = _torch_export(eager, task, batch_size, device, folder, requires)
    except Exception as exc:  # a model torch.export cannot trace; TorchScript may still hold it
        export_error = exception_line(exc)
        if freezing:  # TorchScript would not be served as measured
            raise ParetoError(
                f"Trial {selection.trial} ({selection.candidate.description}) cannot be serialized: torch.export "
                f"failed on its PT2E graph ({export_error}), and no other format is compiled as it was measured."
            ) from exc
    else:
        return dataclasses.replace(artifact, inductor_freezing=freezing)
    why = f"torch.export failed on this model ({export_error}), so the artifact is TorchScript"
    try:
        return _torchscript(eager, as_args(task.example_input(batch_size)), folder, requires, why)
    except Exception as exc:  # neither format holds it: refuse, with both reasons
        raise ParetoError(
            f"Trial {selection.trial} ({selection.candidate.description}) cannot be serialized: torch.export failed "
            f"({export_error}) and torch.jit.trace failed ({exception_line(exc)})."
        ) from exc


def _torch_export(
    model: nn.Module, task: Task, batch_size: int, device: str, folder: Path, requires: list[str]
) -> Artifact:
    """Export with a dynamic batch dimension where torch.export allows it, else at the measured batch size."""
    import torch

    from pareto.devices import as_args

    # a batch of 1 would be specialized to a constant: trace a dynamic batch on at least 2
    traced_batch = max(batch_size, 2)
    name = ARTIFACT_NAMES[TORCH_EXPORT]
    with _quiet():
        try:
            example = as_args(task.example_input(traced_batch))
            shapes = torch.export.ShapesCollection()
            batch = torch.export.Dim("batch")
            for x in example:
                if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == traced_batch:
                    shapes[x] = {0: batch}
            program = torch.export.export(model, example, dynamic_shapes=shapes.dynamic_shapes(model, example))
            dynamic = bool(program.range_constraints)
        except Exception:  # the model (or its inputs) fix the batch somewhere: export at the measured one
            program = torch.export.export(model, as_args(task.example_input(batch_size)))
            dynamic = False
        torch.export.save(program, folder / name)
    return Artifact(TORCH_EXPORT, name, requires, _WHY[TORCH_EXPORT], dynamic)


def _torchscript(model: nn.Module, args: tuple[Any, ...], folder: Path, requires: list[str], why: str) -> Artifact:
    import torch

    name = ARTIFACT_NAMES[TORCHSCRIPT]
    with _quiet(), torch.no_grad():
        traced = torch.jit.trace(model, args, check_trace=False)
        torch.jit.save(traced, str(folder / name))
    return Artifact(TORCHSCRIPT, name, requires, f"{why}; {_WHY[TORCHSCRIPT]}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide torch's tracing warnings (torch.jit's deprecation among them): the manifest says what was used."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _has_torch_ao_quantized(model: nn.Module) -> bool:
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())


def _requires(model: nn.Module, named: tuple[str, ...] = ()) -> list[str]:
    """Modules beside torch that loading the artifact imports: torchao when its tensor subclasses are in the
    model; what the techniques name (``Served.requires``: the library that registers a PT2E graph's operators)."""
    tensors = [*model.parameters(), *model.buffers()]
    subclasses = ["torchao"] if any(type(t).__module__.startswith("torchao") for t in tensors) else []
    return list(dict.fromkeys([*named, *subclasses]))
