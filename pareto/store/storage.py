"""The write side's transactions: each function here is one transaction of its own, on an engine.

What a search, a bench and their claims did in a ``session_scope`` of their own is one function here,
with the same statements in the same order, the same locks and the same boundaries (a claim's insert and
its check for a verdict in one transaction; a trial COMPLETE with its measurement in one). The
statements themselves are ``pareto.store.trials``'s and ``pareto.store.queries``'s; callers see
records (``pareto.store.records``), never a session or a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from pareto.errors import StoreError, TrialTakenOver, message_line
from pareto.front import Candidate
from pareto.machine import environment_key
from pareto.metrics import Metrics
from pareto.store import queries, trials
from pareto.store.engine import display_url, get_or_create, session_scope
from pareto.store.models import Environment, LoadRun, Measurement, Run, Study, TechniqueCheck, Trial, utcnow
from pareto.store.records import CheckRecord, NewTrial, NightlyRecord, TrialState, Verdict
from pareto.store.writes import nightly_record

if TYPE_CHECKING:
    from pareto.machine import HardwareProfile


def _trial_row(new: NewTrial) -> Trial:
    fields = {f.name: getattr(new, f.name) for f in dataclasses.fields(new)}
    return Trial(**{**fields, "state": TrialState(new.state).value})


# --- environments, calibrations, runs ------------------------------------------------------------


def save_calibration(
    engine: Engine, fingerprint: dict[str, Any], *, peak_flops: dict[str, float], bandwidth: float, method: str
) -> None:
    """Keep a measured hardware profile for the environment of ``fingerprint`` (stored on first sight)."""
    with session_scope(engine) as session:
        env_id = get_or_create(session, lambda s: queries.environment_id(s, fingerprint))
        trials.add_calibration(session, env_id, peak_flops=peak_flops, bandwidth=bandwidth, method=method)


def bench_environment(
    engine: Engine, fingerprint: dict[str, Any], *, store: bool
) -> tuple[int | None, HardwareProfile | None, str | None, float | None]:
    """In one transaction: the environment's id (stored on first sight unless not ``store``; two first
    runs on one host at once both store it: one insert wins, the other reads it), its calibration, why
    none, and its quiet contention-probe time."""
    with session_scope(engine) as session:
        env_id = get_or_create(session, lambda s: queries.environment_id(s, fingerprint)) if store else None
        calibration, note = queries.host_calibration(session, fingerprint)
        quiet = queries.probe_quiet_ms(session, environment_key(fingerprint))
    return env_id, calibration, note, quiet


def add_run(
    engine: Engine,
    *,
    study_id: int | None,
    kind: str,
    environment_id: int,
    hostname: str,
    pid: int,
    probe_reference_ms: float | None,
) -> int:
    """Store a new run; its id."""
    with session_scope(engine) as session:
        run = Run(
            study_id=study_id,
            kind=kind,
            environment_id=environment_id,
            hostname=hostname,
            pid=pid,
            probe_reference_ms=probe_reference_ms,
            details={},
        )
        session.add(run)
        session.flush()
        return run.id


def finish_run(engine: Engine, run_id: int, details: dict[str, Any]) -> None:
    """A run stamped finished, ``details`` added to its own."""
    with session_scope(engine) as session:
        row = session.get(Run, run_id)
        if row is not None:
            row.finished_at = utcnow()
            row.details = {**(row.details or {}), **details}


# --- measurements --------------------------------------------------------------------------------


def _measurement(
    trial_id: int, env_id: int, run_id: int, metrics: Metrics, *, kind: str, held: bool = False
) -> Measurement:
    row = Measurement(trial_id=trial_id, environment_id=env_id, run_id=run_id, kind=kind, **metrics.to_dict())
    row.held = held
    return row


def add_measurement(
    engine: Engine, trial_id: int, env_id: int, run_id: int, metrics: Metrics, *, kind: str, held: bool = False
) -> None:
    """Keep one measurement of a trial's configuration, tagged with its run and environment; ``held``:
    not answered from until promoted (``pareto.store.trials.promote``)."""
    row = _measurement(trial_id, env_id, run_id, metrics, kind=kind, held=held)
    with session_scope(engine) as session:
        session.add(row)


def trial_metrics(engine: Engine, trial_id: int, env_id: int) -> Metrics | None:
    """A trial's stored metrics: from this environment when it was measured here, else any other."""
    with session_scope(engine) as session:
        rows = trials.measurements_of(session, trial_id)
        here = [m for m in rows if m.environment_id == env_id]
        chosen = here or list(rows)
        return Metrics.from_row(chosen[-1]) if chosen else None


