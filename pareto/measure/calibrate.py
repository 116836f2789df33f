"""Measure the host's own roofline ceilings: matmul FLOP/s per dtype and memory-copy bandwidth.

Method (recorded in the profile): each ceiling is the *best* of several calls timed one by one
(CPU: ``perf_counter_ns``; CUDA: a start/end event pair per call, synchronized). A ceiling is what
the hardware can attain, and noise on a shared machine only ever slows a call down, so the fastest
call is the estimate; the median is recorded beside it in ``sources``.

- Matmul: ``a @ b`` of two n×n matrices, 2·n³ FLOPs per call. After one untimed start-up call,
  n starts at 256 and doubles while the faster of two calls is under ``_TARGET_CALL_S`` or the
  last doubling raised the rate by more than ``_GROWTH_GAIN`` (fixed per-call costs such as thread
  wake-ups still amortizing), up to a cap and while the next size fits the budget share. The best
  square size and the rectangular shapes models run (a batch of activations times a weight
  matrix, ``_MODEL_SHAPES``) are each timed; the ceiling is the best of them, since a ceiling that
  some shape beats is no ceiling.
  Dtypes tried: fp32, bf16 and fp16 (plus tf32 on CUDA devices of compute capability 8.0 and up);
  a dtype the device cannot multiply is skipped and the reason kept in ``method``.
- Bandwidth: ``dst.copy_(src)`` of several buffer sizes, from one that a model's weights may share
  with the last-level cache to one far larger (CPU 8, 32 and 256 MiB; CUDA 64 MiB and 1 GiB or 1/8
  of free memory); bytes moved = 2 × buffer (read + write); the best size sets the ceiling.

The budget is split evenly between the dtypes and the copy; each keeps calling until its share is
spent (at least ``_MIN_CALLS`` timed calls after the sizing calls, which warm up the final size).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from pareto.devices import resolve_device
from pareto.errors import UsageError
from pareto.machine import HardwareProfile
from pareto.measure.environment import fingerprint

_TARGET_CALL_S = 0.02
_GROWTH_GAIN = 1.2
_MIN_CALLS = 3
_MAX_CALLS = 50
_CPU_MAX_N = 2048
_CUDA_MAX_N = 8192
_CPU_COPY_BYTES = (8 * 2**20, 32 * 2**20, 256 * 2**20)
_CUDA_COPY_BYTES = (64 * 2**20, 2**30)
#: (rows, inner, columns) of activation × weight products typical of served models.
_MODEL_SHAPES = ((256, 1024, 1024), (64, 4096, 4096), (2048, 512, 2048), (1, 4096, 4096))

_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def calibrate(device: str = "cpu", *, seconds_budget: float = 5.0, threads: int | None = None) -> HardwareProfile:
    """Measure ``device``'s matmul FLOP/s per dtype and copy bandwidth as a ``HardwareProfile``.

    Args:
        device: "auto", "cpu", "cuda" or "cuda:N".
        seconds_budget: Wall-clock seconds to spend, roughly (one slow call may overrun its share).
        threads: ``torch.set_num_threads`` while measuring, restored afterwards; None keeps it.

    Returns:
        A profile named ``host-cpu`` or ``host-cuda-N`` whose ``sources`` say, for every number,
        the size, the calls and the best and median rates measured; ``method`` and ``measured_at``
        record how and when.

    Raises:
        UsageError: a bad device, ``seconds_budget <= 0`` or ``threads < 1``.
    """
    if not seconds_budget > 0:
        raise UsageError(f"The calibration budget must be positive, got {seconds_budget} s.")
    if threads is not None and threads < 1:
        raise UsageError(f"Thread count must be at least 1, got {threads}.")
    device = resolve_device(device)
    on_cuda = device.startswith("cuda")
    dtypes = ["fp32", "bf16", "fp16"]
    if on_cuda and torch.cuda.get_device_capability(device) >= (8, 0):
        dtypes.insert(1, "tf32")
    share_s = seconds_budget / (len(dtypes) + 1)
    previous_threads = torch.get_num_threads()
    previous_precision = torch.get_float32_matmul_precision()
    if threads is not None:
        torch.set_num_threads(threads)
    used_threads = torch.get_num_threads()
    try:
        peaks, bandwidth, sources, skipped = _ceilings(device, dtypes, share_s)
    finally:
        torch.set_float32_matmul_precision(previous_precision)
        torch.set_num_threads(previous_threads)
    if not peaks:
        raise UsageError(f"No matmul dtype runs on {device}: {'; '.join(skipped)}.")
    memory_bytes, sources["memory_bytes"] = _memory_capacity(device)
    env = fingerprint(device, used_threads)
    timer = "cuda event pair per call, synchronized" if on_cuda else "perf_counter_ns per call"
    method = (
        f"calibrate: best of per-call timings ({timer}, {used_threads} threads, inference_mode, "
        f"{seconds_budget:g} s budget); matmul n x n at 2 n^3 FLOPs per call, n doubled from 256 while "
        f"a call is under {_TARGET_CALL_S * 1e3:g} ms or the rate rises > {_GROWTH_GAIN:g}x, best of that size and "
        f"{len(_MODEL_SHAPES)} model shapes; bandwidth: best dst.copy_(src) over several sizes, read + write counted"
        + (f"; skipped {'; '.join(skipped)}" if skipped else "")
    )
    return HardwareProfile(
        name=f"host-{device.replace(':', '-')}",
        description=f"{env['device_name']} ({used_threads} threads, measured)",
        peak_flops=peaks,
        memory_bandwidth_bytes_per_s=bandwidth,
        memory_bytes=memory_bytes,
        sources=sources,
        method=method,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _ceilings(
    device: str, dtypes: list[str], share_s: float
) -> tuple[dict[str, float], float, dict[str, str], list[str]]:
    """Peak FLOP/s per dtype, copy bandwidth, the source of each, and the dtypes that cannot run."""
    peaks: dict[str, float] = {}
    sources: dict[str, str] = {}
    skipped: list[str] = []
    with torch.inference_mode():
        for name in dtypes:
            # "highest" keeps fp32 matmuls in full fp32; "high" lets CUDA use TF32 tensor cores
            torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
            result = _matmul_rate(device, name, share_s)
            if isinstance(result, str):
                skipped.append(f"{name}: {result}")
                continue
            peaks[name], sources[f"peak_flops.{name}"] = result
        bandwidth, sources["memory_bandwidth_bytes_per_s"] = _copy_rate(device, share_s)
    return peaks, bandwidth, sources, skipped


def _matmul_rate(device: str, name: str, share_s: float) -> tuple[float, str] | str:
    """Best FLOP/s of an n×n matmul in dtype ``name`` and its source line, or why it cannot run."""
    dtype = _DTYPES[name]
    deadline = time.perf_counter() + share_s
    cap = _CUDA_MAX_N if device.startswith("cuda") else _CPU_MAX_N

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)

    def sizing_rate(n: int, a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
        seconds = min(_time_calls(lambda: a @ b, device, 2))
        return 2 * n**3 / seconds, seconds

    try:
        n = 256
        a, b = operands(n)
        _time_calls(lambda: a @ b, device, 1)  # one-time start-up (thread pool, kernel selection)
        rate, seconds = sizing_rate(n, a, b)
        best = (rate, n, a, b)
        improving = True
        # grow while calls are short or a bigger size still pays (fixed per-call costs such as
        # thread wake-ups amortize), as long as the next size (8x the work) fits the share
        while (
            n < cap
            and (seconds < _TARGET_CALL_S or improving)
            and time.perf_counter() + 8 * seconds * (2 + _MIN_CALLS) < deadline
        ):
            n *= 2
            a, b = operands(n)
            rate, seconds = sizing_rate(n, a, b)
            improving = rate > _GROWTH_GAIN * best[0]
            if rate > best[0]:
                best = (rate, n, a, b)
    except RuntimeError as exc:  # e.g. a dtype this device has no matmul kernel for
        return f"not supported ({str(exc).splitlines()[0]})"
    _, n, a, b = best
    times = _time_calls(lambda: a @ b, device, _MIN_CALLS, deadline)
    flops = 2 * n**3
    best_rate, median = flops / min(times), flops / statistics.median(times)
    shape, timed = f"{n}x{n}x{n}", 0
    for rows, inner, cols in _MODEL_SHAPES:
        predicted_s = 2 * rows * inner * cols / best_rate * (_MIN_CALLS + 1)
        if predicted_s > max(deadline - time.perf_counter(), share_s / 4):
            continue  # this shape would overrun the budget share
        shape_times = _matmul_times(device, dtype, rows, inner, cols)
        timed += 1
        rate = 2 * rows * inner * cols / min(shape_times)
        if rate > best_rate:
            best_rate, median = rate, 2 * rows * inner * cols / statistics.median(shape_times)
            shape = f"{rows}x{inner}x{cols}"
    source = (
        f"measured: {name} matmul, best of the square {n}x{n} and {timed} model shapes (of {len(_MODEL_SHAPES)}): "
        f"{shape} (m x k x n) at {best_rate / 1e9:.3g} GFLOP/s (median {median / 1e9:.3g} GFLOP/s)"
    )
    return best_rate, source


def _copy_rate(device: str, share_s: float) -> tuple[float, str]:
    """Best bytes/s of ``dst.copy_(src)`` over several sizes, counting read + write, and its source line."""
    sizes: tuple[int, ...] = _CPU_COPY_BYTES
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(device)
        sizes = tuple(min(size, free // 8) for size in _CUDA_COPY_BYTES)
    best: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)  # rate, median rate, bytes, calls
    for nbytes in sizes:
        times = _copy_times(device, nbytes, time.perf_counter() + share_s / len(sizes))
        rate = 2 * nbytes / min(times)
        if rate > best[0]:
            best = (rate, 2 * nbytes / statistics.median(times), nbytes, len(times))
    rate, median, nbytes, calls = best
    listed = ", ".join(f"{size / 2**20:.0f}" for size in sizes)
    source = (
        f"measured: copies of {listed} MiB (read + write counted), best at {nbytes / 2**20:.0f} MiB: "
        f"best of {calls} calls {rate / 1e9:.3g} GB/s (median {median / 1e9:.3g} GB/s)"
    )
    return rate, source


def _copy_times(device: str, nbytes: int, deadline: float) -> list[float]:
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)  # written: pages are really mapped
    dst = torch.empty_like(src)
    _time_calls(lambda: dst.copy_(src), device, 1)  # first touch of dst's pages is not bandwidth
    return _time_calls(lambda: dst.copy_(src), device, _MIN_CALLS, deadline)


def _matmul_times(device: str, dtype: torch.dtype, rows: int, inner: int, cols: int) -> list[float]:
    x = torch.randn(rows, inner, device=device).to(dtype)
    w = torch.randn(inner, cols, device=device).to(dtype)
    _time_calls(lambda: x @ w, device, 1)
    return _time_calls(lambda: x @ w, device, _MIN_CALLS)


def _time_calls(call: Callable[[], object], device: str, min_calls: int, deadline: float | None = None) -> list[float]:
    """Seconds of each call, timed one by one: ``min_calls`` calls, then more until ``deadline``."""
    on_cuda = device.startswith("cuda")
    times: list[float] = []
    with torch.cuda.device(device) if on_cuda else contextlib.nullcontext():
        while len(times) < min_calls or (
            deadline is not None and len(times) < _MAX_CALLS and time.perf_counter() < deadline
        ):
            if on_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                start_ns = time.perf_counter_ns()
                call()
                times.append((time.perf_counter_ns() - start_ns) / 1e9)
    return [max(t, 1e-9) for t in times]


def _memory_capacity(device: str) -> tuple[int | None, str]:
    if device.startswith("cuda"):
        total = torch.cuda.get_device_properties(device).total_memory
        return int(total), "torch.cuda.get_device_properties(device).total_memory"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that reports it
        return None, "unknown: os.sysconf has no SC_PHYS_PAGES here"
    return int(total), "os.sysconf: SC_PAGE_SIZE x SC_PHYS_PAGES (physical memory)"
