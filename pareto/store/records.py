"""What the store hands out: frozen, typed records built from its rows, and a trial's state.

Nothing outside ``pareto/store/`` holds a session or an ORM row (as Optuna's ``BaseStorage`` hands out
frozen trials): a caller reads a record, and writes through one of the store's functions, each a
transaction of its own (``pareto.store.storage``, ``pareto.store.reads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any


class _Stored(str, Enum):
    """An enum whose values are the strings a column stores, printed as those strings."""

    def __str__(self) -> str:
        return self.value


class TrialState(_Stored):
    """A trial's state, as stored in ``pareto_trials.state`` (the values are the stored strings).

    RUNNING; COMPLETE (measured); DUPLICATE (answered from an earlier trial's measurement); FAILED (its
    ``error`` says why); BUSY (the contention guard gave up: no verdict); PRUNED (rejected early).
    """

    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    DUPLICATE = "DUPLICATE"
    FAILED = "FAILED"
    BUSY = "BUSY"
    PRUNED = "PRUNED"


class NightStatus(_Stored):
    """How a nightly ended, as stored in ``pareto_nightly_runs.status`` (the values are the stored strings).

    RUNNING (in progress, or its process died: the next nightly marks it INTERRUPTED); OK (exit 0);
    REGRESSION (the pick got slower, found again by a second pass: exit 3); NOISY (the machine too busy
    to conclude, nothing of the night answered from: exit 75); INTERRUPTED (Ctrl-C, SIGTERM or a dead
    process); FAILED (an error ended it).
    """

    RUNNING = "running"
    OK = "ok"
    REGRESSION = "regression"
    NOISY = "noisy"
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    @property
    def concluded(self) -> bool:
        """A night that ended with a verdict or none (ok, regression, noisy): its history counts."""
        return self in (NightStatus.OK, NightStatus.REGRESSION, NightStatus.NOISY)


#: The states of a trial that gave a verdict on its configuration in an environment.
VERDICT_STATES = (TrialState.COMPLETE.value, TrialState.PRUNED.value, TrialState.FAILED.value)


@dataclass(frozen=True)
class StudyRecord:
    """A stored study: its name, task and spec (the latest run's)."""

    id: int
    name: str
    task: str
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class EnvironmentRecord:
    """Where measurements were taken (``pareto.store.queries.environment_dict`` has its fields in words)."""

    id: int
    key: str
    device: str
    device_name: str
    threads: int
    hostname: str
    details: dict[str, Any]


@dataclass(frozen=True)
class NewTrial:
    """A trial's row to insert: Optuna's ``number`` of a configuration in a study and an environment."""

    study_id: int
    optuna_number: int
    config: dict[str, Any]
    config_key: str
    description: str
    is_baseline: bool
    batch_size: int
    environment_id: int | None
    state: TrialState = TrialState.RUNNING
    error: str | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class Verdict:
    """An earlier trial of the same configuration here: its number, its metrics ({} when rejected early or
    broken), the P99 lower bound that rejected it, or the reason it broke."""

    number: int
    metrics: dict[str, Any]
    p99_lower_ms: float | None
    failed: str | None = None


@dataclass(frozen=True)
class CheckRecord:
    """A stored technique check (``pareto.store.models.TechniqueCheck``)."""

    technique: str
    ok: bool
    reason: str | None
    details: dict[str, Any]


@dataclass(frozen=True)
class NightlyRecord:
    """A nightly job's history row: who ran it, when, and how it ended."""

    id: int
    status: str
    environment_id: int
    hostname: str
    pid: int
    pick_after: int | None
    started_at: datetime
    summary: dict[str, Any]


@dataclass(frozen=True)
class CalibrationRecord:
    """A stored ``pareto calibrate`` result and the host it was taken on."""

    id: int
    peak_flops: dict[str, Any]
    memory_bandwidth_bytes_per_s: float
    suspect_reason: str | None
    created_at: datetime
    hostname: str