def set_load_capacity(
    engine: Engine,
    measurement_id: int,
    qps: float,
    max_batch: int | None,
    max_wait_ms: float | None,
    layout: tuple[int, int] | None = None,
) -> None:
    """The capacity load runs found for measurement ``measurement_id`` (0.0: none met the SLO), with the
    batcher settings and the serving layout (instances, intra-op threads) they ran; reads judge the
    configuration at a rate by it from now on. ``layout`` None keeps the stored one."""
    with session_scope(engine) as session:
        m = session.get(Measurement, measurement_id)
        if m is None:
            raise StoreError(f"measurement {measurement_id} is not stored")
        m.load_capacity_qps, m.load_capacity_max_batch, m.load_capacity_max_wait_ms = qps, max_batch, max_wait_ms
        if layout is not None:
            m.load_capacity_instances, m.load_capacity_threads = layout


def met_rates(engine: Engine, measurement_id: int, slo_ms: float) -> list[float]:
    """The rates at which the stored load runs of measurement ``measurement_id``'s configuration (its
    trial, in its environment) counted with their request P99 bound within ``slo_ms``."""
    with session_scope(engine) as session:
        m = session.get(Measurement, measurement_id)
        if m is None:
            raise StoreError(f"measurement {measurement_id} is not stored")
        rows = session.scalars(
            select(LoadRun.qps).where(
                LoadRun.trial_id == m.trial_id,
                LoadRun.environment_id == m.environment_id,
                LoadRun.valid.is_(True),
                LoadRun.request_p99_upper_ms <= slo_ms,
            )
        ).all()
        return [float(r) for r in rows]


def save_load_run(engine: Engine, measurement_id: int, run_id: int | None, load: dict[str, Any]) -> None:
    """A load run of the configuration of measurement ``measurement_id`` (its trial, in its environment):
    ``load`` is ``pareto.measure.load.LoadRun.to_dict()``."""
    with session_scope(engine) as session:
        m = session.get(Measurement, measurement_id)
        if m is None:
            raise StoreError(f"measurement {measurement_id} is not stored")
        session.add(
            LoadRun(
                trial_id=m.trial_id,
                environment_id=m.environment_id,
                run_id=run_id,
                qps=load["qps"],
                max_batch=load["max_batch"],
                max_wait_ms=load["max_wait_ms"],
                request_p99_upper_ms=load.get("p99_upper_ms"),
                kept_up=load["kept_up"],
                valid=load["valid"],
                summary=load,
            )
        )


def baseline_trial(engine: Engine, study_id: int, batch_size: int, env_id: int) -> int | None:
    """The id of the study's completed baseline trial at ``batch_size``, preferring this environment."""
    with session_scope(engine) as session:
        rows = trials.baseline_trials(session, study_id, batch_size)
        here = [t for t in rows if t.environment_id == env_id]
        chosen = here or list(rows)
        return chosen[0].id if chosen else None


