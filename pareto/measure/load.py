"""A real load run: Poisson requests sent on a schedule to a dynamic batcher that calls the served model,
each request timed from its scheduled arrival to its batch's completion.

A generator thread issues request ``i`` at ``t0 + arrivals[i]`` (it sleeps until then; with ``spin_s``
it sleeps until shortly before and spins); one batcher thread per model instance (``Batcher.instances``)
runs the policy of ``pareto.measure.queue`` on the shared queue (a free instance takes a full batch at
once, otherwise what is queued at the oldest request's arrival + max wait or when the queue fills) and
calls ``call(bucket)``, the instances concurrently; the caller's thread waits for them all.
The numbers include what a Python server adds: thread wake-ups, the GIL, the generator's own lateness
(reported as the issue lag: a request is timed from its scheduled arrival, so a late generator can only
add to its latency). LoadGen's rule decides whether the run counts: the queue did not grow (the system
kept up with the offered rate), and enough requests were timed for the one-sided P99 bound.
"""

from __future__ import annotations

import gc
import heapq
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pareto.errors import UsageError
from pareto.measure.queue import Batcher, Requests, RequestSummary, buckets, summarize_requests
from pareto.slo import min_samples_for_upper_bound

__all__ = ["LoadRun", "fixed_time_call", "load_run", "served_costs"]

#: By default the generator sleeps until each arrival and does not spin: a sleep overshoots by 0.05-0.2 ms
#: (counted: a request is timed from its scheduled arrival), where a spinning generator takes a core from
#: the model (on 2 vCPUs at 3 000 requests/s the demo pick's P99 was 30 ms with a 0.5 ms spin, 8 ms
#: without). A stub model, which needs no core, can be sent an exact schedule with ``spin_s``.
DEFAULT_SPIN_S = 0.0
#: The stub model sleeps its service time less this much, then spins.
STUB_SPIN_S = 0.5e-3
#: Untimed calls per bucket before the schedule starts.
WARMUP_CALLS = 3
#: The run's GIL switch interval: a thread that spins gives the GIL up after this long, not Python's 5 ms.
SWITCH_INTERVAL_S = 50e-6
#: LoadGen-style limit: the backlog (last completion − last arrival) allowed, the larger of an absolute
#: floor and a share of the schedule's span.
BACKLOG_FLOOR_MS = 5.0
BACKLOG_SHARE = 0.05
#: The share of a run's first requests left out of its summary by default (the queue starting empty).
_WARMUP_SHARE = 20
#: Seconds between starting the threads and the schedule's time zero.
_LEAD_S = 5e-3


@dataclass(frozen=True)
class LoadRun:
    """One load run at one offered rate: the per-request latency summary and whether the run counts.

    ``kept_up``: the queue drained within max(5 ms, 5 % of the schedule's span) of the last arrival
    (the generator's lateness, ``issue_lag_p99_ms``, is reported and counted in every latency).
    ``valid``: kept up, not cut by the timeout, and enough requests summarized for a one-sided P99 bound.
    ``requests`` holds the completed requests' times in seconds from the schedule's zero (scheduled
    arrival, batch start, completion, batch size) and ``issue_s`` when each was issued; neither is in
    ``to_dict``.
    """

    qps: float
    batcher: Batcher
    summary: RequestSummary
    issued: int
    issue_lag_p99_ms: float
    achieved_qps: float
    backlog_ms: float
    kept_up: bool
    valid: bool
    reason: str | None
    batches: int
    elapsed_s: float
    method: str
    requests: Requests = field(repr=False, compare=False)
    issue_s: np.ndarray = field(repr=False, compare=False)

    def call_ms(self) -> dict[str, float]:
        """The mean time of a batch's call during the run, by bucket (ms): beside the same calls timed alone,
        what serving under load costs the model (the other threads, the cores they share)."""
        req = self.requests
        first = req.first_of_batches()
        spent = (req.done_s[first] - req.start_s[first]) * 1e3
        bucket = np.array([self.batcher.bucket(int(n)) for n in req.batch[first]])
        return {str(b): float(spent[bucket == b].mean()) for b in sorted(set(bucket.tolist()))}

    def served_costs(self) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """What each batch of the run cost on the serving path, in seconds by bucket: back to back, and
        after idle (see ``served_costs``)."""
        return served_costs(self.requests, self.batcher)

    def to_dict(self) -> dict[str, Any]:
        """The rate, the batcher's settings, the summary's fields and the run's checks, flat."""
        return {
            "qps": self.qps,
            "max_batch": self.batcher.max_batch,
            "max_wait_ms": self.batcher.max_wait_ms,
            "instances": self.batcher.instances,
            **self.summary.to_dict(),
            "issued": self.issued,
            "issue_lag_p99_ms": self.issue_lag_p99_ms,
            "achieved_qps": self.achieved_qps,
            "backlog_ms": self.backlog_ms,
            "kept_up": self.kept_up,
            "valid": self.valid,
            "reason": self.reason,
            "batches": self.batches,
            "call_ms": self.call_ms(),
            "elapsed_s": self.elapsed_s,
            "method": self.method,
        }


