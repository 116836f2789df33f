from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import binom

from pareto.measure.stats import between_round_bounds, order_statistic_bounds, percentile_bounds, summarize
from pareto.slo import MIN_SAMPLES_P99, min_samples_for_upper_bound, slo_verdict


def _rank(bound: float, n: int) -> int:
    """1-based rank of a bound among the samples 1..n (0 for -inf, n + 1 for +inf)."""
    return 0 if bound == -math.inf else n + 1 if bound == math.inf else int(bound)


@pytest.mark.parametrize("n", [1, 2, 5, 10, 30, 100, 250, 662, 1000])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_each_bound_holds_alone_at_its_confidence(n: int, q: float, confidence: float) -> None:
    est = order_statistic_bounds(np.arange(n, 0.0, -1.0), q, confidence)  # values n..1: a value is its rank
    lower_rank, upper_rank = _rank(est.lower, n), _rank(est.upper, n)
    # P(x_q <= X_(u)) >= F(u - 1) and P(X_(l) <= x_q) >= 1 - F(l - 1), with F(-1) = 0 and F(n) = 1
    assert binom.cdf(upper_rank - 1, n, q) >= confidence - 1e-12
    assert 1 - (binom.cdf(lower_rank - 1, n, q) if lower_rank >= 1 else 0.0) >= confidence - 1e-12
    assert est.lower <= est.value <= est.upper


def test_ranks_are_the_tightest_one_sided() -> None:
    est = order_statistic_bounds(np.arange(1.0, 1001.0), 0.99, 0.99)
    lower_rank, upper_rank = int(est.lower), int(est.upper)
    assert binom.cdf(lower_rank - 1, 1000, 0.99) <= 0.01 < binom.cdf(lower_rank, 1000, 0.99)
    assert binom.cdf(upper_rank - 2, 1000, 0.99) < 0.99 <= binom.cdf(upper_rank - 1, 1000, 0.99)


def test_small_n_gives_unbounded_sides() -> None:
    est = order_statistic_bounds([3.0, 1.0, 2.0], 0.99)
    assert est.upper == math.inf and est.value == 3.0
    n = min_samples_for_upper_bound(0.99, 0.99)
    assert n == 459  # the maximum of 459 samples is a 99 % bound on the P99: 0.99 ** 459 <= 0.01
    assert order_statistic_bounds(np.arange(float(n)), 0.99).upper == n - 1
    assert order_statistic_bounds(np.arange(float(n - 1)), 0.99).upper == math.inf
    assert order_statistic_bounds([5.0], 0.5, 0.95).lower == -math.inf


@pytest.mark.parametrize("n", [1, 7, 100, 662, 1001])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_point_estimate_is_inverted_cdf_order_statistic(n: int, q: float) -> None:
    samples = np.random.default_rng(n).lognormal(size=n)
    est = order_statistic_bounds(samples, q)
    assert est.value == np.quantile(samples, q, method="inverted_cdf")
    assert est.value == np.sort(samples)[math.ceil(q * n) - 1]


def test_ties_stay_within_observed_values() -> None:
    samples = [1.0] * 50 + [2.0] * 900 + [3.0] * 50
    est = order_statistic_bounds(samples, 0.99)
    assert est.value == 3.0
    assert est.lower in (2.0, 3.0) and est.upper == 3.0
    constant = percentile_bounds([[4.0] * 35] * 20, 0.99)
    assert constant.lower == constant.value == constant.upper == 4.0


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        order_statistic_bounds([], 0.99)
    with pytest.raises(ValueError, match="NaN"):
        order_statistic_bounds([1.0, float("nan")], 0.5)
    with pytest.raises(ValueError, match="q must be"):
        order_statistic_bounds([1.0], 1.0)
    with pytest.raises(ValueError, match="confidence"):
        order_statistic_bounds([1.0], 0.5, confidence=1.0)
    with pytest.raises(ValueError):
        summarize([])


def test_between_rounds_needs_two_rounds_and_widens_with_their_spread() -> None:
    rng = np.random.default_rng(3)
    assert between_round_bounds([rng.lognormal(0, 0.2, 100)], 0.99) is None
    steady = [rng.lognormal(0.0, 0.2, 34) for _ in range(20)]
    drifting = [rng.lognormal(0.0, 0.2, 34) * math.exp(rng.normal(0, 0.3)) for _ in range(20)]
    low_s, high_s = between_round_bounds(steady, 0.99)  # type: ignore[misc]
    low_d, high_d = between_round_bounds(drifting, 0.99)  # type: ignore[misc]
    assert low_s < high_s and low_d < high_d
    assert high_d / low_d > high_s / low_s  # rounds that disagree give a wider interval
    est = percentile_bounds(drifting, 0.99)
    assert est.bound == "between rounds" and est.upper == pytest.approx(high_d)
    assert percentile_bounds(steady, 0.99).bound == "order statistics"


