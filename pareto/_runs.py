"""What every measuring command shares: the bench (task, device, environment, database) and its runs.

A run is one invocation that measures (a search, a confirmation, a re-measurement). It has its own
contention probe, compared with the environment's quiet time, and its own baseline timing: speedups
divide by the baseline measured in the same run.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from pareto.metrics import Metrics
from pareto.store import queries
from pareto.store.engine import open_engine, session_scope, upgrade
from pareto.store.models import Environment, Measurement, Run, Trial, utcnow

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from pareto.measure.latency import LatencyResult
    from pareto.measure.probe import ContentionProbe
    from pareto.measure.roofline import HardwareProfile
    from pareto.spec import Measure
    from pareto.task import Task


@dataclass
class Bench:
    """Where and how this process measures: the task, the device, its environment, the database."""

    engine: Engine
    task: Task
    device: str
    threads: int
    fingerprint: dict[str, Any]
    env_id: int
    measure: Measure
    profile: HardwareProfile | None = None
    profile_note: str | None = None


@dataclass
class RunHandle:
    """A run in progress: its row and its contention probe (None when the guard is off)."""

    run_id: int
    probe: ContentionProbe | None


def open_bench(db_url: str, task: Task, measure: Measure, *, with_profile: bool = True) -> Bench:
    """Resolve the device and thread count, store the environment, find the roofline profile.

    Raises:
        UsageError: a bad device or hardware profile; StoreError: the database cannot be used.
    """
    import torch

    from pareto.measure.environment import fingerprint
    from pareto.measure.latency import resolve_device
    from pareto.measure.roofline import resolve_profile

    device = resolve_device(measure.device)
    threads = measure.threads or torch.get_num_threads()
    env_fp = fingerprint(device, threads)
    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        env_id = queries.environment_id(session, env_fp)
        calibration, note = queries.host_calibration(session, env_fp)
    profile = None
    if with_profile:
        profile, missing = resolve_profile(measure.hardware, fingerprint=env_fp, calibration=calibration)
        note = note or missing if measure.hardware in {"auto", "host"} else None
    return Bench(engine, task, device, threads, env_fp, env_id, measure, profile, note)


def start_run(bench: Bench, *, kind: str, study_id: int | None) -> RunHandle:
    """Store a new run; build its contention probe against the environment's quiet time."""
    from pareto.measure.probe import ContentionProbe

    with session_scope(bench.engine) as session:
        env = session.get(Environment, bench.env_id)
        assert env is not None
        probe = None
        if bench.measure.contention_limit is not None:
            probe = ContentionProbe(
                bench.device,
                threads=bench.threads,
                stored_quiet_ms=queries.probe_quiet_ms(session, env.key),
                limit=bench.measure.contention_limit,
            )
        run = Run(
            study_id=study_id,
            kind=kind,
            environment_id=bench.env_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            probe_reference_ms=probe.run_reference_ms if probe is not None else None,
            details={},
        )
        session.add(run)
        session.flush()
        return RunHandle(run.id, probe)


def finish_run(bench: Bench, run: RunHandle, **details: Any) -> None:
    with session_scope(bench.engine) as session:
        row = session.get(Run, run.run_id)
        if row is not None:
            row.finished_at = utcnow()
            row.details = {**(row.details or {}), **details}


def store_measurement(bench: Bench, run: RunHandle, trial_id: int, metrics: Metrics, *, kind: str) -> None:
    """Keep one measurement of a trial's configuration, tagged with its run and environment."""
    with session_scope(bench.engine) as session:
        session.add(
            Measurement(
                trial_id=trial_id, environment_id=bench.env_id, run_id=run.run_id, kind=kind, **metrics.to_dict()
            )
        )


def stored_metrics(bench: Bench, trial_id: int) -> Metrics | None:
    """A trial's stored metrics: from this environment when it was measured here, else any other."""
    with session_scope(bench.engine) as session:
        rows = session.scalars(
            select(Measurement).where(Measurement.trial_id == trial_id).order_by(Measurement.id)
        ).all()
        here = [m for m in rows if m.environment_id == bench.env_id]
        chosen = here or list(rows)
        return Metrics.from_row(chosen[-1]) if chosen else None


def baseline_trial(bench: Bench, study_id: int, batch_size: int) -> int | None:
    """The id of the study's completed baseline trial at ``batch_size``, preferring this environment."""
    with session_scope(bench.engine) as session:
        rows = session.scalars(
            select(Trial)
            .where(
                Trial.study_id == study_id, Trial.is_baseline, Trial.state == "COMPLETE", Trial.batch_size == batch_size
            )
            .order_by(Trial.id)
        ).all()
        here = [t for t in rows if t.environment_id == bench.env_id]
        chosen = here or list(rows)
        return chosen[0].id if chosen else None


def guard_summary(results: list[LatencyResult]) -> str:
    """One line on what the contention guard did across some measurements."""
    discarded = sum(r.discarded_rounds for r in results)
    ratios = [r.probe_ratio_max for r in results if r.probe_ratio_max is not None]
    if not ratios:
        return "no contention probe"
    return f"{discarded} rounds discarded for contention; probe up to {max(ratios):.2g}x its quiet time"
