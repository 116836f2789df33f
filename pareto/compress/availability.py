"""What can run here: why a technique, a backend or a whole configuration cannot be built on a device
on this install (a technique's own checks, then on a CUDA device a probe through its real kernels,
``pareto.compress.kernels``, and the pairs those probes refuse), and the listing ``pareto techniques``
prints."""

from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Any, Literal

import annotated_types
from pydantic.fields import FieldInfo

from pareto.compress.base import Technique, canonical_key, registry
from pareto.compress.compile import Compile
from pareto.compress.cpu import Int8DotProducts
from pareto.compress.kernels import kernel_reason
from pareto.compress.onnxrt import device_reason, graph_file_reason
from pareto.compress.pipeline import Config
from pareto.devices import on_device

if TYPE_CHECKING:
    from pareto.task import Task


def technique_reason(technique: Technique, device: str, task: Task | None = None) -> str | None:
    """Why ``technique`` cannot run on ``device`` for ``task``, or None: its own checks, then on a CUDA
    device a probe through its real kernels (``pareto.compress.kernels``). On a graph read from an ONNX
    file only ONNX Runtime's passes run."""
    if task is not None:
        why = graph_file_reason(technique.name, technique.on_graph, task.model)
        if why is not None:
            return why
    return technique.available(device, task) or kernel_reason(technique, device)


def backend_reason(backend: str, device: str) -> str | None:
    """Why configurations cannot be served on ``backend`` on ``device`` ("cpu", "cuda:0") here, or None."""
    if backend == "compile":
        return technique_reason(Compile(), device)
    if backend == "onnxruntime":
        return device_reason(device)
    return None


def why_not_here(config: Config, task: Task | None, device: str) -> str | None:
    """Why ``config`` cannot be built on ``device`` here (its backend, or one of its techniques), or None."""
    why = backend_reason(config.backend, device)
    if why is None and config.backend == "compile" and task is not None:
        why = graph_file_reason("torch.compile", False, task.model)
    if why is not None:
        return f"the {config.backend} backend: {why.rstrip('.')}"
    for technique in config.techniques:
        why = technique_reason(technique, device, task)
        if why is not None:
            return f"{technique.name}: {why.rstrip('.')}"
    return _pair_reason(config, device)


def _pair_reason(config: Config, device: str) -> str | None:
    """Why two of ``config``'s techniques cannot run together on this install, or one of them on the compile
    backend (``Technique.pair_reason``, as a search's ``install_conflicts`` judges them), or None."""
    for technique in config.techniques:
        others = [t.name for t in config.techniques if t is not technique]
        if config.backend == "compile":
            others.append("compile")  # the backend serves through torch.compile's default mode
        space = {name: [value] for name, value in technique.params().items()}
        for other in others:
            why = type(technique).pair_reason(other, device, space)
            if why is not None:
                beside = f"with {other}" if other in {t.name for t in config.techniques} else "on the compile backend"
                return f"{technique.name} {beside}: {why.rstrip('.')}"
    return None