def served_costs(requests: Requests, batcher: Batcher) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Per batch of a load run, its completion less the moment the batcher's policy could have started it
    (``pareto.measure.queue.simulate``: the later of the first instance free and the earlier of its
    oldest request's arrival + max wait and the arrival that fills it; the instances' free moments
    replayed in start order), in seconds by bucket, split into batches that started back to back (an
    instance coming free decided) and after idle (the arrivals decided, the instance had waited). What the
    simulation draws is then what a batch costs when served: the call inside the run, the batcher
    thread's wake-up, the generator's, the other instances' and the GIL's share."""
    first = requests.first_of_batches()
    arrival, done, top = requests.arrival_s, requests.done_s, batcher.max_batch
    fills = np.concatenate([arrival[top - 1 :], np.full(top - 1, np.inf)])  # the arrival that fills a batch
    deadline = np.minimum(arrival[first] + batcher.max_wait_ms / 1e3, fills[first])
    free = _free_moments(done[first], batcher.instances)
    idle = deadline > free
    cost = done[first] - np.where(idle, deadline, free)
    bucket = np.array([batcher.bucket(int(n)) for n in requests.batch[first]])
    keep = cost > 0  # a clock read before the policy's moment: not a cost (never seen, kept out)
    split: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = ({}, {})
    for pool, chosen in zip(split, (~idle & keep, idle & keep), strict=True):
        for b in sorted(set(bucket[chosen].tolist())):
            pool[b] = cost[chosen & (bucket == b)]
    return split


def _free_moments(done: np.ndarray, instances: int) -> np.ndarray:
    """For batches in start order with these completions, the moment an instance was first free for each
    (-inf before every instance had run one): the previous completion with one instance."""
    if instances == 1:
        return np.concatenate([[-np.inf], done[:-1]])
    frees, moments = [-math.inf] * instances, []
    for end in done.tolist():
        moments.append(heapq.heapreplace(frees, end))
    return np.asarray(moments)


def fixed_time_call(service_s: Mapping[int, float]) -> Callable[[int], None]:
    """A stub model: a call at bucket ``b`` takes ``service_s[b]`` seconds, slept (the GIL released) but
    for the last ``STUB_SPIN_S``, which it spins on ``time.perf_counter`` so that it ends on time."""
    if not isinstance(service_s, Mapping) or not service_s:
        raise UsageError("the stub needs a mapping of bucket to service time in seconds.")
    times: dict[int, float] = {}
    for bucket, seconds in service_s.items():
        if not isinstance(bucket, int | np.integer) or isinstance(bucket, bool) or bucket < 1:
            raise UsageError(f"the stub's buckets must be integers >= 1, got {bucket!r}.")
        if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
            raise UsageError(f"bucket {bucket}'s service time must be a finite number >= 0 seconds, got {seconds!r}.")
        times[int(bucket)] = float(seconds)

    def call(bucket: int) -> None:
        seconds = times.get(bucket)
        if seconds is None:
            raise UsageError(f"the stub has no service time for bucket {bucket!r}; it has {sorted(times)}.")
        end = time.perf_counter() + seconds
        if seconds > STUB_SPIN_S:
            time.sleep(seconds - STUB_SPIN_S)
        _spin_until(end)

    return call


#: Gives the CPU (and the GIL) to another runnable thread; time.sleep(0) where there is no sched_yield.
_yield_cpu: Callable[[], object] = getattr(os, "sched_yield", lambda: time.sleep(0))


def _spin_until(deadline: float) -> None:
    """Spin on ``time.perf_counter`` until ``deadline``, yielding the CPU and the GIL on each turn (on a
    machine with few cores the other thread of the run, or another process, gets to run meanwhile)."""
    clock = time.perf_counter
    while clock() < deadline:
        _yield_cpu()


class _Run:
    """The state the generator and batcher threads share, guarded by one condition variable."""

    def __init__(
        self, call: Callable[[int], object], arrivals: list[float], batcher: Batcher, timeout_s: float | None
    ) -> None:
        self.call, self.arrivals, self.batcher = call, arrivals, batcher
        self.bucket_of = [0, *(batcher.bucket(k) for k in range(1, batcher.max_batch + 1))]
        n = len(arrivals)
        self.issue = [math.nan] * n
        self.start = [math.nan] * n
        self.done = [math.nan] * n
        self.size = [0] * n
        self.batch_of = [-1] * n
        self.queue: deque[int] = deque()
        self.cond = threading.Condition()
        self.stop = threading.Event()  # an exception in either thread: stop both
        self.issued_all = False
        self.error: BaseException | None = None
        self.batches = 0
        self.timeout_s = timeout_s
        self.spin_s = DEFAULT_SPIN_S
        self.t0 = 0.0
        self.elapsed_s = 0.0

    def generate(self) -> None:
        """Issue each request at its scheduled time: sleep until ``spin_s`` before, then spin."""
        clock, cond, queue, top = time.perf_counter, self.cond, self.queue, self.batcher.max_batch
        try:
            for i, at in enumerate(self.arrivals):
                if self.stop.is_set() or (self.timeout_s is not None and at > self.timeout_s):
                    break
                target = self.t0 + at
                rest = target - clock() - self.spin_s
                if rest > 0 and self.stop.wait(rest):
                    break
                _spin_until(target)
                now = clock()
                with cond:
                    self.issue[i] = now
                    queue.append(i)
                    if len(queue) == 1 or len(queue) >= top:
                        cond.notify()
        except BaseException as exc:
            self._fail(exc)
        finally:
            with cond:
                self.issued_all = True
                cond.notify()

    def _next_batch(self) -> list[int] | None:
        """Wait for the policy to start a batch and take its requests, stamping its start and number; None
        when the run is over. With more instances, one that leaves requests queued wakes another."""
        clock, cond, queue, top = time.perf_counter, self.cond, self.queue, self.batcher.max_batch
        wait = self.batcher.max_wait_ms / 1e3
        cutoff = math.inf if self.timeout_s is None else self.t0 + self.timeout_s
        with cond:
            while True:
                now = clock()
                if self.stop.is_set() or now >= cutoff:
                    return None
                if len(queue) >= top:
                    break
                if not queue:
                    if self.issued_all:
                        return None
                    cond.wait(None if cutoff == math.inf else cutoff - now)
                    continue
                remaining = self.t0 + self.arrivals[queue[0]] + wait - now  # from the arrival, as simulated
                if remaining <= 0:
                    break
                cond.wait(min(remaining, cutoff - now))
            batch = [queue.popleft() for _ in range(min(top, len(queue)))]
            start, number = clock(), self.batches
            self.batches += 1
            for i in batch:
                self.start[i], self.batch_of[i] = start, number
            if queue:
                cond.notify()
            return batch

    def serve(self) -> None:
        """Run batches as the policy starts them, stamping each request's batch start and completion."""
        clock, call = time.perf_counter, self.call
        try:
            while (batch := self._next_batch()) is not None:
                n = len(batch)
                call(self.bucket_of[n])
                done = clock()
                for i in batch:
                    self.done[i], self.size[i] = done, n
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.stop.set()
            self.cond.notify_all()

    def run(self) -> float:
        """Start the threads with the schedule's zero just ahead and wait for them; the wall seconds."""
        threads = [threading.Thread(target=self.generate, name="pareto-load-generator", daemon=True)] + [
            threading.Thread(target=self.serve, name=f"pareto-load-instance-{k}", daemon=True)
            for k in range(self.batcher.instances)
        ]
        started: list[threading.Thread] = []
        self.t0 = time.perf_counter() + _LEAD_S
        try:
            for thread in threads:
                thread.start()
                started.append(thread)
            for thread in started:
                thread.join()
        finally:  # interrupted while waiting (Ctrl-C): stop both threads before leaving
            if any(thread.is_alive() for thread in started):
                self._fail(RuntimeError("the load run was interrupted"))
                for thread in started:
                    thread.join()
        if self.error is not None:
            raise self.error
        return time.perf_counter() - self.t0