def measured_in(engine: Engine, trial_id: int, env_id: int) -> bool:
    """``trials.measured_in``, in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.measured_in(session, trial_id, env_id)


def study_candidates(engine: Engine, study_id: int, env_id: int | None) -> list[Candidate]:
    """``queries.candidates`` of a study in one environment (None: every one), by their ids."""
    with session_scope(engine) as session:
        study = session.get(Study, study_id)
        assert study is not None
        env = session.get(Environment, env_id) if env_id is not None else None
        return queries.candidates(session, study, env)


# --- trials --------------------------------------------------------------------------------------


def add_trial(engine: Engine, new: NewTrial) -> int:
    """Store a trial's row (a verdict given without a claim: a baseline that failed before its trial); its id."""
    with session_scope(engine) as session:
        return trials.add_trial(session, _trial_row(new))


def configuration_tried(engine: Engine, study_id: int, env_id: int, key: str) -> bool:
    """``trials.configuration_tried``, in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.configuration_tried(session, study_id, env_id, key)


def configurations_tried(engine: Engine, study_id: int, env_id: int) -> int:
    """``trials.configurations_tried``, in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.configurations_tried(session, study_id, env_id)


def same_as_chain(
    engine: Engine, study_id: int, env_id: int, key: str, key_of: Callable[[dict[str, Any]], str]
) -> dict[str, Any] | None:
    """The configuration (as stored) that ``key`` turned out to be here, followed to its end in one
    transaction (``key_of`` gives a stored configuration's key), or None when it is itself."""
    found = None
    with session_scope(engine) as session:
        while (smaller := trials.same_as(session, study_id, env_id, key)) is not None:
            found, key = smaller, key_of(smaller)
    return found


def save_same_as(
    engine: Engine, study_id: int, env_id: int, key: str, technique: str, reason: str, config: dict[str, Any]
) -> None:
    """``trials.save_same_as``, in a transaction of its own."""
    with session_scope(engine) as session:
        trials.save_same_as(session, study_id, env_id, key, technique, reason, config)


def finish_trial(
    engine: Engine, trial_id: int, state: TrialState, error: str | None, *, config_failed: bool = False
) -> bool:
    """``trials.finish_trial`` in a transaction of its own; False when the trial was no longer RUNNING."""
    with session_scope(engine) as session:
        return trials.finish_trial(session, trial_id, state.value, error, config_failed=config_failed) is not None


def reject_trial(
    engine: Engine, trial_id: int, reason: str, *, timings: dict[str, float | None], early: dict[str, Any]
) -> None:
    """A running trial PRUNED (rejected early) with its phases' ``timings`` and its first round's latency
    (``early``); a trial failed meanwhile by a worker that took this one for dead keeps that verdict."""
    with session_scope(engine) as session:
        row = trials.finish_trial(session, trial_id, TrialState.PRUNED.value, reason)
        if row is not None:
            for name, value in timings.items():
                setattr(row, name, value)
            row.early_latency = early


def complete_trial(
    engine: Engine,
    trial_id: int,
    *,
    study_id: int,
    timings: dict[str, float | None],
    measurement: tuple[int, int, Metrics],
    suspect: tuple[int, str] | None = None,
) -> None:
    """A running trial COMPLETE with its phases' ``timings`` and its measurement (``(environment id, run
    id, metrics)``), its study stamped updated, and (``suspect``: a calibration's id and why) a calibration
    the measurement beat marked suspect, in one transaction (a twin never sees the one without the other).

    Raises:
        TrialTakenOver: the trial is no longer RUNNING (failed by another worker that took this one for dead);
            nothing is stored.
    """
    env_id, run_id, metrics = measurement
    with session_scope(engine) as session:
        row = session.get(Trial, trial_id)
        assert row is not None
        for name, value in timings.items():
            setattr(row, name, value)
        stored = _measurement(trial_id, env_id, run_id, metrics, kind="search")
        if not trials.complete_trial(session, trial_id, stored):
            session.rollback()
            raise TrialTakenOver(
                f"Trial {row.optuna_number} was failed by another worker that took this one for dead (no "
                "heartbeat) and retried; this measurement is not stored."
            )
        study = session.get(Study, study_id)
        assert study is not None
        study.updated_at = utcnow()
        if suspect is not None:
            queries.mark_calibration_suspect(session, *suspect)


