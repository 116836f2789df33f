"""What every measuring command shares: the bench (task, device, environment, database) and its runs.

A run is one invocation that measures (a search, a confirmation, a re-measurement). It has its own
contention probe, compared with the environment's quiet time, and its own baseline timing: speedups
divide by the baseline measured in the same run.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.errors import MachineBusy, StoreError
from pareto.locks import gpu_work, timing_lock
from pareto.machine import environment_key
from pareto.measure.environment import fingerprint, separate_compiled_code
from pareto.measure.roofline import resolve_profile
from pareto.metrics import Metrics
from pareto.store import storage
from pareto.store.engine import open_engine, require_schema, upgrade
from pareto.store.reads import reading

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.engine import Engine
    from torch import nn

    from pareto.compress import Config, Served
    from pareto.devices import DeviceTask
    from pareto.machine import HardwareProfile
    from pareto.measure.latency import LatencyResult, RoundPlan, Timed
    from pareto.measure.probe import ContentionProbe
    from pareto.spec import Measure
    from pareto.task import Task


@dataclass
class Bench:
    """Where and how this process measures: the task on its device, the environment, the database.

    The bench owns the device: it is resolved once, here, and ``task`` is the task's view on it
    (``pareto.devices.on_device``): every model built for this bench (``build``) and every input,
    training batch and evaluation that feeds one sits on ``device``.
    """

    database: Engine | None  # None: measuring beside no database (``pareto measure`` before any search)
    task: DeviceTask
    device: str
    threads: int
    fingerprint: dict[str, Any]
    stored_env_id: int | None  # None on a read-only bench: the environment is not stored
    measure: Measure
    profile: HardwareProfile | None = None
    profile_note: str | None = None
    #: the environment's quiet contention-probe time from earlier runs (None before the first)
    quiet_ms: float | None = None

    @property
    def engine(self) -> Engine:
        """The database this bench stores into (a read-only bench has none to store into)."""
        assert self.database is not None, "a read-only bench stores nothing"
        return self.database

    @property
    def env_id(self) -> int:
        """The stored environment's id."""
        assert self.stored_env_id is not None, "a read-only bench stores no environment"
        return self.stored_env_id

    def probe(self) -> ContentionProbe | None:
        """A contention probe for a run on this bench (None when the guard is off)."""
        from pareto.measure.probe import ContentionProbe

        if self.measure.contention_limit is None:
            return None
        # on a GPU the reference is timed alone, as a timing is; on the CPU, as before, without the lock
        held = (
            timing_lock(self.device, what="the contention probe's reference")
            if self.device.startswith("cuda")
            else None
        )
        with held or contextlib.nullcontext():
            return ContentionProbe(
                self.device, threads=self.threads, stored_quiet_ms=self.quiet_ms, limit=self.measure.contention_limit
            )


@dataclass
class RunHandle:
    """A run in progress: its row and its contention probe (None when the guard is off)."""

    run_id: int
    probe: ContentionProbe | None


def open_bench(
    db_url: str | None, task: Task, measure: Measure, *, with_profile: bool = True, read_only: bool = False
) -> Bench:
    """Resolve the device and thread count, put the task's data there, store the environment, find the
    roofline profile.

    With ``read_only`` nothing is written: calibrations and the probe's quiet time are read from the
    database when it exists, and the bench has no engine when it does not.

    Raises:
        UsageError: a bad device or hardware profile; StoreError: the database cannot be used.
    """
    import torch

    from pareto.devices import on_device, resolve_device

    separate_compiled_code()  # before anything compiles: code compiled under other kernel limits stays apart
    device = resolve_device(measure.device)
    threads = measure.threads or torch.get_num_threads()
    env_fp = fingerprint(device, threads)
    engine, env_id, calibration, note, quiet = _stored_environment(db_url, env_fp, read_only)
    profile = None
    if with_profile:
        profile, missing = resolve_profile(measure.hardware, fingerprint=env_fp, calibration=calibration)
        note = note or missing if measure.hardware in {"auto", "host"} else None
    view = on_device(task, device)
    return Bench(engine, view, device, threads, env_fp, env_id, measure, profile, note, quiet)


