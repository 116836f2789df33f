"""Real load runs at the user's traffic after a search: the pick and its baseline served behind the
batcher, requests sent on the simulation's schedule by a generator thread (``pareto.measure.load``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from pareto.compress import Config
from pareto.devices import as_args
from pareto.errors import ParetoError, TechniqueError, UsageError
from pareto.front import select_best
from pareto.locks import timing_lock
from pareto.measure.load import load_run
from pareto.measure.queue import Batcher, buckets, poisson_arrivals
from pareto.spec import Traffic
from pareto.store import storage
from pareto.study.assess import build_served
from pareto.units import format_ms

if TYPE_CHECKING:
    from pareto.compress.served import Served
    from pareto.front import Candidate
    from pareto.limits import Constraints
    from pareto.store.records import StudyRecord
    from pareto.study.bench import Bench
    from pareto.task import Task


def served_call(served: Served, task: Task, max_batch: int, device: str) -> Callable[[int], object]:
    """One batch of the served model at a bucket, inputs made beforehand (a CUDA call synchronized)."""
    args = {bucket: as_args(task.example_input(bucket)) for bucket in buckets(max_batch)}
    module, cuda = served.module, device.startswith("cuda")

    def call(bucket: int) -> object:
        with torch.inference_mode():
            out = module(*args[bucket])
        if cuda:
            torch.cuda.synchronize(device)
        return out

    return call


class Target:
    """A stored configuration built once and served for load runs: its batch calls, its batcher settings
    (the simulation's choice at the study's rate) and where each run is stored."""

    def __init__(self, bench: Bench, candidate: Candidate, batcher: Batcher | None = None) -> None:
        config = Config.from_dict(candidate.config)
        served, _ = build_served(bench.task, config, bench.device, bench.threads)
        if served.ready is not None:
            served.ready()
        m = candidate.metrics
        self.bench, self.candidate, self.description = bench, candidate, config.describe()
        self.batcher = batcher or Batcher(max_batch=int(m["max_batch"]), max_wait_ms=float(m["max_wait_ms"]))
        self.call = served_call(served, bench.task, self.batcher.max_batch, bench.device)

    def run(self, rate: float, requests: int, *, seed: int, run_id: int | None) -> dict[str, Any]:
        """One load run at ``rate`` on the seeded Poisson schedule (the simulation's for the same seed), at
        the bench's thread count under the device's timing lock; stored, and returned as stored:
        ``LoadRun.to_dict()`` at ``rate`` (``schedule_qps``: the schedule's own)."""
        arrivals = poisson_arrivals(rate, requests, seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(self.bench.threads)
        try:
            with timing_lock(self.bench.device, what=f"load run of {self.description}"):
                result = load_run(
                    self.call,
                    arrivals,
                    self.batcher,
                    confidence=self.candidate.metrics["confidence"],
                    timeout_s=_load_timeout(arrivals),
                )
        finally:
            torch.set_num_threads(threads)
        assert self.candidate.measurement_id is not None
        data = {**result.to_dict(), "qps": rate, "schedule_qps": result.qps}
        storage.save_load_run(self.bench.engine, self.candidate.measurement_id, run_id, data)
        return data

    def capacity(
        self, slo_ms: float, low: float, high: float, *, requests: int, seed: int, rel_tol: float = 0.05
    ) -> tuple[float | None, list[dict[str, Any]]]:
        """The highest rate whose load run is valid with its request P99 bound within ``slo_ms``, by bisection
        on log(rate) between ``low`` and ``high`` (widened by halving or doubling until one meets and one
        misses, at most 4 times each): the rate (None when even the lowest tried misses) and every run."""
        runs: list[dict[str, Any]] = []

        def meets(rate: float) -> bool:
            runs.append(self.run_checked(rate, requests, seed=seed, run_id=None))
            return _meets(runs[-1], slo_ms)

        return bisect_rate(meets, low, high, rel_tol=rel_tol), runs

    def run_checked(self, rate: float, requests: int, *, seed: int, run_id: int | None) -> dict[str, Any]:
        """``run``, a model that fails under load a ``TechniqueError`` with the reason (one sentence)."""
        try:
            return self.run(rate, requests, seed=seed, run_id=run_id)
        except ParetoError:
            raise
        except Exception as exc:
            raise TechniqueError(f"{self.description} failed in a load run: {type(exc).__name__}: {exc}") from exc


def bisect_rate(
    meets: Callable[[float], bool], low: float, high: float, *, rel_tol: float, widen: int = 4
) -> float | None:
    """The highest rate ``meets`` holds, by bisection on log(rate): ``low`` is halved (at most ``widen``
    times) until it meets, each miss becoming the upper end; else ``high`` is doubled (at most ``widen``
    times) until it misses; then the two ends close to ``rel_tol``. Every rate returned was tried and
    met; None when none did. When every doubling met, the highest tried (a lower bound)."""
    missed_high = False
    for _ in range(widen + 1):
        if meets(low):
            break
        high, low, missed_high = low, low / 2, True
    else:
        return None
    if not missed_high:
        for _ in range(widen):
            if not meets(high):
                break
            low, high = high, high * 2
        else:
            return low
    while high / low - 1 > rel_tol:
        middle = (low * high) ** 0.5
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def _load_timeout(arrivals: Any) -> float:
    """The schedule's span and as much again, at least 10 s: a run still queued then is over capacity."""
    return max(10.0, 2.0 * float(arrivals[-1]))


def _meets(load: dict[str, Any], slo_ms: float) -> bool:
    upper = load.get("p99_upper_ms")
    return bool(load["valid"]) and upper is not None and upper <= slo_ms


def describe_load(load: dict[str, Any], slo_ms: float) -> str:
    """One line of a load run: its P99 bound against the SLO, or why it does not count."""
    upper = load.get("p99_upper_ms")
    bound = f"request P99 ≤ {format_ms(upper)}" if upper is not None else f"request P99 {format_ms(load['p99_ms'])}"
    if not load["valid"]:
        return f"{bound}, not valid: {load['reason'].rstrip('.')}"
    verdict = "meets" if _meets(load, slo_ms) else "misses"
    return f"{bound} in {load['requests']} requests, kept up: {verdict} {format_ms(slo_ms)}"


def confirm_at_rate(
    bench: Bench, study_id: int, traffic: Traffic, pick: Candidate, *, seed: int, run_id: int | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load runs of the pick and of the baseline at the pick's batch size, at the study's rate, each with
    the batcher settings its simulation chose there; stored, and set as the pick's ``load_run``."""
    base = next(
        (
            c
            for c in storage.study_candidates(bench.engine, study_id, bench.env_id)
            if not c.config.get("techniques")
            and "backend" not in c.config
            and c.config["batch_size"] == pick.config["batch_size"]
        ),
        None,
    )
    assert traffic.qps is not None
    load = Target(bench, pick).run_checked(traffic.qps, traffic.load_requests, seed=seed, run_id=run_id)
    pick.load_run = load
    if base is None or base.trial == pick.trial:
        return load, None
    return load, Target(bench, base).run_checked(traffic.qps, traffic.load_requests, seed=seed, run_id=run_id)


def load_study(
    bench: Bench,
    study: StudyRecord,
    constraints: Constraints,
    *,
    trial: int | None = None,
    capacity: bool = False,
    requests: int | None = None,
) -> dict[str, Any]:
    """``pareto load``: a load run of a stored configuration (trial ``trial``, else the pick under
    ``constraints``) at the rate asked, or its capacity found by load runs around the simulated one.

    Raises:
        UsageError: a study searched without a rate, no such measured trial, no simulated capacity.
        NoFeasibleConfiguration: no trial named and nothing meets the limits.
    """
    traffic = Traffic.model_validate(study.spec.get("traffic") or {}, context={"stored": True})
    if traffic.qps is None or constraints.qps is None or constraints.p99_ms is None:
        raise UsageError(
            f"Study {study.name!r} was searched one call at a time; a load run needs a study searched with --qps."
        )
    everything = storage.study_candidates(bench.engine, study.id, bench.env_id)
    if trial is None:
        candidate = select_best(everything, constraints, study=study.name)
    else:
        found = [c for c in everything if c.trial == trial]
        if not found:
            raise UsageError(f"Trial {trial} of study {study.name!r} has no measurement in this environment to serve.")
        candidate = found[0]
    seed, count, slo, m = traffic.seed, requests or traffic.load_requests, constraints.p99_ms, candidate.metrics
    head = {"study": study.name, "trial": candidate.trial, "description": candidate.description, "slo_ms": slo}
    if not capacity:
        run = Target(bench, candidate).run_checked(constraints.qps, count, seed=seed, run_id=None)
        simulated = m.get("request_p99_upper_ms") if m.get("qps") == constraints.qps else None
        return {
            **head,
            "qps": constraints.qps,
            "simulated_p99_upper_ms": simulated,
            "meets": _meets(run, slo),
            "load_run": run,
        }
    if not m.get("capacity_qps"):
        raise UsageError(f"Trial {candidate.trial} has no simulated capacity within {format_ms(slo)} to search around.")
    batcher = Batcher(max_batch=int(m["capacity_max_batch"]), max_wait_ms=float(m["capacity_max_wait_ms"]))
    simulated = float(m["capacity_qps"])
    found_qps, runs = Target(bench, candidate, batcher).capacity(
        slo, 0.8 * simulated, 1.25 * simulated, requests=count, seed=seed
    )
    return {
        **head,
        "simulated_capacity_qps": simulated,
        "load_capacity_qps": found_qps,
        "max_batch": batcher.max_batch,
        "max_wait_ms": batcher.max_wait_ms,
        "runs": runs,
    }
