"""A configuration at the user's traffic: its batch call times measured, its requests simulated.

With ``traffic.qps`` set (``pareto search --qps 800``), a trial measures the call time of every batch bucket
up to its batch size (the batcher's largest batch: its own latency measurement is the largest bucket; the
smaller ones are timed in rounds after it), and a seeded discrete-event simulation of the queue
(``pareto.measure.queue``) turns them into request latencies: Poisson arrivals at the rate, a dynamic
batcher forming batches up to the largest batch or the longest wait, one batch at a time per model
instance (the serving layout, instances × intra-op threads, chosen by short serving runs). The wait
is chosen per configuration from ``traffic.max_wait`` by the simulation (it changes nothing measured); the
capacity is the highest rate whose request P99 upper bound stays within the SLO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.errors import MachineBusy, TechniqueError, UsageError
from pareto.locks import timing_lock
from pareto.units import format_ms

if TYPE_CHECKING:
    import numpy as np

    from pareto.compress.served import Served
    from pareto.measure.latency import LatencyResult
    from pareto.measure.load import LoadRun
    from pareto.measure.queue import Batcher, RatePoint, ServiceTimes
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
#: A serving run's schedule lasts at most this long (fewer requests than ``traffic.serve_requests`` at a
#: low rate), but holds at least ``SERVE_MIN_REQUESTS``.
SERVE_SECONDS = 4.0
SERVE_MIN_REQUESTS = 200


def waits_ms(traffic: Traffic, slo_ms: float) -> list[float]:
    """The batcher's waits to try: the spec's, else ``WAIT_FRACTIONS`` of the SLO."""
    if traffic.max_wait is not None:
        return sorted(set(traffic.max_wait))
    return [round(f * slo_ms, 6) for f in WAIT_FRACTIONS]


def batchers(max_batch: int, traffic: Traffic, slo_ms: float, instances: int = 1) -> list[Batcher]:
    """The batcher settings a configuration of largest batch ``max_batch`` served by ``instances`` model
    instances is simulated with."""
    from pareto.measure.queue import Batcher

    waits = waits_ms(traffic, slo_ms) if max_batch > 1 else [0.0]
    return [Batcher(max_batch=max_batch, max_wait_ms=w, instances=instances) for w in waits]


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
    from pareto.devices import timed_inputs
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
            served.module, timed_inputs(task, bucket), device=device, plan=plan, threads=threads, ready=served.ready
        )
        if timed.busy or timed.samples_ms is None:
            raise MachineBusy(timed.stop_reason or f"batch {bucket} could not be timed: machine busy")
        by_batch[bucket], rows[bucket] = timed.samples_ms / 1e3, _row(bucket, timed)
    return ServiceTimes(by_batch), [rows[b] for b in sorted(rows)]


def served_call(served: Served, task: Task, max_batch: int, device: str) -> Callable[[int], object]:
    """One batch of the served model at a bucket, inputs made beforehand (a CUDA call synchronized); a task
    with real requests (``timing_inputs``) has each call take the bucket's next batch of them in turn."""
    import itertools

    import torch

    from pareto.devices import as_args
    from pareto.measure.queue import buckets

    def inputs(bucket: int) -> list[tuple[object, ...]]:
        return [as_args(x) for x in (task.timing_inputs or (lambda b: [task.example_input(b)]))(bucket)]

    args = {bucket: itertools.cycle(inputs(bucket)) for bucket in buckets(max_batch)}
    module, cuda = served.module, device.startswith("cuda")

    def call(bucket: int) -> object:
        with torch.inference_mode():
            out = module(*next(args[bucket]))
        if cuda:
            torch.cuda.synchronize(device)
        return out

    return call


def serve_requests(traffic: Traffic, rate: float) -> int:
    """A serving run's requests at ``rate``: ``SERVE_SECONDS`` of schedule, within
    ``SERVE_MIN_REQUESTS``..``traffic.serve_requests``."""
    return max(min(SERVE_MIN_REQUESTS, traffic.serve_requests), min(traffic.serve_requests, int(rate * SERVE_SECONDS)))