def _stored_environment(
    db_url: str | None, env_fp: dict[str, Any], read_only: bool
) -> tuple[Engine | None, int | None, HardwareProfile | None, str | None, float | None]:
    """The engine, the environment's id (stored unless read-only), its calibration, why none, its quiet probe time."""
    if db_url is None:
        return None, None, None, None, None
    try:
        engine = open_engine(db_url, create=not read_only)
        if read_only:
            require_schema(engine)
        else:
            upgrade(engine)
    except StoreError:
        if not read_only:
            raise
        return None, None, None, None, None  # no database yet: no calibration, the probe's quiet time is its own
    env_id, calibration, note, quiet = storage.bench_environment(engine, env_fp, store=not read_only)
    return engine, env_id, calibration, note, quiet


def start_run(bench: Bench, *, kind: str, study_id: int | None) -> RunHandle:
    """Store a new run; build its contention probe against the environment's quiet time."""
    with reading(bench.engine) as r:
        bench.quiet_ms = r.probe_quiet_ms(environment_key(bench.fingerprint))
    probe = bench.probe()  # outside a transaction: it may wait for the device's timing lock
    run_id = storage.add_run(
        bench.engine,
        study_id=study_id,
        kind=kind,
        environment_id=bench.env_id,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        probe_reference_ms=probe.run_reference_ms if probe is not None else None,
    )
    return RunHandle(run_id, probe)


@dataclass
class Built:
    """A configuration built on the bench's device, and what building it took."""

    config: Config
    served: Served
    compress_s: float

    @property
    def model(self) -> nn.Module:
        """What serves the configuration (``served.module``)."""
        return self.served.module

    @property
    def compile_s(self) -> float | None:
        """Seconds spent building its serving form (``served.compile_s``), kept apart from latency."""
        return self.served.compile_s


def build(bench: Bench, config: Config) -> Built:
    """``config`` applied to a copy of the bench's model, on the bench's device.

    Raises:
        TechniqueError: the configuration broke the model (the reason is kept for the trial).
    """
    from pareto.study.assess import build_served

    served, compress_s = build_served(bench.task, config, bench.device, bench.threads)
    return Built(config, served, compress_s)


def time_together(
    bench: Bench,
    configs: list[Config],
    *,
    plan: RoundPlan,
    probe: ContentionProbe | None,
    seed: int | None = None,
) -> list[tuple[Built, LatencyResult]]:
    """Build every configuration and time them in interleaved rounds, in a random order each round:
    the one way pareto measures a configuration beside its baseline (``pareto measure``, re-measure,
    confirmation, a search's baseline timed again). A configuration listed twice is built once.

    Raises:
        TechniqueError: a configuration broke the model.
        OutOfMemory: building, warming or timing ran out of device memory (``time_beside``).
    """
    return time_beside(bench, configs, (), plan=plan, probe=probe, seed=seed)[0]


def time_beside(
    bench: Bench,
    configs: list[Config],
    beside: Sequence[Timed],
    *,
    plan: RoundPlan,
    probe: ContentionProbe | None,
    seed: int | None = None,
) -> tuple[list[tuple[Built, LatencyResult]], list[LatencyResult]]:
    """``time_together``, with ``beside`` (already built, on the bench's device) timed in the same
    rounds: the nightly's frozen reference workload. Returns the configurations' results and theirs.

    Raises:
        OutOfMemory: (``pareto.study.assess.device_memory``) a configuration ran out of device memory while
            it was built (the sentence names it) or while they were warmed and timed (it names those
            timed together), with the device and the batch; the models built here are let go of and
            the device's cached memory is freed before it is raised.
    """
    from pareto.study.assess import device_memory

    with gpu_work(bench.device, what="configurations timed together"), device_memory(configs, bench.device):
        return _build_and_time(bench, configs, beside, plan=plan, probe=probe, seed=seed)


