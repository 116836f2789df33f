"""Did a configuration get slower? Two rules, the first whenever the history allows it.

**Drift-corrected** (``compare_corrected``): the nightly times a frozen reference workload in the same
rounds; the configuration's P99 over the reference's, tonight, is compared with that ratio's level over
past nights, and called slower above the noise band learned from the study's history
(``pareto.drift``). The baseline's own ratio says whether the model got slower or this configuration.

**Absolute** (``compare``), for a configuration with no drift-corrected history yet: the rule
follows airspeed velocity's ``asv compare``, the continuous-benchmarking tool whose verdicts people
act on: a change counts only when it is larger than a ratio threshold *and* statistically
significant. The statistic here is the P99 (what the SLO is about); the test compares the round
medians of the two measurements with a one-sided Mann-Whitney U test at ``p < 0.002`` (asv's level).
Rounds, not single calls, are the samples: calls within a round share the machine's state of that
moment and are not independent, rounds are close to it (the between-round model of
``pareto.measure.stats``). With too few rounds for the test to ever reach that level, the P99's
order-statistic intervals decide instead: slower when the new lower bound is above the old upper
one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pareto.drift import NoiseBand
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
    #: "drift-corrected" (against the reference, with the noise band), "absolute" (the ratio rule
    #: above: no drift-corrected history yet) or "not compared" (measured in another environment)
    basis: str = "absolute"
    corrected_ratio: float | None = None  #: drift-corrected P99 tonight over its level
    corrected_p50_ratio: float | None = None  #: drift-corrected P50 tonight over its level
    reference_ratio: float | None = None  #: the reference's P50 tonight over its level: the machine's drift
    baseline_ratio: float | None = None  #: the baseline's drift-corrected P50 ratio tonight
    band: float | None = None  #: the P99 noise band's threshold
    band_p50: float | None = None  #: the P50 noise band's threshold
    kind: str | None = None  #: slower: "model" (the baseline too) or "configuration" (the baseline not)
    #: missed its P99 SLO tonight, but met it with the machine's drift taken out: the night is noisy
    machine_missed_slo: bool = False

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
    reasons = [_lost_slo_reason(after, slo_ms, verdict_after)] if lost_slo else []
    if slower:
        how = f"p = {p:.2g}" if p is not None else "the P99 intervals do not overlap"
        reasons.append(
            f"P99 {ratio:.2f}x slower ({before['latency_p99_ms']:.3g} → {after['latency_p99_ms']:.3g} ms, {how})"
        )
    elif ratio > threshold:
        reasons.append(f"P99 {ratio:.2f}x slower but not significantly ({test})")
    return Comparison(
        **_measured(trial, description, before, after),
        test=test,
        p_value=p,
        slower=slower,
        verdict_before=verdict_before,
        verdict_after=verdict_after,
        lost_slo=lost_slo,
        regression=lost_slo or slower,
        reason="; ".join(reasons) or "no change beyond noise",
    )


def compare_corrected(
    trial: int,
    description: str,
    before: dict[str, Any],
    after: dict[str, Any],
    *,
    ratios: dict[str, float],
    bands: dict[str, NoiseBand],
    reference_ratio: float | None,
    baseline_ratios: dict[str, float] | None,
    slo_ms: float | None,
    reference_p99_ratio: float | None = None,
) -> Comparison:
    """Compare on the drift-corrected statistics: slower when the P50's or the P99's ratio to its level
    is above its noise band.

    ``ratios`` holds, for "p50" and "p99", (statistic / the reference's) tonight over the
    configuration's level of that ratio (``pareto._nightly_drift``); ``baseline_ratios`` the baseline's,
    which say whether the whole model got slower (the baseline too) or this configuration alone.
    """
    over = [s for s in ("p50", "p99") if ratios[s] > bands[s].threshold]
    slower = bool(over)
    kind = None
    if slower:
        base = [s for s in over if baseline_ratios is not None and baseline_ratios[s] > bands[s].threshold]
        kind = "model" if base else "configuration"
    verdict_before = p99_verdict(before, slo_ms) if slo_ms is not None else None
    verdict_after = p99_verdict(after, slo_ms) if slo_ms is not None else None
    lost_slo = verdict_before == "met" and verdict_after != "met"
    machine_missed = False
    reasons = [_lost_slo_reason(after, slo_ms, verdict_after)] if lost_slo else []
    if lost_slo and slo_ms is not None and reference_p99_ratio is not None and reference_p99_ratio > 1.0:
        upper = after.get("latency_p99_upper_ms")
        usual = upper / reference_p99_ratio if upper is not None else None
        if usual is not None and usual <= slo_ms:  # the machine's slowness alone explains the miss
            lost_slo, machine_missed = False, True
            reasons = [
                f"missed the P99 SLO of {slo_ms:g} ms tonight (≤ {upper:.3g} ms) with the machine's P99 "
                f"×{reference_p99_ratio:.2f} its usual; at its usual speed {usual:.3g} ms: no verdict tonight"
            ]
    if slower:
        found = ", ".join(f"{s.upper()} ×{ratios[s]:.2f} its level (band ×{bands[s].threshold:.2f})" for s in over)
        base_note = f" (the baseline ×{baseline_ratios['p50']:.2f} at P50)" if baseline_ratios is not None else ""
        which = "the model got slower: the baseline too" if kind == "model" else "this configuration got slower"
        reasons.append(f"{found}, with the machine's drift taken out; {which}{base_note}")
    within = ", ".join(f"{s.upper()} ×{ratios[s]:.2f} ≤ ×{bands[s].threshold:.2f}" for s in ("p50", "p99"))
    return Comparison(
        **_measured(trial, description, before, after),
        test=f"noise bands ({bands['p99'].source})",
        p_value=None,
        slower=slower,
        verdict_before=verdict_before,
        verdict_after=verdict_after,
        lost_slo=lost_slo,
        regression=lost_slo or slower,
        reason="; ".join(reasons) or f"within the noise bands ({within})",
        basis="drift-corrected",
        corrected_ratio=ratios["p99"],
        corrected_p50_ratio=ratios["p50"],
        reference_ratio=reference_ratio,
        baseline_ratio=baseline_ratios["p50"] if baseline_ratios is not None else None,
        band=bands["p99"].threshold,
        band_p50=bands["p50"].threshold,
        kind=kind,
        machine_missed_slo=machine_missed,
    )


def not_compared(trial: int, description: str, before: dict[str, Any], after: dict[str, Any], why: str) -> Comparison:
    """A configuration measured tonight whose earlier measurement cannot be compared with it."""
    return Comparison(
        **_measured(trial, description, before, after),
        test="none",
        p_value=None,
        slower=False,
        verdict_before=None,
        verdict_after=None,
        lost_slo=False,
        regression=False,
        reason=why,
        basis="not compared",
    )


def _measured(trial: int, description: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The fields every comparison starts from: which configuration, its P99 before and now, their ratio."""
    return {
        "trial": trial,
        "description": description,
        "p99_before_ms": before["latency_p99_ms"],
        "p99_after_ms": after["latency_p99_ms"],
        "ratio": after["latency_p99_ms"] / before["latency_p99_ms"],
    }


def _lost_slo_reason(after: dict[str, Any], slo_ms: float | None, verdict_after: str | None) -> str:
    bound = after.get("latency_p99_upper_ms")
    shown = f"{bound:.3g} ms" if bound is not None else "unbounded"
    return f"no longer meets the P99 SLO of {slo_ms:g} ms on its upper bound ({shown}, {verdict_after})"
