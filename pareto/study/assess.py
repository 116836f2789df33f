"""Compress one configuration and measure it on all four axes: the one path trials and `pareto measure` share."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.compress import Config, Served, apply
from pareto.errors import BaselineFailed, MachineBusy, TechniqueError, Transient, UsageError, exception_line
from pareto.measure.roofline import achieved_fraction, ceiling_suspect, roofline_bound_ms
from pareto.measure.roofline import regime as regime_of
from pareto.metrics import METHOD_SEPARATOR, Metrics
from pareto.study.layers import tracing_layers
from pareto.study.traffic import method as method_at_traffic
from pareto.study.traffic import served_call, served_service, service_times, traffic_fields

if TYPE_CHECKING:
    from torch import nn

    from pareto.machine import HardwareProfile
    from pareto.measure.latency import LatencyResult, RoundPlan
    from pareto.measure.probe import ContentionProbe
    from pareto.spec import Measure, Traffic
    from pareto.task import Task


@dataclass
class Assessment:
    """What one configuration measured, and how long each phase took."""

    config: Config
    metrics: Metrics
    compress_s: float
    compile_s: float | None
    latency_s: float
    accuracy_s: float
    notes: list[str]
    #: why the roofline profile cannot be right (the model ran faster than its bound), or None
    suspect_profile: str | None = None


class Rejected(Exception):
    """A configuration rejected early: its first round of latency put the P99 over the SLO."""

    def __init__(self, latency: LatencyResult, compress_s: float, compile_s: float | None) -> None:
        super().__init__(latency.stop_reason or "rejected early")
        self.latency, self.compress_s, self.compile_s = latency, compress_s, compile_s

    def early_latency(self, slo_ms: float) -> dict[str, Any]:
        """What the first round measured, for the trial's row."""
        s = self.latency.summary
        return {
            "slo_ms": slo_ms,
            "latency_p50_ms": s.p50_ms,
            "latency_p99_ms": s.p99_ms,
            "latency_p99_lower_ms": _finite_or_none(s.p99_lower_ms),
            "samples": s.samples,
            "confidence": s.confidence,
            "method": self.latency.method,
        }


def preflight(task: Task, batch_sizes: list[int], device: str) -> None:
    """Before any trial: build the uncompressed model on ``device``, run it on the example input at every
    batch size, evaluate it once and count its FLOPs once, exactly as a trial will.

    Raises:
        BaselineFailed: any of it fails (the sentence names the step and the reason).
    """
    import torch

    from pareto.devices import as_args, on_device
    from pareto.measure.compute import compute_cost

    view = on_device(task, device)
    step = f"building it on {device}"
    try:
        model, _, _ = build(view, Config(batch_size=batch_sizes[0]), device)
        for batch_size in batch_sizes:
            step = f"running it on example_input({batch_size}) on {device}"
            with torch.inference_mode():
                model(*as_args(view.example_input(batch_size)))
        step = f"evaluating it on {device}"
        accuracy = float(view.evaluate(model))
        step = f"counting its FLOPs on {device}"
        compute_cost(model, view.example_input(batch_sizes[0]))
    except Exception as exc:  # the user's task, model and device meet here first: say which step broke
        raise BaselineFailed(
            f"Task {task.name!r}: the uncompressed model failed when {step}: {exception_line(exc)}"
        ) from exc
    if not math.isfinite(accuracy):
        raise BaselineFailed(f"Task {task.name!r}: the uncompressed model's evaluate returned {accuracy}.")


def round_plan(measure: Measure, slo_ms: float | None, *, adaptive: bool | None = None) -> RoundPlan:
    """The rounds a measurement takes under ``measure``; adaptive when an SLO and a budget are set."""
    from pareto.measure.latency import RoundPlan

    use = (measure.adaptive_budget is not None and slo_ms is not None) if adaptive is None else adaptive
    return RoundPlan(
        samples=measure.samples,
        rounds=measure.rounds,
        warmup=measure.warmup,
        confidence=measure.confidence,
        slo_ms=slo_ms if use else None,
        budget_s=measure.adaptive_budget / 1000 if use and measure.adaptive_budget else None,
        max_discards=measure.max_discards,
    )