# --- claims --------------------------------------------------------------------------------------


def claim(
    engine: Engine,
    make: Callable[..., NewTrial],
    key: str,
    *,
    replacing: int | None,
    slo_ms: float | None,
    busy: str | None,
) -> tuple[int | None, Verdict | None]:
    """One attempt at a claim, in one transaction (``pareto.study.claims``): ``replacing`` (the trial's
    earlier row) deleted, ``make()`` inserted RUNNING, then the verdict stored on ``key`` looked for after
    the insert. Returns the DUPLICATE row's id and the verdict that answers it; or the claimed row's id
    and None; or (None, None) when another trial holds the claim (with ``busy``, the trial's row is then
    stored BUSY with that reason). ``make(**fields)`` makes the trial's row."""
    with session_scope(engine) as session:
        if replacing is not None:
            trials.drop_trial(session, replacing)
        row_id = trials.claim_trial(session, _trial_row(make()))
        study_id, env_id = _where(make())
        twin = verdict(session, study_id, env_id, key, exclude_id=row_id, slo_ms=slo_ms)
        if twin is not None:
            return _duplicate(session, make, row_id, twin), twin
        if row_id is not None:
            return row_id, None
        if busy is not None:
            trials.add_trial(session, _trial_row(make(state=TrialState.BUSY, error=busy, finished_at=utcnow())))
    return None, None


def _where(new: NewTrial) -> tuple[int, int]:
    assert new.environment_id is not None
    return new.study_id, new.environment_id


def verdict(
    session: Session, study_id: int, env_id: int, key: str, *, exclude_id: int | None, slo_ms: float | None
) -> Verdict | None:
    """The verdict stored on ``key`` here: measured, broken here, or rejected early against an SLO at
    least as tight as ``slo_ms`` (a looser SLO measures it again)."""
    exclude = exclude_id if exclude_id is not None else -1
    earlier = trials.measured_twin(session, study_id, env_id, key, exclude)
    if earlier is not None:
        return Verdict(earlier.trial.optuna_number, Metrics.from_row(earlier).to_dict(), None)
    failed = trials.failed_twin(session, study_id, env_id, key, exclude)
    if failed is not None:
        return Verdict(failed[0], {}, None, failed=failed[1])
    if slo_ms is None:
        return None
    for number, early in trials.rejected_early(session, study_id, env_id, key, exclude):
        lower = (early or {}).get("latency_p99_lower_ms")
        if lower is not None and lower > slo_ms:
            return Verdict(number, {}, lower)
    return None


def _duplicate(session: Session, make: Callable[..., NewTrial], row_id: int | None, twin: Verdict) -> int:
    reason = f"same configuration as trial {twin.number}; not measured again"
    if row_id is None:
        return trials.add_trial(
            session, _trial_row(make(state=TrialState.DUPLICATE, error=reason, finished_at=utcnow()))
        )
    trials.finish_trial(session, row_id, TrialState.DUPLICATE.value, reason)
    return row_id


def running_numbers(engine: Engine, study_id: int) -> list[int]:
    """``trials.running_numbers`` in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.running_numbers(session, study_id)


def fail_stale_trial(engine: Engine, study_id: int, number: int, why: str) -> None:
    """The study's trial with Optuna's ``number`` FAILED with ``why`` when it is still RUNNING (its worker
    may have stored a verdict since), in a transaction of its own."""
    with session_scope(engine) as session:
        row = trials.trial_by_number(session, study_id, number)
        if row is not None:
            trials.finish_trial(session, row.id, TrialState.FAILED.value, why)


# --- technique checks, nightly references ---------------------------------------------------------


def technique_checks(engine: Engine, study_id: int, env_id: int, kind: str) -> dict[str, CheckRecord]:
    """``trials.technique_checks`` in a transaction of its own, as records."""
    with session_scope(engine) as session:
        rows = trials.technique_checks(session, study_id, env_id, kind)
        return {key: CheckRecord(r.technique, r.ok, r.reason, r.details) for key, r in rows.items()}


def save_technique_check(engine: Engine, study_id: int, env_id: int, kind: str, key: str, check: CheckRecord) -> None:
    """Keep a check (``trials.save_technique_check``: one another worker stored first stands)."""
    row = TechniqueCheck(
        study_id=study_id,
        environment_id=env_id,
        kind=kind,
        technique=check.technique,
        config_key=key,
        ok=check.ok,
        reason=check.reason,
        details=check.details,
    )
    with session_scope(engine) as session:
        trials.save_technique_check(session, row)


def reference_program(engine: Engine, study_id: int, digest: str) -> bytes | None:
    """``trials.reference_program``, in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.reference_program(session, study_id, digest)


