"""Availability proven, not assumed: on a CUDA device a technique is available when a probe through its
real kernels ran there.

A capability number is not enough: PyTorch's CUTLASS 2:4 kernels refuse compute capability 9.0,
torchao's default int4 packing needs the MSLK package, a torchao release may not run on the torch
beside it. So before a technique is offered on a GPU, it is applied to a small MLP (widths of 256,
which every kernel's tiling takes) on that GPU and the result is run once; a failure is the reason it
is not available. A pair of techniques that each run alone may still fail together (torch.compile
cannot trace some torchao weights on some releases): ``pair_reason`` probes the pair the same way.

Results are cached per technique (or pair), GPU, driver, library versions, pareto's version and the
probe's own code, in memory and in ``$PARETO_CACHE_DIR/kernel-probes.json``, so a probe runs once per
machine and upgrade. A failure that says nothing lasting about the kernels (out of memory, a CUDA
error that is not a missing kernel; ``transient``) is the reason for that call only and is never
stored: the probe runs again next time. On the CPU the techniques' own checks decide, as they always have.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import marshal
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto._version import __version__
from pareto.errors import NoEffect, exception_line
from pareto.measure.environment import cuda_driver, distribution_version
from pareto.task import Task

if TYPE_CHECKING:
    from pareto.compress.base import Technique
    from pareto.task import Task

#: The probe model's width and batch: multiples of 256, so that every kernel's tiling takes them.
PROBE_WIDTH = 256
PROBE_BATCH = 16
CACHE_FILE = "kernel-probes.json"

#: Messages (lower case) of a CUDA error that says the kernels cannot run on this GPU with these
#: libraries: as lasting as the facts of the cache key, so such a failure is stored.
LASTING_CUDA_ERRORS = (
    "no kernel image is available",
    "invalid device function",
    "operation not supported",
    "cublas_status_not_supported",
    "cublas_status_arch_mismatch",
    "cusparse_status_not_supported",
    "cusparse_status_arch_mismatch",
    "cusparselt",
)
#: Messages (lower case) of a CUDA runtime error: not stored unless one of ``LASTING_CUDA_ERRORS``.
CUDA_ERRORS = (
    "cuda error",
    "cudaerror",
    "cublas_status",
    "cudnn_status",
    "cusparse_status",
    "device-side assert",
    "illegal memory access",
    "unspecified launch failure",
    "out of memory",
)

_memory: dict[str, str | None] = {}


def kernel_reason(technique: Technique, device: str) -> str | None:
    """None when ``technique`` is proven to run on ``device`` (always on a non-CUDA device); else why not."""
    return _probed((technique,), device)


def pair_reason(first: Technique, second: Technique, device: str) -> str | None:
    """None when ``first`` and ``second`` in one configuration are proven to run on ``device`` (always on a
    non-CUDA device); else why not. ``Compile()`` as ``second`` is also what the compile backend serves
    ``first`` with."""
    return _probed((first, second), device)


def _probed(techniques: tuple[Technique, ...], device: str) -> str | None:
    """The cached result of ``probe(techniques, device)``, probing when there is none; a ``transient``
    failure is returned, not cached."""
    if not device.startswith("cuda"):
        return None
    key = _key(techniques, device)
    if key in _memory:
        return _memory[key]
    stored = _read_cache()
    if key in stored:
        _memory[key] = stored[key]
        return stored[key]
    try:
        reason = probe(techniques, device)
    except Exception as exc:  # probe lets only transient failures through
        if not transient(exc):
            raise
        return _failed(techniques, device, exc)  # the reason for now; the probe runs again next time
    _memory[key] = reason
    _write_cache(key, reason)
    return reason


def transient(exc: BaseException) -> bool:
    """True when ``exc``, or an exception it was raised from, says nothing lasting about the kernels: out of
    memory (``torch.OutOfMemoryError``, which ``torch.cuda.OutOfMemoryError`` is, or ``MemoryError``) or a
    CUDA runtime error (``torch.AcceleratorError``, or a ``RuntimeError`` whose message has one of
    ``CUDA_ERRORS``), unless its message has one of ``LASTING_CUDA_ERRORS`` (a kernel missing for this GPU)."""
    import torch

    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        message = str(error).lower()
        if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
            return True
        runtime = isinstance(error, getattr(torch, "AcceleratorError", ())) or (
            isinstance(error, RuntimeError) and any(m in message for m in CUDA_ERRORS)
        )
        if runtime:
            return not any(m in message for m in LASTING_CUDA_ERRORS)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return False


def probe(techniques: Technique | tuple[Technique, ...], device: str) -> str | None:
    """Apply ``techniques`` (one, or several in one configuration) to the probe MLP on ``device`` and run
    it once; None when it ran and its output has the right shape and finite values, else one sentence on
    what failed.

    Raises:
        Exception: a ``transient`` failure (out of memory, a CUDA runtime error), which is not a reason
            to keep.
    """
    import torch

    from pareto.compress.pipeline import Config, apply
    from pareto.devices import as_args, on_device

    chosen = techniques if isinstance(techniques, tuple) else (techniques,)
    task = on_device(probe_task(), device)  # the probe's data where its model is, as a bench's
    backends = [b for b in chosen[0].backends if all(b in t.backends for t in chosen)]
    try:
        backend = "eager" if "eager" in backends or not backends else backends[0]
        config = Config(techniques=chosen, batch_size=PROBE_BATCH, backend=backend)
        model = apply(task.model, config, task, device=device).module
        with torch.inference_mode():
            out = model(*as_args(task.example_input(PROBE_BATCH)))
        finite = out.is_meta or bool(torch.isfinite(out.float()).all())  # a meta tensor has no values to check
        if out.shape != (PROBE_BATCH, PROBE_WIDTH) or not finite:
            shape = tuple(out.shape)
            return f"{_a_probe(chosen)} on {device} gave a wrong output ({shape}, or not finite)."
    except NoEffect:  # nothing for it to do on the probe's MLP (ORT's fusions): its kernels are not in question
        return None
    except Exception as exc:  # the kernel, the library or the driver refused: that is the reason
        if transient(exc):
            raise
        return _failed(chosen, device, exc)
    finally:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return None


def _failed(techniques: tuple[Technique, ...], device: str, exc: BaseException) -> str:
    """The one sentence a failed probe of ``techniques`` gives."""
    return f"{_a_probe(techniques)} failed on {device}: {exception_line(exc)}."


def _a_probe(techniques: tuple[Technique, ...]) -> str:
    """``a probe through its kernels`` for one technique (the sentence is about it), ``a probe of fp8 with
    compile(mode=default) through their kernels`` for several."""
    if len(techniques) == 1:
        return "a probe through its kernels"
    return f"a probe of {' with '.join(t.describe() for t in techniques)} through their kernels"


def probe_task() -> Task:
    """The probe: a 3-layer MLP of width ``PROBE_WIDTH`` (fixed weights), inputs, and unlabelled training batches."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        w = PROBE_WIDTH
        model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w)).eval()
    x = torch.randn(4 * PROBE_BATCH, w, generator=generator)
    return Task(
        name="kernel-probe",
        model=model,
        example_input=lambda batch_size: x[torch.arange(batch_size) % len(x)],
        evaluate=lambda _: 1.0,
        train_data=[(x[i : i + PROBE_BATCH], None) for i in range(0, len(x), PROBE_BATCH)],
        batch_size=PROBE_BATCH,
    )


