"""The write side's statements: studies, trials, measurements, calibrations and nightly runs.

What the search, the bench and the nightly job read and write while they run, each a function of a
session (the caller owns the transaction, as in ``queries``). ``queries`` answers the read side (the
frontier, the pick, reports); this module answers "has this configuration been measured here", "which
trial is the baseline", "start this run's row". No statement is written outside ``pareto/store/``
(and the advisory locks of ``pareto.locks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from pareto.store.models import (
    HardwareCalibration,
    Measurement,
    NightlyRun,
    ReferenceModel,
    Study,
    TechniqueCheck,
    Trial,
    utcnow,
)
from pareto.store.records import NightStatus
from pareto.store.version import wrote, wrote_nothing

#: The states of a trial that gave a verdict on its configuration in an environment.
VERDICT_STATES = ("COMPLETE", "PRUNED", "FAILED")


# --- studies -------------------------------------------------------------------------------------


def study_named(session: Session, name: str) -> Study | None:
    """The study's row, or None."""
    return session.scalars(select(Study).where(Study.name == name)).one_or_none()


def create_study_row(session: Session, *, name: str, task: str, spec: dict[str, Any]) -> tuple[Study, bool]:
    """A new study's row and True; when another worker created it since the caller looked, theirs and False."""
    try:
        with session.begin_nested():
            row = Study(name=name, task=task, spec=spec)
            session.add(row)
        return row, True
    except IntegrityError:  # created by another worker since the caller's select: use theirs
        return session.scalars(select(Study).where(Study.name == name)).one(), False


# --- trials --------------------------------------------------------------------------------------


def add_trial(session: Session, row: Trial) -> int:
    """Store a new trial row; its id."""
    session.add(row)
    session.flush()
    return row.id


def claim_trial(session: Session, row: Trial) -> int | None:
    """Store ``row`` RUNNING, the claim on its configuration here; its id, or None when another trial is
    running the same configuration in this environment (the unique index ``uq_pareto_trials_running``:
    the insert loses cleanly, nothing of it is stored). On PostgreSQL an insert beside an uncommitted
    claim waits for it to commit or roll back, so the loser never measures beside the winner."""
    row.state = "RUNNING"
    values = {c.key: getattr(row, c.key) for c in Trial.__table__.columns if getattr(row, c.key) is not None}
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert(Trial)
        .values(**values)
        .on_conflict_do_nothing(
            index_elements=["study_id", "environment_id", "config_key"], index_where=text("state = 'RUNNING'")
        )
        .returning(Trial.id)
    )
    # no savepoint: on SQLite, one that opens the transaction commits it when released
    had_written = wrote(session)
    claimed = session.execute(statement).scalar()
    if claimed is None and not had_written:  # a claim that lost stored nothing: readers' caches stay good
        wrote_nothing(session)
    return claimed


def drop_trial(session: Session, trial_id: int) -> None:
    """Delete a RUNNING trial's row before anything of it was measured (it is claimed again as another
    configuration)."""
    row = session.get(Trial, trial_id)
    if row is not None and row.state == "RUNNING":
        session.delete(row)
        session.flush()


def complete_trial(session: Session, trial_id: int, measurement: Measurement) -> bool:
    """The trial COMPLETE and its measurement stored, in the caller's one transaction; False (and nothing
    written) when the trial is no longer RUNNING: a worker taken for dead (its trial failed and retried by
    another) never turns FAILED back into COMPLETE."""
    done = session.execute(
        update(Trial)
        .where(Trial.id == trial_id, Trial.state == "RUNNING")
        .values(state="COMPLETE", error=None, finished_at=utcnow(), config_failed=False)
        .execution_options(synchronize_session=False)
    )
    if not getattr(done, "rowcount", 0):
        return False
    session.add(measurement)
    session.flush()
    return True


def running_numbers(session: Session, study_id: int) -> list[int]:
    """Optuna's numbers of the study's trials whose rows are RUNNING (each holds a claim)."""
    query = select(Trial.optuna_number).where(Trial.study_id == study_id, Trial.state == "RUNNING")
    return list(session.scalars(query.order_by(Trial.optuna_number)))


