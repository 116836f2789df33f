from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import binom

from pareto.measure.stats import MIN_SAMPLES_P99, percentile_ci, slo_verdict, summarize


def _rank(bound: float, n: int) -> int:
    """1-based rank of a bound among the samples 1..n (0 for -inf, n + 1 for +inf)."""
    return 0 if bound == -math.inf else n + 1 if bound == math.inf else int(bound)


@pytest.mark.parametrize("n", [1, 2, 5, 10, 30, 100, 250, 662, 1000])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_exact_coverage_of_chosen_ranks(n: int, q: float, confidence: float) -> None:
    est = percentile_ci(np.arange(n, 0.0, -1.0), q, confidence)  # values n..1: a value is its rank
    lower_rank, upper_rank = _rank(est.lower, n), _rank(est.upper, n)
    # P(X_(l) <= x_q <= X_(u)) >= F(u-1) - F(l-1), with F(-1) = 0 and F(n) = 1
    coverage = binom.cdf(upper_rank - 1, n, q) - binom.cdf(lower_rank - 1, n, q)
    assert coverage >= confidence - 1e-12
    assert est.lower <= est.value <= est.upper


def test_ranks_are_tightest_equal_tailed() -> None:
    est = percentile_ci(np.arange(1.0, 1001.0), 0.99, 0.95)
    lower_rank, upper_rank = int(est.lower), int(est.upper)
    alpha_half = 0.025
    assert binom.cdf(lower_rank - 1, 1000, 0.99) <= alpha_half < binom.cdf(lower_rank, 1000, 0.99)
    assert binom.cdf(upper_rank - 2, 1000, 0.99) < 1 - alpha_half <= binom.cdf(upper_rank - 1, 1000, 0.99)


def test_small_n_gives_unbounded_sides() -> None:
    est = percentile_ci([3.0, 1.0, 2.0], 0.99, 0.95)
    assert est.upper == math.inf
    assert est.value == 3.0
    # 200 samples cannot bound P99 from above at 95 %: 0.99**200 > 0.025
    assert percentile_ci(np.arange(200.0), 0.99).upper == math.inf
    assert percentile_ci(np.arange(400.0), 0.99).upper < math.inf
    assert percentile_ci([5.0], 0.5, 0.95).lower == -math.inf


@pytest.mark.parametrize("n", [1, 7, 100, 662, 1001])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_point_estimate_is_inverted_cdf_order_statistic(n: int, q: float) -> None:
    samples = np.random.default_rng(n).lognormal(size=n)
    est = percentile_ci(samples, q)
    assert est.value == np.quantile(samples, q, method="inverted_cdf")
    assert est.value == np.sort(samples)[math.ceil(q * n) - 1]


@pytest.mark.parametrize(
    "draw",
    [lambda rng, size: rng.exponential(2.0, size), lambda rng, size: rng.lognormal(0.0, 1.0, size)],
    ids=["exponential", "lognormal"],
)
def test_monte_carlo_p99_coverage(draw) -> None:
    rng = np.random.default_rng(20240607)
    true_p99 = np.quantile(draw(rng, 2_000_000), 0.99)
    trials, n, confidence = 800, 662, 0.95
    covered = 0
    for _ in range(trials):
        est = percentile_ci(draw(rng, n), 0.99, confidence)
        covered += est.lower <= true_p99 <= est.upper
    # 3 binomial standard errors below the nominal level, plus a little for the estimated true P99
    tolerance = 3 * math.sqrt(confidence * (1 - confidence) / trials) + 0.005
    assert covered / trials >= confidence - tolerance


def test_ties_stay_within_observed_values() -> None:
    samples = [1.0] * 50 + [2.0] * 900 + [3.0] * 50
    est = percentile_ci(samples, 0.99)
    assert est.value == 3.0
    assert est.lower in (2.0, 3.0) and est.upper == 3.0
    constant = percentile_ci([4.0] * 700, 0.99)
    assert constant.lower == constant.value == constant.upper == 4.0


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        percentile_ci([], 0.99)
    with pytest.raises(ValueError, match="NaN"):
        percentile_ci([1.0, float("nan")], 0.5)
    with pytest.raises(ValueError, match="q must be"):
        percentile_ci([1.0], 1.0)
    with pytest.raises(ValueError, match="confidence"):
        percentile_ci([1.0], 0.5, confidence=1.0)
    with pytest.raises(ValueError):
        summarize([])


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
    ],
)
def test_slo_verdict(lower: float, upper: float, samples: int, expected: str) -> None:
    assert slo_verdict(lower, upper, 7.0, samples) == expected


def test_slo_verdict_min_samples_override() -> None:
    assert slo_verdict(1.0, 2.0, 7.0, 50, min_samples=50) == "met"


def test_summarize_milliseconds_and_dict() -> None:
    samples_ns = np.random.default_rng(1).lognormal(np.log(2e6), 0.3, size=700)
    summary = summarize(samples_ns, 0.95)
    assert summary.samples == 700 and summary.confidence == 0.95
    assert summary.mean_ms == pytest.approx(samples_ns.mean() / 1e6)
    assert summary.p50_ms == pytest.approx(np.quantile(samples_ns, 0.5, method="inverted_cdf") / 1e6)
    assert summary.p50_ms <= summary.p90_ms <= summary.p99_ms <= summary.p999_ms
    for name in ("p50", "p90", "p99", "p999"):
        value = getattr(summary, f"{name}_ms")
        assert getattr(summary, f"{name}_lower_ms") <= value <= getattr(summary, f"{name}_upper_ms")
    assert summary.p99_p50_ratio == pytest.approx(summary.p99_ms / summary.p50_ms)
    data = summary.to_dict()
    assert data["p999_upper_ms"] is None  # 700 samples cannot bound P99.9 from above
    assert data["p99_upper_ms"] == summary.p99_upper_ms
    assert data["samples"] == 700


def test_stats_does_not_import_torch() -> None:
    code = "import sys, pareto.measure.stats, pareto.measure; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
