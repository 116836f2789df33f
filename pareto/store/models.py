"""SQLAlchemy models: studies, trials, measurements and the environments they were measured in."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String, Text
from sqlalchemy import UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


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
    """One configuration tried in a study: COMPLETE with a measurement, FAILED with a reason, or RUNNING."""

    __tablename__ = "pareto_trials"
    __table_args__ = (UniqueConstraint("study_id", "optuna_number", name="uq_trial_study_optuna_number"),)

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
    # seconds spent in each phase; "everything else" (sampler, database) is the trial's wall time minus these
    compress_s: Mapped[float | None] = mapped_column(Float)
    compile_s: Mapped[float | None] = mapped_column(Float)  # torch.compile's first call, never latency
    latency_s: Mapped[float | None] = mapped_column(Float)
    accuracy_s: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    study: Mapped[Study] = relationship(back_populates="trials")
    environment: Mapped[Environment | None] = relationship()
    measurement: Mapped[Measurement | None] = relationship(back_populates="trial", uselist=False)


class Measurement(Base):
    """Everything measured for one trial, with the method that produced it."""

    __tablename__ = "pareto_measurements"

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("pareto_trials.id", ondelete="CASCADE"), unique=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"))
    accuracy: Mapped[float] = mapped_column(Float)
    batch_size: Mapped[int] = mapped_column(Integer)
    latency_mean_ms: Mapped[float] = mapped_column(Float)
    latency_p50_ms: Mapped[float] = mapped_column(Float)
    latency_p50_lower_ms: Mapped[float | None] = mapped_column(Float)
    latency_p50_upper_ms: Mapped[float | None] = mapped_column(Float)
    latency_p90_ms: Mapped[float] = mapped_column(Float)
    latency_p99_ms: Mapped[float] = mapped_column(Float)
    latency_p99_lower_ms: Mapped[float | None] = mapped_column(Float)
    latency_p99_upper_ms: Mapped[float | None] = mapped_column(Float)
    latency_p999_ms: Mapped[float] = mapped_column(Float)
    p99_p50_ratio: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[int] = mapped_column(Integer)
    confidence: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(Text)
    throughput_per_s: Mapped[float] = mapped_column(Float)
    params_bytes: Mapped[int] = mapped_column(BigInteger)
    theoretical_bytes: Mapped[int] = mapped_column(BigInteger)
    compression_ratio: Mapped[float] = mapped_column(Float)
    # the four axes beyond latency (revision 0002); None on rows measured before it
    activation_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_cache_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    flops: Mapped[int | None] = mapped_column(BigInteger)
    bytes_moved: Mapped[int | None] = mapped_column(BigInteger)
    arithmetic_intensity: Mapped[float | None] = mapped_column(Float)
    hardware_profile: Mapped[str | None] = mapped_column(String(128))
    roofline_bound_ms: Mapped[float | None] = mapped_column(Float)
    regime: Mapped[str | None] = mapped_column(String(16))
    achieved_fraction: Mapped[float | None] = mapped_column(Float)
    throughput_curve: Mapped[list[Any] | None] = mapped_column(JSON)
    saturation_batch: Mapped[int | None] = mapped_column(Integer)
    max_batch_within_slo: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    trial: Mapped[Trial] = relationship(back_populates="measurement")
    environment: Mapped[Environment] = relationship()


class HardwareCalibration(Base):
    """The host's own ceilings, measured by ``pareto calibrate`` (peak FLOP/s per dtype, bandwidth)."""

    __tablename__ = "pareto_calibrations"

    id: Mapped[int] = mapped_column(primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("pareto_environments.id"), index=True)
    peak_flops: Mapped[dict[str, Any]] = mapped_column(JSON)
    memory_bandwidth_bytes_per_s: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    environment: Mapped[Environment] = relationship()
