"""Percentiles with distribution-free confidence intervals, and the SLO verdict they support.

Only numpy here, scipy inside the interval computation: query commands import this module for the
verdict and must stay fast (no torch, no scipy at import).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

#: MLPerf LoadGen's minimum sample count for a 99th-percentile claim at 99 % confidence: the smallest
#: n for which the second-largest of n samples is an upper bound on the true P99 with probability
#: >= 0.99 (``binom.cdf(n - 2, n, 0.99) >= 0.99``). Fewer samples can never give the verdict "met".
MIN_SAMPLES_P99 = 662

Verdict = Literal["met", "missed", "uncertain"]

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class PercentileEstimate:
    """A sample percentile and its confidence interval.

    ``lower`` is ``-inf`` or ``upper`` is ``+inf`` when too few samples bound that side.
    """

    q: float
    value: float
    lower: float
    upper: float
    confidence: float


def percentile_ci(samples: ArrayLike, q: float, confidence: float = 0.95) -> PercentileEstimate:
    """Estimate the ``q`` quantile with a distribution-free two-sided confidence interval.

    The point estimate is the order statistic ``X_(ceil(q*n))`` (numpy's ``method="inverted_cdf"``),
    so it is always an observed sample. The interval is ``[X_(l), X_(u)]`` (1-based ranks of the sorted
    samples) with ``B ~ Binomial(n, q)``, ``F`` its CDF and ``a = (1 - confidence) / 2``:

    - ``l = #{k in 0..n : F(k) <= a}``, the largest rank with ``P(B < l) <= a``;
    - ``u = min{k : F(k) >= 1 - a} + 1``, the smallest rank with ``P(B >= u) <= a``.

    Then ``P(X_(l) <= x_q <= X_(u)) >= F(u-1) - F(l-1) >= confidence`` for any distribution, ties
    included (they only make the interval more conservative). ``l = 0`` gives ``lower = -inf`` and
    ``u = n + 1`` gives ``upper = +inf``: n is too small to bound that side at this confidence.

    Args:
        samples: One-dimensional sample values, in any order.
        q: The quantile, strictly between 0 and 1 (0.99 for P99).
        confidence: Two-sided coverage of the interval, strictly between 0 and 1.

    Returns:
        The estimate with its interval.

    Raises:
        ValueError: no samples, a NaN sample, or ``q`` / ``confidence`` outside (0, 1).
    """
    import numpy as np  # here, not at import: query commands load this module for the verdict alone

    values = np.sort(np.asarray(samples, dtype=float).ravel())
    n = values.size
    if n == 0:
        raise ValueError("percentile_ci needs at least one sample")
    if np.isnan(values).any():
        raise ValueError("percentile_ci got a NaN sample")
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be strictly between 0 and 1, got {q}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")

    alpha_half = (1.0 - confidence) / 2.0
    from scipy.stats import binom  # imported here: scipy.stats costs about a second to import

    cdf = binom.cdf(np.arange(n + 1), n, q)
    lower_rank = int(np.searchsorted(cdf, alpha_half, side="right"))
    upper_rank = int(np.searchsorted(cdf, 1.0 - alpha_half, side="left")) + 1
    return PercentileEstimate(
        q=q,
        value=float(np.quantile(values, q, method="inverted_cdf")),
        lower=float(values[lower_rank - 1]) if lower_rank >= 1 else -math.inf,
        upper=float(values[upper_rank - 1]) if upper_rank <= n else math.inf,
        confidence=confidence,
    )


def slo_verdict(
    lower: float, upper: float, slo: float, samples: int, *, min_samples: int = MIN_SAMPLES_P99
) -> Verdict:
    """Judge a percentile's confidence interval against an SLO.

    Args:
        lower: Lower confidence bound of the percentile.
        upper: Upper confidence bound of the percentile.
        slo: The limit the percentile must stay within (same unit as the bounds).
        samples: How many samples the interval was computed from.
        min_samples: Fewest samples for which "met" may be claimed.

    Returns:
        "missed" when even the lower bound exceeds the SLO; "met" when the upper bound is within it
        and there are at least ``min_samples`` samples; otherwise "uncertain".
    """
    if lower > slo:
        return "missed"
    if upper <= slo and samples >= min_samples:
        return "met"
    return "uncertain"


@dataclass(frozen=True)
class LatencySummary:
    """Latency statistics of one measurement, in milliseconds, without the raw samples."""

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
    confidence: float

    def to_dict(self) -> dict[str, float | int | None]:
        """All fields as plain numbers; an unbounded (infinite) interval end becomes None."""
        return {
            key: None if isinstance(value, float) and math.isinf(value) else value
            for key, value in asdict(self).items()
        }


def summarize(samples_ns: ArrayLike, confidence: float = 0.95) -> LatencySummary:
    """Summarize per-call latencies: mean and P50/P90/P99/P99.9 with confidence intervals.

    Args:
        samples_ns: Per-call latencies in nanoseconds.
        confidence: Two-sided coverage of every percentile's interval.

    Returns:
        The summary in milliseconds.

    Raises:
        ValueError: no samples, a NaN sample, or ``confidence`` outside (0, 1).
    """
    import numpy as np

    samples_ms = np.asarray(samples_ns, dtype=float).ravel() / _NS_PER_MS
    p50, p90, p99, p999 = (percentile_ci(samples_ms, q, confidence) for q in (0.5, 0.9, 0.99, 0.999))
    return LatencySummary(
        mean_ms=float(samples_ms.mean()),
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
        samples=int(samples_ms.size),
        confidence=confidence,
    )
