"""SQLAlchemy models: studies, trials, measurements and the environments they were measured in."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    event,
    exists,
    false,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, Mapper, mapped_column, relationship

from pareto.metrics import column_specs


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Environment(Base):
    """Where a measurement was taken; measurements from different environments are not comparable."""

    __tablename__ = "pareto_environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    device: Mapped[str] = mapped_column(String(32))
    device_name: Mapped[str] = mapped_column(String(256))
    driver: Mapped[str | None] = mapped_column(String(128))
    torch_version: Mapped[str] = mapped_column(String(64))
    cpu_model: Mapped[str] = mapped_column(String(256))
    threads: Mapped[int] = mapped_column(Integer)
    hostname: Mapped[str] = mapped_column(String(256))
    details: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Study(Base):
    """One search: a task, its spec, and the Optuna study of the same name."""

    __tablename__ = "pareto_studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    task: Mapped[str] = mapped_column(String(512))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    trials: Mapped[list[Trial]] = relationship(back_populates="study", order_by="Trial.id")


class Trial(Base):
    """One configuration tried in a study.

    ``state``: RUNNING; COMPLETE (measured); DUPLICATE (answered from an earlier trial's measurement);
    FAILED (``error`` says why; ``config_failed`` when the configuration itself broke here, so that a
    repeat is answered with that reason and never built again); BUSY (the contention guard gave up: no
    verdict, measured again when proposed again); PRUNED (rejected early: its first round of latency put
    the P99 over the SLO with confidence, so the rest was not measured; ``early_latency`` holds that
    round, ``error`` the reason).
    """

    __tablename__ = "pareto_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "optuna_number", name="uq_trial_study_optuna_number"),
        Index("ix_pareto_trials_study_baseline", "study_id", "is_baseline"),
        # the claim (revision 0010): one trial at a time measures a configuration in an environment; a
        # second insert of the same RUNNING configuration fails, and its worker waits for the verdict
        Index(
            "uq_pareto_trials_running",
            "study_id",
            "environment_id",
            "config_key",
            unique=True,
            sqlite_where=text("state = 'RUNNING'"),
            postgresql_where=text("state = 'RUNNING'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("pareto_studies.id", ondelete="CASCADE"), index=True)
    optuna_number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="RUNNING")
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(String(64), index=True)
    description: Mapped[str] = mapped_column(Text)
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    batch_size: Mapped[int] = mapped_column(Integer)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("pareto_environments.id"))
    error: Mapped[str | None] = mapped_column(Text)
    #: FAILED because the configuration broke here (not an interruption, nor a worker that stopped)
    config_failed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # seconds spent in each phase; "everything else" (sampler, database) is the trial's wall time minus these
    compress_s: Mapped[float | None] = mapped_column(Float)
    compile_s: Mapped[float | None] = mapped_column(Float)  # torch.compile's first call, never latency
    latency_s: Mapped[float | None] = mapped_column(Float)
    accuracy_s: Mapped[float | None] = mapped_column(Float)
    #: a trial rejected early: its first round's latency (ms) and the SLO it was judged against
    early_latency: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    study: Mapped[Study] = relationship(back_populates="trials")
    environment: Mapped[Environment | None] = relationship()
    measurements: Mapped[list[Measurement]] = relationship(back_populates="trial", order_by="Measurement.id")


def _sql_type(python_type: type, metadata: dict[str, Any]) -> Any:
    kind = metadata.get("sql")
    if kind == "big":
        return BigInteger()
    if kind == "string":
        return String(metadata["length"])
    if kind == "text" or python_type is str:
        return Text()
    return {float: Float(), int: Integer(), bool: Boolean(), list: JSON()}[python_type]


#: One column per field of ``pareto.metrics.Metrics``: the record is the schema's single source.
_MetricColumns: type = type(
    "_MetricColumns",
    (),
    {name: mapped_column(_sql_type(py, meta), nullable=nullable) for name, py, nullable, meta in column_specs()},
)


class Run(Base):
    """One invocation that measured: a search, a confirmation, a re-measurement.

    Speedups divide by the baseline measured in the same run, and the run says when, where and by
    which process the measurements were taken.
    """

    __tablename__ = "pareto_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("pareto_studies.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    hostname: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    probe_reference_ms: Mapped[float | None] = mapped_column(Float)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    environment: Mapped[Environment] = relationship()


class Measurement(_MetricColumns, Base):
    """One measurement of a trial's configuration (the ``Metrics`` columns), with where and why.

    ``kind``: "search" (the trial itself), "baseline" (the uncompressed model timed again at the start
    of a run), "confirm" (re-measured in interleaved rounds with the baseline) or "remeasure"
    (``pareto measure --trial``).

    ``study_id`` (the trial's) and ``preferred`` are kept for the queries (revision 0006), set on
    insert by ``_index_for_queries``: ``preferred`` marks the one measurement per completed trial and
    environment that ``best`` and ``frontier`` use — the latest confirmation, else the first search
    measurement — so that they filter and sort in the database through one index instead of loading
    every row.
    """

    __tablename__ = "pareto_measurements"
    __table_args__ = (
        # best: walk the preferred rows of one study and environment, most accurate first;
        # frontier: read the default objectives from the index alone
        Index(
            "ix_pareto_measurements_choice",
            "study_id",
            "environment_id",
            "preferred",
            "accuracy",
            "latency_p99_upper_ms",
            "samples",
            "trial_id",
        ),
        # the environments of a study and the latest one, newest row first
        Index("ix_pareto_measurements_study_env", "study_id", "environment_id", "created_at"),
        # one preferred measurement per trial and environment (revision 0010)
        Index(
            "uq_pareto_measurements_preferred",
            "trial_id",
            "environment_id",
            unique=True,
            sqlite_where=text("preferred"),
            postgresql_where=text("preferred"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("pareto_trials.id", ondelete="CASCADE"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("pareto_runs.id", ondelete="SET NULL"), index=True)
    kind: Mapped[str] = mapped_column(String(16), default="search")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("pareto_studies.id", ondelete="CASCADE"))
    preferred: Mapped[bool] = mapped_column(Boolean, default=False)

    trial: Mapped[Trial] = relationship(back_populates="measurements")
    environment: Mapped[Environment] = relationship()
    run: Mapped[Run | None] = relationship()

    #: not a column: stored unpreferred, for a later ``promote`` (a nightly's re-measurements, answered
    #: from only once the night ends with a verdict)
    held = False


@event.listens_for(Measurement, "before_insert")
def _index_for_queries(_mapper: Mapper[Any], connection: Connection, target: Measurement) -> None:
    """Fill ``study_id`` and ``preferred`` of a new measurement (and demote the row a confirmation replaces).

    The trial's row is locked first (``FOR UPDATE`` on PostgreSQL; SQLite's writers are serialized
    already), so that two confirmations of one trial, stored at once, demote each other in turn: one
    preferred measurement per trial and environment, as the unique index ``uq_pareto_measurements_preferred``
    requires."""
    trial = connection.execute(
        select(Trial.study_id, Trial.state).where(Trial.id == target.trial_id).with_for_update()
    ).one_or_none()
    target.study_id = trial.study_id if trial is not None else None
    same = (Measurement.trial_id == target.trial_id) & (Measurement.environment_id == target.environment_id)
    if trial is None or trial.state != "COMPLETE" or target.held:  # measured, then failed: never used (a
        target.preferred = False  # trial is stored COMPLETE with its measurement, and leaves RUNNING once)
    elif target.kind == "confirm":
        connection.execute(update(Measurement).where(same, Measurement.preferred.is_(True)).values(preferred=False))
        target.preferred = True
    elif target.kind == "search":
        target.preferred = not connection.scalar(select(exists().where(same, Measurement.preferred.is_(True))))
    else:
        target.preferred = False


class HardwareCalibration(Base):
    """The host's own ceilings, measured by ``pareto calibrate`` (peak FLOP/s per dtype, bandwidth)."""

    __tablename__ = "pareto_calibrations"

    id: Mapped[int] = mapped_column(primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"), index=True)
    peak_flops: Mapped[dict[str, Any]] = mapped_column(JSON)
    memory_bandwidth_bytes_per_s: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(Text)
    #: set when a measurement ran faster than this calibration's roofline allows: calibrate again
    suspect_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    environment: Mapped[Environment] = relationship()


class NightlyRun(Base):
    """One ``pareto nightly`` job: when, where, the pick before and after, and what it decided.

    ``status``: running (in progress, or its process died: the next nightly marks it interrupted);
    ok; regression (exit 3); noisy (the contention guard gave up: no verdict); interrupted; failed.
    ``summary`` is the JSON summary the job wrote.
    """

    __tablename__ = "pareto_nightly_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("pareto_studies.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="running")
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    hostname: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    pick_before: Mapped[int | None] = mapped_column(Integer)  #: Optuna trial number
    pick_after: Mapped[int | None] = mapped_column(Integer)
    trials_run: Mapped[int] = mapped_column(Integer, default=0)
    regressions: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    summary_path: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    environment: Mapped[Environment] = relationship()


class ReferenceModel(Base):
    """A frozen reference a study's nightlies time beside the pick: a ``torch.export`` program, stored once
    per study and environment, and never changed (``pareto.measure.reference``)."""

    __tablename__ = "pareto_reference_models"
    __table_args__ = (UniqueConstraint("study_id", "digest"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("pareto_studies.id", ondelete="CASCADE"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    digest: Mapped[str] = mapped_column(String(64))  #: SHA-256 of ``program``
    source: Mapped[str] = mapped_column(Text)  #: what was frozen, e.g. "trial 5 as served"
    program: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TechniqueCheck(Base):
    """What a study learned about one technique in one environment before its trials (``pareto.preflight``).

    ``kind``: "runs" (the technique alone built on the task's model and ran one forward; ``reason`` says
    why not) or "pays" (the lever probe: the technique on a layer of the task's widths, timed beside
    float32; ``details`` holds the timings) or "leave" (a layer a trial's failure was traced to:
    ``details["layer"]``, which the technique leaves alone for the rest of the study). ``config_key`` is
    the configuration that was checked, so a check is taken again when the space's parameters change.
    """

    __tablename__ = "pareto_technique_checks"
    __table_args__ = (UniqueConstraint("study_id", "environment_id", "kind", "config_key", name="uq_technique_check"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("pareto_studies.id", ondelete="CASCADE"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    kind: Mapped[str] = mapped_column(String(16))
    technique: Mapped[str] = mapped_column(String(64))
    config_key: Mapped[str] = mapped_column(String(64))
    ok: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LoadRun(Base):
    """A real load run of a trial's configuration at an arrival rate (``pareto.measure.load``): requests
    sent on a seeded Poisson schedule to the served model behind the batcher, timed per request.

    ``valid`` is LoadGen's rule: enough requests for the one-sided P99 bound, and the run kept up with
    the offered rate (else it was over capacity: ``summary["reason"]`` says why). ``summary`` is the
    run's ``to_dict``.
    """

    __tablename__ = "pareto_load_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("pareto_trials.id", ondelete="CASCADE"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("pareto_runs.id", ondelete="SET NULL"))
    qps: Mapped[float] = mapped_column(Float)
    max_batch: Mapped[int] = mapped_column(Integer)
    max_wait_ms: Mapped[float] = mapped_column(Float)
    request_p99_upper_ms: Mapped[float | None] = mapped_column(Float)
    kept_up: Mapped[bool] = mapped_column(Boolean)
    valid: Mapped[bool] = mapped_column(Boolean)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DataVersion(Base):
    """One row: a counter every writing transaction of pareto's sessions moves (``pareto.store.version``)."""

    __tablename__ = "pareto_data_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
