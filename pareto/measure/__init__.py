"""Measurement on the target device: latency in rounds with confidence bounds and a contention probe,
throughput, memory, compute, the roofline against hardware profiles, host calibration, environment.

Names are re-exported lazily so that importing ``pareto.measure.stats`` (used by query commands)
never imports torch. ``calibrate`` is imported from ``pareto.measure.calibrate`` itself: its name is
also the submodule's, which Python binds on the package once the submodule is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MIN_SAMPLES_P99": "stats",
    "LatencySummary": "stats",
    "PercentileEstimate": "stats",
    "between_round_bounds": "stats",
    "order_statistic_bounds": "stats",
    "percentile_bounds": "stats",
    "slo_verdict": "stats",
    "summarize": "stats",
    "LatencyResult": "latency",
    "RoundPlan": "latency",
    "Timed": "latency",
    "measure_interleaved": "latency",
    "measure_latency": "latency",
    "ContentionProbe": "probe",
    "params_bytes": "memory",
    "theoretical_bytes": "memory",
    "activation_bytes": "memory",
    "kv_cache_bytes": "memory",
    "MemoryBreakdown": "memory",
    "memory_breakdown": "memory",
    "ComputeCost": "compute",
    "LayerCost": "compute",
    "arithmetic_intensity": "compute",
    "bytes_moved": "compute",
    "compute_cost": "compute",
    "compute_dtype": "compute",
    "count_flops": "compute",
    "layer_costs": "compute",
    "ThroughputCurve": "throughput",
    "ThroughputPoint": "throughput",
    "default_batch_sweep": "throughput",
    "throughput_curve": "throughput",
    "HardwareProfile": "pareto.machine",
    "achieved_fraction": "roofline",
    "list_profiles": "roofline",
    "load_profile": "roofline",
    "regime": "roofline",
    "roofline_bound_ms": "roofline",
    "environment_key": "pareto.machine",
    "fingerprint": "environment",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pareto.measure' has no attribute {name!r}")
    return getattr(importlib.import_module(module if "." in module else f"pareto.measure.{module}"), name)
