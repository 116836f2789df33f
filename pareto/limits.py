"""The limits a configuration is judged by, in one place: what the caller says, the typed value it
becomes, and the rule that says whether stored metrics meet it.

- ``Limits``: what a read is asked against, as the caller said it: the study, the environment and the
  limits (``slo_p99="7ms"``, ``max_memory="2GB"``...); the CLI builds it from its options, the Python API
  from keyword arguments.
- ``Constraints``: the limits parsed (``p99_ms``, ``min_accuracy``, ``max_memory_bytes``,
  ``min_throughput_per_s``), with what the caller did not say taken from the study's stored SLO and
  budget. Every judgement takes this one value: a search's constraints, the queries' SQL, the pick,
  ``explain``, the report; its fields are the names of the ``slo`` block of every JSON answer.
- ``LIMITS``: for each limit, the stored metric it bounds and on which side. The feasibility rule is
  written once, from this table: ``constraint_gaps`` (the relative gap to each limit, what the
  sampler's constraints and ``evaluate`` read), ``distances`` (the same over arrays) and the SQL
  conditions the store derives from it (``pareto.store.queries``).

A new limit (a P90 SLO, say): a field of ``Limits`` and of ``Constraints``, its row in ``LIMITS``, its
phrase in ``evaluate``, an option in ``pareto._cli.options.limits_options`` and its key in the spec's
``slo`` block.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pareto.errors import UsageError
from pareto.metrics import LOAD_RUN, served_capacity
from pareto.slo import MIN_SAMPLES_P99, P99_BOUND_METRIC, Verdict, slo_verdict
from pareto.units import (
    format_bytes,
    format_ms,
    parse_duration_ms,
    parse_rate_per_s,
    parse_request_rate,
    parse_size_bytes,
)


def memory_bytes(metrics: dict[str, Any]) -> int:
    """Total inference memory; trials stored before the activation/KV terms existed count parameters only."""
    total = metrics.get("memory_bytes")
    return int(total) if total is not None else int(metrics["params_bytes"])


def _scale(limit: float) -> float:
    return max(abs(limit), 1e-12)


@dataclass(frozen=True)
class Limit:
    """One limit: the ``Constraints`` field that holds it and the stored metric it bounds.

    The gap of a value to its limit is ``(value - limit) / scale(limit)`` for an upper limit
    (``at_most``) and ``(limit - value) / scale(limit)`` for a floor: <= 0 when met (Optuna's
    convention), relative, so that limits in different units weigh alike when a sampler adds them.
    ``bound`` limits are met only on an upper confidence bound from enough samples for the claim
    (``Constraints.min_samples``): a missing bound is an infinite gap, and one within the limit from
    too few samples a small positive one.
    """

    name: str
    metric: str
    at_most: bool
    value: Callable[[dict[str, Any]], Any]
    scale: Callable[[float], float] = abs
    bound: bool = False

    def gap(self, metrics: dict[str, Any], limit: float, min_samples: int) -> float:
        """The relative gap of stored ``metrics`` to ``limit`` (<= 0: met)."""
        value = self.value(metrics)
        if self.bound and value is None:
            return math.inf
        gap = (value - limit if self.at_most else limit - value) / self.scale(limit)
        if self.bound and int(metrics.get("samples") or 0) < min_samples:
            gap = max(gap, 1e-6)
        return float(gap)


#: The limits, in the order every answer lists them. Memory falls back to the parameters for trials
#: stored before the activation and KV terms existed (the store's column for it does the same).
LIMITS: tuple[Limit, ...] = (
    Limit("p99_ms", P99_BOUND_METRIC, at_most=True, value=lambda m: m.get(P99_BOUND_METRIC), bound=True),
    # at a request rate, the P99 limit is the rate within the capacity at the SLO (a configuration that
    # misses the SLO even nearly alone has none: capacity 0)
    Limit("qps", "capacity_qps", at_most=False, value=lambda m: served_capacity(m)[0] or 0.0),
    Limit("min_accuracy", "accuracy", at_most=False, value=lambda m: m["accuracy"], scale=_scale),
    Limit("max_memory_bytes", "memory_bytes", at_most=True, value=memory_bytes),
    Limit("min_throughput_per_s", "throughput_per_s", at_most=False, value=lambda m: m["throughput_per_s"]),
)


@dataclass(frozen=True)
class Constraints:
    """What a configuration must meet; None means unconstrained."""

    p99_ms: float | None = None
    #: requests per second arriving: the P99 is then every request's at that rate (``capacity_qps``)
    qps: float | None = None
    min_accuracy: float | None = None
    max_memory_bytes: int | None = None
    min_throughput_per_s: float | None = None
    min_samples: int = MIN_SAMPLES_P99

    def to_dict(self) -> dict[str, Any]:
        """Every limit by name; ``qps`` only when set (single-stream answers are as they were before it)."""
        return {limit.name: getattr(self, limit.name) for limit in LIMITS if limit.name != "qps" or self.qps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Constraints:
        """The constraints an answer's ``slo`` block was judged by (``to_dict``'s keys; others ignored)."""
        values: dict[str, Any] = {limit.name: data.get(limit.name) for limit in LIMITS}
        return cls(**values)

    def set(self) -> list[tuple[Limit, float]]:
        """The limits set (not None), each with its value, in ``LIMITS``' order. At a request rate the
        single call's P99 is not a limit: the rate within the capacity at the SLO is."""
        limits = [(limit, value) for limit in LIMITS if (value := getattr(self, limit.name)) is not None]
        return [(limit, value) for limit, value in limits if not (limit.name == "p99_ms" and self.qps)]

    @property
    def any(self) -> bool:
        return any(v is not None for v in self.to_dict().values())

    def describe(self) -> str:
        parts = []
        if self.p99_ms is not None:
            parts.append(f"P99 ≤ {format_ms(self.p99_ms)}" + (f" at {self.qps:,.4g} requests/s" if self.qps else ""))
        if self.min_accuracy is not None:
            parts.append(f"accuracy ≥ {self.min_accuracy:g}")
        if self.max_memory_bytes is not None:
            parts.append(f"memory ≤ {format_bytes(self.max_memory_bytes)}")
        if self.min_throughput_per_s is not None:
            parts.append(f"throughput ≥ {self.min_throughput_per_s:,.0f}/s")
        return " and ".join(parts) or "no SLO"


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
    #: at a request rate: the capacity the rate was judged by, and "load-run" or "simulated, not load-run"
    capacity: tuple[float | None, str] | None = None

    def to_dict(self, constraints: Constraints) -> dict[str, Any]:
        data = {
            **constraints.to_dict(),
            "p99_verdict": self.p99_verdict,
            "feasible": self.feasible,
            "undecided_only": self.undecided_only,
            "violations": list(self.violations),
        }
        if self.capacity is not None:
            data["capacity_qps"], data["capacity_source"] = self.capacity
        return data


