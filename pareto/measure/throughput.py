"""Throughput over a batch sweep: T(B) = B / L(B), where it saturates, and the largest batch within an SLO."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pareto.errors import UsageError
from pareto.measure.latency import RoundPlan, measure_latency
from pareto.measure.stats import LatencySummary, Verdict, slo_verdict

#: A batch is "saturated" once its throughput reaches this fraction of the sweep's maximum.
SATURATION_FRACTION = 0.9
#: Graphs per compiled function a sweep allows beyond Dynamo's limit as it stood and one per batch size.
SWEEP_RECOMPILE_MARGIN = 4


@dataclass(frozen=True)
class ThroughputPoint:
    """One batch size of the sweep: latency of one call and the throughput it implies."""

    batch: int
    p50_ms: float
    p99_ms: float
    p99_upper_ms: float
    mean_ms: float
    throughput_per_s: float
    samples: int
    verdict: Verdict | None


@dataclass(frozen=True)
class ThroughputCurve:
    """T(B) over a batch sweep.

    ``saturation_batch`` is the smallest batch whose throughput is at least ``SATURATION_FRACTION``
    (90 %) of the largest throughput in the sweep: beyond it a bigger batch buys at most 10 % more
    throughput for more latency. It is judged within the sweep only; when the largest batch is also
    the fastest, throughput may still be rising past it. ``max_batch_within_slo`` is the largest
    batch whose P99 verdict against ``slo_ms`` is "met" (upper confidence bound within the SLO and
    at least ``MIN_SAMPLES_P99`` samples), None when no batch meets it or no SLO was given.
    """

    points: tuple[ThroughputPoint, ...]
    saturation_batch: int
    max_batch_within_slo: int | None
    slo_ms: float | None
    stopped_reason: str | None
    method: str

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain values; an unbounded upper bound (``inf``) becomes None."""
        data = asdict(self)
        for point in data["points"]:
            if point["p99_upper_ms"] == float("inf"):
                point["p99_upper_ms"] = None
        return data


def default_batch_sweep(limit: int) -> list[int]:
    """Powers of two from 1 up to ``limit`` inclusive: 1, 2, 4, … ≤ limit.

    Raises:
        UsageError: ``limit < 1``.
    """
    if limit < 1:
        raise UsageError(f"The batch sweep limit must be at least 1, got {limit}.")
    sweep, batch = [], 1
    while batch <= limit:
        sweep.append(batch)
        batch *= 2
    return sweep


def _checked_batches(batch_sizes: Iterable[int]) -> list[int]:
    batches = sorted(set(batch_sizes))
    if not batches:
        raise UsageError("A throughput sweep needs at least one batch size.")
    if batches[0] < 1:
        raise UsageError(f"Batch sizes must be at least 1, got {batches[0]}.")
    return batches


def _point(batch: int, s: LatencySummary, slo_ms: float | None) -> ThroughputPoint:
    return ThroughputPoint(
        batch=batch,
        p50_ms=s.p50_ms,
        p99_ms=s.p99_ms,
        p99_upper_ms=s.p99_upper_ms,
        mean_ms=s.mean_ms,
        throughput_per_s=batch / (s.mean_ms / 1e3),
        samples=s.samples,
        verdict=slo_verdict(s.p99_lower_ms, s.p99_upper_ms, slo_ms, s.samples) if slo_ms else None,
    )


@contextlib.contextmanager
def recompiles_for(batches: int) -> Iterator[int | None]:
    """Raise Dynamo's recompile limit for a sweep of ``batches`` batch sizes, and make a hit an error.

    A model compiled with static shapes (``torch.compile``'s reduce-overhead mode here) compiles a
    graph per batch size; past ``torch._dynamo.config.recompile_limit`` graphs (8 by default) Dynamo
    runs the function eagerly, silently. Inside, the limit is the one in force plus one per batch size
    plus ``SWEEP_RECOMPILE_MARGIN``, and a hit raises ``FailOnRecompileLimitHit``
    (``pareto.devices.recompile_settings``). Yields the limit; None, with nothing changed,
    when Dynamo is not loaded (nothing in this process has been compiled).
    """
    if "torch._dynamo" not in sys.modules:
        yield None
        return
    import torch._dynamo.config as dynamo_config

    from pareto.devices import recompile_settings

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    limit = int(getattr(dynamo_config, name)) + batches + SWEEP_RECOMPILE_MARGIN
    with dynamo_config.patch(recompile_settings(limit)):
        yield limit


