"""Compress one configuration and measure it on all four axes: the one path trials and `pareto measure` share."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.compress import Config, apply
from pareto.errors import TechniqueError, UsageError

if TYPE_CHECKING:
    from torch import nn

    from pareto.measure.roofline import HardwareProfile
    from pareto.spec import Measure
    from pareto.task import Task


#: Joins the method of each term (latency, memory, compute) in a measurement's ``method``.
METHOD_SEPARATOR = " | "


@dataclass
class Assessment:
    """What one configuration measured: ``metrics`` (the columns of a measurement row) and timings."""

    config: Config
    metrics: dict[str, Any]
    compress_s: float
    compile_s: float | None
    latency_s: float
    accuracy_s: float
    notes: list[str]


def check_input_fits(task: Task) -> None:
    """Fail before any search when the task's example_input does not fit its own model.

    Raises:
        UsageError: the model raises on ``example_input(1)``.
    """
    import torch

    inputs = task.example_input(1)
    args = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    try:
        with torch.inference_mode():
            task.model.eval()(*args)
    except Exception as exc:  # the user's example_input and model disagree: say so before measuring
        raise UsageError(
            f"Task {task.name!r}: the model does not accept example_input(1): {type(exc).__name__}: {exc}"
        ) from exc


def assess(
    task: Task,
    config: Config,
    *,
    device: str,
    threads: int,
    measure: Measure,
    slo_ms: float | None = None,
    profile: HardwareProfile | None = None,
    baseline_theoretical_bytes: int,
) -> Assessment:
    """Apply ``config`` to a copy of the task's model and measure accuracy, latency, memory and compute.

    Latency is timed first (it decides the SLO verdict), then accuracy, then the memory terms, the
    FLOPs and bytes of one forward pass and, given a hardware profile, the roofline.

    Raises:
        TechniqueError: the configuration broke the model (the reason is kept for the trial).
    """
    from pareto.measure.compute import compute_cost, compute_dtype
    from pareto.measure.latency import measure_latency
    from pareto.measure.memory import memory_breakdown, params_bytes, theoretical_bytes

    t0 = time.perf_counter()
    model = apply(task.model, config, task, device=device)
    compile_s = getattr(model, "pareto_compile_s", None)
    compress_s = time.perf_counter() - t0 - (compile_s or 0.0)
    notes: list[str] = []
    try:
        inputs = task.example_input(config.batch_size)
        t1 = time.perf_counter()
        adaptive = measure.adaptive_budget is not None and slo_ms is not None
        latency = measure_latency(
            model,
            inputs,
            device=device,
            samples=measure.samples,
            warmup=measure.warmup,
            threads=threads,
            confidence=measure.confidence,
            slo_ms=slo_ms if adaptive else None,
            budget_s=measure.adaptive_budget / 1000 if adaptive and measure.adaptive_budget else None,
        )
        t2 = time.perf_counter()
        accuracy = float(task.evaluate(model))
        t3 = time.perf_counter()
        memory = memory_breakdown(model, inputs, device=device, batch_size=config.batch_size, attention=task.attention)
        cost = compute_cost(model, inputs)
        dtype = compute_dtype(model)
        stored_bytes, ideal_bytes = params_bytes(model), theoretical_bytes(model)
    except UsageError:
        raise
    except Exception as exc:  # a compressed model that cannot run or be measured fails its trial, reason kept
        raise TechniqueError(f"{config.describe()} could not be measured: {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(accuracy):
        raise TechniqueError(f"{config.describe()} made the task's metric {accuracy}")
    s = latency.summary
    metrics: dict[str, Any] = {
        "accuracy": accuracy,
        "batch_size": config.batch_size,
        "latency_mean_ms": s.mean_ms,
        "latency_p50_ms": s.p50_ms,
        "latency_p50_lower_ms": _finite_or_none(s.p50_lower_ms),
        "latency_p50_upper_ms": _finite_or_none(s.p50_upper_ms),
        "latency_p90_ms": s.p90_ms,
        "latency_p99_ms": s.p99_ms,
        "latency_p99_lower_ms": _finite_or_none(s.p99_lower_ms),
        "latency_p99_upper_ms": _finite_or_none(s.p99_upper_ms),
        "latency_p999_ms": s.p999_ms,
        "p99_p50_ratio": s.p99_p50_ratio,
        "samples": s.samples,
        "warmup": latency.warmup,
        "confidence": s.confidence,
        "method": METHOD_SEPARATOR.join(filter(None, [latency.method, latency.stop_reason, memory.method, cost.method])),
        "throughput_per_s": config.batch_size / (s.mean_ms / 1000),
        "params_bytes": stored_bytes,
        "theoretical_bytes": ideal_bytes,
        "compression_ratio": baseline_theoretical_bytes / max(ideal_bytes, 1),
        "activation_bytes": memory.activation_bytes,
        "kv_cache_bytes": memory.kv_cache_bytes,
        "memory_bytes": memory.total_bytes,
        "flops": cost.flops,
        "bytes_moved": cost.bytes_moved,
        "arithmetic_intensity": _finite_or_none(cost.arithmetic_intensity),
        "hardware_profile": None,
        "roofline_bound_ms": None,
        "regime": None,
        "achieved_fraction": None,
        "throughput_curve": None,
        "saturation_batch": None,
        "max_batch_within_slo": None,
    }
    if profile is not None:
        _roofline(metrics, profile, dtype, notes)
    if measure.throughput_sweep:
        _sweep(metrics, model, task, config, device=device, threads=threads, measure=measure, slo_ms=slo_ms)
    return Assessment(config, metrics, compress_s, compile_s, t2 - t1, t3 - t2, notes)


def _roofline(metrics: dict[str, Any], profile: HardwareProfile, dtype: str, notes: list[str]) -> None:
    from pareto.measure.roofline import achieved_fraction, roofline_bound_ms
    from pareto.measure.roofline import regime as regime_of

    if dtype not in profile.peak_flops:
        notes.append(f"no roofline: profile {profile.name!r} has no {dtype} peak")
        return
    bound = roofline_bound_ms(metrics["flops"], metrics["bytes_moved"], profile, dtype)
    intensity = metrics["arithmetic_intensity"]
    metrics["hardware_profile"] = profile.name
    metrics["roofline_bound_ms"] = bound
    metrics["regime"] = regime_of(intensity if intensity is not None else math.inf, profile, dtype)
    metrics["achieved_fraction"] = achieved_fraction(bound, metrics["latency_p50_ms"])


def _sweep(
    metrics: dict[str, Any], model: nn.Module, task: Task, config: Config, *, device: str, threads: int,
    measure: Measure, slo_ms: float | None,
) -> None:
    from pareto.measure.throughput import default_batch_sweep, throughput_curve

    curve = throughput_curve(
        model,
        task.example_input,
        default_batch_sweep(2 * config.batch_size),
        device=device,
        samples=measure.samples,
        warmup=measure.warmup,
        threads=threads,
        slo_ms=slo_ms,
        confidence=measure.confidence,
    )
    metrics["throughput_curve"] = curve.to_dict()["points"]
    metrics["saturation_batch"] = curve.saturation_batch
    metrics["max_batch_within_slo"] = curve.max_batch_within_slo


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
