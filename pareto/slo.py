"""The measurement rules shared by the measuring side and the query side: the verdict, the sample
rule and the defaults of a latency measurement.

Pure Python: ``pareto best`` imports this without torch, numpy or scipy.
"""

from __future__ import annotations

import math
from typing import Literal

#: MLPerf LoadGen's minimum sample count for a 99th-percentile claim at 99 % confidence: the smallest
#: n for which the second-largest of n samples is an upper bound on the true P99 with probability
#: >= 0.99 (``binom.cdf(n - 2, n, 0.99) >= 0.99``). Fewer samples can never give the verdict "met".
MIN_SAMPLES_P99 = 662

#: Default one-sided confidence of every percentile bound: "met" means the P99 is within the SLO
#: with at least this probability (the level of MLPerf LoadGen's latency rule).
DEFAULT_CONFIDENCE = 0.99

#: The lowest confidence a user may ask for: below it "met" stops meaning much (at 0.5 about one
#: configuration in five whose true P99 sits at the SLO would be called "met").
MIN_CONFIDENCE = 0.9

#: Untimed calls before a model's first timed round (allocator, caches, lazy initialization).
DEFAULT_WARMUP = 50

#: Rounds a latency measurement is split into (the contention probe runs between them).
DEFAULT_ROUNDS = 20

#: A round is discarded when the contention probe is slower than this multiple of its quiet time. On
#: the 2-core VM of BENCHMARKS.md the probe's quiet 90th percentile is 1.3x its 10th, and one
#: CPU-bound process beside the measurement makes it 2-3x slower.
DEFAULT_CONTENTION_LIMIT = 1.5

#: The P99 objective and verdicts read this stored metric: the conservative (upper) bound.
P99_BOUND_METRIC = "latency_p99_upper_ms"

Verdict = Literal["met", "missed", "uncertain"]


def slo_verdict(
    lower: float | None, upper: float | None, slo: float, samples: int, *, min_samples: int = MIN_SAMPLES_P99
) -> Verdict:
    """Judge a percentile's confidence bounds against an SLO.

    Args:
        lower: Lower confidence bound of the percentile; None or -inf when unbounded.
        upper: Upper confidence bound of the percentile; None or +inf when unbounded.
        slo: The limit the percentile must stay within (same unit as the bounds).
        samples: How many samples the bounds were computed from.
        min_samples: Fewest samples for which "met" may be claimed.

    Returns:
        "missed" when even the lower bound exceeds the SLO; "met" when the upper bound is within it
        and there are at least ``min_samples`` samples; otherwise "uncertain".
    """
    low = -math.inf if lower is None else lower
    if low > slo:
        return "missed"
    if within(upper, slo) and samples >= min_samples:
        return "met"
    return "uncertain"


def within(upper: float | None, limit: float | None) -> bool:
    """The rule every P99 limit is judged by: an upper confidence bound exists and is within the limit
    (a missing bound is unbounded, a missing limit met by nothing). The SQL filter of the read side is
    the same comparison (``pareto.store.queries``)."""
    return upper is not None and limit is not None and upper <= limit


def min_samples_for_upper_bound(q: float, confidence: float) -> int:
    """The fewest samples whose largest one is a ``confidence`` upper bound on the ``q`` quantile.

    With n independent samples the maximum is below the true quantile with probability q**n, so the
    bound is finite once q**n <= 1 - confidence (459 samples for the P99 at 99 %).
    """
    if not (0.0 < q < 1.0 and 0.0 < confidence < 1.0):
        raise ValueError(f"q and confidence must be strictly between 0 and 1, got {q} and {confidence}")
    return math.ceil(math.log1p(-confidence) / math.log(q) - 1e-12)
