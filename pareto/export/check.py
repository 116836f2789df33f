"""The reload check of an export: load the artifact back, run it, compare with the compressed model.

In a fresh Python process that imports torch and no pareto module (``pareto export`` always), or in
this process; on the measured batch size, which must match within torch.testing's tolerance, and on one
other, which the manifest says runs and matches or not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.errors import ParetoError, exception_line
from pareto.export.artifact import ONNX, TORCH_EXPORT, TORCHSCRIPT, Artifact

if TYPE_CHECKING:
    from torch import nn

    from pareto.compress import Config
    from pareto.export.artifact import Selection
    from pareto.task import Task

#: Seconds the fresh process may take to import torch, load the artifact and run it.
CHECK_TIMEOUT_S = 900

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


def tensors(value: Any) -> list[Any]:
    """The tensors in a model output (a tensor, or tuples, lists and dicts of them), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    return []


def max_abs_diff(actual: Any, expected: Any) -> float:
    """The largest absolute difference between two model outputs of the same structure (inf if it differs)."""
    a, b = tensors(actual), tensors(expected)
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


def graph_args(model: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments the artifact is called with: an ONNX file's graph takes its own inputs, in order (the
    task's ``input_ids`` and ``attention_mask`` and the zeros the model feeds as ``token_type_ids``)."""
    by_graph = getattr(model, "graph_args", None)
    return tuple(by_graph(args)) if callable(by_graph) else args


def served_output(model: nn.Module, outputs: Any) -> Any:
    """The artifact's output the model returns: a graph with several outputs read by name (an ONNX file's
    ``logits``) gives that one, as the model does."""
    index = getattr(model, "output_index", None)
    at = index() if callable(index) else None
    return outputs[at] if at is not None and isinstance(outputs, tuple | list) else outputs


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
            return graph_args(model, args), reference(*args), None
    except Exception as exc:  # the task or model takes one batch size only: the check says so
        return None, None, f"the compressed model itself fails on it ({exception_line(exc)})"


def reload_check(
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

    given = as_args(task.example_input(config.batch_size))
    with torch.inference_mode():
        expected = _clone(model(*given))  # cloned: a CUDA-graph compiled model reuses its output buffers
    args = graph_args(model, given)  # what the artifact is called with
    other_batch = 1 if config.batch_size != 1 else 2
    other_args, other_expected, other_error = _other_batch(task, model, artifact, other_batch)
    batches = [args] if other_args is None else [args, other_args]
    loaded = _run_fresh(artifact, staging, batches) if fresh_process else _run_here(artifact, staging, batches)
    where = (
        f"in a fresh Python process that imported torch {loaded['torch']} and no pareto module"
        if fresh_process
        else "in the exporting process"
    )
    actual = served_output(model, loaded["outputs"][0])
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
    other = served_output(model, loaded["outputs"][1]) if len(batches) > 1 else None
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
