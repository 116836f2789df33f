"""What a search run returns: its trials' outcomes, its frontier and pick, and why it stopped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pareto.front import Candidate
from pareto.limits import Constraints
from pareto.store.records import TrialState
from pareto.study.confirmation import ConfirmResult


@dataclass
class TrialOutcome:
    number: int
    state: TrialState  # COMPLETE, FAILED, DUPLICATE (a repeat, not counted), PRUNED (rejected early), BUSY
    description: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    repeat_of: int | None = None  # DUPLICATE: the trial that measured (or rejected) this configuration
    baseline: bool = False  # the uncompressed model


@dataclass
class SearchResult:
    study: str
    trials_run: int  # finished in this run: measured, duplicate, busy or failed
    measured: int  # of those, measured and stored with a measurement
    interrupted: bool
    frontier: list[Candidate]
    best: Candidate | None
    no_best_reason: str | None
    constraints: Constraints
    confirmation: ConfirmResult | None = None
    busy: int = 0  # trials the contention guard gave up on
    stopped_busy: bool = False  # the machine stayed busy: the search stopped before its trials ran
    repeats: int = 0  # proposals of a configuration measured already: answered from the database, not counted
    rejected: int = 0  # rejected early: the first round of latency missed the SLO with confidence
    sampler: str = "tpe"
    #: why the search stopped before --n-trials new configurations (nothing new left), or None
    exhausted: str | None = None
    #: workers (their numbers) that ended on an error: their share of the trials was not run
    failed_workers: list[int] = field(default_factory=list)
    #: at a request rate: the load run of the baseline at the pick's batch size (the pick's is its ``load_run``)
    baseline_load_run: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """What ``pareto search --json`` prints and a worker hands its parent (the constraints are the
        study's, not part of it)."""
        return {
            "study": self.study,
            "trials_run": self.trials_run,
            "measured": self.measured,
            "interrupted": self.interrupted,
            "frontier": [c.to_dict() for c in self.frontier],
            "best": self.best.to_dict() if self.best else None,
            "no_best_reason": self.no_best_reason,
            "busy_trials": self.busy,
            "sampler": self.sampler,
            "repeats": self.repeats,
            "rejected_early": self.rejected,
            "exhausted": self.exhausted,
            "stopped_busy": self.stopped_busy,
            "failed_workers": self.failed_workers,
            "confirmation": self.confirmation.to_dict() if self.confirmation else None,
            **({"baseline_load_run": self.baseline_load_run} if self.baseline_load_run else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], constraints: Constraints | None = None) -> SearchResult:
        """The result ``to_dict`` wrote, judged against ``constraints`` (default: none)."""
        confirmation = data.get("confirmation")
        return cls(
            study=data["study"],
            trials_run=data["trials_run"],
            measured=data["measured"],
            interrupted=data["interrupted"],
            frontier=[Candidate.from_dict(c) for c in data["frontier"]],
            best=Candidate.from_dict(data["best"]) if data.get("best") else None,
            no_best_reason=data["no_best_reason"],
            constraints=constraints or Constraints(),
            confirmation=ConfirmResult.from_dict(confirmation) if confirmation else None,
            busy=data["busy_trials"],
            stopped_busy=data["stopped_busy"],
            repeats=data["repeats"],
            rejected=data["rejected_early"],
            sampler=data["sampler"],
            exhausted=data["exhausted"],
            failed_workers=data.get("failed_workers", []),
            baseline_load_run=data.get("baseline_load_run"),
        )
