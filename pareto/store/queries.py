"""Reads and writes the commands need; queries never import torch."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload

from pareto.errors import UsageError
from pareto.frontier import Candidate
from pareto.store.models import Environment, Measurement, Study, Trial

#: Metric names copied from a measurement row into a candidate's ``metrics``.
MEASUREMENT_METRICS = (
    "accuracy",
    "batch_size",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p50_lower_ms",
    "latency_p50_upper_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "latency_p99_lower_ms",
    "latency_p99_upper_ms",
    "latency_p999_ms",
    "p99_p50_ratio",
    "samples",
    "warmup",
    "confidence",
    "throughput_per_s",
    "params_bytes",
    "theoretical_bytes",
    "compression_ratio",
)


def get_study(session: Session, name: str) -> Study:
    """The study called ``name``.

    Raises:
        UsageError: no such study (the message lists the known ones).
    """
    study = session.scalars(select(Study).where(Study.name == name)).one_or_none()
    if study is None:
        known = session.scalars(select(Study.name).order_by(Study.name)).all()
        listed = f"known studies: {', '.join(known)}" if known else "the database holds no study yet"
        raise UsageError(f"No study named {name!r}; {listed}.")
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


def environment_dict(env: Environment) -> dict[str, Any]:
    return {
        "key": env.key,
        "device": env.device,
        "device_name": env.device_name,
        "driver": env.driver,
        "torch_version": env.torch_version,
        "cpu_model": env.cpu_model,
        "threads": env.threads,
        "hostname": env.hostname,
    }


def candidates(session: Session, study: Study) -> list[Candidate]:
    """Every completed trial of ``study`` with its measurement and speedups over the baseline.

    The baseline of a trial is the study's uncompressed trial at the same batch size in the same
    environment; without one, the speedups are None.
    """
    rows = session.scalars(
        select(Measurement)
        .join(Trial)
        .where(Trial.study_id == study.id, Trial.state == "COMPLETE")
        .options(joinedload(Measurement.trial), joinedload(Measurement.environment))
        .order_by(Trial.optuna_number)
    ).all()
    baselines: dict[tuple[int, int], Measurement] = {}
    for m in rows:
        if m.trial.is_baseline:
            baselines.setdefault((m.batch_size, m.environment_id), m)
    result = []
    for m in rows:
        metrics = {name: getattr(m, name) for name in MEASUREMENT_METRICS}
        base = baselines.get((m.batch_size, m.environment_id))
        metrics["speedup_p50"] = base.latency_p50_ms / m.latency_p50_ms if base else None
        metrics["speedup_p99"] = base.latency_p99_ms / m.latency_p99_ms if base else None
        metrics["accuracy_delta"] = m.accuracy - base.accuracy if base else None
        metrics["method"] = m.method
        result.append(
            Candidate(
                study=study.name,
                trial=m.trial.optuna_number,
                config=m.trial.config,
                description=m.trial.description,
                metrics=metrics,
                environment=environment_dict(m.environment),
            )
        )
    return result


def study_summaries(session: Session) -> list[dict[str, Any]]:
    """One row per study: name, task, trial counts by state, SLO, environments, dates."""
    studies = session.scalars(select(Study).order_by(Study.created_at, Study.id)).all()
    counts: dict[tuple[int, str], int] = {
        (study_id, state): n
        for study_id, state, n in session.execute(
            select(Trial.study_id, Trial.state, func.count()).group_by(Trial.study_id, Trial.state)
        ).all()
    }
    result = []
    for s in studies:
        n_env = session.scalar(
            select(func.count(func.distinct(Measurement.environment_id))).join(Trial).where(Trial.study_id == s.id)
        )
        result.append(
            {
                "study": s.name,
                "task": s.task,
                "complete": counts.get((s.id, "COMPLETE"), 0),
                "failed": counts.get((s.id, "FAILED"), 0),
                "duplicate": counts.get((s.id, "DUPLICATE"), 0),
                "running": counts.get((s.id, "RUNNING"), 0),
                "slo": s.spec.get("slo", {}),
                "scenario": s.spec.get("scenario"),
                "objectives": s.spec.get("objectives", ["accuracy", "p99"]),
                "environments": n_env or 0,
                "created_at": s.created_at.isoformat(),
                "updated_at": s.updated_at.isoformat(),
            }
        )
    return result