def constraint_gaps(metrics: dict[str, Any], constraints: Constraints) -> dict[str, float]:
    """The relative gap to every limit set, <= 0 when the limit is met (``Limit.gap``): the P99 bound
    over the SLO, the accuracy under the floor, the memory over the budget, the throughput under the
    floor, each divided by the limit."""
    return {limit.name: limit.gap(metrics, value, constraints.min_samples) for limit, value in constraints.set()}


def constraint_names(constraints: Constraints) -> list[str]:
    """The names ``constraint_gaps`` gives a trial under ``constraints``: one per limit set."""
    return [limit.name for limit, _ in constraints.set()]


def distance(metrics: dict[str, Any], constraints: Constraints) -> float:
    """How far from feasible: the sum of the relative gaps of the violated limits (``Judgement.distance``)."""
    total = sum(max(gap, 0.0) for gap in constraint_gaps(metrics, constraints).values())
    return total if math.isfinite(total) else 1e9


def distance_names(constraints: Constraints) -> list[str]:
    """The stored metrics ``distances`` reads for these constraints."""
    names = []
    for limit, _ in constraints.set():
        names += [limit.metric, "samples"] if limit.bound else [limit.metric]
    return names


def distances(columns: dict[str, Any], constraints: Constraints) -> Any:
    """``distance`` over arrays of stored values (``queries.light_columns``), limit by limit as ``Limit.gap``."""
    import numpy as np  # deferred: the read commands that do not need it never load NumPy

    n = len(next(iter(columns.values()))) if columns else 0
    total = np.zeros(n)
    with np.errstate(invalid="ignore"):
        for limit, value in constraints.set():
            values = columns[limit.metric]
            gap = (values - value if limit.at_most else value - values) / limit.scale(value)
            if limit.bound:
                gap = np.where(np.isnan(values), np.inf, gap)
                gap = np.where(columns["samples"] < constraints.min_samples, np.maximum(gap, 1e-6), gap)
            total += np.maximum(gap, 0.0)
    return np.where(np.isfinite(total), total, 1e9)


