"""Availability proven, not assumed: on a CUDA device a technique is available when a probe through its
real kernels ran there.

A capability number is not enough: PyTorch's CUTLASS 2:4 kernels refuse compute capability 9.0,
torchao's default int4 packing needs the MSLK package, a torchao release may not run on the torch
beside it. So before a technique is offered on a GPU, it is applied to a small MLP (widths of 256,
which every kernel's tiling takes) on that GPU and the result is run once; a failure is the reason it
is not available. Results are cached per technique, GPU, driver and library versions, in memory and
in ``$PARETO_CACHE_DIR/kernel-probes.json``, so a probe runs once per machine and upgrade. On the CPU
the techniques' own checks decide, as they always have.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.errors import NoEffect, exception_line

if TYPE_CHECKING:
    from pareto.compress.base import Technique
    from pareto.task import Task

#: The probe model's width and batch: multiples of 256, so that every kernel's tiling takes them.
PROBE_WIDTH = 256
PROBE_BATCH = 16
CACHE_FILE = "kernel-probes.json"

_memory: dict[str, str | None] = {}


def kernel_reason(technique: Technique, device: str) -> str | None:
    """None when ``technique`` is proven to run on ``device`` (always on a non-CUDA device); else why not."""
    if not device.startswith("cuda"):
        return None
    key = _key(technique, device)
    if key in _memory:
        return _memory[key]
    stored = _read_cache()
    if key in stored:
        _memory[key] = stored[key]
        return stored[key]
    reason = probe(technique, device)
    _memory[key] = reason
    _write_cache(key, reason)
    return reason


def probe(technique: Technique, device: str) -> str | None:
    """Apply ``technique`` to the probe MLP on ``device`` and run it once; None when it ran and its
    output has the right shape and finite values, else one sentence on what failed."""
    import torch

    from pareto.compress.pipeline import Config, apply
    from pareto.devices import as_args, on_device

    task = on_device(probe_task(), device)  # the probe's data where its model is, as a bench's
    backend = "eager" if "eager" in technique.backends else technique.backends[0]
    try:
        config = Config(techniques=(technique,), batch_size=PROBE_BATCH, backend=backend)
        model = apply(task.model, config, task, device=device).module
        with torch.inference_mode():
            out = model(*as_args(task.example_input(PROBE_BATCH)))
        finite = out.is_meta or bool(torch.isfinite(out.float()).all())  # a meta tensor has no values to check
        if out.shape != (PROBE_BATCH, PROBE_WIDTH) or not finite:
            return f"a probe through its kernels on {device} gave a wrong output ({tuple(out.shape)}, or not finite)."
    except NoEffect:  # nothing for it to do on the probe's MLP (ORT's fusions): its kernels are not in question
        return None
    except Exception as exc:  # the kernel, the library or the driver refused: that is the reason
        return f"a probe through its kernels failed on {device}: {exception_line(exc)}."
    finally:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return None


def probe_task() -> Task:
    """The probe: a 3-layer MLP of width ``PROBE_WIDTH`` (fixed weights), inputs, and unlabelled training batches."""
    import torch
    from torch import nn

    from pareto.task import Task

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


def _key(technique: Technique, device: str) -> str:
    """What a probe's result depends on: the technique and its parameters, the GPU, the driver, the libraries."""
    import importlib.util

    import torch

    from pareto.measure.environment import cuda_driver, distribution_version

    index = torch.device(device).index or 0
    facts: dict[str, Any] = {
        "technique": technique.name,
        "params": technique.params(),
        "gpu": torch.cuda.get_device_name(index),
        "capability": list(torch.cuda.get_device_capability(index)),
        "driver": cuda_driver(),
        "torch": torch.__version__,
        "torchao": distribution_version("torchao"),
        "mslk": importlib.util.find_spec("mslk") is not None,
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