def describe_techniques(device: str, task: Task | None = None) -> list[dict[str, Any]]:
    """Every registered technique with its parameters and whether it can run on ``device`` for ``task``.

    Each entry is ``{"name", "family", "summary", "parameters", "available", "reason", "backend", "backends",
    "judged_with", "on_this_cpu"}``;
    ``parameters`` maps each parameter to a short type/range text, ``backend`` names the library
    whose kernels would run (None where the technique does not say or cannot run), ``backends`` the
    serving backends a configuration with it can use, ``judged_with`` the parameters availability was
    judged with, ``on_this_cpu`` (on the CPU) what this CPU's instructions do for it
    (``Technique.cpu_facts``; None where they do not decide). Entries come in canonical
    family order, then by name. Availability is judged on the technique built from its defaults
    and ``example`` values, with ``task`` seen on ``device`` as a bench sees it
    (``pareto.devices.on_device``): a trial run (``prune_structured``'s) runs there, under that
    device's rules (widths kept at multiples of 8 on CUDA). On a CUDA device it also needs a probe
    through the technique's kernels to have run there (``pareto.compress.kernels``).

    Example::

        >>> [t["name"] for t in describe_techniques("cpu") if t["family"] == "lowrank"]
        ['lowrank']
    """
    view = on_device(task, device) if task is not None else None
    techniques = sorted(registry().values(), key=canonical_key)
    listing = []
    for cls in techniques:
        technique = cls(**cls.example)
        reason = technique_reason(technique, device, view)
        listing.append(
            {
                "name": cls.name,
                "family": cls.family,
                "summary": cls.summary,
                "parameters": {
                    name: _field_text(field)
                    for name, field in cls.model_fields.items()
                    if name != "leave" or cls.leaves_layers  # layers left alone: only where honoured
                },
                "available": reason is None,
                "reason": reason,
                "backend": technique.backend(device) if reason is None else None,
                "backends": list(cls.backends),
                "judged_with": technique.params(),
                "on_this_cpu": cls.cpu_facts() if device == "cpu" else None,
            }
        )
    return listing


def _field_text(field: FieldInfo) -> str:
    """``"float in (0, 1]"``, ``"int >= 1, default 200"``, ``"one of 'a', 'b'; default 'a'"``."""
    annotation = field.annotation
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        optional = True
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else annotation
    if typing.get_origin(annotation) is Literal:
        text = "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    else:
        text = getattr(annotation, "__name__", str(annotation)) + _bounds(field)
    if optional:
        text += " or null"
    if not field.is_required():
        text += f", default {field.default!r}" if field.default is not None else ", default null"
    return text


def _bounds(field: FieldInfo) -> str:
    low = high = None
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Gt):
            low = f"({meta.gt}"
        elif isinstance(meta, annotated_types.Ge):
            low = f"[{meta.ge}"
        elif isinstance(meta, annotated_types.Lt):
            high = f"{meta.lt})"
        elif isinstance(meta, annotated_types.Le):
            high = f"{meta.le}]"
    if low and high:
        return f" in {low}, {high}"
    if low:
        return (" > " if low[0] == "(" else " >= ") + low[1:]
    if high:
        return (" < " if high[-1] == ")" else " <= ") + high[:-1]
    return ""


# --- what a CPU's instructions do for each technique, by name (the rules: ``pareto.compress.cpu``)


def levers() -> tuple[str, ...]:
    """The CPU's levers: what its instructions decide the speed of (a technique whose ``cpu_native`` is a
    lever), by name. Before a search on a CPU each one in the space is timed beside float32 on a layer of
    the task's widths (``pareto.study.space_checks``)."""
    return tuple(sorted(name for name, cls in registry().items() if cls.cpu_native and cls.cpu_native.lever))


def int8() -> tuple[str, ...]:
    """The techniques whose speed on a CPU turns on its int8 instructions, by name."""
    return tuple(sorted(name for name, cls in registry().items() if isinstance(cls.cpu_native, Int8DotProducts)))


def kernel_library(name: str) -> str:
    """Whose kernels technique ``name`` runs on a CPU, as ``pareto.measure.environment.host_cpu`` names them:
    ONNX Runtime's MLAS, FBGEMM (PyTorch's dynamic int8) or oneDNN (casts, PT2E int8, Inductor)."""
    cls = registry().get(name)
    return cls.cpu_kernels if cls is not None else "onednn"


def on_this_cpu(name: str, features: str | None, capability: str | None = None) -> str | None:
    """What this CPU's instructions do for technique ``name`` (its ``KERNEL_FEATURES``, space-separated,
    and torch's dispatch level); None for a technique they do not decide."""
    cls = registry().get(name)
    return cls.on_this_cpu(features, capability) if cls is not None else None


def cpu_facts(name: str) -> str | None:
    """What this CPU's instructions, as the kernels technique ``name`` runs on may use them, do for it."""
    cls = registry().get(name)
    return cls.cpu_facts() if cls is not None else None