@dataclass(frozen=True)
class ServedCosts:
    """What serving runs measured for one configuration: the served costs in the layout chosen (model
    instances × intra-op threads each), the runs (every layout tried), and the simulated capacity of each
    layout (0.0: none)."""

    service: ServiceTimes
    threads: int
    instances: int
    runs: list[ServingRun]
    capacity_by_layout: dict[tuple[int, int], float]
    #: the simulated capacity in the layout chosen (None: none within the SLO), for ``traffic_fields``
    capacity: RatePoint | None = None


@dataclass(frozen=True)
class ServingRun:
    """One serving run as stored with the trial (``serving_runs``): its rate, batcher and threads, the mean
    served cost per bucket back to back and after idle (ms), and what the run said (a serving run of fewer
    requests than a P99 bound needs is not ``valid`` as a load run; its costs count all the same)."""

    qps: float
    max_batch: int
    max_wait_ms: float
    threads: int
    instances: int
    requests: int
    batches: int
    back_to_back_ms: dict[str, float]
    after_idle_ms: dict[str, float]
    p99_upper_ms: float | None
    valid: bool
    reason: str | None

    def to_dict(self) -> dict[str, object]:
        """The stored form (JSON)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Simulation:
    """How a configuration's queue is simulated (``pareto.measure.queue``): requests per replication, the
    study's seed, the confidence of the bounds, the replications and their shortest span."""

    requests: int
    seed: int
    confidence: float
    replications: int = 1
    min_span_s: float = 0.0
    settle: float = 0.0

    @classmethod
    def of(cls, traffic: Traffic, seed: int, confidence: float, *, quick: bool = False) -> Simulation:
        """The study's simulation; ``quick``: one replication, no minimum span (to choose a serving run's
        rate); both settle as the study says (``traffic.settle``)."""
        if quick:
            return cls(traffic.requests, seed, confidence, settle=traffic.settle)
        return cls(traffic.requests, seed, confidence, traffic.replications, traffic.load_min_s, traffic.settle)

    def at(self, rate: float, service: ServiceTimes, options: list[Batcher]) -> RatePoint:
        """``best_at_rate`` with these settings."""
        from pareto.measure.queue import best_at_rate

        return best_at_rate(
            rate, service, options, requests=self.requests, seed=self.seed, confidence=self.confidence,
            replications=self.replications, min_span_s=self.min_span_s, settle=self.settle,
        )  # fmt: skip

    def capacity(self, service: ServiceTimes, slo_ms: float, options: list[Batcher]) -> RatePoint | None:
        """``capacity`` with these settings."""
        from pareto.measure.queue import capacity

        return capacity(
            service, slo_ms, options, requests=self.requests, seed=self.seed, confidence=self.confidence,
            replications=self.replications, min_span_s=self.min_span_s, settle=self.settle,
        )  # fmt: skip

    def curve(self, service: ServiceTimes, options: list[Batcher], rates: list[float]) -> list[RatePoint]:
        """``traffic_curve`` with these settings."""
        from pareto.measure.queue import traffic_curve

        return traffic_curve(
            service, options, rates, requests=self.requests, seed=self.seed, confidence=self.confidence,
            replications=self.replications, min_span_s=self.min_span_s, settle=self.settle,
        )  # fmt: skip


def serve_layouts(traffic: Traffic, threads: int) -> list[tuple[int, int]]:
    """The serving layouts a configuration is served in and chosen from, as (model instances, intra-op
    threads each): every instance count (the spec's, else 1 and ``threads``) with every thread count (the
    spec's, else 1 and ``threads``) whose product fits the cores: ``threads`` or the most threads asked
    for. One thread per call leaves cores to the generator and batcher threads; more make a call faster
    alone; more instances run batches side by side where a call leaves cores idle."""
    counts = sorted(set(traffic.serve_threads)) if traffic.serve_threads else sorted({1, threads})
    instances = sorted(set(traffic.serve_instances)) if traffic.serve_instances else sorted({1, threads})
    cores = max(threads, *counts)
    found = [(i, t) for i in instances for t in counts if i * t <= cores]
    return found or [(min(instances), min(counts))]