def trial_by_number(session: Session, study_id: int, number: int) -> Trial | None:
    """The study's trial with Optuna's ``number``, or None."""
    return session.scalars(select(Trial).where(Trial.study_id == study_id, Trial.optuna_number == number)).one_or_none()


def finish_trial(
    session: Session, trial_id: int, state: str, error: str | None, *, config_failed: bool = False
) -> Trial | None:
    """Set a running trial's final state (and its reason), stamped now; the row, or None when it is no
    longer RUNNING (failed by another worker that took this one for dead: its verdict stands).
    ``config_failed``: FAILED because the configuration itself broke (a repeat of it is then answered
    with ``error``, never built again)."""
    done = session.execute(
        update(Trial)
        .where(Trial.id == trial_id, Trial.state == "RUNNING")
        .values(state=state, error=error, finished_at=utcnow(), config_failed=config_failed)
        .execution_options(synchronize_session=False)
    )
    if not getattr(done, "rowcount", 0):
        return None
    row = session.get(Trial, trial_id, populate_existing=True)
    assert row is not None, f"trial {trial_id} is not stored"
    return row


def retarget_trial(
    session: Session, trial_id: int, *, config: dict[str, Any], key: str, description: str, is_baseline: bool
) -> None:
    """A trial's configuration replaced by the one it turned out to be (a technique that changed nothing
    left out of it), before anything of it was measured."""
    row = session.get(Trial, trial_id)
    assert row is not None, f"trial {trial_id} is not stored"
    row.config, row.config_key, row.description, row.is_baseline = config, key, description, is_baseline


def baseline_trials(session: Session, study_id: int, batch_size: int) -> Sequence[Trial]:
    """The study's completed baseline trials at ``batch_size``, oldest first."""
    return session.scalars(
        select(Trial)
        .where(Trial.study_id == study_id, Trial.is_baseline, Trial.state == "COMPLETE", Trial.batch_size == batch_size)
        .order_by(Trial.id)
    ).all()


def configurations_tried(session: Session, study_id: int, env_id: int) -> int:
    """Distinct configurations of the study measured, rejected early or failed in this environment, and
    those found to be one of them with a technique that changed nothing (``same_as``)."""
    count = session.scalar(
        select(func.count(func.distinct(Trial.config_key))).where(
            Trial.study_id == study_id, Trial.environment_id == env_id, Trial.state.in_(VERDICT_STATES)
        )
    )
    return int(count or 0) + len(technique_checks(session, study_id, env_id, SAME_AS))


def configuration_tried(session: Session, study_id: int, env_id: int, key: str) -> bool:
    """Whether this configuration of the study was measured, rejected early or failed in this environment."""
    found = session.scalar(
        select(Trial.id)
        .where(
            Trial.study_id == study_id,
            Trial.config_key == key,
            Trial.environment_id == env_id,
            Trial.state.in_(VERDICT_STATES),
        )
        .limit(1)
    )
    return found is not None


def failed_twin(session: Session, study_id: int, env_id: int, key: str, exclude_id: int) -> tuple[int, str] | None:
    """``(number, reason)`` of a trial of this configuration that broke in this environment, or None."""
    row = session.execute(
        select(Trial.optuna_number, Trial.error)
        .where(
            Trial.study_id == study_id,
            Trial.config_key == key,
            Trial.environment_id == env_id,
            Trial.config_failed.is_(True),
            Trial.id != exclude_id,
        )
        .order_by(Trial.id)
        .limit(1)
    ).one_or_none()
    return None if row is None else (row.optuna_number, row.error or "no reason stored")


def rejected_early(
    session: Session, study_id: int, env_id: int, key: str, exclude_id: int
) -> list[tuple[int, dict[str, Any] | None]]:
    """``(number, early latency)`` of the trials of this configuration rejected early in this environment."""
    rows = session.execute(
        select(Trial.optuna_number, Trial.early_latency).where(
            Trial.study_id == study_id,
            Trial.config_key == key,
            Trial.environment_id == env_id,
            Trial.state == "PRUNED",
            Trial.id != exclude_id,
        )
    ).all()
    return [(number, early) for number, early in rows]


