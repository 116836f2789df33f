"""The ``manifest.json`` an export writes beside its artifact: what was exported, how to load and serve it
as it was measured, what the reload check found, and where this environment differs from the measured one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pareto._version import __version__
from pareto.export.artifact import ONNX, TORCH_EXPORT, TORCHSCRIPT, Artifact
from pareto.export.check import tensors
from pareto.metrics import served_capacity

if TYPE_CHECKING:
    from pareto.compress import Config, Technique
    from pareto.export.artifact import Selection
    from pareto.front import Candidate

MANIFEST = "manifest.json"
#: Bumped when a manifest field changes meaning.
MANIFEST_VERSION = 1
#: What differs between the measuring and the exporting environment that can change latency.
ENVIRONMENT_FIELDS = ("device", "device_name", "driver", "cpu_model", "cpu_features", "torch_version", "threads")

#: What the manifest says of a technique that declares no ``Technique.artifact_note``.
UNNOTED = "applied by pareto before serialization"


class _Notes(Mapping[str, str]):
    """What each registered technique becomes in the artifact, by name: its ``Technique.artifact_note``
    (read from the registry when asked, so that this module does not import torch)."""

    def _notes(self) -> dict[str, str]:
        from pareto.compress.base import registry

        return {name: cls.artifact_note for name, cls in registry().items() if cls.artifact_note is not None}

    def __getitem__(self, name: str) -> str:
        return self._notes()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._notes())

    def __len__(self) -> int:
        return len(self._notes())


#: What each technique becomes in the artifact, from its class (tests check that every registered one says).
TECHNIQUE_NOTES: Mapping[str, str] = _Notes()


def environment_differences(
    measured: dict[str, Any], here: dict[str, Any], *, onnxruntime: bool = False, torchao: bool = False
) -> list[dict[str, Any]]:
    """The ``ENVIRONMENT_FIELDS`` that differ between where a trial was measured and where it is exported.

    When both ran on the CPU, the device name is the CPU model: it is compared once, as ``cpu_model``.
    With ``onnxruntime`` (a trial served by it), ONNX Runtime's version is compared too; with
    ``torchao`` (an artifact that loads it), torchao's.
    """
    both_cpu = measured.get("device") == here.get("device") == "cpu"
    fields = [f for f in ENVIRONMENT_FIELDS if not (f == "device_name" and both_cpu)]
    if onnxruntime:
        fields.append("onnxruntime_version")
    if torchao:
        fields.append("torchao_version")
    return [
        {"field": f, "measured": measured.get(f), "here": here.get(f)} for f in fields if measured.get(f) != here.get(f)
    ]


def _spec(value: Any, batch: int | None = None) -> list[dict[str, Any]]:
    """Shape, dtype and device of each tensor; ``batch_dim`` 0 where dimension 0 is a batch that may vary."""
    specs = []
    for t in tensors(value):
        spec: dict[str, Any] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device),
        }
        if batch is not None:
            spec["batch_dim"] = 0 if t.dim() >= 1 and t.shape[0] == batch else None
        specs.append(spec)
    return specs


def _compile_call(artifact: Artifact, compile_mode: str, loaded: str) -> str:
    """``torch.compile`` as measured: with Inductor's freezing and static shapes for a PT2E graph."""
    if artifact.inductor_freezing:
        return f'torch.compile({loaded}, mode="{compile_mode}", dynamic=False)'
    return f'torch.compile({loaded}, mode="{compile_mode}")'


