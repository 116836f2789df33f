"""Did a configuration get slower? Two measurements compared as distributions, not as two numbers.

The rule follows airspeed velocity's ``asv compare``, the continuous-benchmarking tool whose verdicts
people act on: a change counts only when it is larger than a ratio threshold *and* statistically
significant. The statistic here is the P99 (what the SLO is about); the test compares the round
medians of the two measurements with a one-sided Mann-Whitney U test at ``p < 0.002`` (asv's level).
Rounds, not single calls, are the samples: calls within a round share the machine's state of that
moment and are not independent, rounds are close to it (the between-round model of
``pareto.measure.stats``). With too few rounds for the test to ever reach that level, the P99's
order-statistic intervals decide instead: slower when the new lower bound is above the old upper one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pareto.frontier import p99_verdict

#: A P99 must grow by more than this factor to count as slower. asv's default is 1.1, for a dedicated
#: benchmark machine; between two nightlies on a shared 2-core cloud VM the same configuration's P99
#: moved by up to 1.6x with nothing changed (BENCHMARKS.md), and rounds within one run share that
#: run's state, so the U test alone cannot tell such drift from a change. Lower it on a quiet machine.
DEFAULT_THRESHOLD = 2.0
#: asv's significance level for its Mann-Whitney U test.
DEFAULT_P_VALUE = 0.002


@dataclass(frozen=True)
class Comparison:
    """A configuration's latency before and after, and what follows from it."""

    trial: int
    description: str
    p99_before_ms: float
    p99_after_ms: float
    ratio: float  #: P99 after / before
    test: str  #: "mann-whitney" (round medians) or "intervals" (P99 order-statistic bounds)
    p_value: float | None  #: the test's one-sided p-value; None for intervals
    slower: bool  #: beyond the threshold and significant
    verdict_before: str | None
    verdict_after: str | None
    lost_slo: bool  #: met its P99 SLO on the upper bound before, no longer does
    regression: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def min_rounds_for_test(p_value: float) -> int:
    """The fewest rounds per side for which the exact one-sided U test can reach ``p_value``.

    The smallest p-value of n against n rounds is 1 / C(2n, n).
    """
    n = 2
    while 1 / math.comb(2 * n, n) >= p_value:
        n += 1
    return n


def compare(
    trial: int,
    description: str,
    before: dict[str, Any],
    after: dict[str, Any],
    *,
    slo_ms: float | None,
    threshold: float = DEFAULT_THRESHOLD,
    p_value: float = DEFAULT_P_VALUE,
) -> Comparison:
    """Compare two stored measurements (``Metrics`` dictionaries) of one configuration."""
    from scipy.stats import mannwhitneyu

    ratio = after["latency_p99_ms"] / before["latency_p99_ms"]
    old, new = before.get("round_medians_ms") or [], after.get("round_medians_ms") or []
    need = min_rounds_for_test(p_value)
    if len(old) >= need and len(new) >= need:
        test, p = "mann-whitney", float(mannwhitneyu(new, old, alternative="greater").pvalue)
        significant = p < p_value
    else:
        test, p = "intervals", None
        low, high = after.get("latency_p99_lower_ms"), before.get("latency_p99_upper_ms")
        significant = low is not None and high is not None and low > high
    slower = ratio > threshold and significant
    verdict_before = p99_verdict(before, slo_ms) if slo_ms is not None else None
    verdict_after = p99_verdict(after, slo_ms) if slo_ms is not None else None
    lost_slo = verdict_before == "met" and verdict_after != "met"
    reasons = []
    if lost_slo:
        bound = after.get("latency_p99_upper_ms")
        shown = f"{bound:.3g} ms" if bound is not None else "unbounded"
        reasons.append(f"no longer meets the P99 SLO of {slo_ms:g} ms on its upper bound ({shown}, {verdict_after})")
    if slower:
        how = f"p = {p:.2g}" if p is not None else "the P99 intervals do not overlap"
        reasons.append(
            f"P99 {ratio:.2f}x slower ({before['latency_p99_ms']:.3g} → {after['latency_p99_ms']:.3g} ms, {how})"
        )
    elif ratio > threshold:
        reasons.append(f"P99 {ratio:.2f}x slower but not significantly ({test})")
    return Comparison(
        trial=trial,
        description=description,
        p99_before_ms=before["latency_p99_ms"],
        p99_after_ms=after["latency_p99_ms"],
        ratio=ratio,
        test=test,
        p_value=p,
        slower=slower,
        verdict_before=verdict_before,
        verdict_after=verdict_after,
        lost_slo=lost_slo,
        regression=lost_slo or slower,
        reason="; ".join(reasons) or "no change beyond noise",
    )
