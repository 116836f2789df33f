"""Regression decisions: a ratio threshold and a Mann-Whitney U test, or order-statistic intervals."""

from __future__ import annotations

from typing import Any

import numpy as np

from pareto.nightly_job.regression import compare, min_rounds_for_test


def _metrics(medians: list[float], p99: float, lower: float, upper: float) -> dict[str, Any]:
    return {
        "round_medians_ms": medians,
        "latency_p99_ms": p99,
        "latency_p99_lower_ms": lower,
        "latency_p99_upper_ms": upper,
        "samples": 680,
    }


def test_min_rounds_for_the_test_to_reach_asv_level() -> None:
    # 1 / C(10, 5) = 0.004 cannot reach 0.002; 1 / C(12, 6) = 0.001 can
    assert min_rounds_for_test(0.002) == 6


def test_same_distribution_is_no_regression_and_a_shift_is() -> None:
    rng = np.random.default_rng(0)
    same = [float(x) for x in rng.lognormal(0, 0.05, 20)]
    again = [float(x) for x in rng.lognormal(0, 0.05, 20)]
    before = _metrics(same, 2.0, 1.8, 2.4)
    unchanged = compare(1, "x", before, _metrics(again, 2.1, 1.9, 2.5), slo_ms=7.0)
    assert not unchanged.regression and unchanged.test == "mann-whitney" and unchanged.p_value > 0.002
    slower = compare(1, "x", before, _metrics([2.5 * m for m in again], 5.0, 4.5, 6.0), slo_ms=7.0)
    assert slower.slower and slower.regression and slower.p_value < 0.002 and not slower.lost_slo
    # significant but within the threshold: noise on a shared machine, not a regression
    slight = compare(1, "x", before, _metrics([1.5 * m for m in again], 3.0, 2.7, 3.3), slo_ms=7.0)
    assert slight.p_value < 0.002 and not slight.regression


def test_losing_the_slo_is_a_regression_when_the_round_medians_moved_with_it() -> None:
    rng = np.random.default_rng(1)
    rounds = [float(x) for x in rng.lognormal(0, 0.02, 20)]
    before = _metrics(rounds, 6.0, 5.0, 6.8)
    lost = compare(3, "x", before, _metrics([1.2 * m for m in rounds], 6.6, 6.1, 7.3), slo_ms=7.0)
    assert lost.lost_slo and lost.regression and not lost.slower and lost.inconclusive is None
    assert "no longer meets the P99 SLO of 7 ms" in lost.reason
    # the same bound lost with the medians where they were: the tail alone, no verdict
    tail = compare(3, "x", before, _metrics(list(reversed(rounds)), 6.1, 5.1, 7.3), slo_ms=7.0)
    assert tail.lost_slo and not tail.regression and tail.inconclusive is not None
    assert "round medians not slower" in tail.reason and "no verdict tonight" in tail.reason


def test_few_rounds_fall_back_to_order_statistic_intervals() -> None:
    before = _metrics([1.0, 1.1], 2.0, 1.8, 2.4)
    overlapping = compare(1, "x", before, _metrics([2.0, 2.1], 2.6, 2.3, 3.0), slo_ms=None)
    assert overlapping.test == "intervals" and not overlapping.regression  # 2.3 < 2.4: could be the same
    apart = compare(1, "x", before, _metrics([3.0, 3.1], 5.0, 4.5, 5.5), slo_ms=None)
    assert apart.test == "intervals" and apart.regression