def _load_line(artifact: Artifact, compile_mode: str | None, threads: int | None = None) -> str:
    if artifact.format == ONNX:  # the session options the latency was measured with
        return (
            "import onnxruntime; options = onnxruntime.SessionOptions(); "
            f"options.intra_op_num_threads = {threads or 0}; options.inter_op_num_threads = 1; "
            'options.add_session_config_entry("session.intra_op.allow_spinning", "0"); '
            f'session = onnxruntime.InferenceSession("{artifact.file}", options, providers=["CPUExecutionProvider"])'
        )
    freezing = compile_mode is not None and artifact.inductor_freezing
    imports = ", ".join(["torch", *(["torch._inductor.config"] if freezing else []), *artifact.requires])
    loaded = (
        f'torch.export.load("{artifact.file}").module()'
        if artifact.format == TORCH_EXPORT
        else f'torch.jit.load("{artifact.file}")'
    )
    if compile_mode is not None:
        loaded = _compile_call(artifact, compile_mode, loaded)
    settings = "torch._inductor.config.freezing = True; " if freezing else ""
    return f"import {imports}; {settings}model = {loaded}"


def _serve_notes(config: Config, artifact: Artifact, compile_mode: str | None) -> list[str]:
    """What serving the artifact as measured takes beyond its load line."""
    notes = []
    if artifact.inductor_freezing:
        notes.append(
            "compiled with static shapes: each new input shape compiles once, and Dynamo stops compiling after "
            "torch._dynamo.config.recompile_limit shapes (8 by default; pareto allowed 64 while measuring): raise "
            "it for a server that sees many batch sizes"
        )
    if compile_mode is not None and artifact.format == TORCHSCRIPT:
        notes.append("torch.compile takes the TorchScript module but captures no graph from it; it runs as TorchScript")
    if any(t.name == "cuda_graphs" for t in config.techniques):
        notes.append(
            "measured with CUDA graphs: record the loaded model's forward once per batch shape with "
            "torch.cuda.graph (after a few warm-up calls on a side stream), then per request copy the input into "
            "the graph's static input, replay, and clone the output; the latency includes that copy and clone"
        )
    if compile_mode in {"reduce-overhead", "max-autotune"} and config.techniques:
        notes.append(
            "a cudagraph mode on CUDA: call torch.compiler.cudagraph_mark_step_begin() before each request and "
            "clone the outputs you keep (the next replay overwrites them), as measured"
        )
    return notes


def build_manifest(
    selection: Selection,
    config: Config,
    artifact: Artifact,
    *,
    files: dict[str, dict[str, Any]],
    device: str,
    here: dict[str, Any],
    differences: list[dict[str, Any]],
    inputs: tuple[Any, ...],
    outputs: Any,
    check: dict[str, Any],
) -> dict[str, Any]:
    """The ``manifest.json`` of an export: what it holds, how to load and serve it, and what the check found."""
    candidate = selection.candidate
    compile_mode = next(
        (str(t.params().get("mode", "default")) for t in config.techniques if t.name == "compile"),
        "default" if config.backend == "compile" else None,
    )
    return {
        "manifest_version": MANIFEST_VERSION,
        "pareto_version": __version__,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "study": selection.study,
        "task": selection.task,
        "trial": selection.trial,
        "chosen_by": selection.chosen_by,
        "config": candidate.config,
        "description": candidate.description,
        "techniques": [technique_entry(t, device) for t in config.techniques],
        "metrics": candidate.metrics,
        "metrics_note": "measured when the trial ran, not by this export; metrics.method says how",
        "confirmation": candidate.confirmation,
        "measured_environment": candidate.environment,
        "export_environment": here,
        "environment_differs": bool(differences),
        "environment_differences": differences,
        "artifact": _artifact_entry(artifact, config, candidate, compile_mode, here, device, check),
        "serve": _serve_entry(artifact, config, candidate, compile_mode),
        "inputs": _spec(inputs, config.batch_size if check["other_batch"]["matches"] else None),
        "outputs": _spec(outputs),
        "reload_check": check,
        "files": files,
        "files_note": "SHA-256 of every file this export wrote beside this manifest",
    }