# Coverage by simulation: 20 rounds of 34 calls, lognormal calls (sigma 0.25) with a lognormal scale
# per round (sigma = drift; 0 = no drift); the true P99 is that of the mixture, known in closed form.
def _true_p99(drift: float, sigma: float = 0.25) -> float:
    return math.exp(2.3263478740408408 * math.hypot(drift, sigma))


def _coverage(drift: float, bound: str, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    truth, covered = _true_p99(drift), 0
    for _ in range(trials):
        rounds = [rng.lognormal(0.0, 0.25, 34) * math.exp(rng.normal(0.0, drift)) for _ in range(20)]
        if bound == "pooled":
            upper = order_statistic_bounds(np.concatenate(rounds), 0.99, 0.99).upper
        else:
            upper = percentile_bounds(rounds, 0.99, 0.99).upper
        covered += upper >= truth
    return covered / trials


@pytest.mark.parametrize("drift", [0.0, 0.1, 0.3])
def test_the_round_bound_covers_the_p99_at_its_level_with_and_without_drift(drift: float) -> None:
    trials = 300
    coverage = _coverage(drift, "rounds", trials, seed=11)
    # three binomial standard errors below the nominal 99 %
    assert coverage >= 0.99 - 3 * math.sqrt(0.99 * 0.01 / trials)


def test_the_pooled_order_statistics_alone_miss_under_strong_drift() -> None:
    # why rounds: without the between-round term, 30 % drift leaves the P99 uncovered far too often
    assert _coverage(0.3, "pooled", 300, seed=11) < 0.95


def test_min_samples_p99_is_loadgen_rule() -> None:
    def second_largest_bounds_p99(n: int) -> bool:
        return binom.cdf(n - 2, n, 0.99) >= 0.99

    assert second_largest_bounds_p99(MIN_SAMPLES_P99)
    assert not second_largest_bounds_p99(MIN_SAMPLES_P99 - 1)


@pytest.mark.parametrize(
    ("lower", "upper", "samples", "expected"),
    [
        (8.0, 9.0, 1000, "missed"),
        (8.0, math.inf, 10, "missed"),  # even with few samples, a lower bound above the SLO decides
        (5.0, 6.5, 1000, "met"),
        (5.0, 7.0, 662, "met"),  # the bound may equal the SLO
        (5.0, 6.5, 661, "uncertain"),  # too few samples for a P99 claim
        (5.0, 8.0, 1000, "uncertain"),
        (-math.inf, math.inf, 1000, "uncertain"),
        (None, None, 1000, "uncertain"),  # unbounded sides stored as None
    ],
)
def test_slo_verdict(lower: float | None, upper: float | None, samples: int, expected: str) -> None:
    assert slo_verdict(lower, upper, 7.0, samples) == expected


def test_slo_verdict_min_samples_override() -> None:
    assert slo_verdict(1.0, 2.0, 7.0, 50, min_samples=50) == "met"


def test_summarize_rounds_in_milliseconds_and_dict() -> None:
    rng = np.random.default_rng(1)
    rounds_ns = [rng.lognormal(np.log(2e6), 0.3, size=35) for _ in range(20)]
    pooled = np.concatenate(rounds_ns)
    summary = summarize(rounds_ns, 0.99)
    assert summary.samples == 700 and summary.rounds == 20 and summary.confidence == 0.99
    assert summary.mean_ms == pytest.approx(pooled.mean() / 1e6)
    assert summary.p50_ms == pytest.approx(np.quantile(pooled, 0.5, method="inverted_cdf") / 1e6)
    assert summary.p50_ms <= summary.p90_ms <= summary.p99_ms <= summary.p999_ms
    for name in ("p50", "p90", "p99", "p999"):
        value = getattr(summary, f"{name}_ms")
        assert getattr(summary, f"{name}_lower_ms") <= value <= getattr(summary, f"{name}_upper_ms")
    assert summary.p99_p50_ratio == pytest.approx(summary.p99_ms / summary.p50_ms)
    assert summary.round_spread is not None and 0 < summary.round_spread < 0.3
    data = summary.to_dict()
    assert data["p999_upper_ms"] is None  # 700 samples cannot bound P99.9 from above
    assert data["p99_upper_ms"] == summary.p99_upper_ms
    assert summarize(pooled).rounds == 1  # a flat array is one round


def test_stats_and_slo_do_not_import_torch() -> None:
    code = "import sys, pareto.measure.stats, pareto.measure, pareto.slo; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