def p99_verdict(metrics: dict[str, Any], slo_ms: float, min_samples: int = MIN_SAMPLES_P99) -> Verdict:
    """The P99 verdict of stored metrics; a missing bound means unbounded on that side."""
    return slo_verdict(
        metrics.get("latency_p99_lower_ms"),
        metrics.get(P99_BOUND_METRIC),
        slo_ms,
        int(metrics.get("samples") or 0),
        min_samples=min_samples,
    )


def evaluate(metrics: dict[str, Any], constraints: Constraints) -> Judgement:
    """Judge stored metrics against the constraints (no side effects)."""
    gaps = constraint_gaps(metrics, constraints)
    violations: list[str] = []
    verdict = p99_verdict(metrics, constraints.p99_ms, constraints.min_samples) if constraints.p99_ms else None
    undecided = False
    if gaps.get("p99_ms", 0) > 0:
        phrase, undecided = _p99_violation(metrics, constraints)
        violations.append(phrase)
    if constraints.qps:
        verdict = "met" if gaps["qps"] <= 0 else "missed"
        if gaps["qps"] > 0:
            violations.append(_rate_violation(metrics, constraints))
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
        capacity=served_capacity(metrics) if constraints.qps else None,
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


def _rate_violation(metrics: dict[str, Any], constraints: Constraints) -> str:
    """How a configuration falls short at the request rate, and whether it would meet the SLO alone."""
    slo, rate = constraints.p99_ms or 0.0, constraints.qps or 0.0
    capacity, source = served_capacity(metrics)
    if not capacity:
        phrase = (
            f"it has no load-run capacity at {format_ms(slo)}: no rate its load runs tried met the SLO"
            if source == LOAD_RUN
            else f"it has no capacity at {format_ms(slo)}: its requests miss the SLO even at the lowest rate tried"
        )
    else:
        phrase = (
            f"at {rate:,.4g} requests/s it is over its capacity of {capacity:,.4g}/s at {format_ms(slo)} ({source})"
        )
        if metrics.get("qps") == rate and metrics.get("request_p99_upper_ms") is not None:
            phrase += f" (its requests' P99 upper bound there is {format_ms(metrics['request_p99_upper_ms'])})"
    single = _single_call(metrics)
    if single is not None and single <= slo:
        phrase += f"; alone (one request, nothing queued) its call's P99 is {format_ms(single)}, within the SLO"
    return phrase


def _single_call(metrics: dict[str, Any]) -> float | None:
    """The P99 of one call at batch 1 (the service curve's first bucket), None when not measured."""
    for point in metrics.get("service_curve") or ():
        if point.get("batch") == 1:
            return float(point["p99_ms"])
    return None


