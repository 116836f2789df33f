"""Per-call latency on the target device, following the measurement rules in ARCHITECTURE.md."""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pareto.errors import UsageError
from pareto.measure.stats import MIN_SAMPLES_P99, LatencySummary, summarize

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class LatencyResult:
    """One latency measurement: its summary and how it was taken."""

    summary: LatencySummary
    warmup: int
    threads: int
    device: str
    method: str
    elapsed_s: float


def resolve_device(spec: str) -> str:
    """Turn a device spec ("auto", "cpu", "cuda", "cuda:N") into "cpu" or "cuda:N".

    Raises:
        UsageError: an unknown spec, or a CUDA device torch does not see.
    """
    name = spec.strip().lower()
    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise UsageError(f"Unknown device {spec!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'.")
    index = int(match.group(1) or 0)
    device = f"cuda:{index}"
    if not torch.cuda.is_available():
        raise UsageError(
            f"CUDA device {device!r} was requested but torch sees no CUDA device; use --device cpu."
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(
            f"CUDA device {device!r} was requested but torch sees only {count} CUDA device(s); "
            f"use cuda:0 to cuda:{count - 1}."
        )
    return device


def measure_latency(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    device: str,
    samples: int = MIN_SAMPLES_P99,
    warmup: int = 50,
    threads: int | None = None,
    confidence: float = 0.95,
) -> LatencyResult:
    """Time ``samples`` forward passes one by one after ``warmup`` untimed ones.

    The model is put in eval mode and moved to ``device`` in place; inputs are moved there before
    timing. Calls run under ``torch.inference_mode()`` with the garbage collector collected, frozen
    and disabled. CPU calls are timed with ``time.perf_counter_ns``; CUDA calls with a start/end
    event pair each, synchronized after every call so that calls never overlap.

    Args:
        model: The module to time; called as ``model(*inputs)``.
        inputs: A tensor, or a tuple/list of tensors (non-tensor items are passed as they are).
        device: "auto", "cpu", "cuda" or "cuda:N".
        samples: Timed calls; a P99 verdict of "met" needs at least ``MIN_SAMPLES_P99``.
        warmup: Untimed calls first (allocator, caches, lazy initialization, autotuning).
        threads: ``torch.set_num_threads`` while timing; the previous value is restored. None keeps it.
        confidence: Two-sided coverage of the percentile intervals.

    Returns:
        The latency summary and a record of the method.

    Raises:
        UsageError: ``samples < 1``, ``warmup < 0``, ``threads < 1`` or a bad device.
    """
    if samples < 1:
        raise UsageError(f"Latency needs at least 1 timed sample, got {samples}.")
    if warmup < 0:
        raise UsageError(f"Warm-up calls cannot be negative, got {warmup}.")
    if threads is not None and threads < 1:
        raise UsageError(f"Thread count must be at least 1, got {threads}.")
    device = resolve_device(device)
    started_s = time.perf_counter()
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used_threads = torch.get_num_threads()
        model = model.to(device).eval()
        args = _as_args(inputs, device)
        with torch.inference_mode():
            for _ in range(warmup):
                model(*args)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
                samples_ns = _time_cuda(model, args, samples, device)
                timer = "cuda event pair per call, synchronized"
            else:
                samples_ns = _time_cpu(model, args, samples)
                timer = "perf_counter_ns per call"
    finally:
        if threads is not None:
            torch.set_num_threads(previous_threads)
    method = (
        f"{timer}, {warmup} warm-up, {samples} samples, inference_mode, gc frozen, {used_threads} threads"
    )
    return LatencyResult(
        summary=summarize(samples_ns, confidence),
        warmup=warmup,
        threads=used_threads,
        device=device,
        method=method,
        elapsed_s=time.perf_counter() - started_s,
    )


def _as_args(inputs: torch.Tensor | Sequence[Any], device: str) -> tuple[Any, ...]:
    items = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in items)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Collect, freeze and disable the garbage collector; restore its state afterwards."""
    was_enabled = gc.isenabled()
    was_frozen = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        # a caller that froze the heap itself did so on purpose; unfreezing would undo that too
        if not was_frozen:
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def _time_cpu(model: nn.Module, args: tuple[Any, ...], samples: int) -> np.ndarray:
    samples_ns = np.empty(samples, dtype=np.int64)
    with _gc_paused():
        for i in range(samples):
            start_ns = time.perf_counter_ns()
            output = model(*args)
            samples_ns[i] = time.perf_counter_ns() - start_ns
            del output  # freeing the output is not part of the next call's time
    return samples_ns


def _time_cuda(model: nn.Module, args: tuple[Any, ...], samples: int, device: str) -> np.ndarray:
    with torch.cuda.device(device):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        with _gc_paused():
            for start, end in zip(starts, ends):
                start.record()
                output = model(*args)
                end.record()
                end.synchronize()  # one query at a time: the next call must not overlap this one
                del output
    return np.array([start.elapsed_time(end) * _NS_PER_MS for start, end in zip(starts, ends)])
