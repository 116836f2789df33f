"""A transaction that reads and writes: ``with writing(engine) as w:`` for the callers whose one
transaction interleaves their own decisions with the store's statements (a study settled against a
spec, a nightly's history entry opened or closed).

``Writer`` is a ``Reader`` (``pareto.store.reads``) with the writes those transactions make, each the
statement ``pareto.store.trials`` made for them, in the caller's order; records in, records out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine

from pareto.store import trials
from pareto.store.engine import session_scope
from pareto.store.models import NightlyRun, Study, utcnow
from pareto.store.reads import Reader, study_record
from pareto.store.records import NightlyRecord, NightStatus, StudyRecord

#: The longest study name the database holds (``pareto_studies.name``).
STUDY_NAME_LENGTH: int = Study.__table__.c.name.type.length  # type: ignore[attr-defined]


def nightly_record(row: NightlyRun) -> NightlyRecord:
    return NightlyRecord(
        row.id, row.status, row.environment_id, row.hostname, row.pid, row.pick_after, row.started_at, row.summary
    )


class Writer(Reader):
    """Reads and writes in one transaction (``writing``): a study's row, a nightly's history."""

    def study_named(self, name: str) -> StudyRecord | None:
        """``trials.study_named``."""
        row = trials.study_named(self._session, name)
        return None if row is None else study_record(row)

    def create_study(self, *, name: str, task: str, spec: dict[str, Any]) -> tuple[StudyRecord, bool]:
        """``trials.create_study_row``: the new study and True, or the one another worker created since, and False."""
        row, created = trials.create_study_row(self._session, name=name, task=task, spec=spec)
        return study_record(row), created

    def update_study(self, study: StudyRecord, spec: dict[str, Any]) -> StudyRecord:
        """The study's spec replaced by ``spec`` (its latest run's), stamped updated."""
        row = self._study(study)
        row.spec = spec
        row.updated_at = utcnow()
        return study_record(row)

    def trial_count(self, study: StudyRecord) -> int:
        """How many trials the study has stored."""
        return len(self._study(study).trials)

    def interrupt_nightlies(self, study_id: int, note: str) -> list[NightlyRecord]:
        """The study's nightlies still marked running (under its lock: each one's process died), marked
        interrupted with ``note``; as they were."""
        dead = []
        for row in trials.nightlies_marked_running(self._session, study_id):
            dead.append(nightly_record(row))
            row.status, row.finished_at = NightStatus.INTERRUPTED.value, row.finished_at or utcnow()
            row.summary = {**(row.summary or {}), "interrupted": note}
        return dead

    def last_finished_nightly(self, study_id: int) -> NightlyRecord | None:
        """``trials.last_finished_nightly``."""
        row = trials.last_finished_nightly(self._session, study_id)
        return None if row is None else nightly_record(row)

    def add_nightly(self, *, study_id: int, environment_id: int, hostname: str, pid: int) -> int:
        """A nightly's history entry, running; its id."""
        row = NightlyRun(
            study_id=study_id,
            status=NightStatus.RUNNING.value,
            environment_id=environment_id,
            hostname=hostname,
            pid=pid,
            trials_run=0,
            regressions=0,
            summary={},
        )
        self._session.add(row)
        self._session.flush()
        return row.id

    def nightly_exists(self, row_id: int) -> bool:
        """Whether the nightly history entry ``row_id`` is stored."""
        return self._session.get(NightlyRun, row_id) is not None

    def promote(self, runs: list[int]) -> int:
        """``trials.promote``: how many held measurements of ``runs`` were promoted."""
        return trials.promote(self._session, runs)

    def close_nightly(self, row_id: int, status: str, values: dict[str, Any], summary: dict[str, Any]) -> None:
        """The nightly history entry ``row_id`` (stored: ``nightly_exists``) ended with ``status``, its
        columns ``values`` and its ``summary``, stamped finished."""
        row = self._session.get(NightlyRun, row_id)
        assert row is not None
        row.status, row.finished_at = status, utcnow()
        for key, value in values.items():
            setattr(row, key, value)
        row.summary = summary


@contextmanager
def writing(engine: Engine) -> Iterator[Writer]:
    """One transaction of reads and writes (committed, or rolled back on an error, as ``session_scope``)."""
    with session_scope(engine) as session:
        yield Writer(session)