def build(task: Task, config: Config, device: str) -> tuple[nn.Module, float, float | None]:
    """The compressed model, the seconds spent compressing, and torch.compile's first-call seconds."""
    served, compress_s = build_served(task, config, device)
    return served.module, compress_s, served.compile_s


def build_served(task: Task, config: Config, device: str, threads: int | None = None) -> tuple[Served, float]:
    """``config`` applied to a copy of the task's model on ``device``, its serving form built at the
    ``threads`` it is timed at, and the seconds spent compressing: the seconds spent building its
    serving form (``Served.compile_s``: compile, capture, export) left out."""
    t0 = time.perf_counter()
    served = apply(task.model, config, task, device=device, threads=threads)
    return served, time.perf_counter() - t0 - (served.compile_s or 0.0)


class OutOfMemory(Transient):
    """A configuration ran out of device memory: ``device_memory``'s one sentence. An outer
    ``device_memory`` frees the memory again and passes it on unchanged."""


@contextmanager
def device_memory(what: Config | Sequence[Config], device: str) -> Iterator[None]:
    """Turn running out of device memory, however deep it was raised and wrapped, into one sentence
    naming the configuration (or the configurations timed together), the device and the batch, and
    give the memory back so the next build starts with the device's memory: the finished frames the
    error passed through are cleared (their tensors would live on in its traceback), the collector
    runs, and CUDA's cached blocks are released.

    Raises:
        OutOfMemory: ``what`` ran out of memory on ``device`` (other work may have held it).
    """
    try:
        yield
    except Exception as exc:
        oom = _out_of_memory(exc)
        if oom is None:
            raise
        _release(exc, device)
        if isinstance(exc, OutOfMemory):
            raise  # an inner device_memory named the configuration; its frames are let go of now
        configs = [what] if isinstance(what, Config) else list({c.key(): c for c in what}.values())
        raise OutOfMemory(
            f"{_named(configs)} ran out of memory on {device}{_batches(configs)} ({_oom_reason(oom)}); "
            f"{'its' if len(configs) == 1 else 'their'} memory was freed"
        ) from exc


def _named(configs: list[Config]) -> str:
    """One configuration's description, or up to three of those timed together."""
    if len(configs) <= 1:
        return configs[0].describe() if configs else "The models timed together"
    names = [c.describe() for c in configs[:3]] + ([f"{len(configs) - 3} more"] if len(configs) > 3 else [])
    return f"{', '.join(names[:-1])} and {names[-1]}, timed together,"


def _batches(configs: list[Config]) -> str:
    """`` at batch 8``, `` at batches 1, 8``; nothing without a configuration."""
    batches = sorted({c.batch_size for c in configs})
    if not batches:
        return ""
    return f" at batch {batches[0]}" if len(batches) == 1 else f" at batches {', '.join(map(str, batches))}"


def _oom_reason(oom: BaseException) -> str:
    """``exception_line`` cut after the CUDA allocator's first three sentences ("CUDA out of memory.
    Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 3.56 MiB is free"):
    the rest of its message is usage figures and advice on fragmentation."""
    return ". ".join(exception_line(oom).split(". ")[:3])


