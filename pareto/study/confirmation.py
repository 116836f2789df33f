"""Confirmation: re-measure the best configurations in interleaved rounds with the baseline.

A search measures each configuration once, at one moment; on a shared machine that moment may have
been lucky. Confirmation rebuilds the feasible and near-feasible frontier configurations and the
uncompressed baseline, and times them together in one process, in rounds whose order is random each
time (randomized multiple interleaved trials, Abedi & Brecht, ICPE 2017), so a slow spell of the
machine hits them alike and the speedups compare like with like. The pick then rests on the
confirmed measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pareto.compress import Config, why_not_here
from pareto.errors import MachineBusy, NoFeasibleConfiguration, UsageError
from pareto.front import DEFAULT_OBJECTIVE_NAMES, Candidate, frontier, objective_metrics, select_best
from pareto.limits import Constraints, constraint_gaps, p99_verdict
from pareto.locks import gpu_work
from pareto.metrics import Metrics
from pareto.slo import P99_BOUND_METRIC
from pareto.store import storage
from pareto.store.reads import Reader, reading
from pareto.store.records import StudyRecord
from pareto.study.bench import (
    Bench,
    RunHandle,
    baseline_trial,
    finish_run,
    guard_summary,
    start_run,
    store_measurement,
    stored_metrics,
    time_beside,
)

if TYPE_CHECKING:
    from pareto.measure.latency import LatencyResult, Timed


@dataclass
class ConfirmedItem:
    """One configuration before and after confirmation (``after`` is None when the machine was busy)."""

    trial: int
    description: str
    is_baseline: bool
    before: dict[str, Any]
    after: dict[str, Any] | None
    verdict_before: str | None
    verdict_after: str | None
    busy_reason: str | None = None


@dataclass
class ConfirmResult:
    study: str
    run: int | None  # the first pass's run; ``runs`` lists every pass
    environment: str
    runs: list[int] = field(default_factory=list)
    items: list[ConfirmedItem] = field(default_factory=list)
    guard: str = ""
    note: str | None = None
    #: the reference workload timed in the same rounds (``confirm(..., reference=)``): its latency
    #: view, with ``busy``; None when none was timed
    reference: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "run": self.run,
            "runs": self.runs,
            "environment": {"key": self.environment},
            "guard": self.guard,
            "note": self.note,
            "items": [item.__dict__ for item in self.items],
            "reference": self.reference,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConfirmResult:
        """The result ``to_dict`` wrote."""
        return cls(
            study=data["study"],
            run=data["run"],
            environment=data["environment"]["key"],
            runs=list(data["runs"]),
            items=[ConfirmedItem(**item) for item in data["items"]],
            guard=data["guard"],
            note=data["note"],
            reference=data.get("reference"),
        )


#: After the first pass, the pick is confirmed in at most this many further passes when the first
#: pass changed it to a configuration that was not confirmed (a confirmed bound that widened can
#: let a configuration it dominated become the pick).
EXTRA_PASSES = 2


def choose(
    candidates: list[Candidate], constraints: Constraints, objectives: list[str], *, top: int, margin: float
) -> list[Candidate]:
    """The configurations worth confirming, in the order the pick is made: every limit other than the
    P99 met and the P99 upper bound within ``margin`` times the SLO, highest accuracy first, then the
    lowest bound. Without a P99 SLO: the frontier, highest accuracy first."""
    pool = candidates if constraints.p99_ms is not None else frontier(candidates, objective_metrics(objectives))
    chosen = []
    for c in pool:
        gaps = constraint_gaps(c.metrics, constraints)
        if any(gap > 0 for name, gap in gaps.items() if name != "p99_ms"):
            continue
        bound = c.metrics.get(P99_BOUND_METRIC)
        alone = constraints.p99_ms is not None and constraints.qps is None  # at a rate: its capacity judged above
        if alone and (bound is None or bound > margin * (constraints.p99_ms or 0.0)):
            continue
        chosen.append(c)
    chosen.sort(key=lambda c: (-c.metrics["accuracy"], _bound_or_inf(c.metrics), c.trial))
    return chosen[:top]


def _bound_or_inf(metrics: dict[str, Any]) -> float:
    bound = metrics.get(P99_BOUND_METRIC)
    return float("inf") if bound is None else float(bound)


#: Metrics that belong to the machine a measurement was taken on, not to the configuration: dropped
#: when a configuration measured in another environment is re-measured here (the latency fields are
#: measured anew; these would mix the other machine's ceilings with this machine's times).
MACHINE_FIELDS = (
    "hardware_profile",
    "roofline_bound_ms",
    "regime",
    "achieved_fraction",
    "roofline_suspect",
    "throughput_curve",
    "saturation_batch",
    "max_batch_within_slo",
    # at a request rate: what serving runs and load runs found on the machine they ran on
    "serving_runs",
    "serve_threads",
    "serve_instances",
    "load_capacity_qps",
    "load_capacity_max_batch",
    "load_capacity_max_wait_ms",
)


def confirm(
    bench: Bench,
    study_id: int,
    picks: list[Candidate],
    constraints: Constraints,
    *,
    seed: int | None = None,
    reference: Timed | None = None,
    held: bool = False,
) -> ConfirmResult:
    """Re-measure ``picks`` and the baseline at their batch sizes in interleaved rounds; store the results.

    The run is its own: confirmed speedups divide by the baseline timed in these same rounds. A
    configuration whose rounds the contention guard gave up on is reported as busy and not stored.
    ``reference`` (the nightly's frozen workload) is timed in the same rounds and reported, not stored.
    ``held``: stored but not answered from until promoted (``pareto.store.trials.promote``: the nightly's).
    """
    from pareto.study.assess import round_plan

    with reading(bench.engine) as r:
        study = r.study_by_id(study_id)
        env = r.environment_by_id(bench.env_id)
        assert env is not None
        name, env_key = study.name, env.key
        trial_ids = r.trial_ids(study_id, [p.trial for p in picks])
    result = ConfirmResult(study=name, run=None, environment=env_key)
    if not picks:
        result.note = "nothing to confirm: no frontier configuration is feasible or near the SLO"
        return result
    entries = _entries(bench, study_id, picks, trial_ids, env_key)
    for _, pick, _, config in entries:
        why = why_not_here(config, bench.task, bench.device)
        if why is not None:
            what = f"Trial {pick.trial} ({pick.description})" if pick is not None else config.describe()
            raise UsageError(f"{what} cannot be measured here: {why}.")
    run = start_run(bench, kind="confirm", study_id=study_id)
    result.run, result.runs = run.run_id, [run.run_id]
    # the builds hold the GPU's work lock shared (the timing takes it exclusively): no other worker times meanwhile
    with gpu_work(bench.device, what=f"confirmation of study {name!r}"):
        timed, beside = time_beside(
            bench,
            [config for _, _, _, config in entries],
            [reference] if reference is not None else [],
            plan=round_plan(bench.measure, constraints.p99_ms, adaptive=False if reference is not None else None),
            probe=run.probe,
            seed=seed,
        )
    latencies = [latency for _, latency in timed]
    if beside:
        result.reference = _reference_view(beside[0])
    for (trial_id, pick, stored, config), latency in zip(entries, latencies, strict=True):
        result.items.append(_record(bench, run, (trial_id, pick, stored, config), latency, constraints, held))
    result.guard = guard_summary(latencies)
    finish_run(bench, run, confirmed=[i.trial for i in result.items if i.after is not None])
    return result


def _entries(
    bench: Bench, study_id: int, picks: list[Candidate], trial_ids: dict[int, int], here: str
) -> list[tuple[int, Candidate | None, Metrics, Config]]:
    """(trial id, the pick or None for a baseline, its stored metrics, its configuration) to time."""
    entries: list[tuple[int, Candidate | None, Metrics, Config]] = []
    for pick in picks:
        stored = Metrics.from_dict(pick.metrics)
        if pick.environment.get("key") not in (None, here):
            blank: dict[str, Any] = dict.fromkeys(MACHINE_FIELDS)
            stored = dataclasses.replace(stored, **blank)
        entries.append((trial_ids[pick.trial], pick, stored, Config.from_dict(pick.config)))
    for batch_size in sorted({p.config["batch_size"] for p in picks}):
        base_id = baseline_trial(bench, study_id, batch_size)
        if base_id is None or base_id in {e[0] for e in entries}:
            continue
        base_metrics = stored_metrics(bench, base_id)
        if base_metrics is not None:
            entries.append((base_id, None, base_metrics, Config(batch_size=batch_size)))
    return entries


def _record(
    bench: Bench,
    run: RunHandle,
    entry: tuple[int, Candidate | None, Metrics, Config],
    latency: Any,
    constraints: Constraints,
    held: bool,
) -> ConfirmedItem:
    from pareto.study.assess import remeasured

    trial_id, pick, stored, config = entry
    before = stored.to_dict()
    verdict_before = p99_verdict(before, constraints.p99_ms) if constraints.p99_ms else None
    with reading(bench.engine) as r:
        number, description = r.trial_label(trial_id)
    item = ConfirmedItem(
        number, description, pick is None or config.is_baseline, _latency_view(before), None, verdict_before, None
    )
    try:
        confirmed = remeasured(stored, latency)
    except MachineBusy as exc:
        item.busy_reason = str(exc)
        return item
    store_measurement(bench, run, trial_id, confirmed, kind="confirm", held=held)
    after = confirmed.to_dict()
    item.after = _latency_view(after)
    item.verdict_after = p99_verdict(after, constraints.p99_ms) if constraints.p99_ms else None
    return item


def _reference_view(latency: LatencyResult) -> dict[str, Any]:
    s = latency.summary
    return {
        "latency_p50_ms": s.p50_ms,
        "latency_p99_ms": s.p99_ms,
        "latency_p99_lower_ms": s.p99_lower_ms,
        "latency_p99_upper_ms": s.p99_upper_ms,
        "samples": s.samples,
        "rounds": s.rounds,
        "discarded_rounds": latency.discarded_rounds,
        "busy": latency.busy,
    }


def _latency_view(metrics: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "latency_p50_ms",
        "latency_p99_ms",
        "latency_p99_lower_ms",
        "latency_p99_upper_ms",
        "samples",
        "rounds",
        "discarded_rounds",
        "confidence",
    )
    return {k: metrics.get(k) for k in keys}


def confirm_pick(
    bench: Bench,
    study_id: int,
    load: Callable[[], list[Candidate]],
    constraints: Constraints,
    objectives: list[str],
    *,
    top: int,
    margin: float,
    seed: int | None = None,
    held: bool = False,
) -> ConfirmResult:
    """Confirm the ``top`` configurations worth it; then, while the pick is one that was not
    confirmed (the first pass can change it), confirm the pick too, ``EXTRA_PASSES`` times at most.

    Args:
        load: Returns the study's candidates in the environment compared in, freshly from the store.
        held: Store every pass held (``confirm``); the passes' runs are in the result's ``runs``.
    """
    chosen = choose(load(), constraints, objectives, top=top, margin=margin)
    result = confirm(bench, study_id, chosen, constraints, seed=seed, held=held)
    tried = {item.trial for item in result.items}
    for _ in range(EXTRA_PASSES):
        try:
            pick = select_best(load(), constraints, study=result.study)
        except NoFeasibleConfiguration:
            break
        if pick.confirmation is not None or pick.trial in tried:
            break
        more = confirm(bench, study_id, [pick], constraints, seed=seed, held=held)
        result.items += more.items
        result.runs += more.runs
        result.guard = f"{result.guard}; then {more.guard}" if result.guard else more.guard
        tried.add(pick.trial)
    return result


def confirm_study(
    bench: Bench, study_name: str, constraints: Constraints, *, top: int, margin: float, environment: str | None = None
) -> ConfirmResult:
    """Choose the configurations of a stored study worth confirming, and confirm them on this bench."""
    with reading(bench.engine) as r:
        study = r.study(study_name)
        env = r.choose_environment(study, environment or _here(r, study, bench))
        objectives = study.spec.get("objectives") or list(DEFAULT_OBJECTIVE_NAMES)
        study_id, env_id = study.id, env.id if env is not None else None
    return confirm_pick(
        bench,
        study_id,
        lambda: load_candidates(bench, study_id, env_id),
        constraints,
        objectives,
        top=top,
        margin=margin,
    )


def load_candidates(bench: Bench, study_id: int, env_id: int | None) -> list[Candidate]:
    """A study's candidates in one environment (None: all), read afresh."""
    return storage.study_candidates(bench.engine, study_id, env_id)


def _here(r: Reader, study: StudyRecord, bench: Bench) -> str:
    """This machine's environment when the study was measured here, else the study's latest."""
    keys = [e["key"] for e in r.environments(study)]
    env = r.environment_by_id(bench.env_id)
    return env.key if env is not None and env.key in keys else "latest"