def _build_and_time(
    bench: Bench,
    configs: list[Config],
    beside: Sequence[Timed],
    *,
    plan: RoundPlan,
    probe: ContentionProbe | None,
    seed: int | None,
) -> tuple[list[tuple[Built, LatencyResult]], list[LatencyResult]]:
    """``time_beside``'s work, in a frame of its own: once an error has left it, its models can be let go of."""
    from pareto.devices import timed_inputs
    from pareto.measure.latency import Timed, measure_interleaved
    from pareto.study.assess import device_memory

    built: dict[str, Built] = {}
    for config in configs:
        if config.key() not in built:
            with device_memory(config, bench.device):
                built[config.key()] = build(bench, config)
    unique = list(built.values())
    items = [
        Timed(b.model, timed_inputs(bench.task, b.config.batch_size), label=b.config.key(), ready=b.served.ready)
        for b in unique
    ]
    latencies = measure_interleaved(
        [*items, *beside], device=bench.device, plan=plan, threads=bench.threads, probe=probe, seed=seed
    )
    by_key = {b.config.key(): (b, latency) for b, latency in zip(unique, latencies[: len(items)], strict=True)}
    return [by_key[config.key()] for config in configs], latencies[len(items) :]


def retime_baseline(
    bench: Bench, run: RunHandle, trial_id: int, batch_size: int, notice: Callable[[str], None]
) -> None:
    """Time the uncompressed model at ``batch_size`` again for this run's speedups (its trial ``trial_id``),
    stored as a "baseline" measurement; said in one line, as is a machine too busy to time it."""
    from pareto.compress import Config
    from pareto.study.assess import remeasured, round_plan

    stored = stored_metrics(bench, trial_id)
    assert stored is not None
    [(_, latency)] = time_together(
        bench, [Config(batch_size=batch_size)], plan=round_plan(bench.measure, None), probe=run.probe
    )
    try:
        timed = remeasured(stored, latency)
    except MachineBusy as exc:
        notice(
            f"The baseline @ batch {batch_size} could not be timed again ({exc}); "
            "this run's speedups use an earlier run's baseline."
        )
        return
    store_measurement(bench, run, trial_id, timed, kind="baseline")
    notice(
        f"Baseline @ batch {batch_size} timed again for this run's speedups: p50 {timed.latency_p50_ms:.3g} ms, "
        f"p99 {timed.latency_p99_ms:.3g} ms (first run: p50 {stored.latency_p50_ms:.3g} ms, "
        f"p99 {stored.latency_p99_ms:.3g} ms)."
    )


def wait_for_quiet(run: RunHandle, notice: Callable[[str], None], wait_s: float) -> bool:
    """After a busy trial: wait up to ``wait_s`` for the machine to quiet down; False when it stayed busy."""
    if run.probe is None:
        return True
    notice(f"The machine is busy: waiting up to {wait_s:.0f} s for it to quiet down before the next trial.")
    if run.probe.wait_for_quiet(wait_s):
        notice("The machine is quiet again; the search goes on.")
        return True
    notice(
        f"The machine stayed busy for {wait_s:.0f} s: the search stops here, every trial stored. "
        "Run the same command when the machine is quiet to continue the study."
    )
    return False


def finish_run(bench: Bench, run: RunHandle, **details: Any) -> None:
    storage.finish_run(bench.engine, run.run_id, details)


def store_measurement(
    bench: Bench, run: RunHandle, trial_id: int, metrics: Metrics, *, kind: str, held: bool = False
) -> None:
    """Keep one measurement of a trial's configuration, tagged with its run and environment; ``held``:
    not answered from until promoted (``pareto.store.trials.promote``)."""
    storage.add_measurement(bench.engine, trial_id, bench.env_id, run.run_id, metrics, kind=kind, held=held)


def stored_metrics(bench: Bench, trial_id: int) -> Metrics | None:
    """A trial's stored metrics: from this environment when it was measured here, else any other."""
    return storage.trial_metrics(bench.engine, trial_id, bench.env_id)


def baseline_trial(bench: Bench, study_id: int, batch_size: int) -> int | None:
    """The id of the study's completed baseline trial at ``batch_size``, preferring this environment."""
    return storage.baseline_trial(bench.engine, study_id, batch_size, bench.env_id)


def guard_summary(results: list[LatencyResult]) -> str:
    """One line on what the contention guard did across some measurements."""
    discarded = sum(r.discarded_rounds for r in results)
    ratios = [r.probe_ratio_max for r in results if r.probe_ratio_max is not None]
    if not ratios:
        return "no contention probe"
    return f"{discarded} rounds discarded for contention; probe up to {max(ratios):.2g}x its quiet time"