def _check_inputs(
    arrivals: np.ndarray, confidence: float, warmup: int | None, timeout_s: float | None
) -> tuple[np.ndarray, int]:
    times = np.asarray(arrivals, dtype=float)
    if times.ndim != 1 or times.size == 0 or not np.isfinite(times).all():
        raise UsageError("arrivals must be a non-empty 1-D array of finite times in seconds.")
    if times[0] < 0 or (np.diff(times) < 0).any() or times[-1] <= 0:
        raise UsageError("arrivals must be non-decreasing seconds from 0 that span some time (poisson_arrivals).")
    if not isinstance(confidence, int | float) or not 0.0 < confidence < 1.0:
        raise UsageError(f"confidence must be strictly between 0 and 1, got {confidence!r}.")
    skip = times.size // _WARMUP_SHARE if warmup is None else warmup
    if not isinstance(skip, int | np.integer) or isinstance(skip, bool) or not 0 <= skip < times.size:
        raise UsageError(f"warmup must be an integer in 0..{times.size - 1} (fewer than the requests), got {warmup!r}.")
    if timeout_s is not None and (not isinstance(timeout_s, int | float) or not timeout_s > 0):
        raise UsageError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}.")
    return times, int(skip)


def _warm(call: Callable[[int], object], batcher: Batcher) -> None:
    for bucket in buckets(batcher.max_batch):
        for _ in range(WARMUP_CALLS):
            call(bucket)


