from __future__ import annotations

import math

import pytest

from pareto.errors import NoFeasibleConfiguration
from pareto.front import Candidate, frontier, judged, non_dominated, objective_value, select_best
from pareto.limits import Constraints, constraint_gaps, evaluate, p99_verdict


def cand(
    trial: int, acc: float, upper: float, *, lower: float | None = None, samples: int = 1000, params: int = 100
) -> Candidate:
    metrics = {
        "accuracy": acc,
        "latency_p99_ms": upper * 0.9,
        "latency_p99_lower_ms": lower if lower is not None else upper * 0.8,
        "latency_p99_upper_ms": upper,
        "samples": samples,
        "params_bytes": params,
    }
    return Candidate("s", trial, {}, f"config {trial}", metrics, {})


def test_non_dominated_basic() -> None:
    points = [(0.85, 10.0), (0.83, 5.0), (0.80, 6.0), (0.90, 20.0)]
    assert non_dominated(points, [True, False]) == [0, 1, 3]


def test_non_dominated_empty_and_single() -> None:
    assert non_dominated([], [True, False]) == []
    assert non_dominated([(1.0, 2.0)], [True, False]) == [0]


def test_duplicates_stay_together_and_ties_are_handled() -> None:
    points = [(0.9, 5.0), (0.9, 5.0), (0.9, 6.0), (0.8, 5.0)]
    # the two equal points do not dominate each other; a tie in one objective and worse in the other loses
    assert non_dominated(points, [True, False]) == [0, 1]


def test_non_dominated_three_objectives() -> None:
    points = [(1, 1, 1), (2, 0, 0), (0, 2, 0), (0, 0, 2), (0, 0, 0)]
    assert non_dominated(points, [True, True, True]) == [0, 1, 2, 3]
    assert non_dominated(points, [False, False, False]) == [4]


def test_frontier_sorted_fastest_first() -> None:
    cands = [cand(1, 0.85, 10), cand(2, 0.83, 5), cand(3, 0.80, 6)]
    assert [c.trial for c in frontier(cands)] == [2, 1]


def test_domain_example_slo_decides_between_incomparable_points() -> None:
    a, b = cand(1, 0.85, 10), cand(2, 0.83, 5)  # A 85 % at 10 ms and B 83 % at 5 ms are incomparable
    assert select_best([a, b], Constraints(p99_ms=7), study="s").trial == 2
    assert select_best([a, b], Constraints(min_accuracy=0.84), study="s").trial == 1


def test_selection_uses_the_upper_bound_then_lowest_p99() -> None:
    cands = [cand(1, 0.9, 7.5, lower=6.0), cand(2, 0.9, 6.5), cand(3, 0.9, 6.0), cand(4, 0.8, 1.0)]
    assert select_best(cands, Constraints(p99_ms=7), study="s").trial == 3


def test_too_few_samples_is_uncertain_never_met() -> None:
    few = cand(1, 0.9, 3.0, samples=100)
    assert p99_verdict(few.metrics, 7.0, 662) == "uncertain"
    with pytest.raises(NoFeasibleConfiguration, match="only 100 samples"):
        select_best([few], Constraints(p99_ms=7), study="s")


def test_missed_when_lower_bound_is_above() -> None:
    assert p99_verdict(cand(1, 0.9, 12.0, lower=8.0).metrics, 7.0, 662) == "missed"
    assert p99_verdict(cand(1, 0.9, 8.0, lower=6.0).metrics, 7.0, 662) == "uncertain"


def test_no_feasible_names_the_closest() -> None:
    cands = [cand(1, 0.9, 20.0), cand(2, 0.9, 7.5), cand(3, 0.5, 3.0)]
    with pytest.raises(NoFeasibleConfiguration) as info:
        select_best(cands, Constraints(p99_ms=7, min_accuracy=0.8), study="s")
    message = str(info.value)
    assert "closest is trial 2" in message
    assert "0.500 ms (7% over) above 7.00 ms" in message


def test_no_candidates() -> None:
    with pytest.raises(NoFeasibleConfiguration, match="no completed trial"):
        select_best([], Constraints(p99_ms=7), study="s")


def test_memory_budget() -> None:
    cands = [cand(1, 0.9, 1.0, params=1000), cand(2, 0.85, 1.0, params=10)]
    assert select_best(cands, Constraints(max_memory_bytes=100), study="s").trial == 2


def test_too_few_samples_for_a_bound_still_places_on_the_frontier_as_uncertain() -> None:
    few = Candidate(
        "s",
        1,
        {},
        "config 1",
        {
            "accuracy": 0.9,
            "latency_p99_ms": 3.0,
            "latency_p99_lower_ms": 2.0,
            "latency_p99_upper_ms": None,
            "samples": 200,
            "params_bytes": 1,
        },
        {},
    )
    assert [c.trial for c in frontier([few])] == [1]
    judgement = evaluate(few.metrics, Constraints(p99_ms=7))
    assert judgement.feasible is False and "undecided after 200 samples" in judgement.violations[0]
    assert judgement.undecided_only and judgement.p99_verdict == "uncertain"
    assert few.slo == {}  # judging has no side effect: the caller attaches the verdict
    assert judged(few, Constraints(p99_ms=7)).slo["undecided_only"]