@dataclass(frozen=True)
class Limits:
    """The study, the environment and the limits a read answers against; None leaves each to its default.

    Args:
        study: Study name; may be omitted when the database holds one study.
        environment: ``latest`` (default: where the study was last measured), an environment key, or
            ``all`` where a read takes every environment.
        slo_p99: P99 bound, ``"7ms"`` or milliseconds; default: the study's own SLO.
        min_accuracy: Accuracy floor (the task's metric); default: the study's.
        max_memory: Memory budget (params + activations + KV cache), ``"2GB"`` or bytes; default: the study's.
        min_throughput: Throughput floor, ``"500/s"`` or samples per second; default: the study's.
        qps: Requests per second arriving (``"800/s"`` or a number): the P99 is then every request's at
            that rate, judged by the capacity stored with a study searched at a rate; default: the study's.
    """

    study: str | None = None
    environment: str | None = None
    slo_p99: str | float | None = None
    qps: str | float | None = None
    min_accuracy: float | None = None
    max_memory: str | int | None = None
    min_throughput: str | float | None = None

    @classmethod
    def of(cls, limits: Limits | None = None, **keywords: Any) -> Limits:
        """``limits`` with any of its fields given as keywords instead (None keywords are ignored).

        Raises:
            UsageError: a keyword that is not a limit.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise UsageError(f"Unknown limit {unknown[0]!r}: the limits are {', '.join(sorted(names))}.")
        given = {k: v for k, v in keywords.items() if v is not None}
        return dataclasses.replace(limits or cls(), **given)

    def given(self) -> Constraints:
        """The limits the caller said, parsed and checked (nothing from the study).

        Raises:
            UsageError: a malformed or non-positive duration, size or rate.
        """
        memory = parse_size_bytes(self.max_memory) if isinstance(self.max_memory, str) else self.max_memory
        if memory is not None and not memory > 0:
            raise UsageError(f"A memory budget must be positive, got {self.max_memory!r}; write it like '512MiB'.")
        rate = self.min_throughput
        throughput = parse_rate_per_s(rate) if isinstance(rate, str) else None if rate is None else float(rate)
        if throughput is not None and not throughput > 0:
            raise UsageError(f"A throughput floor must be positive, got {rate!r}; write it like '500/s'.")
        qps = None if self.qps is None else parse_request_rate(self.qps)
        if qps is not None and not qps > 0:
            raise UsageError(f"A request rate must be positive, got {self.qps!r}; write it like '800/s'.")
        return Constraints(
            p99_ms=slo_ms(self.slo_p99),
            qps=qps,
            min_accuracy=self.min_accuracy,
            max_memory_bytes=memory,
            min_throughput_per_s=throughput,
        )

    def constraints(self, study_spec: dict[str, Any] | None) -> Constraints:
        """The limits to judge by: what the caller said, else the study's stored SLO, rate and budget.

        Raises:
            UsageError: a rate asked of a study searched without one, or with another SLO than its own
                (its capacity was found at its own SLO).
        """
        given = self.given()
        spec = study_spec or {}
        slo, budget = spec.get("slo") or {}, spec.get("budget") or {}
        stored_rate = (spec.get("traffic") or {}).get("qps")

        def either(said: Any, stored: Any) -> Any:
            return said if said is not None else stored

        if given.qps is not None and stored_rate is None:
            raise UsageError(
                "This study was searched one call at a time (no --qps): its configurations have no capacity "
                "at a request rate; search a study with --qps to ask for one."
            )
        if stored_rate is not None and given.p99_ms is not None and not math.isclose(given.p99_ms, slo.get("p99") or 0):
            raise UsageError(
                f"This study's capacities were found at its SLO of {format_ms(slo.get('p99') or 0)}, not at "
                f"{format_ms(given.p99_ms)}; ask with that SLO, or search a study at the other one."
            )
        return Constraints(
            p99_ms=either(given.p99_ms, slo.get("p99")),
            qps=either(given.qps, stored_rate),
            min_accuracy=either(given.min_accuracy, slo.get("min_accuracy")),
            max_memory_bytes=either(given.max_memory_bytes, budget.get("max_memory")),
            min_throughput_per_s=either(given.min_throughput_per_s, slo.get("min_throughput")),
        )


def slo_ms(value: str | float | None) -> float | None:
    """A P99 SLO in milliseconds, from ``"7ms"`` or a number of milliseconds (None stays None).

    Raises:
        UsageError: malformed, or not positive.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration_ms(value)
    if not value > 0:
        raise UsageError(f"P99 SLO {value!r} ms must be positive.")
    return float(value)
