"""Reads and writes the commands need; queries never import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload

from pareto.errors import UsageError
from pareto.frontier import Candidate
from pareto.store.models import Environment, HardwareCalibration, Measurement, Study, Trial

if TYPE_CHECKING:
    from pareto.measure.roofline import HardwareProfile

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
    "activation_bytes",
    "kv_cache_bytes",
    "memory_bytes",
    "flops",
    "bytes_moved",
    "arithmetic_intensity",
    "hardware_profile",
    "roofline_bound_ms",
    "regime",
    "achieved_fraction",
    "throughput_curve",
    "saturation_batch",
    "max_batch_within_slo",
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


def environment_id(session: Session, fp: dict[str, Any]) -> int:
    """The id of the environment with this fingerprint, stored on first sight."""
    from pareto.measure.environment import environment_key

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


def latest_calibration(session: Session, fingerprint: dict[str, Any]) -> HardwareCalibration | None:
    """The latest calibration of this environment, else of the same device on the same host with the
    same torch (calibrated at another thread count)."""
    from pareto.measure.environment import environment_key

    newest = (HardwareCalibration.created_at.desc(), HardwareCalibration.id.desc())
    exact = session.scalars(
        select(HardwareCalibration).join(Environment).where(Environment.key == environment_key(fingerprint))
        .order_by(*newest).limit(1)
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
    from pareto.measure.roofline import HardwareProfile

    return HardwareProfile(
        name=f"host-{row.environment.device.replace(':', '-')}",
        description=f"{row.environment.device_name} on {row.environment.hostname}, calibrated",
        peak_flops=dict(row.peak_flops),
        memory_bandwidth_bytes_per_s=row.memory_bandwidth_bytes_per_s,
        method=row.method,
        measured_at=row.created_at.isoformat(),
    )


#: GPU names (as torch reports them) to datasheet profiles, most specific first.
_GPU_PROFILES = (("H200", "h200"), ("H100", "h100-sxm"), ("A100-SXM4-80GB", "a100-80gb"), ("A100 80GB", "a100-80gb"),
                 ("A100", "a100-40gb"), ("V100", "v100"))


def resolve_profile(
    session: Session | None, name: str | None, *, fingerprint: dict[str, Any]
) -> tuple[HardwareProfile | None, str | None]:
    """The roofline profile a measurement uses, and a note when there is none.

    ``auto``: a CUDA device's datasheet profile by its name, else this host's latest calibration.
    ``host``: the latest calibration of this environment. Any other name: a configs/hardware profile.

    Raises:
        UsageError: an unknown profile name, or ``host`` without a calibration.
    """
    from pareto.measure.roofline import load_profile

    if name is None:
        return None, None
    device, device_name = fingerprint["device"], fingerprint["device_name"]
    calibration = latest_calibration(session, fingerprint) if session is not None else None
    if name == "host":
        if calibration is None:
            raise UsageError(
                "No calibration of this machine is stored; run 'pareto calibrate' first, "
                "or name a profile with --hardware (see 'pareto hardware')."
            )
        return calibration_profile(calibration), None
    if name != "auto":
        return load_profile(name), None
    if device.startswith("cuda"):
        for marker, profile in _GPU_PROFILES:
            if marker.lower() in device_name.lower():
                return load_profile(profile), None
    if calibration is not None:
        return calibration_profile(calibration), None
    return None, "No roofline: run 'pareto calibrate' once to measure this machine's ceilings, or pass --hardware."
