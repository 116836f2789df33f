"""Measurement on the target device: latency with confidence intervals, memory, environment.

Names are re-exported lazily so that importing ``pareto.measure.stats`` (used by query commands)
never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MIN_SAMPLES_P99": "stats",
    "LatencySummary": "stats",
    "PercentileEstimate": "stats",
    "percentile_ci": "stats",
    "slo_verdict": "stats",
    "summarize": "stats",
    "LatencyResult": "latency",
    "measure_latency": "latency",
    "resolve_device": "latency",
    "params_bytes": "memory",
    "theoretical_bytes": "memory",
    "environment_key": "environment",
    "fingerprint": "environment",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pareto.measure' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pareto.measure.{module}"), name)
