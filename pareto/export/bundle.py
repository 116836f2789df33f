"""Export a stored trial's compressed model in a format a serving stack loads without pareto.

The trial's configuration is read from the database (only read), applied to the study's task as the
measurement applied it (``pareto.compress.apply``, the call ``pareto.study.assess.build`` makes, on the
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

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.api import best as pick_best
from pareto.errors import UsageError
from pareto.export.artifact import (
    ARTIFACT_NAMES,
    ONNX,
    TORCH_EXPORT,
    TORCHSCRIPT,
    Artifact,
    Selection,
    rebuild,
    serialize,
)
from pareto.export.check import CHECK_TIMEOUT_S, max_abs_diff, reload_check
from pareto.export.manifest import (
    ENVIRONMENT_FIELDS,
    MANIFEST,
    MANIFEST_VERSION,
    TECHNIQUE_NOTES,
    build_manifest,
    environment_differences,
)
from pareto.limits import Limits
from pareto.machine import environment_key
from pareto.measure.environment import fingerprint
from pareto.store.engine import open_engine, require_schema, resolve_url
from pareto.store.reads import reading
from pareto.task import load_task
from pareto.tasks.rows import file_digest

if TYPE_CHECKING:
    pass

__all__ = [
    "ARTIFACT_NAMES",
    "CHECK_TIMEOUT_S",
    "ENVIRONMENT_FIELDS",
    "MANIFEST",
    "MANIFEST_VERSION",
    "ONNX",
    "TECHNIQUE_NOTES",
    "TORCHSCRIPT",
    "TORCH_EXPORT",
    "Artifact",
    "ExportResult",
    "Selection",
    "environment_differences",
    "export",
    "max_abs_diff",
    "select_trial",
]


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


def select_trial(limits: Limits, /, *, trial: int | None, best: bool, db: str | None = None) -> Selection:
    """The measurement to export: trial ``trial``'s, or the pick of ``pareto best`` under the SLOs.

    Reads only; imports no torch.

    Raises:
        UsageError: neither or both of ``trial`` and ``best``, SLO options without ``best``,
            ``environment="all"``, an environment the trial was not measured in.
        NotFound: unknown study or trial number.
        NoFeasibleConfiguration: with ``best``, nothing meets the SLOs (the message names the closest).
    """
    if (trial is None) == (not best):
        raise UsageError("Name what to export with exactly one of --trial N and --best.")
    given = {
        "slo_p99": limits.slo_p99,
        "min_accuracy": limits.min_accuracy,
        "max_memory": limits.max_memory,
        **({"min_throughput": limits.min_throughput} if limits.min_throughput is not None else {}),
    }
    if not best and any(v is not None for v in given.values()):
        raise UsageError(
            "--slo-p99, --min-accuracy, --max-memory and --min-throughput choose the trial with --best; "
            "with --trial drop them."
        )
    if limits.environment == "all":
        raise UsageError("An export rebuilds one measurement; name its environment with --environment KEY.")
    chosen_by: dict[str, Any] = {"by": "trial"}
    env_key: str | None = None
    study, environment = limits.study, limits.environment
    if best:
        pick = pick_best(limits, db=db)
        study, trial, env_key = pick["study"], pick["trial"], pick["environment"]["key"]
        chosen_by = {"by": "best", "given": given, "slo": pick["slo"], "confirmation": pick["confirmation"]}
    assert trial is not None
    engine = open_engine(resolve_url(db), create=False)
    require_schema(engine)
    with reading(engine) as r:
        row = r.study(study)
        _, found = r.trial_measurements(row, trial)
        if env_key is None and environment is not None:
            env = r.choose_environment(row, environment)
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
    limits: Limits | None = None,
    /,
    *,
    out_dir: str | os.PathLike[str],
    trial: int | None = None,
    best: bool = False,
    force: bool = False,
    db: str | None = None,
    fresh_process: bool = True,
    **keywords: Any,
) -> ExportResult:
    """Rebuild a stored trial's compressed model, write it with ``manifest.json`` to ``out_dir``, check it.

    Args:
        out_dir: The folder to write; it must be empty or absent unless ``force``.
        limits: The study (may be omitted when the database holds one), the environment (a key or
            unique prefix; default the latest) and, with ``best``, the limits (default: the
            study's); or their fields as keywords (``study``, ``slo_p99``…).
        trial: The trial number to export; or ``best`` to export the pick under the limits.
        force: Write into a non-empty folder, replacing the files an earlier export there listed.
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
    selection = select_trial(Limits.of(limits, **keywords), trial=trial, best=best, db=db)
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

    candidate = selection.candidate
    config = Config.from_dict(candidate.config)
    device = device_here(str(candidate.environment["device"]))
    task = on_device(load_task(selection.task), device)  # the check's inputs on the device the model is built on
    served = rebuild(selection, task, config, device)
    model = served.module
    artifact = serialize(selection, served, task, config.batch_size, device, staging)
    check, args, expected = reload_check(selection, config, task, model, artifact, device, staging, fresh_process)
    here = fingerprint(device, torch.get_num_threads())
    here = {**here, "key": environment_key(here)}
    differences = environment_differences(
        candidate.environment, here, onnxruntime=config.backend == "onnxruntime", torchao="torchao" in artifact.requires
    )
    written = staging / artifact.file
    manifest = build_manifest(
        selection,
        config,
        artifact,
        files={artifact.file: {"sha256": file_digest(written), "bytes": written.stat().st_size}},
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
