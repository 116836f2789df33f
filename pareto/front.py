"""The Pareto frontier, the SLO rules on conservative bounds, and the pick; no torch, no database."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pareto.errors import NoFeasibleConfiguration
from pareto.naming import describe_config
from pareto.slo import MIN_SAMPLES_P99, P99_BOUND_METRIC, Verdict, slo_verdict
from pareto.units import format_bytes, format_ms

#: Objective names a study may use: the stored metric behind each, and whether more is better.
#: The latency objectives use the conservative bound; "memory" is params + activations + KV cache.
OBJECTIVES: dict[str, tuple[str, bool]] = {
    "accuracy": ("accuracy", True),
    "p99": (P99_BOUND_METRIC, False),
    "p50": ("latency_p50_ms", False),
    "memory": ("memory_bytes", False),
    "throughput": ("throughput_per_s", True),
    "bytes_moved": ("bytes_moved", False),
    "flops": ("flops", False),
}
#: The objectives of a study that names none.
DEFAULT_OBJECTIVE_NAMES: tuple[str, ...] = ("accuracy", "p99")
DEFAULT_OBJECTIVES: tuple[tuple[str, bool], ...] = tuple(OBJECTIVES[name] for name in DEFAULT_OBJECTIVE_NAMES)


def objective_metrics(names: Sequence[str]) -> tuple[tuple[str, bool], ...]:
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

    @property
    def any(self) -> bool:
        return any(v is not None for v in self.to_dict().values())

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
    """One measured configuration as the queries see it.

    ``confirmation`` is None unless the metrics come from a confirmation (interleaved rounds with the
    baseline): then it holds ``rounds``, ``discarded_rounds`` and ``confirmed_at``.
    """

    study: str
    trial: int
    config: dict[str, Any]
    description: str
    metrics: dict[str, Any]
    environment: dict[str, Any]
    slo: dict[str, Any] = field(default_factory=dict)
    confirmation: dict[str, Any] | None = None
    measurement_id: int | None = None  #: the stored row the metrics come from (not part of ``to_dict``)

    def to_dict(self) -> dict[str, Any]:
        """As every JSON answer shows it; ``config.backend`` is always named there (stored: only when not eager)."""
        return {
            "study": self.study,
            "trial": self.trial,
            "config": {**self.config, "backend": self.config.get("backend", "eager")},
            "metrics": self.metrics,
            "slo": self.slo,
            "confirmation": self.confirmation,
            "environment": self.environment,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        """The candidate ``to_dict`` wrote (the description made again from the configuration)."""
        config = dict(data["config"])
        if config.get("backend") == "eager":
            del config["backend"]  # stored only when not eager
        return cls(
            study=data["study"],
            trial=data["trial"],
            config=config,
            description=describe_config(config),
            metrics=data["metrics"],
            environment=data["environment"],
            slo=data.get("slo") or {},
            confirmation=data.get("confirmation"),
        )


@dataclass(frozen=True)
class Judgement:
    """A candidate against the constraints, on the conservative bounds.

    ``feasible`` is None when nothing is constrained; ``distance`` sums the relative gaps of the
    violated limits (how far from feasible); ``undecided_only`` means the one problem is a P99 bound
    that could not be decided (too few samples), not a miss.
    """

    feasible: bool | None
    p99_verdict: Verdict | None
    violations: tuple[str, ...]
    distance: float
    undecided_only: bool

    def to_dict(self, constraints: Constraints) -> dict[str, Any]:
        return {
            **constraints.to_dict(),
            "p99_verdict": self.p99_verdict,
            "feasible": self.feasible,
            "undecided_only": self.undecided_only,
            "violations": list(self.violations),
        }


def non_dominated(points: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[int]:
    """Indices of the points no other point dominates, for any number of objectives, in index order.

    A point dominates another when it is at least as good in every objective and better in one;
    equal points therefore do not dominate each other, and duplicates stay on the frontier together.
    The points are sorted once (O(n log n)); with two objectives one sweep then finds the front, with
    more each front point removes the points it dominates (the approach of Optuna's own
    ``_is_pareto_front``, without its slower ``np.unique`` over rows).
    """
    import numpy as np

    n = len(points)
    if n == 0:
        return []
    signs = np.where(np.asarray(maximize, dtype=bool), -1.0, 1.0)  # every objective minimized
    values = np.asarray(points, dtype=float).reshape(n, len(signs)) * signs
    order = np.lexsort(values.T[::-1])  # by the first objective, ties by the next, ...
    ranked = values[order]
    first = np.ones(n, dtype=bool)  # the first of each run of equal points
    first[1:] = np.any(ranked[1:] != ranked[:-1], axis=1)
    unique = ranked[first]
    on_front = np.zeros(len(unique), dtype=bool)
    if values.shape[1] == 1:
        on_front[0] = True
    elif values.shape[1] == 2:
        # sorted by the first objective: a point is on the front iff it beats every earlier second value
        on_front[0] = True
        on_front[1:] = unique[1:, 1] < np.minimum.accumulate(unique[:, 1])[:-1]
    else:
        rest = unique[:, 1:]
        remaining = np.arange(len(unique))
        while len(remaining):
            top = remaining[0]  # no later point can dominate the first in sort order
            on_front[top] = True
            remaining = remaining[np.any(rest[remaining] < rest[top], axis=1)]
    group = np.cumsum(first) - 1  # each sorted point's run of equal points
    return sorted(int(i) for i in order[on_front[group]])


def objective_value(metrics: dict[str, Any], metric: str) -> float | None:
    """A stored metric as an objective value, None when it was not measured.

    A P99 without an upper bound (too few samples to bound it) counts as +inf: never better than a
    bounded one. Memory falls back to the parameters for rows stored before the other terms existed.
    """
    if metric == P99_BOUND_METRIC and metrics.get(metric) is None:
        return math.inf if metrics.get("latency_p99_ms") is not None else None
    if metric == "memory_bytes":
        return float(memory_bytes(metrics))
    value = metrics.get(metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def frontier(
    candidates: Sequence[Candidate],
    objectives: Sequence[tuple[str, bool]] = DEFAULT_OBJECTIVES,
) -> list[Candidate]:
    """The non-dominated candidates, fastest first."""
    usable = [c for c in candidates if all(objective_value(c.metrics, name) is not None for name, _ in objectives)]
    points = [[objective_value(c.metrics, name) or 0.0 for name, _ in objectives] for c in usable]
    return fastest_first([usable[i] for i in non_dominated(points, [m for _, m in objectives])])


def fastest_first(front: Sequence[Candidate]) -> list[Candidate]:
    """The frontier's display order: lowest P99 bound first, then the most accurate, then trial number."""
    return sorted(front, key=lambda c: (_p99_key(c), -c.metrics["accuracy"], c.trial))


