"""Latency under traffic: a seeded simulation of a dynamic batcher fed by Poisson arrivals, the capacity
within a P99 SLO, and the M/D/1 yardsticks the simulation is checked against.

The batcher policy (the same in ``pareto.measure.load``): ``instances`` servers (model instances, one
batch each at a time) share one queue; when one is free and at least ``max_batch`` requests are queued,
a batch of ``max_batch`` starts on it at once; otherwise everything queued (at most ``max_batch``)
starts at the earliest of the oldest request's arrival + ``max_wait`` and the moment the queue reaches
``max_batch``, but not before an instance is free (the one free first takes it; Triton's dynamic
batcher with an instance group). A batch of n runs at its bucket (the smallest of
``buckets(max_batch)`` >= n, inputs padded, as static-shape servers do), taking a measured cost at that
bucket, resampled (bootstrap): what a batch cost on the serving path, drawn from the after-idle pool
when the instance had been waiting for arrivals, else from the back-to-back pool. A request's latency
is its batch's completion minus its arrival. A rate's P99 bound comes from independent replications
(``pool_replications``).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from decimal import Decimal, localcontext
from typing import Any

import numpy as np

from pareto.errors import UsageError
from pareto.measure.stats import order_statistic_bounds
from pareto.slo import within

__all__ = [
    "Batcher",
    "RatePoint",
    "RequestSummary",
    "Requests",
    "ServiceTimes",
    "batchers_for",
    "best_at_rate",
    "buckets",
    "capacity",
    "md1_mean_wait_s",
    "md1_wait_quantile_s",
    "poisson_arrivals",
    "pool_replications",
    "replica_seed",
    "settle_requests",
    "settled_fraction",
    "simulate",
    "summarize_requests",
    "traffic_curve",
]

#: Mixed into the seed of the service draws, so that they are independent of ``poisson_arrivals``
#: called with the same seed (the two would otherwise read the same PCG64 stream).
_SERVICE_STREAM = 0x5E2F1CE
#: The low end of the capacity bisection, as a fraction of the saturation rate.
_LOW_FRACTION = 0.01
#: The share of a run's first requests left out of its summary (the queue starting empty).
_WARMUP_SHARE = 20
#: The most model instances one batcher feeds.
MAX_INSTANCES = 64
#: The most simulated requests one replication may need to settle; a rate needing more is not settled.
MAX_SETTLE_REQUESTS = 40_000


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int) -> int:
    if not _is_int(value) or int(value) < low:  # type: ignore[call-overload]
        raise UsageError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)  # type: ignore[call-overload]


def _check_positive(name: str, value: object, *, zero: bool = False) -> float:
    if not isinstance(value, int | float | np.integer | np.floating) or isinstance(value, bool):
        raise UsageError(f"{name} must be a number, got {value!r}.")
    number = float(value)
    if not math.isfinite(number) or number < 0.0 or (number == 0.0 and not zero):
        raise UsageError(f"{name} must be a finite number {'>=' if zero else '>'} 0, got {value!r}.")
    return number


def _check_confidence(confidence: float) -> float:
    if not isinstance(confidence, int | float) or not 0.0 < confidence < 1.0:
        raise UsageError(f"confidence must be strictly between 0 and 1, got {confidence!r}.")
    return float(confidence)


def buckets(max_batch: int) -> list[int]:
    """The batch sizes a server with this max batch is compiled for: powers of two below it, then it."""
    top = _check_int("max_batch", max_batch, 1)
    sizes = []
    size = 1
    while size < top:
        sizes.append(size)
        size *= 2
    return [*sizes, top]


@dataclass(frozen=True)
class Batcher:
    """A dynamic batcher's settings: the largest batch, how long the oldest request may wait, and how many
    model instances take batches from its queue concurrently (1: one batch at a time)."""

    max_batch: int
    max_wait_ms: float
    instances: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_batch", _check_int("max_batch", self.max_batch, 1))
        object.__setattr__(self, "max_wait_ms", _check_positive("max_wait_ms", self.max_wait_ms, zero=True))
        object.__setattr__(self, "instances", _check_int("instances", self.instances, 1))
        if self.instances > MAX_INSTANCES:
            raise UsageError(f"instances must be at most {MAX_INSTANCES}, got {self.instances}.")

    def bucket(self, n: int) -> int:
        """The smallest bucket that holds a batch of ``n`` requests (``n`` in 1..max_batch)."""
        if not _is_int(n) or not 1 <= n <= self.max_batch:
            raise UsageError(f"a batch of {n!r} requests is outside 1..{self.max_batch} for {self.describe()}.")
        return next(b for b in buckets(self.max_batch) if b >= n)

    def describe(self) -> str:
        """The settings in words: "max batch 8, max wait 0.5 ms" (", 2 instances" when more than one)."""
        more = f", {self.instances} instances" if self.instances > 1 else ""
        return f"max batch {self.max_batch}, max wait {self.max_wait_ms:g} ms{more}"


def poisson_arrivals(rate_per_s: float, count: int, seed: int) -> np.ndarray:
    """``count`` arrival times in seconds from 0 at ``rate_per_s``: the cumulative sum of exponential gaps
    drawn by ``numpy.random.Generator(PCG64(seed))``. The same seed gives the same gaps scaled by 1/rate."""
    rate = _check_positive("rate_per_s", rate_per_s)
    n = _check_int("count", count, 1)
    rng = np.random.Generator(np.random.PCG64(_check_int("seed", seed, 0)))
    return np.cumsum(rng.exponential(1.0 / rate, n))


class ServiceTimes:
    """What a served batch costs per bucket, in seconds; resampled (bootstrap) by the simulation.

    ``by_batch``: the cost of a batch that starts right after the previous one (the server busy, back to
    back); ``after_idle`` (optional, per bucket): the cost of one that starts on an idle server, when the
    threads had gone to sleep and must wake. A bucket without ``after_idle`` draws from ``by_batch``.
    """

    def __init__(
        self,
        by_batch: Mapping[int, Sequence[float] | np.ndarray],
        after_idle: Mapping[int, Sequence[float] | np.ndarray] | None = None,
    ) -> None:
        if not isinstance(by_batch, Mapping) or not by_batch:
            raise UsageError("service times need at least one batch size with its measured call times.")
        self._samples = _check_samples(by_batch)
        idle = _check_samples(after_idle) if after_idle else {}
        if set(idle) - set(self._samples):
            raise UsageError(f"after_idle names buckets {sorted(set(idle) - set(self._samples))} without call times.")
        self._idle = {b: idle.get(b, v) for b, v in self._samples.items()}
        #: the buckets with a pool of their own after idle (the others draw from one stream for both)
        self.idle_batches: frozenset[int] = frozenset(idle)
        self._means = {b: float(v.mean()) for b, v in self._samples.items()}
        self.batches: tuple[int, ...] = tuple(self._samples)

    @classmethod
    def fixed(cls, seconds: Mapping[int, float]) -> ServiceTimes:
        """A constant call time per bucket (stubs; with max batch 1, the M/D/1 queue)."""
        if not isinstance(seconds, Mapping):
            raise UsageError("fixed service times need a mapping of batch size to seconds.")
        return cls({b: [s] for b, s in seconds.items()})

    def mean_s(self, batch: int) -> float:
        """The mean measured call time at ``batch``."""
        if batch not in self._means:
            raise UsageError(f"batch {batch!r} was not measured; the service times hold {list(self.batches)}.")
        return self._means[batch]

    def saturation_qps(self, max_batch: int) -> float:
        """The highest request rate a server of this max batch can sustain: the largest ``b / mean_s(b)``
        over the measured buckets ``b <= max_batch``."""
        top = _check_int("max_batch", max_batch, 1)
        rates = [b / m for b, m in self._means.items() if b <= top]
        if not rates:
            raise UsageError(f"no batch size <= {top} was measured; the service times hold {list(self.batches)}.")
        return max(rates)

    def idle_mean_s(self, batch: int) -> float:
        """The mean cost of a batch at ``batch`` that starts on an idle server."""
        self.mean_s(batch)
        return float(self._idle[batch].mean())

    def _draws(self, batch: int, count: int, rng: np.random.Generator, *, idle: bool = False) -> list[float]:
        """``count`` call times at ``batch`` resampled with replacement (after idle: from that pool)."""
        values = (self._idle if idle else self._samples)[batch]
        if values.size == 1:
            return [float(values[0])] * count
        return values[rng.integers(0, values.size, count)].tolist()

    def samples(self) -> dict[str, dict[int, list[float]]]:
        """Every sample in seconds, back to back and after idle, per bucket (to store or rebuild from)."""
        return {
            "back_to_back": {b: v.tolist() for b, v in self._samples.items()},
            "after_idle": {b: v.tolist() for b, v in self._idle.items()},
        }

    def __repr__(self) -> str:
        means = ", ".join(f"{b}: {m * 1e3:.3g} ms" for b, m in self._means.items())
        return f"ServiceTimes({{{means}}})"


def _check_samples(by_batch: Mapping[int, Sequence[float] | np.ndarray]) -> dict[int, np.ndarray]:
    samples: dict[int, np.ndarray] = {}
    for batch, times in by_batch.items():
        size = _check_int("a service time's batch size", batch, 1)
        values = np.asarray(times, dtype=float).ravel()
        if values.size == 0 or not np.isfinite(values).all() or (values <= 0.0).any():
            raise UsageError(f"batch {size} needs at least one call time, each finite and > 0 seconds.")
        samples[size] = values
    return dict(sorted(samples.items()))


@dataclass(frozen=True)
class Requests:
    """Per request, in seconds: arrival, its batch's start and completion, and its batch's size; requests
    in arrival order, their batches started in that order (FIFO), completed in any (several instances)."""

    arrival_s: np.ndarray
    start_s: np.ndarray
    done_s: np.ndarray
    batch: np.ndarray
    #: the batch each request ran in, numbered in start order (None: a new start time starts a new batch)
    batch_id: np.ndarray | None = None

    def first_of_batches(self) -> np.ndarray:
        """The index of each batch's first request, in start order."""
        if self.batch_id is not None:
            return np.flatnonzero(np.diff(np.concatenate([[-1], self.batch_id])) != 0)
        return np.flatnonzero(np.diff(np.concatenate([[-np.inf], self.start_s])) > 0)

    @property
    def latency_s(self) -> np.ndarray:
        """Completion minus arrival."""
        return self.done_s - self.arrival_s

    @property
    def wait_s(self) -> np.ndarray:
        """Batch start minus arrival."""
        return self.start_s - self.arrival_s


