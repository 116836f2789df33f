"""The read side's transaction: one session, hidden, behind typed methods that take and give records.

``with reading(engine) as r:`` opens one transaction (as ``session_scope`` does) for a query made of
several reads (a study, its environments, a pick, the frontier's members), so that they see one state
of the database; the reads are ``pareto.store.queries``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from pareto.front import Candidate
from pareto.limits import Constraints
from pareto.store import queries
from pareto.store.engine import session_scope
from pareto.store.models import Environment, HardwareCalibration, Study, Trial
from pareto.store.records import CalibrationRecord, EnvironmentRecord, StudyRecord

if TYPE_CHECKING:
    from pareto.machine import HardwareProfile


def study_record(row: Study) -> StudyRecord:
    return StudyRecord(row.id, row.name, row.task, row.spec, row.created_at, row.updated_at)


def environment_record(row: Environment) -> EnvironmentRecord:
    return EnvironmentRecord(
        row.id, row.key, row.device, row.device_name, row.threads, row.hostname, dict(row.details or {})
    )


def calibration_record(row: HardwareCalibration) -> CalibrationRecord:
    return CalibrationRecord(
        row.id,
        dict(row.peak_flops),
        row.memory_bandwidth_bytes_per_s,
        row.suspect_reason,
        row.created_at,
        row.environment.hostname,
    )


class Reader:
    """Reads in one transaction (``reading``): studies, environments, candidates, calibrations."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def _study(self, study: StudyRecord) -> Study:
        row = self._session.get(Study, study.id)  # in the session's identity map: no statement
        assert row is not None, f"study {study.id} is not stored"
        return row

    def _environment(self, env: EnvironmentRecord | None) -> Environment | None:
        return None if env is None else self._session.get(Environment, env.id)

    def study(self, name: str | None) -> StudyRecord:
        """The study called ``name``, or the only one (``queries.get_study``, ``queries.default_study``)."""
        row = queries.get_study(self._session, name) if name else queries.default_study(self._session)
        return study_record(row)

    def study_by_id(self, study_id: int) -> StudyRecord:
        row = self._session.get(Study, study_id)
        assert row is not None, f"study {study_id} is not stored"
        return study_record(row)

    def environment_by_id(self, env_id: int | None) -> EnvironmentRecord | None:
        row = self._session.get(Environment, env_id) if env_id is not None else None
        return None if row is None else environment_record(row)

    def environments(self, study: StudyRecord) -> list[dict[str, Any]]:
        """``queries.study_environments``."""
        return queries.study_environments(self._session, self._study(study))

    def choose_environment(
        self, study: StudyRecord, choice: str | None, known: list[dict[str, Any]] | None = None
    ) -> EnvironmentRecord | None:
        """``queries.choose_environment``."""
        row = queries.choose_environment(self._session, self._study(study), choice, known)
        return None if row is None else environment_record(row)

    def candidates(
        self, study: StudyRecord, env: EnvironmentRecord | None = None, *, measurement_ids: list[int] | None = None
    ) -> list[Candidate]:
        """``queries.candidates``."""
        return queries.candidates(
            self._session, self._study(study), self._environment(env), measurement_ids=measurement_ids
        )

    def best_candidate(self, study: StudyRecord, env: EnvironmentRecord, constraints: Constraints) -> Candidate | None:
        """``queries.best_candidate``."""
        row = self._environment(env)
        assert row is not None
        return queries.best_candidate(self._session, self._study(study), row, constraints)

    def light_columns(
        self, study: StudyRecord, env: EnvironmentRecord, names: list[str]
    ) -> tuple[list[int], dict[str, Any]]:
        """``queries.light_columns``."""
        row = self._environment(env)
        assert row is not None
        return queries.light_columns(self._session, self._study(study), row, names)

    def trial_measurements(self, study: StudyRecord, number: int) -> tuple[int, list[Candidate]]:
        """``queries.trial_measurements``."""
        return queries.trial_measurements(self._session, self._study(study), number)

    def study_summaries(self) -> list[dict[str, Any]]:
        """``queries.study_summaries``."""
        return queries.study_summaries(self._session)

    def nightly_history(self, study: StudyRecord) -> list[dict[str, Any]]:
        """``queries.nightly_history``."""
        return queries.nightly_history(self._session, self._study(study))

    def host_calibration(self, fingerprint: dict[str, Any]) -> tuple[HardwareProfile | None, str | None]:
        """``queries.host_calibration``."""
        return queries.host_calibration(self._session, fingerprint)

    def latest_calibration(self, fingerprint: dict[str, Any]) -> CalibrationRecord | None:
        """``queries.latest_calibration``."""
        row = queries.latest_calibration(self._session, fingerprint)
        return None if row is None else calibration_record(row)

    def trial_ids(self, study_id: int, numbers: list[int]) -> dict[int, int]:
        """The ids of the study's trials with Optuna's ``numbers``, by number."""
        rows = self._session.query(Trial).filter(Trial.study_id == study_id, Trial.optuna_number.in_(numbers))
        return {t.optuna_number: t.id for t in rows}

    def trial_label(self, trial_id: int) -> tuple[int, str]:
        """A stored trial's Optuna number and description."""
        row = self._session.get(Trial, trial_id)
        assert row is not None
        return row.optuna_number, row.description

    def probe_quiet_ms(self, environment_key: str) -> float | None:
        """``queries.probe_quiet_ms``."""
        return queries.probe_quiet_ms(self._session, environment_key)


@contextmanager
def reading(engine: Engine) -> Iterator[Reader]:
    """One transaction of reads (committed, or rolled back on an error, as ``session_scope``)."""
    with session_scope(engine) as session:
        yield Reader(session)