def test_an_unbounded_p99_counts_as_infinite_and_cannot_push_a_met_one_off_the_frontier() -> None:
    met = cand(1, 0.90, 6.0)
    unbounded = Candidate(
        "s",
        2,
        {},
        "config 2",
        {"accuracy": 0.90, "latency_p99_ms": 1.0, "latency_p99_upper_ms": None, "samples": 300, "params_bytes": 1},
        {},
    )
    assert objective_value(unbounded.metrics, "latency_p99_upper_ms") == math.inf
    assert [c.trial for c in frontier([met, unbounded])] == [1]
    assert constraint_gaps(unbounded.metrics, Constraints(p99_ms=7))["p99_ms"] == math.inf
    assert select_best([met, unbounded], Constraints(p99_ms=7), study="s").trial == 1


def test_constraint_gaps_are_relative_so_units_weigh_alike() -> None:
    metrics = {
        "accuracy": 0.9,
        "latency_p99_upper_ms": 14.0,
        "samples": 1000,
        "memory_bytes": 3 * 2**30,
        "params_bytes": 1,
        "throughput_per_s": 250.0,
    }
    gaps = constraint_gaps(
        metrics, Constraints(p99_ms=7.0, min_accuracy=0.95, max_memory_bytes=2 * 2**30, min_throughput_per_s=500.0)
    )
    assert gaps["p99_ms"] == pytest.approx(1.0)  # twice the SLO
    assert gaps["max_memory_bytes"] == pytest.approx(0.5)  # bytes, yet the same scale as milliseconds
    assert gaps["min_throughput_per_s"] == pytest.approx(0.5)
    assert gaps["min_accuracy"] == pytest.approx(0.05 / 0.95)
    ok = constraint_gaps({**metrics, "latency_p99_upper_ms": 3.5}, Constraints(p99_ms=7.0))
    assert ok["p99_ms"] == pytest.approx(-0.5)
    few = constraint_gaps({**metrics, "latency_p99_upper_ms": 3.5, "samples": 100}, Constraints(p99_ms=7.0))
    assert few["p99_ms"] > 0  # within the SLO from too few samples: never counts as met


def test_a_confirmed_candidate_wins_a_tie() -> None:
    plain, confirmed = cand(1, 0.9, 5.0), cand(2, 0.9, 5.0)
    confirmed.confirmation = {"rounds": 20, "discarded_rounds": 0, "confirmed_at": "2026-12-02T00:00:00"}
    assert select_best([plain, confirmed], Constraints(p99_ms=7), study="s").trial == 2


def _brute_force(points: list[tuple[float, ...]], maximize: list[bool]) -> list[int]:
    """The definition, pair by pair (O(n²)): the reference the sort-based sweep must agree with."""
    signs = [1.0 if m else -1.0 for m in maximize]
    scored = [[s * v for s, v in zip(signs, p, strict=True)] for p in points]
    return [
        i
        for i, a in enumerate(scored)
        if not any(
            all(bj >= aj for aj, bj in zip(a, b, strict=True)) and any(bj > aj for aj, bj in zip(a, b, strict=True))
            for j, b in enumerate(scored)
            if j != i
        )
    ]


@pytest.mark.parametrize("objectives", [1, 2, 3, 4])
def test_the_sweep_agrees_with_the_definition(objectives: int) -> None:
    import random

    rng = random.Random(objectives)
    for _ in range(60):
        n = rng.randint(1, 60)
        # few distinct values: many ties and exact duplicates; now and then an unbounded P99 (+inf)
        points = [
            tuple(rng.choice([0.0, 1.0, 2.0, 3.0, math.inf if k == 1 else 4.0]) for k in range(objectives))
            for _ in range(n)
        ]
        maximize = [rng.random() < 0.5 for _ in range(objectives)]
        assert non_dominated(points, maximize) == _brute_force(points, maximize), (points, maximize)


def test_vectorized_distance_and_objectives_agree_with_the_per_trial_rules() -> None:
    import random

    import numpy as np

    from pareto.front import objective_columns
    from pareto.limits import distance, distance_names, distances

    rng = random.Random(7)
    rows = [
        {
            "accuracy": rng.uniform(0.5, 1.0),
            "latency_p99_ms": rng.uniform(1, 20),
            "latency_p99_upper_ms": None if rng.random() < 0.1 else rng.uniform(1, 30),
            "samples": rng.choice([100, 662, 1000]),
            "memory_bytes": None if rng.random() < 0.2 else rng.randint(10, 1000),
            "params_bytes": rng.randint(10, 1000),
            "throughput_per_s": rng.uniform(10, 1000),
        }
        for _ in range(300)
    ]

    def stored(row: dict[str, float | None], name: str) -> float:
        """What the database hands back: memory falls back to the parameters, a missing value is NaN."""
        value = row[name] if name != "memory_bytes" or row[name] is not None else row["params_bytes"]
        return math.nan if value is None else float(value)

    for constraints in (
        Constraints(p99_ms=7.0),
        Constraints(p99_ms=7.0, min_accuracy=0.9, max_memory_bytes=500, min_throughput_per_s=400),
        Constraints(min_accuracy=0.8),
    ):
        columns = {name: np.array([stored(r, name) for r in rows]) for name in distance_names(constraints)}
        assert distances(columns, constraints).tolist() == pytest.approx([distance(r, constraints) for r in rows])
    objectives = [("accuracy", True), ("latency_p99_upper_ms", False), ("memory_bytes", False)]
    columns = {metric: np.array([stored(r, metric) for r in rows]) for metric, _ in objectives}
    got = objective_columns(columns, objectives)
    for i, r in enumerate(rows):
        assert got[i].tolist() == [objective_value(r, metric) for metric, _ in objectives]