# --- technique checks ----------------------------------------------------------------------------

#: The check kind that says a configuration is another one: a technique in it changed nothing here
#: (``config_key`` the proposed configuration's, ``details["config"]`` the one it is).
SAME_AS = "same_as"


def save_same_as(
    session: Session, study_id: int, env_id: int, key: str, technique: str, reason: str, config: dict[str, Any]
) -> None:
    """Keep that configuration ``key`` is ``config`` here: ``technique`` in it changed nothing (``reason``)."""
    save_technique_check(
        session,
        TechniqueCheck(
            study_id=study_id,
            environment_id=env_id,
            kind=SAME_AS,
            technique=technique,
            config_key=key,
            ok=True,
            reason=reason,
            details={"config": config},
        ),
    )


def same_as(session: Session, study_id: int, env_id: int, key: str) -> dict[str, Any] | None:
    """The configuration (as stored) that configuration ``key`` turned out to be here, or None."""
    row = technique_checks(session, study_id, env_id, SAME_AS).get(key)
    return None if row is None else dict(row.details["config"])


def technique_checks(session: Session, study_id: int, env_id: int, kind: str) -> dict[str, TechniqueCheck]:
    """The study's checks of one ``kind`` ("runs", "pays") in this environment, by configuration key."""
    rows = session.scalars(
        select(TechniqueCheck).where(
            TechniqueCheck.study_id == study_id, TechniqueCheck.environment_id == env_id, TechniqueCheck.kind == kind
        )
    ).all()
    return {row.config_key: row for row in rows}


def save_technique_check(session: Session, check: TechniqueCheck) -> None:
    """Keep a check; one another worker stored first for the same configuration stands."""
    try:
        with session.begin_nested():
            session.add(check)
    except IntegrityError:
        pass


# --- measurements --------------------------------------------------------------------------------


def measurements_of(session: Session, trial_id: int) -> Sequence[Measurement]:
    """A trial's measurements, oldest first."""
    return session.scalars(select(Measurement).where(Measurement.trial_id == trial_id).order_by(Measurement.id)).all()


def measured_in(session: Session, trial_id: int, env_id: int) -> bool:
    """Whether the trial has a measurement taken in this environment."""
    found = session.scalar(
        select(Measurement.id).where(Measurement.trial_id == trial_id, Measurement.environment_id == env_id).limit(1)
    )
    return found is not None


def measured_twin(session: Session, study_id: int, env_id: int, key: str, exclude_id: int) -> Measurement | None:
    """The measurement ``best`` answers from (the preferred one: never a noisy night's held rows) of the
    latest completed trial with this configuration here."""
    return session.scalars(
        select(Measurement)
        .join(Trial)
        .where(
            Trial.study_id == study_id,
            Trial.config_key == key,
            Trial.state == "COMPLETE",
            Measurement.environment_id == env_id,
            Measurement.kind.in_(("search", "confirm")),
            Measurement.preferred.is_(True),
            Trial.id != exclude_id,
        )
        .order_by(Measurement.id.desc())
        .limit(1)
    ).one_or_none()


def measurement_in_runs(session: Session, study_id: int, number: int, runs: list[int]) -> Measurement:
    """The latest measurement of trial ``number`` taken by one of ``runs``."""
    return session.scalars(
        select(Measurement)
        .join(Trial)
        .where(Trial.study_id == study_id, Trial.optuna_number == number, Measurement.run_id.in_(runs))
        .order_by(Measurement.id.desc())
        .limit(1)
    ).one()