def save_reference(engine: Engine, study_id: int, env_id: int, digest: str, source: str, program: bytes) -> None:
    """``trials.save_reference``, in a transaction of its own."""
    with session_scope(engine) as session:
        trials.save_reference(session, study_id, env_id, digest, source, program)


# --- nightlies -----------------------------------------------------------------------------------


def running_nightly(engine: Engine, study: str) -> NightlyRecord | None:
    """``trials.running_nightly``, in a transaction of its own."""
    with session_scope(engine) as session:
        row = trials.running_nightly(session, study)
        return None if row is None else nightly_record(row)


def nightly_summaries(engine: Engine, study_id: int, env_id: int) -> list[dict[str, Any]]:
    """``trials.nightly_summaries``, in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.nightly_summaries(session, study_id, env_id)


def held_count(engine: Engine, runs: list[int]) -> int:
    """``trials.held_count``, in a transaction of its own."""
    with session_scope(engine) as session:
        return trials.held_count(session, runs)


def measurement_in_runs(engine: Engine, study_id: int, number: int, runs: list[int]) -> Metrics:
    """The metrics of ``trials.measurement_in_runs``, in a transaction of its own."""
    with session_scope(engine) as session:
        return Metrics.from_row(trials.measurement_in_runs(session, study_id, number, runs))


def candidates_if_promoted(engine: Engine, study_id: int, env_id: int, runs: list[int]) -> list[Candidate]:
    """The study's candidates in ``env_id`` as they will be once ``runs``' held measurements are promoted:
    promoted, read, and rolled back in one transaction (nothing changes yet)."""
    with session_scope(engine) as session:
        trials.promote(session, runs)
        study = session.get(Study, study_id)
        assert study is not None
        found = queries.candidates(session, study, session.get(Environment, env_id))
        session.rollback()
    return found


# --- deleting a study ----------------------------------------------------------------------------


def delete_study(engine: Engine, name: str) -> dict[str, Any]:
    """Remove a study, pareto's rows (``queries.delete_study``) and Optuna's study of that name, in one
    transaction: a failure halfway leaves both as they were. What was removed."""
    with session_scope(engine) as session:
        removed = queries.delete_study(session, name)
        removed["optuna"] = _delete_optuna_study(session, name)
    return removed


def _delete_optuna_study(session: Session, name: str) -> str:
    """Optuna's study ``name`` deleted in ``session`` as Optuna's storage deletes it (its trials, values,
    parameters and attributes go with it, by its models' cascades); whether it was there."""
    from optuna.storages._rdb import models
    from sqlalchemy import inspect
    from sqlalchemy.exc import SQLAlchemyError

    if not inspect(session.connection()).has_table(models.StudyModel.__tablename__):
        return "was not there"
    try:
        study = models.StudyModel.find_or_raise_by_name(name, session)
    except KeyError:
        return "was not there"
    except SQLAlchemyError as exc:  # tables of another Optuna version
        raise StoreError(
            f"Cannot delete Optuna's study {name!r} in {display_url(session.connection().engine.url)}: "
            f"{message_line(getattr(exc, 'orig', None) or exc)}; nothing was deleted."
        ) from exc
    session.delete(study)
    return "deleted"
