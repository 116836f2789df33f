"""The Pareto frontier and the pick among the configurations that meet the limits (``pareto.limits``
holds the limits and their rule); no torch, no database."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pareto.errors import NoFeasibleConfiguration
from pareto.limits import Constraints, evaluate, memory_bytes
from pareto.metrics import served_capacity
from pareto.naming import describe_config
from pareto.slo import P99_BOUND_METRIC

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
    # at a request rate: the highest rate whose requests' P99 bound stays within the SLO
    "capacity": ("capacity_qps", True),
}
#: The objectives of a study that names none.
DEFAULT_OBJECTIVE_NAMES: tuple[str, ...] = ("accuracy", "p99")
#: The objectives of a study at a request rate (``--qps``) that names none.
TRAFFIC_OBJECTIVE_NAMES: tuple[str, ...] = ("accuracy", "capacity")
DEFAULT_OBJECTIVES: tuple[tuple[str, bool], ...] = tuple(OBJECTIVES[name] for name in DEFAULT_OBJECTIVE_NAMES)


def objective_metrics(names: Sequence[str]) -> tuple[tuple[str, bool], ...]:
    """(metric, maximize?) for objective names such as ``["accuracy", "p99", "memory"]``."""
    return tuple(OBJECTIVES[name] for name in names)


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
    #: the latest load run of the configuration at a request rate (``pareto.measure.load``), if any
    load_run: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """As every JSON answer shows it; ``config.backend`` is always named there (stored: only when not
        eager); ``load_run`` only when the configuration had one."""
        data = {
            "study": self.study,
            "trial": self.trial,
            "config": {**self.config, "backend": self.config.get("backend", "eager")},
            "metrics": self.metrics,
            "slo": self.slo,
            "confirmation": self.confirmation,
            "environment": self.environment,
        }
        return data if self.load_run is None else {**data, "load_run": self.load_run}

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
            load_run=data.get("load_run"),
        )


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
    if metric == "capacity_qps" and metrics.get("scenario") is not None:
        return served_capacity(metrics)[0] or 0.0  # load-run where found; missing the SLO at every rate: none
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
        pick = min(feasible, key=pick_key)
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


#: The pick among the feasible, each key with whether more is first: the most accurate, then the lowest
#: P99 upper bound (a missing one last), a confirmed measurement before one that is not, then the lowest
#: trial number. ``select_best`` sorts by it and the store's SQL (``queries.best_candidate``) orders by
#: the same keys.
PICK_ORDER: tuple[tuple[str, bool], ...] = (
    ("accuracy", True),
    (P99_BOUND_METRIC, False),
    ("confirmed", True),
    ("trial", False),
)


def pick_key(c: Candidate) -> tuple[float, ...]:
    """``PICK_ORDER`` as a sort key: smallest first."""
    values = {
        "accuracy": c.metrics["accuracy"],
        P99_BOUND_METRIC: _p99_key(c),
        "confirmed": c.confirmation is not None,
        "trial": c.trial,
    }
    return tuple(-values[name] if descending else values[name] for name, descending in PICK_ORDER)


def _p99_key(c: Candidate) -> float:
    value = objective_value(c.metrics, P99_BOUND_METRIC)
    return value if value is not None else math.inf


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