def objective_columns(columns: dict[str, Any], objectives: Sequence[tuple[str, bool]]) -> Any:
    """``objective_value`` over arrays of stored values (``queries.light_columns``): an n × k array,
    NaN where a trial has no usable value. A stored measurement always has a P99, so a missing bound
    is +inf, never better than a bounded one; memory arrives with the parameters as its fallback."""
    import numpy as np

    out = []
    for metric, _ in objectives:
        values = np.array(columns[metric], dtype=float)
        if metric == P99_BOUND_METRIC:
            values[np.isnan(values)] = np.inf
        else:
            values[~np.isfinite(values)] = np.nan
        out.append(values)
    return np.stack(out, axis=1) if out else np.empty((0, 0))


def distances(columns: dict[str, Any], constraints: Constraints) -> Any:
    """``distance`` over arrays of stored values: the relative gaps of ``constraint_gaps``, summed."""
    import numpy as np

    n = len(next(iter(columns.values()))) if columns else 0
    total = np.zeros(n)
    with np.errstate(invalid="ignore"):
        if constraints.p99_ms is not None:
            upper = columns[P99_BOUND_METRIC]
            gap = np.where(np.isnan(upper), np.inf, (upper - constraints.p99_ms) / constraints.p99_ms)
            gap = np.where(columns["samples"] < constraints.min_samples, np.maximum(gap, 1e-6), gap)
            total += np.maximum(gap, 0.0)
        if constraints.min_accuracy is not None:
            floor = constraints.min_accuracy
            total += np.maximum((floor - columns["accuracy"]) / _scale(floor), 0.0)
        if constraints.max_memory_bytes is not None:
            budget = constraints.max_memory_bytes
            total += np.maximum((columns["memory_bytes"] - budget) / budget, 0.0)
        if constraints.min_throughput_per_s is not None:
            floor_t = constraints.min_throughput_per_s
            total += np.maximum((floor_t - columns["throughput_per_s"]) / floor_t, 0.0)
    return np.where(np.isfinite(total), total, 1e9)


