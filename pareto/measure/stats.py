"""Percentiles with confidence bounds that cover the variation between rounds, and the SLO verdict.

numpy and scipy are imported inside the functions: the query side imports ``pareto.slo`` for the
verdict and never this module's dependencies.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pareto.slo import DEFAULT_CONFIDENCE, MIN_SAMPLES_P99, Verdict, slo_verdict

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike

__all__ = [
    "MIN_SAMPLES_P99",
    "LatencySummary",
    "PercentileEstimate",
    "Verdict",
    "between_round_bounds",
    "order_statistic_bounds",
    "percentile_bounds",
    "slo_verdict",
    "summarize",
]

_NS_PER_MS = 1e6
QUANTILES = (0.5, 0.9, 0.99, 0.999)


@dataclass(frozen=True)
class PercentileEstimate:
    """A sample percentile and its one-sided confidence bounds.

    Each bound holds on its own with probability ``confidence``; ``lower`` is ``-inf`` or ``upper``
    is ``+inf`` when too few samples bound that side. ``bound`` says which method gave the upper
    bound: "order statistics" (the pooled samples) or "between rounds" (the round-to-round spread).
    """

    q: float
    value: float
    lower: float
    upper: float
    confidence: float
    bound: str = "order statistics"


def order_statistic_bounds(samples: ArrayLike, q: float, confidence: float = DEFAULT_CONFIDENCE) -> PercentileEstimate:
    """Estimate the ``q`` quantile with distribution-free one-sided bounds from order statistics.

    The point estimate is the order statistic ``X_(ceil(q*n))`` (numpy's ``method="inverted_cdf"``),
    so it is always an observed sample. With ``B ~ Binomial(n, q)``, ``F`` its CDF and
    ``a = 1 - confidence``, the bounds are ``X_(l)`` and ``X_(u)`` (1-based ranks of the sorted samples):

    - ``l = #{k in 0..n : F(k) <= a}``, the largest rank with ``P(B < l) <= a``;
    - ``u = min{k : F(k) >= 1 - a} + 1``, the smallest rank with ``P(B >= u) <= a``.

    Then ``P(x_q <= X_(u)) >= confidence`` and ``P(X_(l) <= x_q) >= confidence`` for independent
    samples of any distribution, ties included. For independent samples whose distribution differs
    (rounds on a drifting machine) the count below a fixed value is Poisson-binomial, which is less
    spread than the binomial of the same mean (Hoeffding, 1956), so the bounds still hold for the
    quantile of the samples' average distribution. ``l = 0`` gives ``lower = -inf`` and ``u = n + 1``
    gives ``upper = +inf``: n is too small to bound that side at this confidence.

    Raises:
        ValueError: no samples, a NaN sample, or ``q`` / ``confidence`` outside (0, 1).
    """
    import numpy as np

    values = np.sort(np.asarray(samples, dtype=float).ravel())
    _check(values, q, confidence)
    n = values.size
    lower_rank, upper_rank = _order_ranks(n, q, confidence)
    return PercentileEstimate(
        q=q,
        value=float(np.quantile(values, q, method="inverted_cdf")),
        lower=float(values[lower_rank - 1]) if lower_rank >= 1 else -math.inf,
        upper=float(values[upper_rank - 1]) if upper_rank <= n else math.inf,
        confidence=confidence,
    )


@functools.lru_cache(maxsize=1024)
def _order_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """The 1-based ranks ``(l, u)`` of ``order_statistic_bounds`` for ``n`` samples: they depend on
    ``n``, ``q`` and the confidence only, and a search asks for the same few thousand times (the
    binomial CDF over ``n + 1`` points costs milliseconds a call)."""
    import numpy as np
    from scipy.stats import binom  # here, not at import: scipy.stats costs about a second to import

    cdf = binom.cdf(np.arange(n + 1), n, q)
    lower_rank = int(np.searchsorted(cdf, 1.0 - confidence, side="right"))
    upper_rank = int(np.searchsorted(cdf, confidence, side="left")) + 1
    return lower_rank, upper_rank


def between_round_bounds(
    rounds: Sequence[ArrayLike], q: float, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float] | None:
    """Bounds on the ``q`` quantile of the distribution that future rounds are drawn from.

    The model: a round's latencies are a common shape ``Z`` scaled by the machine's state during that
    round, ``L = S * Z``, with ``log S`` normal across rounds (clock frequency, co-tenants and cache
    state move the whole round; a lognormal scale is the usual model for such multiplicative noise).
    The shape is estimated from every sample divided by its round's median; ``log S`` from the round
    medians, with a Student-t bound on its mean and a chi-square bound on its spread, each at
    ``confidence``. The quantile of the mixture ``S * Z`` under those bounds solves
    ``mean_i P(S * z_i > x) = 1 - q``.

    Returns:
        (lower, upper), or None with fewer than two rounds (no spread to estimate).
    """
    import numpy as np
    from scipy.stats import chi2, t

    if len(rounds) < 2:
        return None
    arrays = [np.asarray(r, dtype=float).ravel() for r in rounds]
    medians = np.array([np.median(r) for r in arrays])
    if not (medians > 0).all():
        return None
    log_medians = np.log(medians)
    log_shape = np.log(np.maximum(np.concatenate([r / m for r, m in zip(arrays, medians, strict=True)]), 1e-300))
    n_rounds = len(arrays)
    centre, spread = float(log_medians.mean()), float(log_medians.std(ddof=1))
    mean_step = t.ppf(confidence, n_rounds - 1) * spread / math.sqrt(n_rounds)
    spread_high = spread * math.sqrt((n_rounds - 1) / chi2.ppf(1.0 - confidence, n_rounds - 1))
    spread_low = spread * math.sqrt((n_rounds - 1) / chi2.ppf(confidence, n_rounds - 1))
    return (
        _mixture_quantile(log_shape, centre - mean_step, spread_low, q),
        _mixture_quantile(log_shape, centre + mean_step, spread_high, q),
    )


def _mixture_quantile(log_shape: np.ndarray, centre: float, spread: float, q: float) -> float:
    """The ``q`` quantile of ``exp(N(centre, spread²)) * Z``, Z the empirical shape."""
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    if spread <= 0.0:
        return float(np.exp(centre + np.quantile(log_shape, q, method="inverted_cdf")))

    def excess(log_x: float) -> float:
        return float(norm.sf((log_x - log_shape - centre) / spread).mean()) - (1.0 - q)

    low = float(log_shape.min()) + centre - 10.0 * spread
    high = float(log_shape.max()) + centre + 10.0 * spread
    return float(np.exp(brentq(excess, low, high, xtol=1e-9)))


def percentile_bounds(
    rounds: Sequence[ArrayLike], q: float, confidence: float = DEFAULT_CONFIDENCE
) -> PercentileEstimate:
    """The ``q`` quantile of samples taken in rounds, with bounds that cover the rounds' drift.

    The upper bound is the larger of the order-statistic bound on the pooled samples
    (``order_statistic_bounds``: exact for independent calls, whatever their distribution, and valid
    for the rounds actually observed) and the between-round bound (``between_round_bounds``: covers
    rounds yet to come when the machine's speed drifts from round to round). The lower bound is the
    smaller of the two. Taking the more conservative bound keeps at least the coverage of whichever
    model holds: when the rounds agree the order statistics decide, when they disagree the spread
    between them widens the bound. Simulated coverage at 99 %, 20 rounds of 34 calls
    (``benchmarks/coverage.py``, BENCHMARKS.md): 99.7–99.9 % for independent calls and for lognormal
    round-to-round drift of 10–30 %, where the pooled order statistics alone fall to 98 % and 81 %.
    Not covered: a spike rate that varies between rounds (97–99 %: the round medians do not see
    spikes) and rounds on a busy machine (84 %: the contention guard's job, not the bound's).
    """
    import numpy as np

    pooled = order_statistic_bounds(np.concatenate([np.asarray(r, dtype=float).ravel() for r in rounds]), q, confidence)
    between = between_round_bounds(rounds, q, confidence)
    if between is None:
        return pooled
    lower, upper = min(pooled.lower, between[0]), max(pooled.upper, between[1])
    bound = "between rounds" if between[1] > pooled.upper else "order statistics"
    return PercentileEstimate(q, pooled.value, lower, upper, confidence, bound)


def _check(values: np.ndarray, q: float, confidence: float) -> None:
    import numpy as np

    if values.size == 0:
        raise ValueError("a percentile needs at least one sample")
    if np.isnan(values).any():
        raise ValueError("a percentile got a NaN sample")
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be strictly between 0 and 1, got {q}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")


@dataclass(frozen=True)
class LatencySummary:
    """Latency statistics of one measurement, in milliseconds, without the raw samples.

    Bounds are one-sided at ``confidence`` each; ``round_spread`` is the standard deviation of the
    log round medians (0.05 means rounds differ by about 5 %); ``p99_bound`` names the method that
    gave the P99 upper bound.
    """

    mean_ms: float
    p50_ms: float
    p50_lower_ms: float
    p50_upper_ms: float
    p90_ms: float
    p90_lower_ms: float
    p90_upper_ms: float
    p99_ms: float
    p99_lower_ms: float
    p99_upper_ms: float
    p999_ms: float
    p999_lower_ms: float
    p999_upper_ms: float
    p99_p50_ratio: float
    samples: int
    rounds: int
    round_spread: float | None
    p99_bound: str
    confidence: float
    #: the median of each round kept, in the order timed (nightly regression tests compare these)
    round_medians_ms: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, float | int | str | None]:
        """All fields as plain values; an unbounded (infinite) bound becomes None."""
        return {
            key: None if isinstance(value, float) and math.isinf(value) else value
            for key, value in asdict(self).items()
        }


def summarize(rounds_ns: Sequence[ArrayLike] | np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> LatencySummary:
    """Summarize per-call latencies timed in rounds: mean and P50/P90/P99/P99.9 with bounds.

    Args:
        rounds_ns: Per-call latencies in nanoseconds, one array per round (a flat array is one round).
        confidence: One-sided confidence of every bound.

    Returns:
        The summary in milliseconds.

    Raises:
        ValueError: no samples, a NaN sample, or ``confidence`` outside (0, 1).
    """
    import numpy as np

    if isinstance(rounds_ns, np.ndarray) and rounds_ns.ndim <= 1:
        rounds_ns = [rounds_ns]
    rounds_ms = [np.asarray(r, dtype=float).ravel() / _NS_PER_MS for r in rounds_ns if np.size(r)]
    if not rounds_ms:
        raise ValueError("a latency summary needs at least one sample")
    pooled = np.concatenate(rounds_ms)
    p50, p90, p99, p999 = (percentile_bounds(rounds_ms, q, confidence) for q in QUANTILES)
    medians = np.array([np.median(r) for r in rounds_ms])
    spread = float(np.log(medians).std(ddof=1)) if len(rounds_ms) >= 2 and (medians > 0).all() else None
    return LatencySummary(
        mean_ms=float(pooled.mean()),
        p50_ms=p50.value,
        p50_lower_ms=p50.lower,
        p50_upper_ms=p50.upper,
        p90_ms=p90.value,
        p90_lower_ms=p90.lower,
        p90_upper_ms=p90.upper,
        p99_ms=p99.value,
        p99_lower_ms=p99.lower,
        p99_upper_ms=p99.upper,
        p999_ms=p999.value,
        p999_lower_ms=p999.lower,
        p999_upper_ms=p999.upper,
        p99_p50_ratio=p99.value / p50.value if p50.value > 0 else math.inf,
        samples=int(pooled.size),
        rounds=len(rounds_ms),
        round_spread=spread,
        p99_bound=p99.bound,
        confidence=confidence,
        round_medians_ms=tuple(float(m) for m in medians),
    )
