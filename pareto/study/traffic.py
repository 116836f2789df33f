"""A configuration at the user's traffic: its batch call times measured, its requests simulated.

With ``traffic.qps`` set (``pareto search --qps 800``), a trial measures the call time of every batch bucket
up to its batch size (the batcher's largest batch: its own latency measurement is the largest bucket; the
smaller ones are timed in rounds after it), and a seeded discrete-event simulation of the queue
(``pareto.measure.queue``) turns them into request latencies: Poisson arrivals at the rate, a dynamic
batcher forming batches up to the largest batch or the longest wait, one batch served at a time. The wait
is chosen per configuration from ``traffic.max_wait`` by the simulation (it changes nothing measured); the
capacity is the highest rate whose request P99 upper bound stays within the SLO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pareto.errors import MachineBusy
from pareto.units import format_ms

if TYPE_CHECKING:
    from pareto.compress.served import Served
    from pareto.measure.latency import LatencyResult
    from pareto.measure.queue import Batcher, ServiceTimes
    from pareto.spec import Measure, Traffic
    from pareto.task import Task

#: The batcher's waits tried when the spec lists none, as fractions of the SLO.
WAIT_FRACTIONS = (0.0, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
#: The rates of a configuration's traffic curve, as fractions of its capacity (the study's rate is added).
CURVE_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25)
#: Batch sizes a traffic study searches when the spec says none: the batcher's largest batch.
DEFAULT_MAX_BATCHES = [1, 4, 16]
#: Rounds each smaller bucket is timed in.
BUCKET_ROUNDS = 4
#: Untimed calls before each smaller bucket's rounds (the model is warm from its own measurement).
BUCKET_WARMUP = 10


def waits_ms(traffic: Traffic, slo_ms: float) -> list[float]:
    """The batcher's waits to try: the spec's, else ``WAIT_FRACTIONS`` of the SLO."""
    if traffic.max_wait is not None:
        return sorted(set(traffic.max_wait))
    return [round(f * slo_ms, 6) for f in WAIT_FRACTIONS]


def batchers(max_batch: int, traffic: Traffic, slo_ms: float) -> list[Batcher]:
    """The batcher settings a configuration of largest batch ``max_batch`` is simulated with."""
    from pareto.measure.queue import Batcher

    waits = waits_ms(traffic, slo_ms) if max_batch > 1 else [0.0]
    return [Batcher(max_batch=max_batch, max_wait_ms=w) for w in waits]


def service_times(
    served: Served,
    task: Task,
    batch_size: int,
    latency: LatencyResult,
    *,
    device: str,
    threads: int,
    measure: Measure,
    traffic: Traffic,
) -> tuple[ServiceTimes, list[dict[str, Any]]]:
    """The measured call time of every bucket up to ``batch_size``: the trial's own measurement for the
    largest, the smaller ones timed now in ``BUCKET_ROUNDS`` rounds of ``traffic.sweep_samples`` calls.

    Raises:
        MachineBusy: the contention guard gave a bucket up.
    """
    from pareto.measure.latency import RoundPlan, measure_latency
    from pareto.measure.queue import ServiceTimes, buckets

    assert latency.samples_ms is not None
    by_batch = {batch_size: latency.samples_ms / 1e3}
    rows = {batch_size: _row(batch_size, latency)}
    plan = RoundPlan(
        samples=traffic.sweep_samples,
        rounds=min(BUCKET_ROUNDS, traffic.sweep_samples),
        warmup=min(measure.warmup, BUCKET_WARMUP),
        confidence=measure.confidence,
    )
    for bucket in buckets(batch_size)[:-1]:
        timed = measure_latency(
            served.module, task.example_input(bucket), device=device, plan=plan, threads=threads, ready=served.ready
        )
        if timed.busy or timed.samples_ms is None:
            raise MachineBusy(timed.stop_reason or f"batch {bucket} could not be timed: machine busy")
        by_batch[bucket], rows[bucket] = timed.samples_ms / 1e3, _row(bucket, timed)
    return ServiceTimes(by_batch), [rows[b] for b in sorted(rows)]


def _row(batch: int, latency: LatencyResult) -> dict[str, Any]:
    s = latency.summary
    return {"batch": batch, "mean_ms": s.mean_ms, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "samples": s.samples}


def traffic_fields(
    service: ServiceTimes,
    batch_size: int,
    traffic: Traffic,
    slo_ms: float,
    *,
    seed: int,
    confidence: float,
) -> dict[str, Any]:
    """The ``Metrics`` traffic fields: the requests at the study's rate, the capacity at the SLO and the
    curve around it, each with the batcher setting that does best there (the same arrivals for every
    setting and every configuration: the study's seed)."""
    from pareto.measure.queue import best_at_rate, capacity, traffic_curve

    assert traffic.qps is not None
    options = batchers(batch_size, traffic, slo_ms)
    sim: dict[str, Any] = {"requests": traffic.requests, "seed": seed, "confidence": confidence}
    at = best_at_rate(traffic.qps, service, options, **sim)
    most = capacity(service, slo_ms, options, **sim)
    rates = {traffic.qps, *(f * most.qps for f in CURVE_FRACTIONS)} if most is not None else {traffic.qps}
    curve = traffic_curve(service, options, sorted(rates), **sim)
    return {
        "scenario": "server",
        "qps": traffic.qps,
        "max_batch": at.batcher.max_batch,
        "max_wait_ms": at.batcher.max_wait_ms,
        "requests": at.summary.requests,
        "request_p50_ms": at.summary.p50_ms,
        "request_p99_ms": at.summary.p99_ms,
        "request_p99_upper_ms": at.summary.p99_upper_ms,
        "capacity_qps": most.qps if most is not None else None,
        "capacity_max_batch": most.batcher.max_batch if most is not None else None,
        "capacity_max_wait_ms": most.batcher.max_wait_ms if most is not None else None,
        "traffic_curve": [point.to_dict() for point in curve],
    }


def method(traffic: Traffic, slo_ms: float, seed: int) -> str:
    """What the traffic figures are, for the measurement's method."""
    waits = ", ".join(format_ms(w) for w in waits_ms(traffic, slo_ms))
    return (
        f"traffic: Poisson arrivals (seed {seed}), {traffic.requests} simulated requests per rate (the first 5 % "
        f"left out), one batch at a time, the batcher's wait chosen from {waits}; a batch of n runs at the "
        f"smallest bucket (1, 2, 4, ... the largest batch) >= n (padded), its time drawn from that bucket's "
        f"measured calls ({traffic.sweep_samples} calls in {BUCKET_ROUNDS} rounds per smaller bucket); P99 bound: "
        "order statistic of the simulated requests; capacity: bisection on the rate to 2 %; left out: the "
        "serving thread's own time, the host's scheduling, variation of the call times beyond those measured"
    )