def distance_names(constraints: Constraints) -> list[str]:
    """The stored metrics ``distances`` reads for these constraints."""
    names = []
    if constraints.p99_ms is not None:
        names += [P99_BOUND_METRIC, "samples"]
    if constraints.min_accuracy is not None:
        names.append("accuracy")
    if constraints.max_memory_bytes is not None:
        names.append("memory_bytes")
    if constraints.min_throughput_per_s is not None:
        names.append("throughput_per_s")
    return names


def p99_verdict(metrics: dict[str, Any], slo_ms: float, min_samples: int = MIN_SAMPLES_P99) -> Verdict:
    """The P99 verdict of stored metrics; a missing bound means unbounded on that side."""
    return slo_verdict(
        metrics.get("latency_p99_lower_ms"),
        metrics.get(P99_BOUND_METRIC),
        slo_ms,
        int(metrics.get("samples") or 0),
        min_samples=min_samples,
    )


def constraint_gaps(metrics: dict[str, Any], constraints: Constraints) -> dict[str, float]:
    """The relative gap to every limit set, <= 0 when the limit is met (Optuna's convention).

    Each gap is relative to its limit, so that limits in different units weigh alike when a sampler
    adds them up: the P99 bound over the SLO, the accuracy under the floor, the memory over the
    budget, the throughput under the floor, each divided by the limit. A P99 without an upper bound
    is +inf; one within the SLO from too few samples for a claim is a small positive gap.
    """
    gaps: dict[str, float] = {}
    if constraints.p99_ms is not None:
        upper = metrics.get(P99_BOUND_METRIC)
        gap = math.inf if upper is None else (upper - constraints.p99_ms) / constraints.p99_ms
        if int(metrics.get("samples") or 0) < constraints.min_samples:
            gap = max(gap, 1e-6)
        gaps["p99_ms"] = gap
    if constraints.min_accuracy is not None:
        gaps["min_accuracy"] = (constraints.min_accuracy - metrics["accuracy"]) / _scale(constraints.min_accuracy)
    if constraints.max_memory_bytes is not None:
        gaps["max_memory_bytes"] = (memory_bytes(metrics) - constraints.max_memory_bytes) / constraints.max_memory_bytes
    if constraints.min_throughput_per_s is not None:
        floor = constraints.min_throughput_per_s
        gaps["min_throughput_per_s"] = (floor - metrics["throughput_per_s"]) / floor
    return gaps


def constraint_names(constraints: Constraints) -> list[str]:
    """The names ``constraint_gaps`` gives a trial under ``constraints``: one per limit set."""
    limits = {
        "p99_ms": constraints.p99_ms,
        "min_accuracy": constraints.min_accuracy,
        "max_memory_bytes": constraints.max_memory_bytes,
        "min_throughput_per_s": constraints.min_throughput_per_s,
    }
    return [name for name, limit in limits.items() if limit is not None]


def evaluate(metrics: dict[str, Any], constraints: Constraints) -> Judgement:
    """Judge stored metrics against the constraints (no side effects)."""
    gaps = constraint_gaps(metrics, constraints)
    violations: list[str] = []
    verdict = p99_verdict(metrics, constraints.p99_ms, constraints.min_samples) if constraints.p99_ms else None
    undecided = False
    if constraints.p99_ms is not None and gaps["p99_ms"] > 0:
        phrase, undecided = _p99_violation(metrics, constraints)
        violations.append(phrase)
    if gaps.get("min_accuracy", 0) > 0:
        floor, acc = constraints.min_accuracy or 0.0, metrics["accuracy"]
        violations.append(f"its accuracy {acc:.4g} is {floor - acc:.3g} below {floor:g}")
    if gaps.get("max_memory_bytes", 0) > 0:
        memory = memory_bytes(metrics)
        over = memory - (constraints.max_memory_bytes or 0)
        violations.append(f"its memory is {format_bytes(memory)}, {format_bytes(over)} over the budget")
    if gaps.get("min_throughput_per_s", 0) > 0:
        floor_t, have = constraints.min_throughput_per_s or 0.0, metrics["throughput_per_s"]
        violations.append(f"its throughput is {have:,.0f}/s, {floor_t - have:,.0f}/s below {floor_t:,.0f}/s")
    total = sum(max(gap, 0.0) for gap in gaps.values())
    return Judgement(
        feasible=(not violations) if constraints.any else None,
        p99_verdict=verdict,
        violations=tuple(violations),
        distance=total if math.isfinite(total) else 1e9,
        undecided_only=undecided and len(violations) == 1,
    )