def _release(exc: BaseException, device: str) -> None:
    """Clear the finished frames in ``exc``'s tracebacks (and its causes'), collect, empty CUDA's cache."""
    import gc
    import traceback

    import torch

    chained: BaseException | None = exc
    for _ in range(16):
        if chained is None:
            break
        if chained.__traceback__ is not None:
            traceback.clear_frames(chained.__traceback__)  # a frame still running is skipped
        chained = chained.__cause__ or chained.__context__
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _out_of_memory(exc: BaseException | None) -> BaseException | None:
    """The out-of-memory error in ``exc``'s chain of causes, or None."""
    import torch

    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def latency_fields(latency: LatencyResult, batch_size: int) -> dict[str, Any]:
    """The ``Metrics`` fields a latency measurement sets."""
    s = latency.summary
    return {
        "latency_mean_ms": s.mean_ms,
        "latency_p50_ms": s.p50_ms,
        "latency_p50_lower_ms": _finite_or_none(s.p50_lower_ms),
        "latency_p50_upper_ms": _finite_or_none(s.p50_upper_ms),
        "latency_p90_ms": s.p90_ms,
        "latency_p99_ms": s.p99_ms,
        "latency_p99_lower_ms": _finite_or_none(s.p99_lower_ms),
        "latency_p99_upper_ms": _finite_or_none(s.p99_upper_ms),
        "latency_p999_ms": s.p999_ms,
        "latency_p999_upper_ms": _finite_or_none(s.p999_upper_ms),
        "p99_p50_ratio": s.p99_p50_ratio,
        "samples": s.samples,
        "warmup": latency.warmup,
        "confidence": s.confidence,
        "throughput_per_s": batch_size / (s.mean_ms / 1000),
        "rounds": s.rounds,
        "discarded_rounds": latency.discarded_rounds,
        "round_spread": s.round_spread,
        "round_medians_ms": [round(m, 6) for m in s.round_medians_ms],
        "p99_bound": s.p99_bound,
        "probe_ratio_max": latency.probe_ratio_max,
        "load_average": latency.load_average,
    }


def remeasured(stored: Metrics, latency: LatencyResult) -> Metrics:
    """``stored`` with its latency (and what follows from it) replaced by a new measurement."""
    if latency.busy:
        raise MachineBusy(latency.stop_reason or "machine busy")
    fields = latency_fields(latency, stored.batch_size)
    rest = stored.method.split(METHOD_SEPARATOR)[1:]
    fields["method"] = METHOD_SEPARATOR.join([latency.method, *rest])
    if stored.roofline_bound_ms is not None:
        fraction = stored.roofline_bound_ms / fields["latency_p50_ms"]
        fields["achieved_fraction"] = None if fraction > 1 else fraction
        fields["roofline_suspect"] = fraction > 1
    return dataclasses.replace(stored, **fields)


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
    probe: ContentionProbe | None = None,
    reject_above_ms: float | None = None,
    traffic: Traffic | None = None,
    seed: int = 0,
) -> Assessment:
    """Apply ``config`` to a copy of the task's model and measure accuracy, latency, memory and compute.

    Latency is timed first, in rounds with the contention probe between them (it decides the SLO
    verdict), then ``complete`` measures the rest. With ``reject_above_ms``, a configuration whose
    first round puts the P99 over it with confidence is not measured further.

    Raises:
        TechniqueError: the configuration broke the model (the reason is kept for the trial).
        MachineBusy: the contention guard discarded too many rounds; nothing else was measured.
        Rejected: rejected early (``reject_above_ms``); nothing else was measured.
    """
    from pareto.devices import timed_inputs
    from pareto.measure.latency import measure_latency

    with device_memory(config, device):
        served, compress_s = build_served(task, config, device, threads)
    with tracing_layers(served):  # a failure from here on names the layer it came from
        compile_s = served.compile_s
        t1 = time.perf_counter()
        plan = dataclasses.replace(round_plan(measure, slo_ms), reject_above_ms=reject_above_ms)
        try:
            with device_memory(config, device):
                latency = measure_latency(
                    served.module,
                    timed_inputs(task, config.batch_size),
                    device=device,
                    plan=plan,
                    threads=threads,
                    probe=probe,
                    ready=served.ready,
                )
        except (UsageError, TechniqueError, MachineBusy):  # the timing lock's holder never let go: BUSY, no verdict
            raise
        except Exception as exc:  # a compressed model that cannot run fails its trial, reason kept
            raise TechniqueError(f"{config.describe()} could not be measured: {type(exc).__name__}: {exc}") from exc
        latency_s = time.perf_counter() - t1
        if latency.rejected:
            raise Rejected(latency, compress_s, compile_s)
        with device_memory(config, device):
            result = complete(
                task,
                config,
                served,
                latency,
                device=device,
                threads=threads,
                measure=measure,
                slo_ms=slo_ms,
                profile=profile,
                baseline_theoretical_bytes=baseline_theoretical_bytes,
                traffic=traffic,
                seed=seed,
            )
    result.compress_s, result.compile_s, result.latency_s = compress_s, compile_s, latency_s
    return result