#: The functions whose code decides a probe's result (held here, so that a patched module attribute
#: does not change the key).
_PROBE_CODE: tuple[Callable[..., Any], ...] = (probe, probe_task, transient)


@functools.cache
def probe_code() -> str:
    """A digest of the probe's own code (``probe``, ``probe_task``, ``transient`` and the probe's sizes):
    a changed probe does not read the results of the old one. From the source where Python has it, else
    from the compiled code."""
    digest = hashlib.sha256(f"{PROBE_WIDTH} {PROBE_BATCH}".encode())
    for function in _PROBE_CODE:
        try:
            digest.update(inspect.getsource(function).encode())
        except (OSError, TypeError):  # no source shipped: the bytecode stands for it
            digest.update(marshal.dumps(function.__code__))
    return digest.hexdigest()[:16]


@functools.cache
def technique_code(cls: type[Technique]) -> str:
    """A digest of a technique's class and of the pipeline that applies it: a fixed technique (or pipeline)
    does not read the failure its old code left in the cache."""
    from pareto.compress import pipeline

    digest = hashlib.sha256()
    for code in (cls, pipeline.apply):
        try:
            digest.update(inspect.getsource(code).encode())
        except (OSError, TypeError):  # no source shipped: its name stands for it (pareto's version is in the key)
            digest.update(f"{code.__module__}.{code.__qualname__}".encode())
    return digest.hexdigest()[:16]


def _key(techniques: tuple[Technique, ...], device: str) -> str:
    """What a probe's result depends on: the techniques and their parameters, the GPU, the driver, the
    libraries, pareto's version and the probe's code."""
    import importlib.util

    import torch

    index = torch.device(device).index or 0
    facts: dict[str, Any] = {
        "techniques": [[t.name, t.params()] for t in techniques],
        "gpu": torch.cuda.get_device_name(index),
        "capability": list(torch.cuda.get_device_capability(index)),
        "driver": cuda_driver(),
        "torch": torch.__version__,
        "torchao": distribution_version("torchao"),
        "mslk": importlib.util.find_spec("mslk") is not None,
        "pareto": __version__,
        "probe": probe_code(),
        "code": [technique_code(type(t)) for t in techniques],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _path() -> Path:
    from pareto.tasks._cache import cache_root

    return cache_root() / CACHE_FILE


def _read_cache() -> dict[str, str | None]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(key: str, reason: str | None) -> None:
    """Add one result; written to a temporary file and renamed, so a concurrent reader sees a whole file."""
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_read_cache(), key: reason}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the probe runs again next time, which is only slower
