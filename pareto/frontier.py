"""The Pareto frontier, the SLO filter on conservative bounds, and the pick; no torch, no database."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pareto.errors import NoFeasibleConfiguration
from pareto.measure.stats import MIN_SAMPLES_P99, Verdict, slo_verdict
from pareto.units import format_bytes, format_ms

#: Objective names a study may use: the stored metric behind each, and whether more is better.
#: The latency objectives use the conservative bound; "memory" is params + activations + KV cache.
OBJECTIVES: dict[str, tuple[str, bool]] = {
    "accuracy": ("accuracy", True),
    "p99": ("latency_p99_upper_ms", False),
    "p50": ("latency_p50_ms", False),
    "memory": ("memory_bytes", False),
    "throughput": ("throughput_per_s", True),
    "bytes_moved": ("bytes_moved", False),
    "flops": ("flops", False),
}
DEFAULT_OBJECTIVES: tuple[tuple[str, bool], ...] = (OBJECTIVES["accuracy"], OBJECTIVES["p99"])


def objective_metrics(names: list[str] | tuple[str, ...]) -> tuple[tuple[str, bool], ...]:
    """(metric, maximize?) for objective names such as ``["accuracy", "p99", "memory"]``."""
    return tuple(OBJECTIVES[name] for name in names)


@dataclass(frozen=True)
class Constraints:
    """What a configuration must meet; None means unconstrained."""

    p99_ms: float | None = None
    min_accuracy: float | None = None
    max_memory_bytes: int | None = None
    min_throughput_per_s: float | None = None
    min_samples: int = MIN_SAMPLES_P99

    def to_dict(self) -> dict[str, Any]:
        return {
            "p99_ms": self.p99_ms,
            "min_accuracy": self.min_accuracy,
            "max_memory_bytes": self.max_memory_bytes,
            "min_throughput_per_s": self.min_throughput_per_s,
        }

    def describe(self) -> str:
        parts = []
        if self.p99_ms is not None:
            parts.append(f"P99 ≤ {format_ms(self.p99_ms)}")
        if self.min_accuracy is not None:
            parts.append(f"accuracy ≥ {self.min_accuracy:g}")
        if self.max_memory_bytes is not None:
            parts.append(f"memory ≤ {format_bytes(self.max_memory_bytes)}")
        if self.min_throughput_per_s is not None:
            parts.append(f"throughput ≥ {self.min_throughput_per_s:,.0f}/s")
        return " and ".join(parts) or "no SLO"


@dataclass
class Candidate:
    """One measured configuration as the queries see it."""

    study: str
    trial: int
    config: dict[str, Any]
    description: str
    metrics: dict[str, Any]
    environment: dict[str, Any]
    slo: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "trial": self.trial,
            "config": self.config,
            "metrics": self.metrics,
            "slo": self.slo,
            "environment": self.environment,
        }


def non_dominated(points: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[int]:
    """Indices of the points no other point dominates, for any number of objectives.

    A point dominates another when it is at least as good in every objective and better in one;
    equal points therefore do not dominate each other, and duplicates stay on the frontier together.
    """
    signs = [1.0 if m else -1.0 for m in maximize]
    scored = [[s * v for s, v in zip(signs, p, strict=True)] for p in points]
    front = []
    for i, a in enumerate(scored):
        dominated = any(
            all(bj >= aj for aj, bj in zip(a, b)) and any(bj > aj for aj, bj in zip(a, b))
            for j, b in enumerate(scored)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


def objective_value(metrics: dict[str, Any], metric: str) -> float | None:
    """A stored metric as an objective: the P99 bound falls back to the point estimate when too few
    samples bound it (such a trial is never "met"); memory falls back to parameters for old rows."""
    if metric == "latency_p99_upper_ms" and metrics.get(metric) is None:
        metric = "latency_p99_ms"
    if metric == "memory_bytes":
        return float(memory_bytes(metrics))
    value = metrics.get(metric)
    return float(value) if _finite(value) else None


def frontier(
    candidates: Sequence[Candidate],
    objectives: Sequence[tuple[str, bool]] = DEFAULT_OBJECTIVES,
) -> list[Candidate]:
    """The non-dominated candidates, fastest first."""
    usable = [c for c in candidates if all(objective_value(c.metrics, name) is not None for name, _ in objectives)]
    points = [[objective_value(c.metrics, name) for name, _ in objectives] for c in usable]
    front = [usable[i] for i in non_dominated(points, [m for _, m in objectives])]
    return sorted(front, key=lambda c: (_p99_key(c), -c.metrics["accuracy"], c.trial))


def p99_verdict(metrics: dict[str, Any], slo_ms: float, min_samples: int = MIN_SAMPLES_P99) -> Verdict:
    """The P99 verdict of stored metrics; a missing bound (None) means unbounded on that side."""
    lower, upper = metrics.get("latency_p99_lower_ms"), metrics.get("latency_p99_upper_ms")
    return slo_verdict(
        -math.inf if lower is None else lower,
        math.inf if upper is None else upper,
        slo_ms,
        int(metrics.get("samples", 0)),
        min_samples=min_samples,
    )


def evaluate(candidate: Candidate, constraints: Constraints) -> tuple[bool, list[str], float]:
    """(feasible, violations as phrases, relative distance to feasibility) on the conservative bounds."""
    m = candidate.metrics
    violations: list[str] = []
    distance = 0.0
    verdict = None
    undecided = False
    if constraints.p99_ms is not None:
        verdict = p99_verdict(m, constraints.p99_ms, constraints.min_samples)
        upper = m.get("latency_p99_upper_ms")
        if verdict != "met":
            if upper is None or not math.isfinite(upper):
                violations.append(f"its P99 bound is undecided after {m.get('samples')} samples")
                distance += 1.0
                undecided = verdict == "uncertain"
            elif upper > constraints.p99_ms:
                over = upper - constraints.p99_ms
                ratio = upper / constraints.p99_ms
                how_far = f"{ratio:.0f}× the SLO" if ratio >= 10 else f"{over / constraints.p99_ms:.0%} over"
                violations.append(
                    f"its P99 upper bound is {format_ms(upper)}, {format_ms(over)} ({how_far}) "
                    f"above {format_ms(constraints.p99_ms)}"
                )
                distance += over / constraints.p99_ms
            else:
                violations.append(
                    f"its P99 is within {format_ms(constraints.p99_ms)} but from only {m.get('samples')} "
                    f"samples (need {constraints.min_samples})"
                )
                distance += 0.01
                undecided = True
    if constraints.min_accuracy is not None and m["accuracy"] < constraints.min_accuracy:
        short = constraints.min_accuracy - m["accuracy"]
        violations.append(f"its accuracy {m['accuracy']:.4g} is {short:.3g} below {constraints.min_accuracy:g}")
        distance += short / max(abs(constraints.min_accuracy), 1e-12)
    memory = memory_bytes(m)
    if constraints.max_memory_bytes is not None and memory > constraints.max_memory_bytes:
        over_b = memory - constraints.max_memory_bytes
        violations.append(f"its memory is {format_bytes(memory)}, {format_bytes(over_b)} over the budget")
        distance += over_b / constraints.max_memory_bytes
    floor = constraints.min_throughput_per_s
    if floor is not None and m["throughput_per_s"] < floor:
        short_t = floor - m["throughput_per_s"]
        violations.append(f"its throughput is {m['throughput_per_s']:,.0f}/s, {short_t:,.0f}/s below {floor:,.0f}/s")
        distance += short_t / floor
    constrained = any(v is not None for v in constraints.to_dict().values())
    # with no SLO at all there is nothing to meet: the verdict is absent, not "meets"
    candidate.slo = {
        **constraints.to_dict(),
        "p99_verdict": verdict,
        "feasible": (not violations) if constrained else None,
        "undecided_only": verdict == "uncertain" and len(violations) == 1 and undecided,
        "violations": violations,
    }
    return not violations, violations, distance


def select_best(candidates: Sequence[Candidate], constraints: Constraints, *, study: str) -> Candidate:
    """Highest accuracy among the feasible candidates, then the lowest P99 upper bound.

    Raises:
        NoFeasibleConfiguration: nothing meets the constraints; the message names the closest candidate.
    """
    if not candidates:
        raise NoFeasibleConfiguration(f"Study {study!r} has no completed trial to choose from yet.")
    judged = [(c, *evaluate(c, constraints)) for c in candidates]
    feasible = [c for c, ok, _, _ in judged if ok]
    if feasible:
        return min(feasible, key=lambda c: (-c.metrics["accuracy"], _p99_key(c), c.trial))
    closest, _, violations, _ = min(judged, key=lambda j: (j[3], j[0].trial))
    raise NoFeasibleConfiguration(
        f"No stored configuration of study {study!r} meets {constraints.describe()}; the closest is "
        f"trial {closest.trial} ({closest.description}): {'; '.join(violations)}."
    )


def _p99_key(c: Candidate) -> float:
    value = objective_value(c.metrics, "latency_p99_upper_ms")
    return value if value is not None else math.inf


def memory_bytes(metrics: dict[str, Any]) -> int:
    """Total inference memory; trials stored before the activation/KV terms existed count parameters only."""
    total = metrics.get("memory_bytes")
    return int(total) if total is not None else int(metrics["params_bytes"])


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