def complete(
    task: Task,
    config: Config,
    served: Served,
    latency: LatencyResult,
    *,
    device: str,
    threads: int,
    measure: Measure,
    slo_ms: float | None,
    profile: HardwareProfile | None,
    baseline_theoretical_bytes: int,
    traffic: Traffic | None = None,
    seed: int = 0,
) -> Assessment:
    """Everything after the latency: accuracy, memory, compute, the roofline, the throughput sweep, and
    at a request rate (``traffic.qps``) the smaller batches' call times and the queue simulated on them.

    Raises:
        TechniqueError: the model could not be evaluated or measured.
        MachineBusy: ``latency`` was given up as busy.
    """
    if latency.busy:
        raise MachineBusy(latency.stop_reason or "machine busy")
    inputs = task.example_input(config.batch_size)
    t0 = time.perf_counter()
    accuracy, other, notes = _other_axes(task, config, served, inputs, device=device)
    accuracy_s = time.perf_counter() - t0
    fields = {
        **latency_fields(latency, config.batch_size),
        **other,
        "accuracy": accuracy,
        "batch_size": config.batch_size,
        "compression_ratio": baseline_theoretical_bytes / max(other["theoretical_bytes"], 1),
    }
    fields["method"] = METHOD_SEPARATOR.join(
        filter(None, [latency.method, task.inputs_note, latency.stop_reason, fields["method"]])
    )
    dtype = fields.pop("dtype")
    suspect = _roofline(fields, profile, dtype, notes) if profile is not None else None
    if measure.throughput_sweep:
        try:
            _sweep(fields, served, task, config, device=device, threads=threads, measure=measure, slo_ms=slo_ms)
        except (UsageError, MachineBusy):
            raise
        except Exception as exc:  # e.g. a served graph whose batch axis is fixed: the trial fails, reason kept
            raise Transient(f"{config.describe()}: the throughput sweep failed: {type(exc).__name__}: {exc}") from exc
    if traffic is not None and traffic.qps is not None and slo_ms is not None:
        fields.update(_at_traffic(served, task, config, latency, traffic, slo_ms, seed, device, threads, measure))
        fields["method"] = METHOD_SEPARATOR.join([fields["method"], method_at_traffic(traffic, slo_ms, seed)])
    return Assessment(config, Metrics(**fields), 0.0, None, latency.elapsed_s, accuracy_s, notes, suspect)