def served_service(
    call: Callable[[int], object],
    alone: ServiceTimes,
    batch_size: int,
    traffic: Traffic,
    slo_ms: float,
    *,
    seed: int,
    confidence: float,
    device: str,
    threads: int,
) -> ServedCosts:
    """What a served batch costs, measured on the serving path in each layout of ``serve_layouts``
    (``_serve_at``), and the layout whose served costs give the highest simulated capacity (ties: fewer
    instances, then fewer threads)."""
    quick, full = (Simulation.of(traffic, seed, confidence, quick=q) for q in (True, False))
    tried: dict[tuple[int, int], tuple[ServiceTimes, list[ServingRun], float]] = {}
    points: dict[tuple[int, int], RatePoint | None] = {}
    for layout in serve_layouts(traffic, threads):
        service, runs = _serve_at(call, alone, batch_size, traffic, slo_ms, quick, device=device, layout=layout)
        point = full.capacity(service, slo_ms, batchers(batch_size, traffic, slo_ms, layout[0]))
        tried[layout], points[layout] = (service, runs, point.qps if point is not None else 0.0), point
    chosen = max(tried, key=lambda lay: (tried[lay][2], -lay[0], -lay[1]))
    return ServedCosts(
        service=tried[chosen][0],
        threads=chosen[1],
        instances=chosen[0],
        runs=[r for lay in sorted(tried) for r in tried[lay][1]],
        capacity_by_layout={lay: v[2] for lay, v in tried.items()},
        capacity=points[chosen],
    )


def _serve_at(
    call: Callable[[int], object],
    alone: ServiceTimes,
    batch_size: int,
    traffic: Traffic,
    slo_ms: float,
    sim: Simulation,
    *,
    device: str,
    layout: tuple[int, int],
) -> tuple[ServiceTimes, list[ServingRun]]:
    """``traffic.serve_runs`` short load runs in ``layout``: its model instances at its intra-op threads
    each (``pareto.measure.load``: a generator thread, the batcher threads, the model)
    with each batch's cost taken from the policy's start to its completion, back to back and after idle
    kept apart (``served_costs``). The first run is at the study's rate, each later one at the capacity
    simulated on the costs served so far (the two rates a verdict is read at), each with the batcher the
    simulation chose there; all runs' costs are pooled. A bucket no run served draws its calls timed alone
    scaled by the served/alone ratio of the buckets served.
    """
    from collections import defaultdict

    import torch

    from pareto.measure.load import load_run
    from pareto.measure.queue import poisson_arrivals

    instances, threads = layout
    options = batchers(batch_size, traffic, slo_ms, instances)
    pools: tuple[dict[int, list[np.ndarray]], dict[int, list[np.ndarray]]] = (defaultdict(list), defaultdict(list))
    service, rows = alone, []
    assert traffic.qps is not None
    for k in range(traffic.serve_runs):
        if k == 0:  # the study's rate, with the batcher the simulation chooses there
            point: RatePoint | None = sim.at(traffic.qps, service, options)
        else:
            point = sim.capacity(service, slo_ms, options)
        rate = point.qps if point is not None else 0.5 * service.saturation_qps(batch_size) * instances
        batcher = point.batcher if point is not None else max(options, key=lambda b: b.max_wait_ms)
        arrivals = poisson_arrivals(rate, serve_requests(traffic, rate), sim.seed + k)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with timing_lock(device, what="a serving run"):
                timeout = max(10.0, 2 * arrivals[-1])
                run = load_run(call, arrivals, batcher, confidence=sim.confidence, timeout_s=timeout, warmup=0)
        except UsageError as exc:  # no request served before the timeout: this configuration cannot serve
            raise TechniqueError(f"a serving run at {rate:,.4g} requests/s served nothing: {exc}") from exc
        finally:
            torch.set_num_threads(previous)
        for pool, costs in zip(pools, run.served_costs(), strict=True):
            for bucket, values in costs.items():
                pool[bucket].append(values)
        service = _pooled(alone, pools)
        rows.append(_serving_run(rate, batcher, threads, run))
    return service, rows


def _pooled(
    alone: ServiceTimes, pools: tuple[dict[int, list[np.ndarray]], dict[int, list[np.ndarray]]]
) -> ServiceTimes:
    """Served costs per bucket (back to back; after idle), a bucket missing from one pool taking the
    other's, one missing from both taking its calls alone × the median served/alone ratio."""
    import numpy as np

    from pareto.measure.queue import ServiceTimes

    busy, idle = ({b: np.concatenate(v) for b, v in pool.items()} for pool in pools)
    served = {b: busy[b] if b in busy else idle[b] for b in alone.batches if b in busy or b in idle}
    if not served:
        return alone
    ratio = float(np.median([float(np.mean(v)) / alone.mean_s(b) for b, v in served.items()]))
    alone_samples = alone.samples()["back_to_back"]
    by_batch = {b: served.get(b, np.asarray(alone_samples[b]) * ratio) for b in alone.batches}
    after_idle = {b: idle[b] for b in alone.batches if b in idle}
    return ServiceTimes(by_batch, after_idle)