def _recompile_limit_hit(exc: BaseException) -> bool:
    """True when ``exc`` is Dynamo refusing to compile another graph (``fail_on_recompile_limit_hit``)."""
    exc_module = sys.modules.get("torch._dynamo.exc")
    hit = getattr(exc_module, "FailOnRecompileLimitHit", None) or getattr(exc_module, "FailOnCacheLimitHit", None)
    return hit is not None and isinstance(exc, hit)


def throughput_curve(
    model: nn.Module,
    example_input: Callable[[int], Any],
    batch_sizes: Iterable[int],
    *,
    device: str,
    plan: RoundPlan | None = None,
    threads: int | None = None,
    slo_ms: float | None = None,
    ready: Callable[[], object] | None = None,
    **plan_fields: Any,
) -> ThroughputCurve:
    """Measure latency at each batch size with ``measure_latency`` and derive T(B) = B / mean L(B).

    Throughput uses the mean latency of the timed calls (calls back to back: batches per second is
    the reciprocal of the mean). When a batch runs out of device memory the sweep stops there and
    ``stopped_reason`` says so; the batches measured before it are kept. A compiled model may
    compile a graph per batch size: the sweep raises Dynamo's recompile limit while it runs
    (``recompiles_for``), and a batch that would still pass it stops the sweep the same way rather
    than being timed eagerly.

    Args:
        model: The module (put in eval mode and moved to ``device`` in place).
        example_input: ``batch_size -> input``, the task's ``example_input``.
        batch_sizes: Batch sizes to measure, e.g. ``default_batch_sweep(256)``.
        plan: How each batch size is timed (rounds, samples, warm-up, confidence); None builds one
            from ``plan_fields`` (``samples=662, warmup=50``...).
        threads: Torch threads while timing; None keeps the current count.
        slo_ms: P99 SLO in ms for ``max_batch_within_slo``; None leaves it None.
        ready: Called before each batch's warm-up (``measure_latency``'s; ONNX Runtime opens its session).

    Raises:
        UsageError: no batch sizes, a batch size below 1, the first batch out of memory or past the
            recompile limit, or a bad ``measure_latency`` argument.
    """
    plan = plan or RoundPlan(**plan_fields)
    batches = _checked_batches(batch_sizes)
    points: list[ThroughputPoint] = []
    stopped_reason = None
    method = ""
    with recompiles_for(len(batches)) as limit:
        for batch in batches:
            try:
                result = measure_latency(
                    model, example_input(batch), device=device, plan=plan, threads=threads, ready=ready
                )
            except torch.OutOfMemoryError:
                stopped_reason = f"batch {batch} ran out of device memory; larger batches not measured"
                break
            except Exception as exc:
                if not _recompile_limit_hit(exc):
                    raise
                stopped_reason = (
                    f"batch {batch} would compile past torch.compile's recompile limit ({limit} graphs per "
                    "function) and run eagerly; larger batches not measured"
                )
                if not points:
                    raise UsageError(f"The throughput sweep measured nothing: {stopped_reason}.") from exc
                break
            method = result.method
            points.append(_point(batch, result.summary, slo_ms))
    if not points:
        raise UsageError(f"Batch {batches[0]} already runs out of device memory; try a smaller batch.")
    best = max(point.throughput_per_s for point in points)
    saturation = next(p.batch for p in points if p.throughput_per_s >= SATURATION_FRACTION * best)
    within = [p.batch for p in points if p.verdict == "met"]
    return ThroughputCurve(
        points=tuple(points),
        saturation_batch=saturation,
        max_batch_within_slo=max(within) if within else None,
        slo_ms=slo_ms,
        stopped_reason=stopped_reason,
        method=(
            f"measure_latency per batch ({method}); throughput = batch / mean latency; saturation: "
            f"smallest batch with >= {SATURATION_FRACTION:.0%} of the sweep's maximum throughput"
            + (
                f"; torch.compile's recompile limit raised to {limit} for the sweep (it binds compiled models only)"
                if limit is not None
                else ""
            )
        ),
    )
