"""What a search run returns: its trials' outcomes, its frontier and pick, and why it stopped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pareto.confirmation import ConfirmResult
from pareto.frontier import Candidate, Constraints


@dataclass
class TrialOutcome:
    number: int
    state: str  # COMPLETE, FAILED, DUPLICATE (a repeat, not counted), PRUNED (rejected early), BUSY
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
