"""Export a stored trial's compressed model in a format a serving stack loads without pareto.

The trial's configuration is read from the database (only read), applied to the study's task as the
measurement applied it (``pareto.compress.apply``, the call ``pareto.assess.build`` makes, on the
measured device when this machine has it, else the CPU), serialized, loaded back in a fresh Python
process that imports torch and no pareto module, and run on the task's example input at the measured
batch size; its outputs must match the compressed model's (``torch.testing.assert_close``). Only then
are the artifact and ``manifest.json`` moved into the output folder.

What each technique becomes in the artifact (``TECHNIQUE_NOTES`` has one line per technique):

====================  ==========================  ============================================================
technique             artifact                    why
====================  ==========================  ============================================================
baseline, batch size  ``model.pt2``               torch.export's ExportedProgram: the forward as an ATen graph
                      (torch.export)              with its weights; ``torch.export.load`` reads it in plain
                                                  torch. The batch dimension is exported dynamic where
                                                  torch.export allows; the manifest keeps the measured batch
                                                  size (the stored latency holds at that batch only)
prune_structured      ``model.pt2``               smaller plain layers; no masks or hooks remain
prune_unstructured    ``model.pt2``               dense weights holding exact zeros, run at dense speed (as
                                                  measured); no sparse format is implied
lowrank               ``model.pt2``               each factorized Linear is two thin Linears
distill               ``model.pt2``               the trained student, a plain ``nn.Sequential``
finetune              ``model.pt2``               the fine-tuned weights in the same layers
fp16, bf16            ``model.pt2``               half-precision weights; the graph casts float inputs to the
                                                  half dtype and the outputs back to float32, as measured
int8_dynamic          ``model.torchscript.pt``    torch.export cannot trace torch.ao's eager int8 Linear (its
(torch.ao backend,    (``torch.jit.trace``)       packed weights are a TorchScript object); TorchScript keeps
without torchao)                                  ``quantized::linear_dynamic`` and loads with
                                                  ``torch.jit.load`` or libtorch's ``torch::jit::load``
int8_dynamic          ``model.pt2``, tried first  torchao's weights are tensor subclasses torch.export traces;
(torchao),                                        the load line imports torchao first. Not run in the tests
int8_weight_only,                                 (torchao is not installed there); without torchao the
int4_weight_only, fp8                             export is refused with the technique's reason
prune_2_4             ``model.pt2``, tried first  needs CUDA compute capability 8.0+ to be rebuilt at all;
                                                  elsewhere the export is refused with that reason. Not run
                                                  in the tests (no such GPU there)
compile               the eager module's          compiled kernels are made at run time on the machine that
(and the compile      ``model.pt2`` (or .ts)      runs them: the manifest's load line wraps the loaded module
backend)                                          in ``torch.compile(..., mode=...)`` with the measured mode
                                                  (the compile backend: mode "default")
cuda_graphs           the eager module's          a CUDA graph is recorded on the GPU that replays it: the
                      ``model.pt2``               manifest says the latency was measured with graphs, one
                                                  per batch shape, recorded with ``torch.cuda.graph``
int8_static           ``model.pt2``               the converted PT2E graph (int8 weights, quantize/dequantize
(compile backend)                                 operators) as torch.export holds it; the load line imports
                                                  torchao (which registers those operators), sets Inductor's
                                                  ``freezing`` and compiles with static shapes, as measured
the onnxruntime       ``model.onnx``              the ONNX graph ONNX Runtime measured, byte for byte (after
backend,                                          ``ort_int8_dynamic``, with its int8 weights); the load line
ort_int8_dynamic                                  opens an ``onnxruntime.InferenceSession`` on the CPU
                                                  execution provider; no torch is needed to serve it
====================  ==========================  ============================================================

A model torch.export cannot trace (data-dependent Python in a user's model, say) falls back to
``torch.jit.trace``, and the manifest keeps torch.export's error. When both fail, a technique cannot
run on this machine, or the reloaded outputs differ, nothing is written and the error says why in
one sentence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.errors import ParetoError, TechniqueError, UsageError, exception_line

if TYPE_CHECKING:
    from torch import nn

    from pareto.compress import Config
    from pareto.frontier import Candidate
    from pareto.task import Task

MANIFEST = "manifest.json"
#: Bumped when a manifest field changes meaning.
MANIFEST_VERSION = 1
TORCH_EXPORT = "torch.export"
TORCHSCRIPT = "torchscript"
ONNX = "onnx"
ARTIFACT_NAMES = {TORCH_EXPORT: "model.pt2", TORCHSCRIPT: "model.torchscript.pt", ONNX: "model.onnx"}
#: What differs between the measuring and the exporting environment that can change latency.
ENVIRONMENT_FIELDS = ("device", "device_name", "driver", "cpu_model", "torch_version", "threads")
#: Seconds the fresh process may take to import torch, load the artifact and run it.
CHECK_TIMEOUT_S = 900

#: What each built-in technique becomes in the artifact (tests check that every registered one has a line).
TECHNIQUE_NOTES: dict[str, str] = {
    "distill": "the trained student (a plain nn.Sequential); the teacher is not in the artifact",
    "prune_structured": "smaller layers with the removed units, channels and heads gone; no masks",
    "prune_unstructured": "dense weights holding exact zeros; dense kernels run them at dense speed, as measured",
    "prune_2_4": "2:4 semi-structured sparse weights, as torch.export (else torch.jit.trace) holds them; CUDA sm80+",
    "lowrank": "each factorized Linear as two thin Linears (W ≈ U·V)",
    "finetune": "the fine-tuned weights in the same layers",
    "bf16": "weights in bfloat16; the graph casts float inputs to bfloat16 and its outputs back to float32",
    "fp16": "weights in float16; the graph casts float inputs to float16 and its outputs back to float32",
    "int4_weight_only": "torchao int4 weight tensors traced into torchao's operators; loading needs torchao and CUDA",
    "int8_dynamic": (
        "torch.ao backend: quantized::linear_dynamic with packed int8 weights (TorchScript); "
        "torchao backend: torchao's int8 operators (loading needs torchao)"
    ),
    "int8_weight_only": "torchao int8 weight tensors traced into torchao's operators; loading needs torchao",
    "fp8": "torchao float8 weight tensors (per-row scales) in torchao's operators; loading needs torchao and CUDA",
    "compile": "not in the graph: the artifact holds the eager module; the load line calls torch.compile with the mode",
    "cuda_graphs": (
        "not in the graph: the artifact holds the eager module; CUDA graphs are recorded where the model is served "
        "(torch.cuda.graph per batch shape, replayed per call, as measured)"
    ),
    "int8_static": (
        "the PT2E graph: int8 weights with quantize/dequantize operators (loading imports the library that "
        "registers them: torchao, or torch.ao.quantization on older torch); the load line compiles it with "
        "Inductor's freezing, which makes them oneDNN int8 kernels"
    ),
    "ort_int8_dynamic": "the ONNX graph with int8 weights (DynamicQuantizeLinear, MatMulInteger), as ORT ran it",
    "ort_int8_static": "the ONNX graph with QuantizeLinear/DequantizeLinear pairs and calibrated scales, as ORT ran it",
}

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


@dataclass
class ExportResult:
    """What ``export`` wrote: the artifact, its format, the reload check, the manifest, and warnings."""

    directory: Path
    artifact: Path
    format: str
    max_abs_diff: float
    manifest_path: Path
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def select_trial(
    *,
    study: str | None,
    trial: int | None,
    best: bool,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    environment: str | None = None,
    db: str | None = None,
) -> Selection:
    """The measurement to export: trial ``trial``'s, or the pick of ``pareto best`` under the SLOs.

    Reads only; imports no torch.

    Raises:
        UsageError: neither or both of ``trial`` and ``best``, SLO options without ``best``,
            ``environment="all"``, an environment the trial was not measured in.
        NotFound: unknown study or trial number.
        NoFeasibleConfiguration: with ``best``, nothing meets the SLOs (the message names the closest).
    """
    from pareto.store import queries
    from pareto.store.engine import open_engine, require_schema, resolve_url, session_scope

    if (trial is None) == (not best):
        raise UsageError("Name what to export with exactly one of --trial N and --best.")
    if not best and any(v is not None for v in (slo_p99, min_accuracy, max_memory)):
        raise UsageError(
            "--slo-p99, --min-accuracy and --max-memory choose the trial with --best; with --trial drop them."
        )
    if environment == "all":
        raise UsageError("An export rebuilds one measurement; name its environment with --environment KEY.")
    chosen_by: dict[str, Any] = {"by": "trial"}
    env_key: str | None = None
    if best:
        from pareto.api import best as pick_best

        pick = pick_best(
            study=study,
            slo_p99=slo_p99,
            min_accuracy=min_accuracy,
            max_memory=max_memory,
            environment=environment,
            db=db,
        )
        study, trial, env_key = pick["study"], pick["trial"], pick["environment"]["key"]
        given = {"slo_p99": slo_p99, "min_accuracy": min_accuracy, "max_memory": max_memory}
        chosen_by = {"by": "best", "given": given, "slo": pick["slo"], "confirmation": pick["confirmation"]}
    assert trial is not None
    engine = open_engine(resolve_url(db), create=False)
    require_schema(engine)
    with session_scope(engine) as session:
        row = queries.get_study(session, study) if study else queries.default_study(session)
        _, found = queries.trial_measurements(session, row, trial)
        if env_key is None and environment is not None:
            env = queries.choose_environment(session, row, environment)
            env_key = env.key if env is not None else None
        chosen = [c for c in found if env_key is None or c.environment["key"] == env_key]
        if not chosen:
            where = ", ".join(c.environment["key"] for c in found) or "none"
            raise UsageError(
                f"Trial {trial} of study {row.name!r} has no measurement in environment {env_key}; "
                f"it was measured in: {where}."
            )
        return Selection(row.name, row.task, trial, chosen[0], chosen_by)


def export(
    *,
    out_dir: str | os.PathLike[str],
    study: str | None = None,
    trial: int | None = None,
    best: bool = False,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    force: bool = False,
    environment: str | None = None,
    db: str | None = None,
    fresh_process: bool = True,
) -> ExportResult:
    """Rebuild a stored trial's compressed model, write it with ``manifest.json`` to ``out_dir``, check it.

    Args:
        out_dir: The folder to write; it must be empty or absent unless ``force``.
        study: Study name; may be omitted when the database holds one study.
        trial: The trial number to export; or ``best`` to export the pick under the SLOs.
        slo_p99, min_accuracy, max_memory: With ``best``: the SLOs (default: the study's).
        force: Write into a non-empty folder, replacing the files an earlier export there listed.
        environment: Which environment's measurement (a key or unique prefix; default the latest).
        db: Database URL; defaults to ``PARETO_DB_URL`` or ``sqlite:///pareto.db``.
        fresh_process: Load the artifact back in a new Python process that imports no pareto (the
            command always does); False loads it in this process, a few seconds faster, without
            proving that it loads without pareto. The manifest says which.

    Raises:
        UsageError: bad or conflicting arguments, an output folder that is not empty or not writable, a
            technique that cannot run on this machine (its reason given).
        NotFound: unknown study or trial.
        NoFeasibleConfiguration: with ``best``, nothing meets the SLOs.
        ParetoError: a technique broke on the model, no format can hold the model, or the reloaded
            artifact's outputs differ from the compressed model's; nothing is left in ``out_dir``.
    """
    selection = select_trial(
        study=study,
        trial=trial,
        best=best,
        slo_p99=slo_p99,
        min_accuracy=min_accuracy,
        max_memory=max_memory,
        environment=environment,
        db=db,
    )
    target = Path(out_dir).expanduser().absolute()
    created = _open_target(target, force)
    done = False
    staging = Path(tempfile.mkdtemp(prefix=".pareto-export-", dir=target))
    try:
        result = _export(selection, target, staging, fresh_process)
        done = True
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not done and created and not any(target.iterdir()):
            target.rmdir()


def _export(selection: Selection, target: Path, staging: Path, fresh_process: bool) -> ExportResult:
    import torch

    from pareto.compress import Config
    from pareto.devices import device_here, on_device
    from pareto.measure.environment import environment_key, fingerprint
    from pareto.task import load_task

    candidate = selection.candidate
    config = Config.from_dict(candidate.config)
    device = device_here(str(candidate.environment["device"]))
    task = on_device(load_task(selection.task), device)  # the check's inputs on the device the model is built on
    model = _build(selection, task, config, device)
    artifact = _serialize(selection, model, task, config.batch_size, device, staging)
    check, args, expected = _check(selection, config, task, model, artifact, device, staging, fresh_process)
    here = fingerprint(device, torch.get_num_threads())
    here = {**here, "key": environment_key(here)}
    differences = environment_differences(
        candidate.environment, here, onnxruntime=config.backend == "onnxruntime", torchao="torchao" in artifact.requires
    )
    written = staging / artifact.file
    manifest = _manifest(
        selection,
        config,
        artifact,
        files={artifact.file: {"sha256": sha256(written), "bytes": written.stat().st_size}},
        device=device,
        here=here,
        differences=differences,
        inputs=args,
        outputs=expected,
        check=check,
    )
    notes = []
    if differences:
        parts = "; ".join(
            f"{d['field']} {d['measured'] or 'none'} then, {d['here'] or 'none'} now" for d in differences
        )
        notes.append(
            f"Warning: trial {selection.trial} was measured in another environment than this export runs in "
            f"({parts}), so its stored latency may not hold here."
        )
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    _install(staging, target, [artifact.file, MANIFEST])
    return ExportResult(
        directory=target,
        artifact=target / artifact.file,
        format=artifact.format,
        max_abs_diff=check["max_abs_diff"],
        manifest_path=target / MANIFEST,
        manifest=manifest,
        warnings=notes,
    )


def _other_batch(
    task: Task, model: nn.Module, artifact: Artifact, batch: int
) -> tuple[tuple[Any, ...] | None, Any, str | None]:
    """The arguments of another batch size, the compressed model's outputs on them, or why it fails there.

    The eager module runs, so that a compiled one does not recompile for this shape, unless the artifact
    is checked compiled (a PT2E graph, whose eager run is the float reference of its int8 kernels).
    """
    import torch

    from pareto.devices import as_args

    reference = model if artifact.inductor_freezing else getattr(model, "_orig_mod", model)
    try:
        args = as_args(task.example_input(batch))
        with torch.inference_mode():
            return args, reference(*args), None
    except Exception as exc:  # the task or model takes one batch size only: the check says so
        return None, None, f"the compressed model itself fails on it ({exception_line(exc)})"


def _check(
    selection: Selection,
    config: Config,
    task: Task,
    model: nn.Module,
    artifact: Artifact,
    device: str,
    staging: Path,
    fresh_process: bool,
) -> tuple[dict[str, Any], tuple[Any, ...], Any]:
    """Load the artifact back, run it on the measured batch and one other, compare with the compressed model.

    Returns:
        The manifest's ``reload_check``, the measured batch's arguments, and the compressed model's outputs.

    Raises:
        ParetoError: the artifact fails on the measured batch, or its outputs differ beyond the tolerance.
    """
    import torch

    from pareto.devices import as_args

    args = as_args(task.example_input(config.batch_size))
    with torch.inference_mode():
        expected = _clone(model(*args))  # cloned: a CUDA-graph compiled model reuses its output buffers
    other_batch = 1 if config.batch_size != 1 else 2
    other_args, other_expected, other_error = _other_batch(task, model, artifact, other_batch)
    batches = [args] if other_args is None else [args, other_args]
    loaded = _run_fresh(artifact, staging, batches) if fresh_process else _run_here(artifact, staging, batches)
    where = (
        f"in a fresh Python process that imported torch {loaded['torch']} and no pareto module"
        if fresh_process
        else "in the exporting process"
    )
    actual = loaded["outputs"][0]
    if actual is None:
        raise ParetoError(
            f"The exported artifact of trial {selection.trial} fails on example_input({config.batch_size}) "
            f"{where}, so nothing was exported: {loaded['errors'][0]}."
        )
    rtol, atol, basis = _tolerance(model, config)
    diff = max_abs_diff(actual, expected)
    if not _close(actual, expected, rtol, atol):
        raise ParetoError(
            f"The reloaded artifact's outputs differ from the compressed model's (max abs difference {diff:.3g}, "
            f"beyond rtol {rtol:g} and atol {atol:g}), so trial {selection.trial} was not exported."
        )
    other = loaded["outputs"][1] if len(batches) > 1 else None
    check = {
        "method": (
            f"loaded with {_LOADERS[artifact.format]} {where}"
            + (
                ", compiled with Inductor's freezing and static shapes as the load line says"
                if artifact.inductor_freezing
                else ""
            )
            + f", run under torch.inference_mode on "
            f"example_input({config.batch_size}) (the measured batch), compared with the compressed model's "
            f"outputs by torch.testing.assert_close(rtol={rtol:g}, atol={atol:g}) ({basis})"
        ),
        "fresh_process": fresh_process,
        "batch_size": config.batch_size,
        "max_abs_diff": diff,
        "rtol": rtol,
        "atol": atol,
        "passed": True,
        "pareto_imported": loaded["pareto_imported"],
        "other_batch": {
            "batch_size": other_batch,
            "runs": other is not None,
            "matches": other is not None and _close(other, other_expected, rtol, atol),
            "error": other_error or (loaded["errors"][1] if len(batches) > 1 else None),
        },
    }
    return check, args, expected


# --- the output folder ------------------------------------------------------------------------------


def _open_target(target: Path, force: bool) -> bool:
    """Make sure ``target`` is a writable folder an export may fill; return whether it was created here.

    Raises:
        UsageError: a file, a non-empty folder without ``force``, or a folder that cannot be created or written.
    """
    if target.exists() and not target.is_dir():
        raise UsageError(f"Output {target} is a file, not a folder; choose a folder with -o.")
    created = False
    if target.is_dir():
        if not force and any(target.iterdir()):
            raise UsageError(
                f"Output folder {target} is not empty; choose an empty folder, or pass --force to write over "
                "an earlier export there."
            )
    else:
        try:
            target.mkdir(parents=True)
        except OSError as exc:
            raise UsageError(f"Cannot create output folder {target}: {exc.strerror or exc}.") from exc
        created = True
    try:
        handle, probe = tempfile.mkstemp(prefix=".pareto-write-test-", dir=target)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        if created:
            target.rmdir()
        raise UsageError(f"Cannot write in output folder {target}: {exc.strerror or exc}.") from exc
    return created


def _install(staging: Path, target: Path, names: list[str]) -> None:
    """Move the checked files into ``target``, first removing the files an earlier export there listed."""
    old = target / MANIFEST
    if old.is_file():
        try:
            listed = json.loads(old.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            listed = {}
        for name in listed if isinstance(listed, dict) else ():
            path = target / str(name)
            if path.parent == target and path.is_file() and name not in names:
                path.unlink()
    for name in names:
        os.replace(staging / name, target / name)


# --- rebuilding the measured model ------------------------------------------------------------------


def _build(selection: Selection, task: Task, config: Config, device: str) -> nn.Module:
    """The compressed model, built as the measurement built it (``pareto.assess.build``'s call)."""
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


# --- serialization ----------------------------------------------------------------------------------


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


def _serialize(
    selection: Selection, model: nn.Module, task: Task, batch_size: int, device: str, folder: Path
) -> Artifact:
    """Write ``model`` with torch.export, else TorchScript; torch.ao int8 models go to TorchScript directly.

    Raises:
        ParetoError: neither format can hold the model.
    """
    from pareto.devices import as_args

    onnx_bytes = getattr(model, "onnx_bytes", None)  # served by ONNX Runtime: its graph is the artifact
    if isinstance(onnx_bytes, bytes):
        (folder / ARTIFACT_NAMES[ONNX]).write_bytes(onnx_bytes)
        return Artifact(ONNX, ARTIFACT_NAMES[ONNX], ["onnxruntime"], _WHY[ONNX], None)
    eager = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the compile is a run-time step
    requires = _requires(eager)
    if _has_torch_ao_quantized(eager):
        return _torchscript(eager, as_args(task.example_input(batch_size)), folder, requires, _INT8_EAGER)
    freezing = bool(getattr(eager, "pareto_inductor_freezing", False))  # a PT2E graph, compiled as measured
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


def _requires(model: nn.Module) -> list[str]:
    """Modules beside torch that loading the artifact imports: torchao when its tensor subclasses are in the
    model; what a technique names (``pareto_requires``: the library that registers a PT2E graph's operators)."""
    tensors = [*model.parameters(), *model.buffers()]
    named = list(getattr(model, "pareto_requires", ()))
    subclasses = ["torchao"] if any(type(t).__module__.startswith("torchao") for t in tensors) else []
    return list(dict.fromkeys([*named, *subclasses]))


# --- the reload check -------------------------------------------------------------------------------

_LOADERS = {
    TORCH_EXPORT: "torch.export.load(path).module()",
    TORCHSCRIPT: "torch.jit.load(path)",
    ONNX: "onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])",
}

#: Runs in a fresh interpreter: imports torch (and what the artifact requires), never pareto.
_CHILD = r"""
import importlib, json, sys
import torch
artifact, fmt, requires, frozen, out, *inputs = sys.argv[1:]
for name in json.loads(requires):
    importlib.import_module(name)
if fmt == "onnx":
    import onnxruntime
    session = onnxruntime.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    def model(*args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), tensors)}
        outs = [torch.from_numpy(o) for o in session.run(None, feed)]
        return outs[0] if len(outs) == 1 else tuple(outs)
elif fmt == "torch.export":
    model = torch.export.load(artifact).module()
else:
    model = torch.jit.load(artifact)
if frozen == "1":  # compiled as its load line says, as it was measured
    import torch._inductor.config
    torch._inductor.config.freezing = True
    model = torch.compile(model, dynamic=False)
results, errors = [], []
for path in inputs:
    args = torch.load(path, weights_only=True)
    try:
        with torch.inference_mode():
            results.append(model(*args))
        errors.append(None)
    except Exception as exc:
        text = str(exc).strip()
        results.append(None)
        errors.append(type(exc).__name__ + ": " + (text.splitlines()[0] if text else "no message"))
torch.save(results, out)
loaded = sorted(n for n in sys.modules if n == "pareto" or n.startswith("pareto."))
print(json.dumps({"errors": errors, "pareto_imported": loaded, "torch": torch.__version__}))
"""


def _run_fresh(artifact: Artifact, folder: Path, batches: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Load the artifact in a new Python process without pareto, run it on each batch, return its outputs.

    Raises:
        ParetoError: the process cannot load the artifact, or it imported pareto.
    """
    import torch

    paths = []
    for i, args in enumerate(batches):
        path = folder / f"check-input-{i}.pt"
        torch.save(args, path)
        paths.append(str(path))
    out = folder / "check-output.pt"
    command = [sys.executable, "-c", _CHILD, str(folder / artifact.file), artifact.format]
    command += [json.dumps(artifact.requires), "1" if artifact.inductor_freezing else "0", str(out), *paths]
    try:
        proc = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ParetoError(
            f"Loading the exported artifact in a fresh Python process took over {CHECK_TIMEOUT_S} s, "
            "so nothing was exported."
        ) from exc
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        raise ParetoError(
            f"The exported artifact does not load in a fresh Python process, so nothing was exported: "
            f"{lines[-1].strip() if lines else f'exit code {proc.returncode}'}."
        )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["pareto_imported"]:
        raise ParetoError(
            f"Loading the artifact imported pareto ({', '.join(report['pareto_imported'])}); not exported."
        )
    report["outputs"] = torch.load(out, weights_only=True)
    return report


def _run_here(artifact: Artifact, folder: Path, batches: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Load the artifact in this process and run it on each batch (``_run_fresh``'s report, less the imports)."""
    import torch

    path = folder / artifact.file
    for name in artifact.requires:
        __import__(name)
    model: Any
    if artifact.format == ONNX:
        import onnx

        from pareto.compress.onnxrt import OrtModule

        model = OrtModule(onnx.load(str(path)), torch.nn.Identity())
    elif artifact.format == TORCH_EXPORT:
        model = torch.export.load(path).module()
    else:
        model = torch.jit.load(str(path))
    if artifact.inductor_freezing:  # compiled as its load line says, as it was measured
        from pareto.compress.compile import FrozenCompiled

        model = FrozenCompiled(model, "default")
    outputs: list[Any] = []
    errors: list[str | None] = []
    for args in batches:
        try:
            with torch.inference_mode():
                outputs.append(model(*args))
            errors.append(None)
        except Exception as exc:  # reported as the child process reports it
            outputs.append(None)
            errors.append(exception_line(exc))
    return {"outputs": outputs, "errors": errors, "pareto_imported": None, "torch": torch.__version__}


def _tolerance(model: nn.Module, config: Config) -> tuple[float, float, str]:
    """torch.testing's default rtol/atol for the model's lowest-precision floating dtype; looser with compile.

    torch.compile's kernels may order floating-point sums differently from the eager graph the
    artifact holds, so with ``compile`` (the technique or the backend) the relative tolerance is at
    least 1e-4.
    """
    import torch

    defaults = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
    eager = getattr(model, "_orig_mod", model)
    dtypes = {t.dtype for t in (*eager.parameters(), *eager.buffers()) if t.dtype in defaults} or {torch.float32}
    rtol, atol = max(defaults[d] for d in dtypes)
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
    basis = f"torch.testing's defaults for {names}"
    if config.backend == "compile" or any(t.name == "compile" for t in config.techniques):
        rtol, atol = max(rtol, 1e-4), max(atol, 1e-5)
        basis += "; rtol at least 1e-4 because the reference ran torch.compile's kernels"
    return rtol, atol, basis


def _tensors(value: Any) -> list[Any]:
    """The tensors in a model output (a tensor, or tuples, lists and dicts of them), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def max_abs_diff(actual: Any, expected: Any) -> float:
    """The largest absolute difference between two model outputs of the same structure (inf if it differs)."""
    a, b = _tensors(actual), _tensors(expected)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return float("inf")
    diffs = [
        (x.detach().cpu().double() - y.detach().cpu().double()).abs().max().item()
        for x, y in zip(a, b, strict=True)
        if x.numel()
    ]
    return max(diffs, default=0.0)


def _clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_clone(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


def _cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_cpu(v) for v in value]
    return value


def _close(actual: Any, expected: Any, rtol: float, atol: float) -> bool:
    import torch

    try:
        torch.testing.assert_close(_cpu(actual), _cpu(expected), rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError:
        return False
    return True


# --- the manifest -----------------------------------------------------------------------------------


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
    for t in _tensors(value):
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


def _manifest(
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
    import pareto

    candidate = selection.candidate
    compile_mode = next(
        (str(t.params().get("mode", "default")) for t in config.techniques if t.name == "compile"),
        "default" if config.backend == "compile" else None,
    )
    return {
        "manifest_version": MANIFEST_VERSION,
        "pareto_version": pareto.__version__,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "study": selection.study,
        "task": selection.task,
        "trial": selection.trial,
        "chosen_by": selection.chosen_by,
        "config": candidate.config,
        "description": candidate.description,
        "techniques": [
            {
                "name": t.name,
                "family": t.family,
                "params": t.params(),
                "backend": t.backend(device),
                "in_the_artifact": TECHNIQUE_NOTES.get(t.name, "applied by pareto before serialization"),
            }
            for t in config.techniques
        ],
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
    }


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