def _timed(
    call: Callable[[int], object], times: np.ndarray, batcher: Batcher, timeout_s: float | None, spin_s: float
) -> _Run:
    """Warm up, then run the schedule with the garbage collector off and a short GIL switch interval."""
    run = _Run(call, times.tolist(), batcher, timeout_s)
    run.spin_s = spin_s
    interval = sys.getswitchinterval()
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        _warm(call, batcher)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        run.elapsed_s = run.run()
    finally:
        sys.setswitchinterval(interval)
        if was_enabled:
            gc.enable()
    return run


def load_run(
    call: Callable[[int], object],
    arrivals: np.ndarray,
    batcher: Batcher,
    *,
    confidence: float,
    warmup: int | None = None,
    timeout_s: float | None = None,
    spin_s: float = DEFAULT_SPIN_S,
) -> LoadRun:
    """Send requests to ``call`` at the times of ``arrivals`` (seconds from 0) through ``batcher``'s policy
    and time each from its scheduled arrival to its batch's completion (``time.perf_counter``).

    ``call(bucket)`` runs one batch padded to that bucket (the caller makes the inputs beforehand; a CUDA
    caller synchronizes inside). ``WARMUP_CALLS`` untimed calls per bucket come first; the first
    ``warmup`` requests (default one in twenty) are left out of the summary. ``timeout_s`` stops the run
    that many seconds into the schedule: no request is issued and no batch started after it, and the
    run is not valid. The garbage collector is off during the run and the GIL switch interval 50 µs.
    ``spin_s``: the generator spins this long before each arrival (``DEFAULT_SPIN_S``: it sleeps only).

    Raises:
        UsageError: a malformed schedule, confidence, warmup or timeout. What ``call`` raises is raised
            again here, once both threads have stopped.
    """
    if not isinstance(batcher, Batcher):
        raise UsageError(f"batcher must be a pareto.measure.queue.Batcher, got {type(batcher).__name__}.")
    if not callable(call):
        raise UsageError("call must be a function of the bucket size that runs one batch.")
    times, skip = _check_inputs(arrivals, confidence, warmup, timeout_s)
    if not 0 <= spin_s < 0.1:
        raise UsageError(f"spin_s must be between 0 and 0.1 s, got {spin_s!r}.")
    run = _timed(call, times, batcher, timeout_s, spin_s)
    return _result(run, times, batcher, float(confidence), skip)