def _serving_run(rate: float, batcher: Batcher, threads: int, run: LoadRun) -> ServingRun:
    busy, idle = run.served_costs()
    return ServingRun(
        qps=rate,
        max_batch=batcher.max_batch,
        max_wait_ms=batcher.max_wait_ms,
        threads=threads,
        instances=batcher.instances,
        requests=int(run.requests.arrival_s.size),
        batches=run.batches,
        back_to_back_ms={str(b): float(v.mean() * 1e3) for b, v in busy.items()},
        after_idle_ms={str(b): float(v.mean() * 1e3) for b, v in idle.items()},
        p99_upper_ms=run.summary.p99_upper_ms,
        valid=run.valid,
        reason=run.reason,
    )


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
    served: ServedCosts | None = None,
) -> dict[str, Any]:
    """The ``Metrics`` traffic fields: the requests at the study's rate, the capacity at the SLO and the
    curve around it, each with the batcher setting that does best there (the same arrivals for every
    setting and every configuration: the study's seed). ``served``: what the serving runs found (the
    layout's instances serve the batcher, and its capacity, simulated on the same costs, is not simulated
    again); None: one instance."""
    assert traffic.qps is not None
    options = batchers(batch_size, traffic, slo_ms, served.instances if served is not None else 1)
    sim = Simulation.of(traffic, seed, confidence)
    at = sim.at(traffic.qps, service, options)
    most = served.capacity if served is not None else sim.capacity(service, slo_ms, options)
    rates = {traffic.qps, *(f * most.qps for f in CURVE_FRACTIONS)} if most is not None else {traffic.qps}
    curve = sim.curve(service, options, sorted(rates))
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
    served = (
        f"what a served batch costs, measured in {traffic.serve_runs} short load runs in each serving layout "
        f"(model instances {_listed(traffic.serve_instances)} × intra-op threads {_listed(traffic.serve_threads)}"
        " each, within the cores measured on; the layout of highest simulated capacity kept) (a generator "
        "thread and a batcher thread per instance beside the model, at most "
        f"{traffic.serve_requests} requests or {SERVE_SECONDS:g} s each, "
        "the first at the study's rate, the others at the capacity simulated so far): completion less the "
        "moment the policy could start the batch, back to back and after idle apart; "
        "a bucket no run served: its calls timed alone × the median served/alone ratio"
        if traffic.serve_runs
        else "the calls timed alone (no serving runs: the serving thread's own time and wake-ups left out)"
    )
    return (
        f"traffic: Poisson arrivals (seed {seed}), {traffic.replications} independent replications of "
        f"{traffic.requests} simulated requests per rate (the first 5 % of each left out){_settling(traffic)}, "
        "one batch at a time per instance (the instance free first takes the next), "
        f"the batcher's wait chosen from {waits}; a batch of n runs at the smallest bucket (1, 2, 4, ... the "
        f"largest batch) >= n (padded), its cost drawn from {served}; calls timed alone: {traffic.sweep_samples} "
        f"in {BUCKET_ROUNDS} rounds per smaller bucket; P99 bound: the pooled P99 + t((1 + confidence) / 2, R-1) × the "
        "replications' P99 standard deviation / √R (never below the pooled order statistic's); capacity: "
        "bisection on the rate to 2 %, simulated, not load-run"
    )


def _listed(counts: list[int] | None) -> str:
    return ", ".join(map(str, sorted(set(counts)))) if counts else "1 and the measurement's threads"


def _settling(traffic: Traffic) -> str:
    from pareto.measure.queue import MAX_SETTLE_REQUESTS, settled_fraction

    if not traffic.settle:
        return ""
    return (
        f", more where the queue needs them to settle ({traffic.settle:g} / (1 − √ρ)² at load ρ, the rate over "
        f"saturation; a rate needing over {MAX_SETTLE_REQUESTS:,}, above ρ {settled_fraction(traffic.settle):.2f}, "
        "is not settled and counts as a miss)"
    )
