"""What `pareto report` shows, loaded once: the study's trials, frontier and pick in one environment,
the limits they were judged by, and the roofline ceilings; plus the helpers the page and its figures share.

Everything is read through ``pareto.api`` and ``pareto.store.queries``; nothing in the database changes.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

from pareto import api
from pareto.errors import NoFeasibleConfiguration, UsageError
from pareto.front import DEFAULT_OBJECTIVE_NAMES
from pareto.limits import Constraints, Limits, evaluate
from pareto.measure.roofline import load_profile
from pareto.store.engine import read_engine
from pareto.store.reads import reading
from pareto.tasks.source import score_name


@dataclass
class Ceilings:
    """A roofline profile's ceilings as the report draws them."""

    name: str
    peak_flops: dict[str, float]
    bandwidth: float
    origin: str  #: where the numbers come from, for the caption
    warning: str | None = None


@dataclass
class ReportData:
    """Everything the page shows, loaded once."""

    study: str
    task: str
    objectives: list[str]
    rows: list[dict[str, Any]]
    front: list[dict[str, Any]]
    constraints: Constraints
    pick: dict[str, Any] | None
    no_pick: str | None
    closest: dict[str, Any] | None
    baseline: dict[str, Any] | None
    environment: dict[str, Any] | None
    ceilings: dict[str, Ceilings | str] = field(default_factory=dict)
    #: the study's nightly runs in this environment, oldest first (``pareto history``'s rows)
    nightly: list[dict[str, Any]] = field(default_factory=list)

    @property
    def score(self) -> str:
        """What the accuracy figures are: "accuracy", "macro-F1" or "fidelity" (``score_name``)."""
        return score_name(self.task)

    @property
    def focus(self) -> dict[str, Any] | None:
        """The configuration the page is about: the pick, else the closest one."""
        return self.pick or self.closest


def escape(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too, for attributes)."""
    return html.escape(str(value), quote=True)


def trial_status(row: dict[str, Any]) -> str:
    """A trial's SLO outcome: ``meets``, ``uncertain``, ``misses`` or ``unjudged`` (no SLO set)."""
    slo = row.get("slo") or {}
    feasible = slo.get("feasible")
    if feasible is None:
        return "unjudged"
    if feasible:
        return "meets"
    return "uncertain" if slo.get("undecided_only") else "misses"


def load_data(limits: Limits, db: str | None) -> ReportData:
    """The study's trials, frontier and pick in one environment, judged by ``limits``.

    Raises:
        UsageError: ``environment="all"``; bad limits.
        NotFound: no such study.
    """

    if limits.environment == "all":
        raise UsageError("A report compares measurements within one environment; name one with --environment KEY.")
    rows = api.trials(db=db, **asdict(limits))
    summaries = api.studies(db=db)
    name = rows[0]["study"] if rows else limits.study
    summary = next((s for s in summaries if s["study"] == name), summaries[0] if len(summaries) == 1 else {})
    name = summary.get("study", name or "?")
    constraints = _constraints(rows, summary, limits)
    # the same study and environment as the trials: the frontier and the pick `pareto frontier` and `best` give
    asked = Limits.of(limits, study=name)
    by_trial = {r["trial"]: r for r in rows}
    front = [by_trial.get(r["trial"], r) for r in api.frontier(db=db, **asdict(asked))] if rows else []
    pick, no_pick, closest = None, None, None
    try:
        chosen = api.best(db=db, **asdict(asked))
        pick = by_trial.get(chosen["trial"], chosen)
    except NoFeasibleConfiguration as exc:
        no_pick = str(exc)
        if rows:  # the one the message names: the lowest distance, then the lowest trial number
            closest = by_trial[min((evaluate(r["metrics"], constraints).distance, r["trial"]) for r in rows)[1]]
    data = ReportData(
        study=name,
        task=str(summary.get("task", "?")),
        objectives=list(summary.get("objectives") or DEFAULT_OBJECTIVE_NAMES),
        rows=rows,
        front=front,
        constraints=constraints,
        pick=pick,
        no_pick=no_pick,
        closest=closest,
        baseline=_baseline(rows, pick or closest),
        environment=rows[0]["environment"] if rows else None,
    )
    data.ceilings = _ceilings(rows, db)
    if data.environment is not None:
        key = data.environment.get("key")
        data.nightly = [r for r in api.history(study=name, db=db) if r["environment"] == key]
    return data


def _constraints(rows: list[dict[str, Any]], summary: dict[str, Any], limits: Limits) -> Constraints:
    """The constraints each trial was judged by (the same on every row); with no trial, ``limits`` and
    the study's stored SLO (the study summary carries no memory budget, so only a given one counts)."""
    if rows:
        return Constraints.from_dict(rows[0]["slo"])
    return limits.constraints(summary)


def _is_baseline(row: dict[str, Any]) -> bool:
    config = row.get("config") or {}
    return not config.get("techniques") and config.get("backend", "eager") == "eager"


def _baseline(rows: list[dict[str, Any]], focus: dict[str, Any] | None) -> dict[str, Any] | None:
    """The uncompressed model at the focus's batch size (what its speedup divides by), else the first one."""
    bases = [r for r in rows if _is_baseline(r)]
    if focus is not None:
        same = [r for r in bases if r["metrics"]["batch_size"] == focus["metrics"]["batch_size"]]
        bases = same or bases
    return bases[0] if bases else None


def _ceilings(rows: list[dict[str, Any]], db: str | None) -> dict[str, Ceilings | str]:
    """Each roofline profile the trials were placed on: its ceilings, or why they cannot be drawn."""

    names = {r["metrics"].get("hardware_profile") for r in rows} - {None}
    result: dict[str, Ceilings | str] = {}
    for name in sorted(str(n) for n in names):
        if name.startswith("host-"):
            result[name] = _host_ceilings(name, rows[0]["environment"], db)
            continue
        try:
            profile = load_profile(name)
        except UsageError as exc:
            result[name] = str(exc)
            continue
        result[name] = Ceilings(
            name=profile.name,
            peak_flops=dict(profile.peak_flops),
            bandwidth=profile.memory_bandwidth_bytes_per_s,
            origin=f"datasheet profile {profile.name} ({profile.description})",
        )
    return result


def _host_ceilings(name: str, env: dict[str, Any], db: str | None) -> Ceilings | str:
    """The latest `pareto calibrate` of this environment (else of the same device, host and torch),
    read without writing; one marked suspect too, with a warning (the page says so rather than hiding
    the roof)."""
    with reading(read_engine(db)) as r:
        row = r.latest_calibration(env)
    if row is None:
        return f"profile {name} is a calibration of {env['hostname']}, and none is stored any more"
    peaks, bandwidth, suspect = row.peak_flops, row.memory_bandwidth_bytes_per_s, row.suspect_reason
    created, hostname = row.created_at, row.hostname
    when = created.strftime("%Y-%m-%d %H:%M") if created else "?"
    return Ceilings(
        name=name,
        peak_flops={str(k): float(v) for k, v in dict(peaks).items()},
        bandwidth=float(bandwidth),
        origin=f"host {hostname}'s calibration ({when} UTC; 'pareto calibrate' keeps the best of several matmul and "
        "copy sizes)",
        warning=f"that calibration is marked suspect: {suspect}" if suspect else None,
    )