def _result(run: _Run, times: np.ndarray, batcher: Batcher, confidence: float, skip: int) -> LoadRun:
    """The run's per-request times, its summary and LoadGen's checks."""
    issue = np.asarray(run.issue) - run.t0
    done = np.asarray(run.done) - run.t0
    issued, completed = int(np.isfinite(issue).sum()), int(np.isfinite(done).sum())  # both a prefix (FIFO)
    if completed <= skip:
        raise UsageError(
            f"only {completed} requests completed before the timeout, none past the {skip} warm-up ones: "
            "give a longer timeout_s."
        )
    requests = Requests(
        arrival_s=times[:completed],
        start_s=np.asarray(run.start[:completed]) - run.t0,
        done_s=done[:completed],
        batch=np.asarray(run.size[:completed]),
        batch_id=np.asarray(run.batch_of[:completed]),
    )
    summary = summarize_requests(requests.latency_s, confidence=confidence, batch=requests.batch, warmup=skip)
    lag_ms = float(np.quantile(issue[:issued] - times[:issued], 0.99)) * 1e3
    backlog_ms = float(done[completed - 1] - times[issued - 1]) * 1e3
    limit_ms = max(BACKLOG_FLOOR_MS, BACKLOG_SHARE * float(times[-1] - times[0]) * 1e3)
    left = issued - completed
    kept_up = backlog_ms <= limit_ms and left == 0
    qps = times.size / float(times[-1])
    queued = int((requests.start_s > issue[issued - 1]).sum())
    reason = _reason(run, times.size, issued, left, lag_ms, qps, backlog_ms, limit_ms, queued, summary)
    return LoadRun(
        qps=qps,
        batcher=batcher,
        summary=summary,
        issued=issued,
        issue_lag_p99_ms=lag_ms,
        achieved_qps=completed / float(done[completed - 1] - times[0]),
        backlog_ms=backlog_ms,
        kept_up=kept_up,
        valid=reason is None,
        reason=reason,
        batches=run.batches,
        elapsed_s=run.elapsed_s,
        method=_method(batcher, skip, run.spin_s),
        requests=requests,
        issue_s=issue[:completed],
    )


def _reason(
    run: _Run,
    count: int,
    issued: int,
    left: int,
    lag_ms: float,
    qps: float,
    backlog_ms: float,
    limit_ms: float,
    queued: int,
    summary: RequestSummary,
) -> str | None:
    """Why the run does not count, one sentence (the first that applies), or None."""
    needed = min_samples_for_upper_bound(0.99, summary.confidence)
    if issued < count or left > 0:
        return f"stopped at the timeout ({run.timeout_s:g} s): {issued} of {count} requests issued, {left} left queued"
    if backlog_ms > limit_ms:
        return (
            f"over capacity: {queued} requests still queued at the last arrival, drained {backlog_ms:.1f} ms "
            f"later (limit {limit_ms:.1f} ms)"
        )
    if summary.requests < needed:
        return (
            f"too few requests: {summary.requests} summarized, a one-sided P99 bound at "
            f"{summary.confidence:.0%} needs {needed}"
        )
    return None


def _method(batcher: Batcher, skip: int, spin_s: float) -> str:
    issue = f"sleep, then spin the last {spin_s * 1e3:g} ms" if spin_s else "sleeping until each arrival"
    servers = (
        "a batcher thread" if batcher.instances == 1 else f"{batcher.instances} batcher threads (one per instance)"
    )
    return (
        f"a generator thread issues Poisson requests on schedule ({issue}) to {servers} "
        f"({batcher.describe()}, threading.Condition) that "
        f"calls the model at the batch's bucket; latency = completion − scheduled arrival (time.perf_counter), "
        f"so Python's thread wake-ups and the GIL are included (switch interval {SWITCH_INTERVAL_S * 1e6:g} µs, "
        f"gc off); {WARMUP_CALLS} untimed calls per bucket first, the first {skip} requests left out"
    )