def _other_axes(
    task: Task, config: Config, served: Served, inputs: Any, *, device: str
) -> tuple[float, dict[str, Any], list[str]]:
    """Accuracy, then memory and compute; the ``method`` key joins their methods."""
    from pareto.measure.compute import compute_cost, compute_dtype
    from pareto.measure.memory import memory_breakdown, params_bytes, theoretical_bytes

    model = served.module
    try:
        accuracy = float(task.evaluate(model))
        memory = memory_breakdown(
            model,
            inputs,
            device=device,
            batch_size=config.batch_size,
            attention=task.attention,
            source=served.source,
            graph_pool_bytes=served.graph_pool_bytes,
        )
        cost = compute_cost(model, inputs, source=served.source)
        dtype = compute_dtype(model, served.compute_dtype)
        stored_bytes, ideal_bytes = params_bytes(model), theoretical_bytes(model)
    except UsageError:
        raise
    except Exception as exc:  # a compressed model that cannot be evaluated fails its trial, reason kept
        raise TechniqueError(f"{config.describe()} could not be measured: {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(accuracy):
        raise TechniqueError(f"{config.describe()} made the task's metric {accuracy}")
    return (
        accuracy,
        {
            # a model served by another runtime says how (ONNX Runtime: its version, provider, threads)
            "method": METHOD_SEPARATOR.join(filter(None, [*served.notes, memory.method, cost.method])),
            "params_bytes": stored_bytes,
            "theoretical_bytes": ideal_bytes,
            "activation_bytes": memory.activation_bytes,
            "kv_cache_bytes": memory.kv_cache_bytes,
            "memory_bytes": memory.total_bytes,
            "flops": cost.flops,
            "bytes_moved": cost.bytes_moved,
            "arithmetic_intensity": _finite_or_none(cost.arithmetic_intensity),
            "dtype": dtype,
        },
        [],
    )


def _roofline(fields: dict[str, Any], profile: HardwareProfile, dtype: str, notes: list[str]) -> str | None:
    """Place the measurement on the roofline; return why the profile is wrong when it ran faster."""
    if dtype not in profile.peak_flops:
        notes.append(f"no roofline: profile {profile.name!r} has no {dtype} peak")
        return None
    bound = roofline_bound_ms(fields["flops"], fields["bytes_moved"], profile, dtype)
    intensity = fields["arithmetic_intensity"]
    fraction = achieved_fraction(bound, fields["latency_p50_ms"])
    suspect = ceiling_suspect(fraction, profile)
    fields.update(
        hardware_profile=profile.name,
        roofline_bound_ms=bound,
        regime=regime_of(intensity if intensity is not None else math.inf, profile, dtype),
        achieved_fraction=None if suspect else fraction,
        roofline_suspect=suspect is not None,
    )
    if suspect:
        notes.append(f"roofline not shown as fact: {suspect}")
    return suspect


def _sweep(
    fields: dict[str, Any],
    served: Served,
    task: Task,
    config: Config,
    *,
    device: str,
    threads: int,
    measure: Measure,
    slo_ms: float | None,
) -> None:
    from pareto.devices import timed_inputs
    from pareto.measure.throughput import default_batch_sweep, throughput_curve

    curve = throughput_curve(
        served.module,
        lambda batch: timed_inputs(task, batch),
        default_batch_sweep(2 * config.batch_size),
        device=device,
        plan=round_plan(measure, slo_ms, adaptive=False),
        threads=threads,
        slo_ms=slo_ms,
        ready=served.ready,
    )
    fields["throughput_curve"] = curve.to_dict()["points"]
    fields["saturation_batch"] = curve.saturation_batch
    fields["max_batch_within_slo"] = curve.max_batch_within_slo


def _at_traffic(
    served: Served,
    task: Task,
    config: Config,
    latency: LatencyResult,
    traffic: Traffic,
    slo_ms: float,
    seed: int,
    device: str,
    threads: int,
    measure: Measure,
) -> dict[str, Any]:
    """The traffic fields of ``Metrics`` (``pareto.study.traffic``): the buckets timed, the queue simulated."""
    try:
        service, rows = service_times(
            served, task, config.batch_size, latency, device=device, threads=threads, measure=measure, traffic=traffic
        )
    except (UsageError, MachineBusy):
        raise
    except Exception as exc:  # a served graph whose batch axis is fixed: the trial fails, reason kept
        why = f"{type(exc).__name__}: {exc}"
        raise TechniqueError(f"{config.describe()}: a smaller batch could not be timed: {why}") from exc
    costs = None
    if traffic.serve_runs:
        call = served_call(served, task, config.batch_size, device)
        try:
            costs = served_service(
                call, service, config.batch_size, traffic, slo_ms,
                seed=seed, confidence=measure.confidence, device=device, threads=threads,
            )  # fmt: skip
        except (UsageError, MachineBusy):
            raise
        except Exception as exc:  # the served model failed behind the batcher: the trial fails, reason kept
            raise TechniqueError(f"{config.describe()}: a serving run failed: {type(exc).__name__}: {exc}") from exc
        service = costs.service
        for row in rows:
            row["served_mean_ms"] = service.mean_s(row["batch"]) * 1e3
            row["served_after_idle_mean_ms"] = service.idle_mean_s(row["batch"]) * 1e3
    fields = traffic_fields(
        service, config.batch_size, traffic, slo_ms, seed=seed, confidence=measure.confidence, served=costs
    )
    if costs is None:
        return {**fields, "service_curve": rows}
    return {
        **fields,
        "service_curve": rows,
        "serving_runs": [r.to_dict() for r in costs.runs],
        "serve_threads": costs.threads,
        "serve_instances": costs.instances,
    }


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
