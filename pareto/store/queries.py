"""Reads and writes the commands need; queries never import torch."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from pareto.errors import NotFound, StoreError, UsageError
from pareto.front import DEFAULT_OBJECTIVE_NAMES, PICK_ORDER, Candidate
from pareto.limits import Constraints
from pareto.machine import HardwareProfile, describe_cpu_features, environment_key
from pareto.metrics import Metrics
from pareto.slo import P99_BOUND_METRIC
from pareto.store.models import (
    Environment,
    HardwareCalibration,
    LoadRun,
    Measurement,
    NightlyRun,
    ReferenceModel,
    Run,
    Study,
    Trial,
)
from pareto.tasks.source import score_name

if TYPE_CHECKING:
    from pareto.machine import HardwareProfile


def get_study(session: Session, name: str) -> Study:
    """The study called ``name``.

    Raises:
        UsageError: no such study (the message lists the known ones).
    """
    study = session.scalars(select(Study).where(Study.name == name)).one_or_none()
    if study is None:
        known = session.scalars(select(Study.name).order_by(Study.name)).all()
        listed = f"known studies: {', '.join(known)}" if known else "the database holds no study yet"
        raise NotFound(f"No study named {name!r}; {listed}.")
    return study


def default_study(session: Session) -> Study:
    """The only study in the database.

    Raises:
        UsageError: none or several (then ``--study`` must say which).
    """
    names = session.scalars(select(Study.name).order_by(Study.name)).all()
    if len(names) == 1:
        return get_study(session, names[0])
    if not names:
        raise UsageError("The database holds no study yet; run 'pareto search' first.")
    raise UsageError(f"The database holds {len(names)} studies ({', '.join(names)}); pass --study NAME.")


def environment_id(session: Session, fp: dict[str, Any]) -> int:
    """The id of the environment with this fingerprint, stored on first sight."""

    key = environment_key(fp)
    env = session.scalars(select(Environment).where(Environment.key == key)).one_or_none()
    if env is None:
        env = Environment(
            key=key,
            device=fp["device"],
            device_name=fp["device_name"],
            driver=fp.get("driver"),
            torch_version=fp["torch_version"],
            cpu_model=fp["cpu_model"],
            threads=fp["threads"],
            hostname=fp["hostname"],
            details=fp,
        )
        session.add(env)
        session.flush()
    return env.id


def environment_dict(env: Environment) -> dict[str, Any]:
    details = env.details or {}
    # CUDA's float32 math settings (TF32) are part of a GPU environment's key; a CPU's has none
    cuda_math = {"cuda_math": details["cuda_math"]} if details.get("cuda_math") else {}
    return {
        "key": env.key,
        "device": env.device,
        "device_name": env.device_name,
        "driver": env.driver,
        "torch_version": env.torch_version,
        "cpu_model": env.cpu_model,
        "threads": env.threads,
        "hostname": env.hostname,
        # where ONNX Runtime was installed (the version is part of the key then); None elsewhere
        "onnxruntime_version": details.get("onnxruntime_version"),
        "torchao_version": details.get("torchao_version"),  # likewise, torchao
        # the CPU's kernel features, family and model (part of the key where recorded; None before)
        "cpu_features": details.get("cpu_features"),
        "cpu_id": details.get("cpu_id"),
        **cuda_math,
    }


def study_environments(session: Session, study: Study) -> list[dict[str, Any]]:
    """The environments a study was measured in, most recent first (by their latest measurement).

    One index lookup per known environment (``ix_pareto_measurements_study_env``), not a scan of the
    study's measurements: there are few environments and many measurements. (Ordered by time, not
    id: PostgreSQL would walk the primary key backwards for ``ORDER BY id DESC LIMIT 1``.)
    """
    latest: list[tuple[datetime, int, Environment]] = []
    for env in session.scalars(select(Environment)).all():
        when = session.scalar(
            select(Measurement.created_at)
            .where(Measurement.study_id == study.id, Measurement.environment_id == env.id)
            .order_by(Measurement.created_at.desc())
            .limit(1)
        )
        if when is not None:
            latest.append((when, env.id, env))
    latest.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [{**environment_dict(env), "last_measured_at": when.isoformat()} for when, _, env in latest]


def choose_environment(
    session: Session, study: Study, choice: str | None, known: list[dict[str, Any]] | None = None
) -> Environment | None:
    """The environment a query compares measurements in: ``latest`` (the default: where the study was
    last measured), an environment key (or a unique prefix of one), or ``all`` (None: every one).

    Raises:
        UsageError: the key matches no environment of the study, or several.
    """
    choice = (choice or "latest").strip()
    if choice == "all":
        return None
    known = study_environments(session, study) if known is None else known
    if not known:
        return None
    matches = [known[0]] if choice == "latest" else [e for e in known if e["key"].startswith(choice)]
    if len(matches) != 1:
        listed = ", ".join(f"{e['key']} ({e['device_name']}, {e['threads']} threads, {e['hostname']})" for e in known)
        what = "matches none" if not matches else "matches several"
        raise UsageError(f"Environment {choice!r} {what} of study {study.name!r}; its environments: {listed}.")
    return session.scalars(select(Environment).where(Environment.key == matches[0]["key"])).one()


def _preferred(study: Study, environment: Environment | None) -> list[Any]:
    """The conditions of the measurements queries use: one per completed trial and environment."""
    conditions = [
        Measurement.study_id == study.id,
        Measurement.preferred.is_(True),
        Trial.id == Measurement.trial_id,
        Trial.state == "COMPLETE",
    ]
    if environment is not None:
        conditions.append(Measurement.environment_id == environment.id)
    return conditions


def candidates(
    session: Session, study: Study, environment: Environment | None = None, *, measurement_ids: list[int] | None = None
) -> list[Candidate]:
    """The completed trials of ``study`` measured in ``environment`` (None: in every one), each once
    per environment with its preferred measurement and speedups, in trial order.

    A trial's metrics come from its latest confirmation in that environment, else from its search
    measurement (the ``preferred`` row). Speedups divide by the baseline (the uncompressed model at
    the same batch size) timed in the same run; a measurement whose run timed none (stored before
    runs existed) uses the latest baseline of its environment, and ``speedup_basis`` says which.
    ``measurement_ids`` limits the result to those preferred measurements.
    """
    # plain rows, not ORM objects: a study of 100 000 trials loads in seconds, not half a minute
    query = (
        select(*Measurement.__table__.columns, Trial.optuna_number, Trial.config, Trial.description)
        .join(Trial, Trial.id == Measurement.trial_id)
        .where(*_preferred(study, environment))
        .order_by(Trial.optuna_number, Measurement.environment_id, Measurement.id)
    )
    if measurement_ids is not None:
        rows: list[Any] = []
        for start in range(0, len(measurement_ids), 10_000):
            chunk = measurement_ids[start : start + 10_000]
            rows.extend(session.execute(query.where(Measurement.id.in_(chunk))).all())
        rows.sort(key=lambda m: (m.optuna_number, m.environment_id, m.id))
    else:
        rows = list(session.execute(query).all())
    chosen: dict[tuple[int, int], Any] = {}
    for m in rows:  # two confirmations stored at once could both be marked: the later one wins
        chosen[(m.trial_id, m.environment_id)] = m
    by_run, latest_base = _baselines(session, study, environment)
    environments = {
        env.id: environment_dict(env)
        for env in session.scalars(select(Environment).where(Environment.id.in_({m.environment_id for m in rows})))
    }
    result = []
    loads = _load_runs(session, study) if any(m.scenario for m in chosen.values()) else {}
    score = score_name(study.task)
    for m in chosen.values():
        base = by_run.get((m.run_id, m.batch_size)) if m.run_id is not None else None
        basis = "same run" if base is not None else None
        if base is None:
            base = latest_base.get((m.environment_id, m.batch_size))
            basis = "another run" if base is not None else None
        candidate = _candidate(study.name, m, base, basis, environments[m.environment_id])
        candidate.metrics["accuracy_metric"] = score  # what the accuracy column holds (fidelity, macro-F1)
        candidate.load_run = loads.get((m.trial_id, m.environment_id))
        result.append(candidate)
    return result


def _load_runs(session: Session, study: Study) -> dict[tuple[int, int], dict[str, Any]]:
    """The latest load run of each trial of ``study`` and environment (a traffic study's few)."""
    rows = session.execute(
        select(LoadRun.trial_id, LoadRun.environment_id, LoadRun.summary, LoadRun.created_at)
        .join(Trial, Trial.id == LoadRun.trial_id)
        .where(Trial.study_id == study.id)
        .order_by(LoadRun.id)
    ).all()
    return {(r.trial_id, r.environment_id): {**r.summary, "at": r.created_at.isoformat()} for r in rows}


def _baselines(
    session: Session, study: Study, environment: Environment | None
) -> tuple[dict[tuple[int | None, int], Measurement], dict[tuple[int, int], Measurement]]:
    """The baseline measurements speedups divide by: the first of each run, and the latest answered from
    (preferred: a noisy night's held re-measurement is not) of each environment, per batch size."""
    query = (
        select(Measurement)
        .join(Trial, Trial.id == Measurement.trial_id)
        .where(Trial.study_id == study.id, Trial.is_baseline.is_(True), Trial.state == "COMPLETE")
        .order_by(Measurement.id)
    )
    if environment is not None:
        query = query.where(Measurement.environment_id == environment.id)
    by_run: dict[tuple[int | None, int], Measurement] = {}
    latest: dict[tuple[int, int], Measurement] = {}
    for m in session.scalars(query).all():
        by_run.setdefault((m.run_id, m.batch_size), m)
        if m.preferred:
            latest[(m.environment_id, m.batch_size)] = m  # id order: the last one is the latest
    return by_run, latest


#: Reads of the pick before ``best_candidate`` gives up on a study that confirmations keep changing.
PICK_TRIES = 5


def best_candidate(
    session: Session, study: Study, environment: Environment, constraints: Constraints
) -> Candidate | None:
    """The pick ``pareto.front.select_best`` would make among ``candidates(...)``, found by the
    database: the feasible preferred measurements filtered and ordered in SQL, one row read.

    None when nothing is feasible (then ``closest_candidate`` says what is nearest). The pick's id and its
    row are two statements: a confirmation committed between them (it changes which measurement is
    preferred) is answered by asking again, up to ``PICK_TRIES`` times.
    """
    query = (
        select(Measurement.id)
        .join(Trial, Trial.id == Measurement.trial_id)
        .where(*_preferred(study, environment), *_feasible(constraints))
        .order_by(*_pick_order())
        .limit(1)
    )
    for _ in range(PICK_TRIES):
        found = session.scalar(query)
        if found is None:
            return None
        picked = candidates(session, study, environment, measurement_ids=[found])
        if picked:
            return picked[0]
    raise StoreError(f"Study {study.name!r} changed under {PICK_TRIES} reads in a row; ask again.")


def _feasible(constraints: Constraints) -> list[Any]:
    """``pareto.limits``' rule as SQL conditions, limit by limit from ``LIMITS``: the stored metric at or
    under (or over) the limit; a bounded limit also needs its bound stored, from enough samples."""
    conditions: list[Any] = []
    for limit, value in constraints.set():
        column = _column(limit.metric)
        if limit.bound:
            conditions.append(column.is_not(None))
        conditions.append(column <= value if limit.at_most else column >= value)
        if limit.bound:
            conditions.append(Measurement.samples >= constraints.min_samples)
    return conditions


def _pick_order() -> list[Any]:
    """``pareto.front.PICK_ORDER`` as an ORDER BY: more first where it says so, a missing value last."""
    keys = {
        "accuracy": Measurement.accuracy,
        P99_BOUND_METRIC: Measurement.latency_p99_upper_ms,
        "confirmed": Measurement.kind == "confirm",
        "trial": Trial.optuna_number,
    }
    order: list[Any] = []
    for name, more_first in PICK_ORDER:
        column = keys[name]
        order += [column.desc()] if more_first else [column.is_(None), column]
    return order


#: The stored columns the frontier and the distance to the SLOs read, by metric name; memory falls
#: back to the parameters for rows stored before the activation and KV terms existed.
_LIGHT_COLUMNS: dict[str, Any] = {
    "accuracy": Measurement.accuracy,
    "latency_p99_upper_ms": Measurement.latency_p99_upper_ms,
    "latency_p50_ms": Measurement.latency_p50_ms,
    "samples": Measurement.samples,
    "memory_bytes": func.coalesce(Measurement.memory_bytes, Measurement.params_bytes),
    "throughput_per_s": Measurement.throughput_per_s,
    # no capacity (requests miss the SLO even at the lowest rate): none at any rate
    "capacity_qps": func.coalesce(Measurement.load_capacity_qps, Measurement.capacity_qps, 0.0),
    "bytes_moved": Measurement.bytes_moved,
    "flops": Measurement.flops,
}


def _column(metric: str) -> Any:
    """The stored column of a metric (``Metrics``' field), memory with its fallback."""
    return _LIGHT_COLUMNS[metric] if metric in _LIGHT_COLUMNS else getattr(Measurement, metric)


def light_columns(
    session: Session, study: Study, environment: Environment, names: list[str]
) -> tuple[list[int], dict[str, Any]]:
    """The measurement ids of the preferred measurements in one environment and, for each metric
    named, a float array of its values (NaN where not stored): what the frontier and the distance to
    the SLOs read, without loading rows. The default ones (accuracy, P99 bound, samples) come from
    the index ``ix_pareto_measurements_choice`` alone.
    """
    import numpy as np

    names = list(dict.fromkeys(names))
    query = select(Measurement.id, Measurement.trial_id, *(_column(n) for n in names)).where(
        Measurement.study_id == study.id,
        Measurement.environment_id == environment.id,
        Measurement.preferred.is_(True),
    )
    rows = [tuple(row) for row in session.execute(query)]  # numpy probes a Row for array interfaces, slowly
    table = np.array(rows, dtype=float).reshape(len(rows), 2 + len(names))
    trial_ids = table[:, 1]
    if len(np.unique(trial_ids)) < len(rows):  # two confirmations stored at once: the later one counts
        order = np.lexsort((table[:, 0], trial_ids))
        last = np.ones(len(order), dtype=bool)
        last[:-1] = trial_ids[order][1:] != trial_ids[order][:-1]
        table = table[order[last]]
    return [int(i) for i in table[:, 0]], {name: table[:, 2 + k] for k, name in enumerate(names)}


def trial_measurements(session: Session, study: Study, number: int) -> tuple[int, list[Candidate]]:
    """Trial ``number``'s row id and its preferred measurement in each environment, latest first.

    Raises:
        UsageError: no such trial, or one that was never measured (failed, busy, a repeat).
    """
    trial = session.scalars(
        select(Trial).where(Trial.study_id == study.id, Trial.optuna_number == number)
    ).one_or_none()
    if trial is None:
        last = session.scalar(select(func.max(Trial.optuna_number)).where(Trial.study_id == study.id))
        known = f"its trials are 0 to {last}" if last is not None else "it has no trials yet"
        raise NotFound(f"Study {study.name!r} has no trial {number}; {known}.")
    if trial.state != "COMPLETE":
        why = f" ({trial.error})" if trial.error else ""
        raise UsageError(
            f"Trial {number} of study {study.name!r} is {trial.state}{why}; there is no measurement to compare with."
        )
    ids = session.scalars(
        select(Measurement.id).where(Measurement.trial_id == trial.id, Measurement.preferred.is_(True))
    ).all()
    found = candidates(session, study, measurement_ids=list(ids))
    order = {e["key"]: i for i, e in enumerate(study_environments(session, study))}
    return trial.id, sorted(found, key=lambda c: order.get(c.environment["key"], len(order)))


def _candidate(study: str, m: Any, base: Measurement | None, basis: str | None, env: dict[str, Any]) -> Candidate:
    """A candidate from a row of ``candidates``' query: the measurement's columns and its trial's number,
    configuration and description."""
    metrics = Metrics.from_row(m).to_dict()
    metrics["speedup_p50"] = base.latency_p50_ms / m.latency_p50_ms if base else None
    metrics["speedup_p99"] = base.latency_p99_ms / m.latency_p99_ms if base else None
    metrics["accuracy_delta"] = m.accuracy - base.accuracy if base else None
    metrics["speedup_basis"] = basis
    confirmation = None
    if m.kind == "confirm":
        confirmation = {
            "rounds": m.rounds,
            "discarded_rounds": m.discarded_rounds,
            "confirmed_at": m.created_at.isoformat(),
            "run": m.run_id,
        }
    return Candidate(
        study=study,
        trial=m.optuna_number,
        config=m.config,
        description=m.description,
        metrics=metrics,
        environment=dict(env),
        confirmation=confirmation,
        measurement_id=m.id,
    )


#: How many recent runs of an environment set its quiet probe time.
QUIET_RUNS = 10


def probe_quiet_ms(session: Session, environment_key: str) -> float | None:
    """What "quiet" means for the contention probe here: the median reference of the environment's
    last ``QUIET_RUNS`` runs (None before the first). A median, not the lowest ever: a shared machine's
    normal speed moves over a day, and the lowest reference would call its normal state busy."""
    refs = session.scalars(
        select(Run.probe_reference_ms)
        .join(Environment, Run.environment_id == Environment.id)
        .where(Environment.key == environment_key, Run.probe_reference_ms.is_not(None))
        .order_by(Run.id.desc())
        .limit(QUIET_RUNS)
    ).all()
    values = sorted(r for r in refs if r is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def study_summaries(session: Session) -> list[dict[str, Any]]:
    """One row per study: name, task, trial counts by state, SLO, environments (and their CPUs' kernel
    features in words), dates."""
    studies = session.scalars(select(Study).order_by(Study.created_at, Study.id)).all()
    counts: dict[tuple[int, str], int] = {
        (study_id, state): n
        for study_id, state, n in session.execute(
            select(Trial.study_id, Trial.state, func.count()).group_by(Trial.study_id, Trial.state)
        ).all()
    }
    result = []
    for s in studies:
        environments = study_environments(session, s)
        n_env = len(environments)
        result.append(
            {
                "study": s.name,
                "task": s.task,
                "complete": counts.get((s.id, "COMPLETE"), 0),
                "rejected": counts.get((s.id, "PRUNED"), 0),
                "failed": counts.get((s.id, "FAILED"), 0),
                "duplicate": counts.get((s.id, "DUPLICATE"), 0),
                "running": counts.get((s.id, "RUNNING"), 0),
                "busy": counts.get((s.id, "BUSY"), 0),
                "slo": s.spec.get("slo", {}),
                "scenario": s.spec.get("scenario"),
                "objectives": s.spec.get("objectives", list(DEFAULT_OBJECTIVE_NAMES)),
                "environments": n_env or 0,
                "cpu_kernels": _cpu_kernels(environments),
                "last_nightly": _last_nightly(session, s.id),
                "created_at": s.created_at.isoformat(),
                "updated_at": s.updated_at.isoformat(),
            }
        )
    return result


def _cpu_kernels(environments: list[dict[str, Any]]) -> list[str]:
    """The kernel features of the CPUs a study was measured on, in words, once each."""

    return sorted({describe_cpu_features(e["cpu_features"]) for e in environments if e.get("cpu_features")})


def _last_nightly(session: Session, study_id: int) -> dict[str, Any] | None:
    row = session.scalars(
        select(NightlyRun).where(NightlyRun.study_id == study_id).order_by(NightlyRun.id.desc()).limit(1)
    ).one_or_none()
    if row is None:
        return None
    return {"started_at": row.started_at.isoformat(), "status": row.status, "regressions": row.regressions}


def nightly_history(session: Session, study: Study) -> list[dict[str, Any]]:
    """Every nightly of ``study``, oldest first, with the pick's P99 so that drift shows."""
    runs = session.scalars(select(NightlyRun).where(NightlyRun.study_id == study.id).order_by(NightlyRun.id)).all()
    return [_nightly_row(r, r.summary or {}) for r in runs]


def _nightly_row(r: NightlyRun, summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": r.id,
        "started_at": r.started_at.isoformat(),
        "finished_at": r.finished_at.isoformat() if r.finished_at else None,
        "status": r.status,
        "host": r.hostname,
        "pid": r.pid,
        "environment": r.environment.key,
        "environment_changes": summary.get("environment_changes", []),
        "pick_before": summary.get("pick_before"),
        "pick_after": summary.get("pick_after"),
        "frontier_added": summary.get("frontier_added", []),
        "frontier_removed": summary.get("frontier_removed", []),
        "regressions": summary.get("regressions", []),
        "comparisons": summary.get("comparisons", []),
        "drift": _drift_view(summary.get("drift") or {}),
        "change_point": summary.get("change_point"),
        "trials_run": r.trials_run,
        "summary_path": r.summary_path,
    }


def _drift_view(drift: dict[str, Any]) -> dict[str, Any]:
    """The night's drift block without its per-configuration measurements."""
    return {key: value for key, value in drift.items() if key != "measured"}


def delete_study(session: Session, name: str) -> dict[str, Any]:
    """Delete a study's rows, children first (no reliance on the database's cascades); counts removed.

    Raises:
        UsageError: no such study.
    """
    study = get_study(session, name)
    trial_ids = select(Trial.id).where(Trial.study_id == study.id)
    counts = {
        "trials": session.scalar(select(func.count()).where(Trial.study_id == study.id)) or 0,
        "measurements": session.scalar(select(func.count()).where(Measurement.trial_id.in_(trial_ids))) or 0,
        "nightly_runs": session.scalar(select(func.count()).where(NightlyRun.study_id == study.id)) or 0,
    }
    session.execute(delete(Measurement).where(Measurement.trial_id.in_(trial_ids)))
    session.execute(delete(Trial).where(Trial.study_id == study.id))
    session.execute(delete(Run).where(Run.study_id == study.id))
    session.execute(delete(NightlyRun).where(NightlyRun.study_id == study.id))
    session.execute(delete(ReferenceModel).where(ReferenceModel.study_id == study.id))
    session.execute(delete(Study).where(Study.id == study.id))
    return {"study": name, **counts}


def latest_calibration(session: Session, fingerprint: dict[str, Any]) -> HardwareCalibration | None:
    """The latest calibration of this environment, else of the same device on the same host with the
    same torch (calibrated at another thread count)."""

    newest = (HardwareCalibration.created_at.desc(), HardwareCalibration.id.desc())
    exact = session.scalars(
        select(HardwareCalibration)
        .join(Environment)
        .where(Environment.key == environment_key(fingerprint))
        .order_by(*newest)
        .limit(1)
    ).one_or_none()
    if exact is not None:
        return exact
    return session.scalars(
        select(HardwareCalibration)
        .join(Environment)
        .where(
            Environment.hostname == fingerprint["hostname"],
            Environment.device == fingerprint["device"],
            Environment.device_name == fingerprint["device_name"],
            Environment.torch_version == fingerprint["torch_version"],
        )
        .order_by(*newest)
        .limit(1)
    ).one_or_none()


def calibration_profile(row: HardwareCalibration) -> HardwareProfile:
    """A stored `pareto calibrate` result as a roofline profile."""

    return HardwareProfile(
        name=f"host-{row.environment.device.replace(':', '-')}",
        description=f"{row.environment.device_name} on {row.environment.hostname}, calibrated",
        peak_flops=dict(row.peak_flops),
        memory_bandwidth_bytes_per_s=row.memory_bandwidth_bytes_per_s,
        method=row.method,
        measured_at=row.created_at.isoformat(),
        calibration_id=row.id,
    )


def host_calibration(session: Session | None, fingerprint: dict[str, Any]) -> tuple[HardwareProfile | None, str | None]:
    """This host's latest calibration as a roofline profile, or None and why.

    A calibration that a measurement beat (``suspect_reason``) is not used: its ceilings are wrong.
    """
    row = latest_calibration(session, fingerprint) if session is not None else None
    if row is None:
        return None, None
    if row.suspect_reason:
        return None, f"The calibration of {row.created_at:%Y-%m-%d %H:%M} is not used: {row.suspect_reason}."
    return calibration_profile(row), None


def mark_calibration_suspect(session: Session, calibration_id: int, reason: str) -> None:
    """Record that a measurement beat this calibration's roofline: its ceilings are too low."""
    row = session.get(HardwareCalibration, calibration_id)
    if row is not None and row.suspect_reason is None:
        row.suspect_reason = reason