def _check_arrivals(arrivals: np.ndarray) -> np.ndarray:
    times = np.asarray(arrivals, dtype=float)
    if times.ndim != 1 or times.size == 0 or not np.isfinite(times).all() or (np.diff(times) < 0.0).any():
        raise UsageError("arrivals must be a non-empty 1-D array of finite, non-decreasing times in seconds.")
    return times


def simulate(arrivals: np.ndarray, service: ServiceTimes, batcher: Batcher, *, seed: int) -> Requests:
    """Run the batcher policy over ``arrivals`` (seconds), a discrete-event simulation one batch at a time.

    Each batch starts at ``max(first instance free, min(oldest arrival + max_wait, arrival that fills
    max_batch))`` on the instance free first and takes every request arrived by then (at most
    ``max_batch``); its service time is drawn for its bucket from ``service`` (bootstrap, pre-drawn per
    bucket with a generator seeded by ``seed``).
    """
    times = _check_arrivals(arrivals)
    sizes = buckets(batcher.max_batch)
    missing = [b for b in sizes if b not in service.batches]
    if missing:
        raise UsageError(
            f"{batcher.describe()} runs batches at bucket {missing[0]}, which the service times lack "
            f"(they hold {list(service.batches)}); measure every bucket of {sizes}."
        )
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_check_int("seed", seed, 0), _SERVICE_STREAM])))
    n, top, wait = times.size, batcher.max_batch, batcher.max_wait_ms / 1e3
    most = {b: n // (low + 1) + 1 for low, b in zip([0, *sizes], sizes, strict=False)}  # batches at a bucket
    busy = {b: iter(service._draws(b, c, rng)) for b, c in most.items()}
    idle = {
        b: iter(service._draws(b, c, rng, idle=True)) if b in service.idle_batches else busy[b] for b, c in most.items()
    }
    draw_of = [
        (busy[batcher.bucket(k)], idle[batcher.bucket(k)]) if k else (iter(()), iter(())) for k in range(top + 1)
    ]
    ends, starts, dones = _run(times.tolist(), top, wait, draw_of, batcher.instances)
    counts = np.diff(np.asarray([0, *ends]))
    return Requests(
        arrival_s=times,
        start_s=np.repeat(np.asarray(starts), counts),
        done_s=np.repeat(np.asarray(dones), counts),
        batch=np.repeat(counts, counts),
        batch_id=np.repeat(np.arange(counts.size), counts),
    )


def _run(
    arrival: list[float],
    top: int,
    wait: float,
    draw_of: list[tuple[Iterator[float], Iterator[float]]],
    instances: int = 1,
) -> tuple[list[int], list[float], list[float]]:
    """The event loop: per batch, the index after its last request, its start and its completion.

    ``draw_of[n]``: the cost draws of a batch of n, back to back and after idle (a batch whose start
    the arrivals decide, the instance having waited for them). ``instances``: the servers, a min-heap of
    the moments each is free (the first free takes the next batch).

    ``arrival`` is padded with ``top`` infinite arrivals, so that the request that would fill a batch
    always exists (it never fills one when infinite) and no index is clipped.
    """
    n = len(arrival)
    arrival = arrival + [math.inf] * top
    ends: list[int] = []
    starts: list[float] = []
    dones: list[float] = []
    end, start_at, done_at, cut = ends.append, starts.append, dones.append, bisect.bisect_right
    frees = [0.0] * instances
    swap = heapq.heapreplace
    free, i = 0.0, 0
    while i < n:
        last = i + top
        deadline = arrival[i] + wait
        full = arrival[last - 1]
        if full < deadline:
            deadline = full
        idle = deadline > free
        start = deadline if idle else free
        i2 = cut(arrival, start, i, last)
        done = start + next(draw_of[i2 - i][idle])
        if instances == 1:
            free = done
        else:
            swap(frees, done)
            free = frees[0]
        end(i2)
        start_at(start)
        done_at(done)
        i = i2
    return ends, starts, dones


@dataclass(frozen=True)
class RequestSummary:
    """Per-request latency in milliseconds; ``p99_upper_ms`` is the one-sided order-statistic upper bound
    at ``confidence`` (None when too few requests bound it); ``mean_batch`` the mean size of the batch a
    request ran in (0 when not given)."""

    requests: int
    mean_ms: float
    p50_ms: float
    p99_ms: float
    p99_upper_ms: float | None
    confidence: float
    mean_batch: float
    #: independent replications pooled (each its own arrivals and draws); 1: one run
    replications: int = 1
    #: the standard deviation of the replications' P99s (None with one replication)
    p99_spread_ms: float | None = None
    #: False: the queue at this rate could not settle within ``MAX_SETTLE_REQUESTS`` per replication (see
    #: ``settle_requests``); the figures are one short run's, with no bound
    settled: bool = True

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain values."""
        return asdict(self)


def summarize_requests(
    latency_s: np.ndarray, *, confidence: float, batch: np.ndarray | None = None, warmup: int = 0
) -> RequestSummary:
    """Mean, P50 and P99 of per-request latencies (seconds) with the P99's upper bound
    (``order_statistic_bounds``), leaving out the first ``warmup`` requests (the queue starting empty)."""
    level = _check_confidence(confidence)
    skip = _check_int("warmup", warmup, 0)
    values = np.asarray(latency_s, dtype=float).ravel()
    if values.size <= skip or not np.isfinite(values).all():
        raise UsageError(f"a summary needs finite latencies and more than warmup={skip} requests, got {values.size}.")
    kept = values[skip:] * 1e3
    sizes = None if batch is None else np.asarray(batch, dtype=float).ravel()
    if sizes is not None and sizes.size != values.size:
        raise UsageError(f"batch has {sizes.size} entries for {values.size} latencies; give one per request.")
    p99 = order_statistic_bounds(kept, 0.99, level)
    return RequestSummary(
        requests=int(kept.size),
        mean_ms=float(kept.mean()),
        p50_ms=float(np.quantile(kept, 0.5, method="inverted_cdf")),
        p99_ms=p99.value,
        p99_upper_ms=p99.upper if math.isfinite(p99.upper) else None,
        confidence=level,
        mean_batch=float(sizes[skip:].mean()) if sizes is not None else 0.0,
    )


def replica_seed(seed: int, replica: int) -> int:
    """The seed of replication ``replica`` of a study seeded ``seed``: ``seed`` itself for the first (one
    replication is the run it always was), an independent stream (``numpy.random.SeedSequence``) after."""
    base = _check_int("seed", seed, 0)
    if _check_int("replica", replica, 0) == 0:
        return base
    return int(np.random.SeedSequence([base, replica]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def pool_replications(summaries: Sequence[RequestSummary], latency_ms: Sequence[np.ndarray]) -> RequestSummary:
    """Independent replications as one summary: P50 and P99 of the pooled requests, and the P99's upper
    bound from the replications (Law & Kelton's method of independent replications): the upper end of
    the two-sided t interval at ``confidence``, the pooled P99 + ``t((1 + confidence) / 2, R - 1) · s /
    √R``, ``s`` the standard deviation of the replications' P99s; never below the pooled order-statistic
    bound. Requests in one batch share their completion and queue waits are correlated over a busy
    period, so the order statistic alone (which takes requests as independent) is too tight near
    capacity; replications are independent whatever happens inside each. A replication's P99 is skewed
    (a rare long busy period lifts it), so the one-sided t quantile covered a batched queue's true P99 in
    97 % of 400 seeds at a stated 99 %; the two-sided interval's upper end in 98.5 %."""
    from scipy.stats import t as student_t

    if len(summaries) != len(latency_ms) or not summaries:
        raise UsageError("give one summary and one array of kept latencies per replication.")
    if len(summaries) == 1:
        return summaries[0]
    level = summaries[0].confidence
    pooled = np.concatenate([np.asarray(v, dtype=float) for v in latency_ms])
    p99 = order_statistic_bounds(pooled, 0.99, level)
    each = np.array([s.p99_ms for s in summaries])
    r = each.size
    spread = float(each.std(ddof=1))
    upper: float | None = None  # too few requests for the order statistic: no bound, as with one run
    if math.isfinite(p99.upper):
        upper = max(p99.value + float(student_t.ppf((1 + level) / 2, r - 1)) * spread / math.sqrt(r), p99.upper)
    return RequestSummary(
        requests=int(pooled.size),
        mean_ms=float(pooled.mean()),
        p50_ms=float(np.quantile(pooled, 0.5, method="inverted_cdf")),
        p99_ms=p99.value,
        p99_upper_ms=upper,
        confidence=level,
        mean_batch=float(np.mean([s.mean_batch for s in summaries])),
        replications=r,
        p99_spread_ms=spread,
    )


@dataclass(frozen=True)
class RatePoint:
    """One arrival rate: the batcher chosen for it and what its requests saw."""

    qps: float
    batcher: Batcher
    summary: RequestSummary

    def to_dict(self) -> dict[str, Any]:
        """The rate, the batcher's settings and the summary's latencies, flat."""
        s = self.summary
        return {
            "qps": self.qps,
            "max_batch": self.batcher.max_batch,
            "max_wait_ms": self.batcher.max_wait_ms,
            **({"instances": self.batcher.instances} if self.batcher.instances > 1 else {}),
            "p50_ms": s.p50_ms,
            "p99_ms": s.p99_ms,
            "p99_upper_ms": s.p99_upper_ms,
            "mean_batch": s.mean_batch,
            "requests": s.requests,
            "replications": s.replications,
            "p99_spread_ms": s.p99_spread_ms,
            **({} if s.settled else {"settled": False}),
        }


def _rank(point: RatePoint) -> tuple[float, float, int, float, int]:
    upper = point.summary.p99_upper_ms
    return (
        math.inf if upper is None else upper,
        point.summary.p99_ms,
        point.batcher.max_batch,
        point.batcher.max_wait_ms,
        point.batcher.instances,
    )


def _check_batchers(batchers: Sequence[Batcher]) -> list[Batcher]:
    chosen = list(batchers)
    if not chosen or not all(isinstance(b, Batcher) for b in chosen):
        raise UsageError("give at least one Batcher to compare.")
    return chosen


def settle_requests(rate_per_s: float, service: ServiceTimes, batcher: Batcher, settle: float) -> int | None:
    """The requests one replication at ``rate_per_s`` needs for its queue to settle: ``settle`` /
    (1 − √ρ)², ρ the rate over the batcher's saturation rate (its instances each serving full batches
    back to back; the relaxation time of a queue at load ρ grows as 1/(1 − √ρ)², Whitt 1989); None when
    that is over ``MAX_SETTLE_REQUESTS`` (ρ ≥ 1 included); 0 when ``settle`` is 0 (no rule).

    With ``settle`` 300, six replications' P99 bound covered a batched queue's true P99 in 98–99 % of
    200 seeds at loads 0.5 to 0.9 (``benchmarks/queue_bound.py --settle``); at 100, 96 % near 0.9."""
    if not settle:
        return 0
    rho = rate_per_s / (service.saturation_qps(batcher.max_batch) * batcher.instances)
    if rho >= 1.0:
        return None
    needed = math.ceil(settle / (1.0 - math.sqrt(rho)) ** 2)
    return needed if needed <= MAX_SETTLE_REQUESTS else None


def settled_fraction(settle: float) -> float:
    """The highest load ρ (rate over saturation) whose queue settles within ``MAX_SETTLE_REQUESTS``."""
    return (1.0 - math.sqrt(settle / MAX_SETTLE_REQUESTS)) ** 2 if settle else 1.0


def best_at_rate(
    rate_per_s: float,
    service: ServiceTimes,
    batchers: Sequence[Batcher],
    *,
    requests: int,
    seed: int,
    confidence: float,
    replications: int = 1,
    min_span_s: float = 0.0,
    settle: float = 0.0,
) -> RatePoint:
    """Simulate every batcher on the same Poisson arrivals and service draws (common random numbers) and
    keep the one with the lowest P99 upper bound (None counts as +inf); ties go to the lower P99, then
    the smaller max batch, then the shorter wait, then fewer instances. The first ``requests // 20``
    requests are left out.
    With ``replications`` > 1 each batcher runs that many independent replications of ``requests``
    (``replica_seed``), pooled by ``pool_replications``. ``min_span_s``: each replication holds at least
    that many seconds of arrivals (more requests at a high rate), as long as a load run's schedule: near
    capacity a queue's P99 grows with the span observed, so a short run would flatter it. ``settle``:
    each replication holds at least ``settle_requests`` (a queue near capacity needs long runs for its
    P99 to settle); a rate no batcher settles at is one short run's figures, ``settled`` False, no bound.
    """
    chosen = _check_batchers(batchers)
    count = _check_int("replications", replications, 1)
    level = _check_confidence(confidence)
    requests = max(requests, math.ceil(_check_positive("rate_per_s", rate_per_s) * min_span_s))
    level_settle = _check_positive("settle", settle, zero=True)
    needs = {b: settle_requests(rate_per_s, service, b, level_settle) for b in chosen}
    settled = [b for b in chosen if needs[b] is not None]
    if not settled:
        return _unsettled(rate_per_s, service, chosen, requests=requests, seed=seed, confidence=level)
    requests = max(requests, *(needs[b] or 0 for b in settled))
    skip = requests // _WARMUP_SHARE
    runs: dict[Batcher, list[tuple[RequestSummary, np.ndarray]]] = {b: [] for b in settled}
    for replica in range(count):
        stream = replica_seed(seed, replica)
        arrivals = poisson_arrivals(rate_per_s, requests, stream)
        for batcher in settled:
            run = simulate(arrivals, service, batcher, seed=stream)
            summary = summarize_requests(run.latency_s, confidence=level, batch=run.batch, warmup=skip)
            runs[batcher].append((summary, run.latency_s[skip:] * 1e3))
    points = [
        RatePoint(float(rate_per_s), b, pool_replications([s for s, _ in done], [v for _, v in done]))
        for b, done in runs.items()
    ]
    return min(points, key=_rank)


def _unsettled(
    rate_per_s: float, service: ServiceTimes, batchers: list[Batcher], *, requests: int, seed: int, confidence: float
) -> RatePoint:
    """A rate too close to capacity to settle: the best batcher's P99 over one run of ``requests``, shown as
    not settled, with no bound (it counts as a miss)."""
    arrivals = poisson_arrivals(rate_per_s, requests, replica_seed(seed, 0))
    points = []
    for batcher in batchers:
        run = simulate(arrivals, service, batcher, seed=replica_seed(seed, 0))
        summary = summarize_requests(run.latency_s, confidence=confidence, batch=run.batch, warmup=requests // 20)
        points.append(RatePoint(float(rate_per_s), batcher, replace(summary, p99_upper_ms=None, settled=False)))
    return min(points, key=lambda p: (p.summary.p99_ms, *_rank(p)[2:]))


def _meets(point: RatePoint, slo_ms: float) -> bool:
    return within(point.summary.p99_upper_ms, slo_ms)


def capacity(
    service: ServiceTimes,
    slo_ms: float,
    batchers: Sequence[Batcher],
    *,
    requests: int,
    seed: int,
    confidence: float,
    rel_tol: float = 0.02,
    replications: int = 1,
    min_span_s: float = 0.0,
    settle: float = 0.0,
) -> RatePoint | None:
    """The highest arrival rate whose best P99 upper bound is within ``slo_ms``, with the batcher that
    gets there.

    Bisection on log(rate) between the highest saturation rate of the batchers (their instances each
    serving the largest bucket back to back; taken as a miss: beyond it the queue grows without bound;
    with ``settle``, the highest rate that settles, ``settled_fraction`` of it) and 1 % of it, until
    ``hi / lo - 1 <= rel_tol``; every rate is simulated with the same seed, so the same inputs give the
    same answer. None when 1 % of saturation already misses (the configuration misses the SLO even nearly
    alone).
    """
    slo = _check_positive("slo_ms", slo_ms)
    tol = _check_positive("rel_tol", rel_tol)
    chosen = _check_batchers(batchers)
    high = max(service.saturation_qps(b.max_batch) * b.instances for b in chosen)
    low = high * _LOW_FRACTION
    high *= min(1.0, settled_fraction(settle) * (1 + 1e-9))  # a miss: above it no rate settles
    at_rate = functools.partial(
        best_at_rate,
        service=service,
        batchers=chosen,
        requests=requests,
        seed=seed,
        confidence=confidence,
        settle=settle,
        replications=replications,
        min_span_s=min_span_s,
    )
    best = at_rate(low)
    if not _meets(best, slo):
        return None
    while high / low - 1.0 > tol:
        middle = math.sqrt(low * high)
        point = at_rate(middle)
        if _meets(point, slo):
            low, best = middle, point
        else:
            high = middle
    return best


def traffic_curve(
    service: ServiceTimes,
    batchers: Sequence[Batcher],
    rates: Sequence[float],
    *,
    requests: int,
    seed: int,
    confidence: float,
    replications: int = 1,
    min_span_s: float = 0.0,
    settle: float = 0.0,
) -> list[RatePoint]:
    """``best_at_rate`` at each rate, in the order given."""
    return [
        best_at_rate(
            rate,
            service,
            batchers,
            requests=requests,
            seed=seed,
            confidence=confidence,
            replications=replications,
            min_span_s=min_span_s,
            settle=settle,
        )
        for rate in rates
    ]


def batchers_for(max_batch: int, waits_ms: Sequence[float]) -> list[Batcher]:
    """Every bucket of ``max_batch`` as a max batch with every wait; max batch 1 only with wait 0 (a
    batch of one never waits for a second request)."""
    waits = list(waits_ms)
    if not waits:
        raise UsageError("give at least one max wait in milliseconds (0 for none).")
    found = [Batcher(1, 0.0)]
    for size in buckets(max_batch)[1:]:
        found += [Batcher(size, wait) for wait in waits]
    return found


def _md1_load(rate_per_s: float, service_s: float) -> tuple[float, float, float]:
    rate = _check_positive("rate_per_s", rate_per_s)
    service = _check_positive("service_s", service_s)
    rho = rate * service
    if rho >= 1.0:
        raise UsageError(f"the M/D/1 queue needs load rate × service < 1, got {rho:.4g}: it grows without bound.")
    return rate, service, rho


def md1_mean_wait_s(rate_per_s: float, service_s: float) -> float:
    """The M/D/1 mean wait in queue (Pollaczek–Khinchine): ``rho * D / (2 (1 - rho))``."""
    _, service, rho = _md1_load(rate_per_s, service_s)
    return rho * service / (2.0 * (1.0 - rho))


def _md1_wait_cdf(rate: float, service: float, t: float) -> float:
    """P(W <= t) of the M/D/1 FIFO queue (Erlang 1909, Crommelin 1932):
    ``(1 - rho) sum_{k=0}^{floor(t/D)} (lam (kD - t))^k / k! exp(-lam (kD - t))``.

    The terms alternate in sign and reach about ``exp(2 lam t)``, so they are summed in decimal
    arithmetic with enough digits for that cancellation (``2 lam t / ln 10`` plus 20).
    """
    with localcontext() as context:
        context.prec = int(2.0 * rate * t / math.log(10.0)) + 30
        lam, d, x = Decimal(rate), Decimal(service), Decimal(t)
        total, factorial = Decimal(0), Decimal(1)
        for k in range(math.floor(t / service) + 1):
            if k:
                factorial *= k
            u = lam * (k * d - x)
            total += (u**k if k else Decimal(1)) / factorial * (-u).exp()
        return float((1 - lam * d) * total)


def md1_wait_quantile_s(rate_per_s: float, service_s: float, q: float) -> float:
    """The ``q`` quantile of the M/D/1 FIFO wait in queue: the exact distribution (``_md1_wait_cdf``,
    summed in decimal arithmetic so that any load below 1 is exact) solved for ``q`` by bisection
    to 1e-9 of the service time. 0 when ``q <= 1 - rho`` (that share of requests never waits)."""
    rate, service, rho = _md1_load(rate_per_s, service_s)
    if not isinstance(q, int | float) or not 0.0 < q < 1.0:
        raise UsageError(f"q must be strictly between 0 and 1, got {q!r}.")
    if q <= 1.0 - rho:
        return 0.0
    low, high = 0.0, service
    while _md1_wait_cdf(rate, service, high) < q:
        low, high = high, 2.0 * high
    while high - low > 1e-9 * service:
        middle = 0.5 * (low + high)
        if _md1_wait_cdf(rate, service, middle) < q:
            low = middle
        else:
            high = middle
    return high