def _p99_violation(metrics: dict[str, Any], constraints: Constraints) -> tuple[str, bool]:
    """How the P99 falls short, and whether that is only undecided (not a miss)."""
    slo = constraints.p99_ms or 0.0
    upper, samples = metrics.get(P99_BOUND_METRIC), metrics.get("samples")
    if upper is None:
        return f"its P99 bound is undecided after {samples} samples", p99_verdict(metrics, slo) == "uncertain"
    if upper > slo:
        over, ratio = upper - slo, upper / slo
        how_far = f"{ratio:.0f}× the SLO" if ratio >= 10 else f"{over / slo:.0%} over"
        return f"its P99 upper bound is {format_ms(upper)}, {format_ms(over)} ({how_far}) above {format_ms(slo)}", False
    return (
        f"its P99 is within {format_ms(slo)} but from only {samples} samples (need {constraints.min_samples})",
        True,
    )


def judged(candidate: Candidate, constraints: Constraints) -> Candidate:
    """A copy of ``candidate`` with its ``slo`` judgement attached."""
    return dataclasses.replace(candidate, slo=evaluate(candidate.metrics, constraints).to_dict(constraints))


def select_best(candidates: Sequence[Candidate], constraints: Constraints, *, study: str) -> Candidate:
    """Highest accuracy among the feasible candidates, then the lowest P99 upper bound, confirmed first.

    Returns:
        The pick, with its ``slo`` judgement attached.

    Raises:
        NoFeasibleConfiguration: nothing meets the constraints; the message names the closest candidate.
    """
    if not candidates:
        raise NoFeasibleConfiguration(f"Study {study!r} has no completed trial to choose from yet.")
    judgements = [(c, evaluate(c.metrics, constraints)) for c in candidates]
    feasible = [c for c, j in judgements if j.feasible is not False]
    if feasible:
        pick = min(feasible, key=lambda c: (-c.metrics["accuracy"], _p99_key(c), c.confirmation is None, c.trial))
        return judged(pick, constraints)
    closest, _ = min(judgements, key=lambda cj: (cj[1].distance, cj[0].trial))
    raise no_feasible(study, constraints, closest)


def best_or_none(candidates: Sequence[Candidate], constraints: Constraints, *, study: str) -> Candidate | None:
    """``select_best``, or None when nothing (yet) meets the constraints."""
    try:
        return select_best(candidates, constraints, study=study)
    except NoFeasibleConfiguration:
        return None


def no_feasible(study: str, constraints: Constraints, closest: Candidate) -> NoFeasibleConfiguration:
    """The error when nothing meets ``constraints``, naming the closest candidate and how it falls short."""
    why = evaluate(closest.metrics, constraints)
    return NoFeasibleConfiguration(
        f"No stored configuration of study {study!r} meets {constraints.describe()}; the closest is "
        f"trial {closest.trial} ({closest.description}): {'; '.join(why.violations)}."
    )


def distance(metrics: dict[str, Any], constraints: Constraints) -> float:
    """How far from feasible: the sum of the relative gaps of the violated limits (``Judgement.distance``)."""
    total = sum(max(gap, 0.0) for gap in constraint_gaps(metrics, constraints).values())
    return total if math.isfinite(total) else 1e9


def _p99_key(c: Candidate) -> float:
    value = objective_value(c.metrics, P99_BOUND_METRIC)
    return value if value is not None else math.inf


def memory_bytes(metrics: dict[str, Any]) -> int:
    """Total inference memory; trials stored before the activation/KV terms existed count parameters only."""
    total = metrics.get("memory_bytes")
    return int(total) if total is not None else int(metrics["params_bytes"])


def _scale(limit: float) -> float:
    return max(abs(limit), 1e-12)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