def promote(session: Session, runs: list[int]) -> int:
    """The measurements ``runs`` stored held (a nightly's: ``Measurement.held``) become the ones ``best``
    and ``frontier`` answer from, in the caller's one transaction: for each trial and environment, the
    latest of them replaces the preferred one. Returns how many were promoted."""
    latest: dict[tuple[int, int], Measurement] = {}
    for row in session.scalars(
        select(Measurement)
        .join(Trial)
        .where(Measurement.run_id.in_(runs), Measurement.kind == "confirm", Trial.state == "COMPLETE")
        .order_by(Measurement.id)
    ):
        latest[(row.trial_id, row.environment_id)] = row
    for (trial_id, env_id), row in sorted(latest.items()):  # in one order: two promotions never deadlock
        session.get(Trial, trial_id, with_for_update=True)
        session.execute(
            update(Measurement)
            .where(Measurement.trial_id == trial_id, Measurement.environment_id == env_id, Measurement.preferred)
            .values(preferred=False)
            .execution_options(synchronize_session=False)
        )
        row.preferred = True
        session.flush()
    return len(latest)


def held_count(session: Session, runs: list[int]) -> int:
    """How many measurements ``runs`` stored that are not answered from."""
    found = session.scalar(
        select(func.count(Measurement.id)).where(Measurement.run_id.in_(runs), Measurement.preferred.is_(False))
    )
    return int(found or 0)


def add_calibration(
    session: Session, env_id: int, *, peak_flops: dict[str, float], bandwidth: float, method: str
) -> None:
    """Keep a measured hardware profile for an environment."""
    session.add(
        HardwareCalibration(
            environment_id=env_id, peak_flops=peak_flops, memory_bandwidth_bytes_per_s=bandwidth, method=method
        )
    )


# --- nightly runs --------------------------------------------------------------------------------


def running_nightly(session: Session, study: str) -> NightlyRun | None:
    """The study's latest nightly run still marked running, or None."""
    return session.scalars(
        select(NightlyRun)
        .join(Study)
        .where(Study.name == study, NightlyRun.status == NightStatus.RUNNING.value)
        .order_by(NightlyRun.id.desc())
        .limit(1)
    ).one_or_none()


def nightlies_marked_running(session: Session, study_id: int) -> Sequence[NightlyRun]:
    """The study's nightly runs still marked running (under the study's lock: each one's process died)."""
    return session.scalars(
        select(NightlyRun).where(NightlyRun.study_id == study_id, NightlyRun.status == NightStatus.RUNNING.value)
    ).all()


def last_finished_nightly(session: Session, study_id: int) -> NightlyRun | None:
    """The study's latest nightly run that ended (whatever its status), or None."""
    return session.scalars(
        select(NightlyRun)
        .where(NightlyRun.study_id == study_id, NightlyRun.status != NightStatus.RUNNING.value)
        .order_by(NightlyRun.id.desc())
        .limit(1)
    ).one_or_none()


def nightly_summaries(session: Session, study_id: int, environment_id: int) -> list[dict[str, Any]]:
    """The summaries of the study's finished nightlies in one environment, oldest first, each with its
    ``status``: what the drift-corrected comparison learns its noise band and levels from."""
    rows = session.execute(
        select(NightlyRun.status, NightlyRun.summary)
        .where(
            NightlyRun.study_id == study_id,
            NightlyRun.environment_id == environment_id,
            NightlyRun.status.in_([s.value for s in NightStatus if s.concluded]),
        )
        .order_by(NightlyRun.id)
    ).all()
    return [{**(summary or {}), "status": status} for status, summary in rows]


def save_reference(
    session: Session, study_id: int, environment_id: int, digest: str, source: str, program: bytes
) -> None:
    """Keep a frozen reference program once (a second save of the same digest is a no-op)."""
    exists = session.scalars(
        select(ReferenceModel.id).where(ReferenceModel.study_id == study_id, ReferenceModel.digest == digest)
    ).first()
    if exists is None:
        session.add(
            ReferenceModel(
                study_id=study_id, environment_id=environment_id, digest=digest, source=source, program=program
            )
        )


def reference_program(session: Session, study_id: int, digest: str) -> bytes | None:
    """The stored frozen reference program with this digest, or None."""
    return session.scalars(
        select(ReferenceModel.program).where(ReferenceModel.study_id == study_id, ReferenceModel.digest == digest)
    ).first()