def technique_entry(technique: Technique, device: str) -> dict[str, Any]:
    """The manifest's line for one technique: what it is and, from its class, what it becomes in the artifact."""
    note = technique.artifact_note
    return {
        "name": technique.name,
        "family": technique.family,
        "params": technique.params(),
        "backend": technique.backend(device),
        "in_the_artifact": note if note is not None else UNNOTED,
    }


def _artifact_entry(
    artifact: Artifact,
    config: Config,
    candidate: Candidate,
    compile_mode: str | None,
    here: dict[str, Any],
    device: str,
    check: dict[str, Any],
) -> dict[str, Any]:
    """The manifest's ``artifact``: the file, how to load it, what it needs, at which batch sizes it runs."""
    other = check["other_batch"]
    if other["matches"]:
        batch_note = f"runs at other batch sizes too (checked at batch {other['batch_size']})"
    elif other["runs"]:
        batch_note = (
            f"at batch {other['batch_size']} it runs but its outputs differ from the model's: "
            f"serve it at batch {config.batch_size}"
        )
    else:
        batch_note = f"runs at batch {config.batch_size} only (batch {other['batch_size']} failed: {other['error']})"
    return {
        "file": artifact.file,
        "format": artifact.format,
        "why": artifact.why,
        "load": _load_line(artifact, compile_mode, candidate.environment.get("threads")),
        "load_note": (
            "run from this folder (the path is relative), then: "
            + (
                "y = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)})"
                if artifact.format == ONNX
                else "with torch.inference_mode(): y = model(x)"
            )
        ),
        "requires": [*artifact.requires] if artifact.format == ONNX else ["torch", *artifact.requires],
        "torch_version": here["torch_version"],
        "device": device,
        "dynamic_batch": other["matches"],
        "batch_note": batch_note,
    }


def _serve_entry(artifact: Artifact, config: Config, candidate: Candidate, compile_mode: str | None) -> dict[str, Any]:
    """The manifest's ``serve``: the batch size, threads, backend and compile call the latency was measured with."""
    return {
        "batch_size": config.batch_size,
        "batch_note": "the stored latency was measured at this batch size only",
        "threads": candidate.environment.get("threads"),
        "threads_note": (
            "the stored latency was measured with SessionOptions.intra_op_num_threads = threads, "
            "inter_op_num_threads = 1 and idle spinning off (session.intra_op.allow_spinning = 0)"
            if artifact.format == ONNX
            else "the stored latency was measured with torch.set_num_threads(threads) on this device"
        ),
        "backend": config.backend,
        "torch_compile": (
            {
                "mode": compile_mode,
                "call": f"model = {_compile_call(artifact, compile_mode, 'model')}",
                "inductor_config": {"freezing": True} if artifact.inductor_freezing else {},
            }
            if compile_mode is not None
            else None
        ),
        "notes": _serve_notes(config, artifact, compile_mode),
        **_at_rate(candidate.metrics),
    }


def _at_rate(m: dict[str, Any]) -> dict[str, Any]:
    """A configuration of a study at a request rate: the serving settings its capacity was found with
    (the batcher, the model instances taking its batches concurrently, the intra-op threads of each) and
    that capacity, load-run or simulated; nothing otherwise."""
    if m.get("scenario") is None:
        return {}
    capacity, source = served_capacity(m)
    load = m.get("load_capacity_qps") is not None
    return {
        "traffic": {
            "qps": m.get("qps"),
            "max_batch": m.get("load_capacity_max_batch") if load else m.get("capacity_max_batch"),
            "max_wait_ms": m.get("load_capacity_max_wait_ms") if load else m.get("capacity_max_wait_ms"),
            "instances": (m.get("load_capacity_instances") if load else None) or m.get("serve_instances") or 1,
            "intra_op_threads": (m.get("load_capacity_threads") if load else None) or m.get("serve_threads"),
            "capacity_qps": capacity,
            "capacity_source": source,
            "note": "serve behind a dynamic batcher with these settings: the capacity is the highest Poisson "
            "rate whose request P99 bound stayed within the study's SLO with them",
        }
    }
