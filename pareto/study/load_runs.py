"""Real load runs at the user's traffic after a search: the pick and its baseline served behind the
batcher, requests sent on the simulation's schedule by a generator thread (``pareto.measure.load``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pareto.compress import Config
from pareto.errors import MachineBusy, ParetoError, TechniqueError, UsageError
from pareto.front import select_best
from pareto.locks import gpu_work, timing_lock
from pareto.measure.load import LoadRun, load_run
from pareto.measure.queue import Batcher, poisson_arrivals, pool_replications, replica_seed
from pareto.slo import within
from pareto.spec import Traffic
from pareto.store import storage
from pareto.study.assess import build_served
from pareto.study.traffic import served_call
from pareto.units import format_ms

if TYPE_CHECKING:
    from pareto.front import Candidate
    from pareto.limits import Constraints
    from pareto.measure.probe import ContentionProbe
    from pareto.store.records import StudyRecord
    from pareto.study.bench import Bench
    from pareto.study.result import SearchResult


class Target:
    """A stored configuration built once and served for load runs: its batch calls, its batcher settings
    (those given, else the simulation's choice at the study's rate), its serving layout (the model
    instances and intra-op threads its load-run capacity was found in, else the serving runs' choice) and
    where each run is stored."""

    def __init__(
        self, bench: Bench, candidate: Candidate, batcher: Batcher | None = None, *, min_s: float = 1.0
    ) -> None:
        config = Config.from_dict(candidate.config)
        served, _ = build_served(bench.task, config, bench.device, bench.threads)
        if served.ready is not None:
            served.ready()
        m = candidate.metrics
        self.bench, self.candidate, self.description = bench, candidate, config.describe()
        self.min_s = min_s  # the shortest schedule of one run (``traffic.load_min_s``)
        self.threads = int(m.get("load_capacity_threads") or m.get("serve_threads") or bench.threads)
        self._probe: ContentionProbe | None = None  # the contention guard's, made at the first run
        instances = int(m.get("load_capacity_instances") or m.get("serve_instances") or 1)
        self.batcher = batcher or Batcher(int(m["max_batch"]), float(m["max_wait_ms"]))
        self.batcher = dataclasses.replace(self.batcher, instances=instances)
        self.call = served_call(served, bench.task, self.batcher.max_batch, bench.device)

    @property
    def layout(self) -> tuple[int, int]:
        """The serving layout the runs use: (model instances, intra-op threads each)."""
        return self.batcher.instances, self.threads

    def use_layout(self, layout: tuple[int, int]) -> None:
        """Serve the next runs in ``layout`` (the same built model, called from more batcher threads or at
        another thread count)."""
        self.batcher = dataclasses.replace(self.batcher, instances=layout[0])
        self.threads = layout[1]

    def run(
        self, rate: float, requests: int, *, seed: int, run_id: int | None, replications: int = 1
    ) -> dict[str, Any]:
        """``replications`` load runs at ``rate``, each on its own seeded Poisson schedule (the first the
        simulation's for the same seed; ``replica_seed``), at the served thread count under the device's
        timing lock, stopped at the first that does not count (over capacity: the rate misses); pooled
        (``combine_runs``), stored, and returned as stored.

        The contention guard watches them as it watches a trial's rounds: after each run its probe is read,
        and a run it finds busy is discarded and run again (on its own schedule), at most ``replications``
        times in all; ``discarded_runs`` says how many.

        Raises:
            MachineBusy: more runs were discarded than ``replications``.
        """
        count = _run_requests(rate, requests, self.min_s)
        threads = torch.get_num_threads()
        runs: list[LoadRun] = []
        discarded, replica = 0, 0
        try:
            with timing_lock(self.bench.device, what=f"load run of {self.description}"):
                while len(runs) < replications:
                    torch.set_num_threads(self.threads)
                    arrivals = poisson_arrivals(rate, count, replica_seed(seed, replica))
                    replica += 1
                    level, timeout = self.candidate.metrics["confidence"], _load_timeout(arrivals)
                    run = load_run(self.call, arrivals, self.batcher, confidence=level, timeout_s=timeout)
                    if self._busy():
                        discarded += 1
                        if discarded > replications:
                            raise MachineBusy(
                                f"the machine stayed busy: {discarded} load runs of {self.description} at "
                                f"{rate:,.4g}/s were discarded for contention"
                            )
                        continue
                    runs.append(run)
                    if not run.valid:
                        break
        finally:
            torch.set_num_threads(threads)
        assert self.candidate.measurement_id is not None
        data = {**combine_runs(runs, rate, replications), "threads": self.threads, "discarded_runs": discarded}
        storage.save_load_run(self.bench.engine, self.candidate.measurement_id, run_id, data)
        return data

    def _busy(self) -> bool:
        """The contention guard's probe, read after a run, over its limit (False when the guard is off)."""
        if self.bench.measure.contention_limit is None:
            return False
        if self._probe is None:
            self._probe = self.bench.probe()
        return self._probe is not None and self._probe.read_after_work().ratio > self._probe.limit

    def capacity(
        self,
        slo_ms: float,
        low: float,
        high: float,
        *,
        requests: int,
        seed: int,
        rel_tol: float = 0.05,
        replications: int = 1,
        run_id: int | None = None,
    ) -> tuple[float | None, list[dict[str, Any]]]:
        """The highest rate whose load run is valid with its request P99 bound within ``slo_ms``, by bisection
        on log(rate) between ``low`` and ``high`` (widened by halving or doubling until one meets and one
        misses, at most 4 times each): the rate (None when even the lowest tried misses) and every run."""
        runs: list[dict[str, Any]] = []

        def meets(rate: float) -> bool:
            runs.append(self.run_checked(rate, requests, seed=seed, run_id=run_id, replications=replications))
            return load_meets(runs[-1], slo_ms)

        return bisect_rate(meets, low, high, rel_tol=rel_tol), runs

    def run_checked(
        self, rate: float, requests: int, *, seed: int, run_id: int | None, replications: int = 1
    ) -> dict[str, Any]:
        """``run``, a model that fails under load a ``TechniqueError`` with the reason (one sentence)."""
        try:
            return self.run(rate, requests, seed=seed, run_id=run_id, replications=replications)
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


#: The longest schedule one load run may have.
MAX_RUN_S = 600.0


def _run_requests(rate: float, requests: int, min_s: float) -> int:
    """The requests of one run at ``rate``: ``requests``, more when they would span under ``min_s``
    (``traffic.load_min_s``: a run over in 0.2 s says little of a server's steady state).

    Raises:
        UsageError: the schedule would last longer than ``MAX_RUN_S``.
    """
    if not math.isfinite(rate) or rate <= 0:
        raise UsageError(f"A load run needs a finite rate above 0 requests/s, got {rate!r}.")
    span = requests / rate
    if span > MAX_RUN_S:
        raise UsageError(
            f"A load run of {requests} requests at {rate:,.4g} requests/s would last {span / 60:,.0f} minutes "
            f"(one run may last {MAX_RUN_S / 60:.0f}); ask for a higher rate or fewer requests "
            "(traffic.load_requests, or pareto load --requests)."
        )
    return max(requests, math.ceil(rate * min_s))


def combine_runs(runs: list[LoadRun], rate: float, replications: int) -> dict[str, Any]:
    """Load runs at one rate as one stored record: the pooled request summary with the P99 bound from the
    runs' spread (``pool_replications``), valid when every run counted and all ``replications`` ran; each
    run's own figures under ``runs``."""
    first = runs[0]
    data = {**first.to_dict(), "qps": rate, "schedule_qps": first.qps}
    if replications == 1:
        return data
    kept = [r.requests.latency_s[-r.summary.requests :] * 1e3 for r in runs]
    pooled = pool_replications([r.summary for r in runs], kept)
    bad = next((i for i, r in enumerate(runs) if not r.valid), None)
    calls: dict[str, list[float]] = {}
    for r in runs:
        for bucket, ms in r.call_ms().items():
            calls.setdefault(bucket, []).append(ms)
    return {
        **data,
        **pooled.to_dict(),
        "issued": sum(r.issued for r in runs),
        "issue_lag_p99_ms": max(r.issue_lag_p99_ms for r in runs),
        "achieved_qps": min(r.achieved_qps for r in runs),
        "backlog_ms": max(r.backlog_ms for r in runs),
        "kept_up": all(r.kept_up for r in runs),
        "valid": bad is None and len(runs) == replications,
        "reason": None if bad is None else f"replication {bad + 1} of {replications}: {runs[bad].reason}",
        "batches": sum(r.batches for r in runs),
        "call_ms": {b: float(np.mean(v)) for b, v in calls.items()},
        "elapsed_s": sum(r.elapsed_s for r in runs),
        "method": f"{first.method}; {replications} independent runs on their own seeded schedules, stopped at "
        "the first that did not count, the P99 bound the pooled P99 + t((1 + confidence) / 2, R-1) × the runs' P99 "
        "standard deviation / √R",
        "runs": [{k: r.to_dict()[k] for k in _RUN_KEYS} for r in runs],
    }


_RUN_KEYS = ("qps", "p50_ms", "p99_ms", "p99_upper_ms", "requests", "kept_up", "valid", "reason", "backlog_ms")


def _load_timeout(arrivals: Any) -> float:
    """The schedule's span and as much again, at least 10 s: a run still queued then is over capacity."""
    return max(10.0, 2.0 * float(arrivals[-1]))


def load_meets(load: dict[str, Any], slo_ms: float) -> bool:
    return bool(load["valid"]) and within(load.get("p99_upper_ms"), slo_ms)


def describe_load(load: dict[str, Any], slo_ms: float) -> str:
    """One line of a load run: its P99 bound against the SLO, or why it does not count."""
    upper = load.get("p99_upper_ms")
    bound = f"request P99 ≤ {format_ms(upper)}" if upper is not None else f"request P99 {format_ms(load['p99_ms'])}"
    if not load["valid"]:
        return f"{bound}, not valid: {load['reason'].rstrip('.')}"
    verdict = "meets" if load_meets(load, slo_ms) else "misses"
    runs = f" over {load['replications']} runs" if load.get("replications", 1) > 1 else ""
    return f"{bound} in {load['requests']} requests{runs}, kept up: {verdict} {format_ms(slo_ms)}"


def confirm_at_rate(
    bench: Bench, study_id: int, traffic: Traffic, pick: Candidate, *, seed: int, run_id: int | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load runs of the pick and of the baseline at the pick's batch size, at the study's rate, each with
    the batcher its load-run capacity was found with (``served_batcher``), else the one its simulation
    chose at the rate; stored, and set as the pick's ``load_run``."""
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
    rate, count, replications = traffic.qps, traffic.load_requests, traffic.load_replications
    load = Target(bench, pick, served_batcher(pick), min_s=traffic.load_min_s).run_checked(
        rate, count, seed=seed, run_id=run_id, replications=replications
    )
    pick.load_run = load
    if base is None or base.trial == pick.trial:
        return load, None
    base_target = Target(bench, base, served_batcher(base), min_s=traffic.load_min_s)
    return load, base_target.run_checked(rate, count, seed=seed, run_id=run_id, replications=replications)


def served_batcher(candidate: Candidate) -> Batcher | None:
    """The batcher settings a configuration's load-run capacity was found with (those it is served with
    from then on), None when it has none (the simulation's choice at the rate is used)."""
    m = candidate.metrics
    if m.get("load_capacity_qps") is None or m.get("load_capacity_max_batch") is None:
        return None
    instances = int(m.get("load_capacity_instances") or m.get("serve_instances") or 1)
    return Batcher(int(m["load_capacity_max_batch"]), float(m["load_capacity_max_wait_ms"]), instances)


def demote(bench: Bench, candidate: Candidate, rate: float, slo_ms: float) -> float:
    """A configuration whose load run missed ``rate``: its load-run capacity becomes the highest rate below
    ``rate`` at which its stored load runs met ``slo_ms`` (0.0 when none did), stored; returned."""
    assert candidate.measurement_id is not None
    met = storage.met_rates(bench.engine, candidate.measurement_id, slo_ms)
    below = max((r for r in met if r < rate), default=0.0)
    m = candidate.metrics
    storage.set_load_capacity(
        bench.engine,
        candidate.measurement_id,
        below,
        m.get("load_capacity_max_batch"),
        m.get("load_capacity_max_wait_ms"),
    )
    m["load_capacity_qps"] = below
    return below


def find_load_capacity(
    bench: Bench,
    candidate: Candidate,
    traffic: Traffic,
    slo_ms: float,
    *,
    requests: int | None = None,
    run_id: int | None = None,
) -> tuple[float | None, Batcher, list[dict[str, Any]]]:
    """The capacity load runs find for ``candidate`` (bisection on the rate around its simulated capacity,
    with the batcher and serving layout the simulation chose there, ``traffic.load_replications`` runs per
    rate; then the other layouts its serving runs tried challenge it: ``_challenge_layouts``), stored as
    its load-run capacity (0.0 when no rate met the SLO) with the layout that reached it: the rate (None:
    none met), the batcher (its instances the layout's), the runs.

    Raises:
        UsageError: the configuration has no simulated capacity to search around.
    """
    m = candidate.metrics
    if not m.get("capacity_qps"):
        raise UsageError(
            f"Trial {candidate.trial} has no simulated capacity within {format_ms(slo_ms)} to search around."
        )
    simulated = float(m["capacity_qps"])
    target = Target(bench, candidate, min_s=traffic.load_min_s)
    target.batcher = Batcher(int(m["capacity_max_batch"]), float(m["capacity_max_wait_ms"]))
    target.use_layout((int(m.get("serve_instances") or 1), int(m.get("serve_threads") or bench.threads)))
    plan = RunPlan(requests or traffic.load_requests, traffic.seed, traffic.load_replications, run_id)
    found, runs = target.capacity(
        slo_ms, 0.8 * simulated, 1.25 * simulated,
        requests=plan.requests, seed=plan.seed, replications=plan.replications, run_id=plan.run_id,
    )  # fmt: skip
    found = _challenge_layouts(target, slo_ms, found, simulated, runs, plan)
    batcher = target.batcher
    assert candidate.measurement_id is not None
    storage.set_load_capacity(
        bench.engine, candidate.measurement_id, found or 0.0, batcher.max_batch, batcher.max_wait_ms, target.layout
    )
    candidate.metrics.update(
        load_capacity_qps=found or 0.0,
        load_capacity_max_batch=batcher.max_batch,
        load_capacity_max_wait_ms=batcher.max_wait_ms,
        load_capacity_instances=target.layout[0],
        load_capacity_threads=target.layout[1],
    )
    return found, batcher, runs


#: A serving layout challenging the capacity found is first load-run this much above it.
CHALLENGE_STEP = 1.1


@dataclass(frozen=True)
class RunPlan:
    """How each rate is load-run: requests per run, the study's seed, runs per rate, the run they belong to."""

    requests: int
    seed: int
    replications: int
    run_id: int | None


def _challenge_layouts(
    target: Target,
    slo_ms: float,
    found: float | None,
    simulated: float,
    runs: list[dict[str, Any]],
    plan: RunPlan,
) -> float | None:
    """The load runs choose the serving layout as they choose the capacity: each other layout the trial's
    serving runs tried is load-run at ``CHALLENGE_STEP`` × the capacity found (0.4 × the simulated one
    when none was); one that meets there has its own capacity found above it (bisection) and, when higher,
    becomes ``target``'s layout. Its runs join ``runs``; the capacity of the layout kept is returned."""
    m = target.candidate.metrics
    tried = {(int(r.get("instances") or 1), int(r["threads"])) for r in m.get("serving_runs") or []}
    best = target.layout
    for layout in sorted(tried - {best}):
        target.use_layout(layout)
        higher = _capacity_above(target, slo_ms, CHALLENGE_STEP * found if found else 0.4 * simulated, runs, plan)
        if higher is not None and higher > (found or 0.0):
            found, best = higher, layout
    target.use_layout(best)
    return found


def _capacity_above(
    target: Target, slo_ms: float, start: float, runs: list[dict[str, Any]], plan: RunPlan
) -> float | None:
    """None when ``target`` misses ``start``, else the highest rate it meets from there (bisection up to
    ``CHALLENGE_STEP`` × above, widened by doubling while it meets); each rate run once, into ``runs``."""
    outcome: dict[float, bool] = {}

    def meets(rate: float) -> bool:
        if rate not in outcome:
            load = target.run_checked(
                rate, plan.requests, seed=plan.seed, run_id=plan.run_id, replications=plan.replications
            )
            runs.append(load)
            outcome[rate] = load_meets(runs[-1], slo_ms)
        return outcome[rate]

    if not meets(start):
        return None
    return bisect_rate(meets, start, CHALLENGE_STEP * start, rel_tol=0.05)


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
        replications = traffic.load_replications
        run = Target(bench, candidate, min_s=traffic.load_min_s).run_checked(
            constraints.qps, count, seed=seed, run_id=None, replications=replications
        )
        simulated = m.get("request_p99_upper_ms") if m.get("qps") == constraints.qps else None
        return {
            **head,
            "qps": constraints.qps,
            "simulated_p99_upper_ms": simulated,
            "meets": load_meets(run, slo),
            "load_run": run,
        }
    simulated = m.get("capacity_qps")
    found_qps, batcher, runs = find_load_capacity(bench, candidate, traffic, slo, requests=count)
    return {
        **head,
        "simulated_capacity_qps": simulated,
        "load_capacity_qps": found_qps,
        "max_batch": batcher.max_batch,
        "max_wait_ms": batcher.max_wait_ms,
        "instances": batcher.instances,
        "threads": candidate.metrics.get("load_capacity_threads"),
        "runs": runs,
    }


@dataclass(frozen=True)
class LoadContext:
    """What the load runs after a search work with: the bench, the study and its limits."""

    bench: Bench
    study_id: int
    study: str
    traffic: Traffic
    constraints: Constraints


def decide(
    ctx: LoadContext, make: Callable[[], SearchResult], notice: Callable[[str], None], *, run_id: int | None
) -> SearchResult:
    """At a request rate the load runs decide: while the pick has no load-run capacity (at most
    ``traffic.load_top`` of them), load runs find its capacity (stored; reads judge by it) and the pick is
    chosen again; then the pick and its baseline are load-run at the study's rate, and a pick whose run
    misses the rate is not the pick (``demote``) and the next one is tried. Without a rate, or with
    ``load_runs`` off: ``make()``."""
    traffic, slo = ctx.traffic, ctx.constraints.p99_ms or 0.0
    result = make()
    if traffic.qps is None or not traffic.load_runs:
        return result
    budget = traffic.load_top
    for _ in range(2 * traffic.load_top + 2):
        pick = result.best
        if pick is None:
            break
        if pick.metrics.get("load_capacity_qps") is None and budget > 0:
            budget -= 1
            if _find(ctx, pick, notice, run_id):
                result = make()
                continue
            budget = 0  # load runs cannot run now: the pick is still load-run at the rate below
        load, result.baseline_load_run = _at_rate(ctx, pick, notice, run_id)
        if load is None or load_meets(load, slo):
            break
        below = demote(ctx.bench, pick, traffic.qps, slo)
        notice(
            f"Trial {pick.trial} missed {traffic.qps:,.4g} requests/s in its load run, so it is not the pick: its "
            f"load-run capacity is now {below:,.4g}/s (the highest rate it met below); choosing again."
        )
        result = make()
    else:
        notice("Load runs stopped choosing again after the limit of tries: the pick was not load-run at the rate.")
    return result


def _find(ctx: LoadContext, pick: Candidate, notice: Callable[[str], None], run_id: int | None) -> bool:
    """Load runs find the capacity of ``pick`` (``find_load_capacity``), said; False when they could not run."""
    slo = ctx.constraints.p99_ms or 0.0
    simulated = pick.metrics.get("capacity_qps") or 0.0
    try:
        with gpu_work(ctx.bench.device, what=f"study {ctx.study!r}: load runs"):
            found, _, runs = find_load_capacity(ctx.bench, pick, ctx.traffic, slo, run_id=run_id)
    except (TechniqueError, MachineBusy, UsageError) as exc:  # every trial is stored: the search's answer stands
        notice(f"No load-run capacity now: {str(exc).rstrip('.')}; run 'pareto load --capacity' later.")
        return False
    said = f"{found:,.0f}/s ({found / simulated:.2f}× the simulated {simulated:,.0f}/s)" if found else "none"
    notice(f"Load-run capacity of trial {pick.trial} within {format_ms(slo)}: {said}, {len(runs)} rates run.")
    return True


def _at_rate(
    ctx: LoadContext, pick: Candidate, notice: Callable[[str], None], run_id: int | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The pick and its baseline in real load runs at the study's rate (``confirm_at_rate``), said: the
    pick's run (None when none could run now) and the baseline's."""
    traffic, slo = ctx.traffic, ctx.constraints.p99_ms or 0.0
    assert traffic.qps is not None
    try:
        with gpu_work(ctx.bench.device, what=f"study {ctx.study!r}: load runs"):
            load, base = confirm_at_rate(ctx.bench, ctx.study_id, traffic, pick, seed=traffic.seed, run_id=run_id)
    except (TechniqueError, MachineBusy, UsageError) as exc:  # every trial is stored: the search's answer stands
        notice(f"No load run now: {str(exc).rstrip('.')}; run 'pareto load' to try again.")
        return None, None
    rate = f"{traffic.qps:,.4g} requests/s"
    notice(f"Load run of the pick (trial {pick.trial}) at {rate}: {describe_load(load, slo)}.")
    if base is not None:
        notice(f"Load run of the baseline at the same batch size at {rate}: {describe_load(base, slo)}.")
    return load, base
