"""Did a configuration get slower? Two rules, the first whenever the history allows it.

**Drift-corrected** (``compare_corrected``): the nightly times a frozen reference workload in the same
rounds; the configuration's P50 and P99 over the reference's, tonight, are compared with those ratios'
levels over past nights, and it is called slower when the P50's is above the noise band learned from
the study's history (``pareto.nightly_job.stats``); a P99 or an SLO that moved alone makes the night no verdict.
The baseline's own ratio says whether the model got slower or this configuration.

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

from pareto.limits import p99_verdict
from pareto.nightly_job.stats import NoiseBand
from pareto.spec import DEFAULT_REGRESSION_P_VALUE, DEFAULT_REGRESSION_THRESHOLD

#: A P99 must grow by more than this factor to count as slower; asv's significance level for its
#: Mann-Whitney U test (the nightly settings' defaults, where the spec explains them).
DEFAULT_THRESHOLD = DEFAULT_REGRESSION_THRESHOLD
DEFAULT_P_VALUE = DEFAULT_REGRESSION_P_VALUE


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
    #: why tonight gives no verdict on it (its P99 or its SLO moved while its P50 stayed at its level):
    #: the night is noisy; None when it does
    inconclusive: str | None = None

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
    """Compare two stored measurements (``Metrics`` dictionaries) of one configuration, without a history.

    Slower: the P99 beyond ``threshold`` times and the round medians significantly higher. A P99 SLO
    lost is a regression when the round medians moved up with it; lost with them where they were
    (a one-sided Mann-Whitney U test does not find them higher), it is no verdict (``inconclusive``),
    as on the drift-corrected rule: on a shared machine a tail alone moves from night to night.
    """
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
    inconclusive = None
    if lost_slo and test == "mann-whitney" and not significant:  # the tail moved, the round medians did not
        inconclusive = (
            f"{reasons[0]}, with its round medians not slower (Mann-Whitney p = {p:.2g}): the machine's tail "
            "or the model's, one night cannot tell; no verdict tonight"
        )
        reasons = [inconclusive]
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
        regression=slower or (lost_slo and inconclusive is None),
        reason="; ".join(reasons) or "no change beyond noise",
        inconclusive=inconclusive,
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
    raw_p50_ratio: float | None = None,
) -> Comparison:
    """Compare on the drift-corrected statistics: slower when the P50's ratio to its level is above its
    noise band; a P99 above its band with the P50 at its level is no verdict.

    ``ratios`` holds, for "p50" and "p99", (statistic / the reference's) tonight over the
    configuration's level of that ratio (``pareto.nightly_job.history``); ``baseline_ratios`` the baseline's,
    which say whether the whole model got slower (the baseline too) or this configuration alone;
    ``raw_p50_ratio`` the P50 tonight over its level as measured, the drift left in: a P50 slower with
    the drift taken out but not as measured is the drift's doing, no verdict (``_not_slower_as_measured``).

    A model that got slower is slower at every quantile, and its P50 shows it against a band a few
    per cent wide. A P99 that grew while the P50 did not is what a neighbour's load does to one night
    on a shared machine as well as what a tail regression does; one night cannot tell them apart, so
    such a night, or an SLO missed on it, is no verdict (``inconclusive``), and a tail that stays
    shows as a change point over the nights (``pareto.nightly_job.stats``).
    """
    over = [s for s in ("p50", "p99") if ratios[s] > bands[s].threshold]
    unmoved = _not_slower_as_measured(ratios, raw_p50_ratio, bands["p50"], reference_ratio) if "p50" in over else None
    slower = "p50" in over and unmoved is None
    kind = None
    if slower:
        base = baseline_ratios is not None and baseline_ratios["p50"] > bands["p50"].threshold
        kind = "model" if base else "configuration"
    verdict_before = p99_verdict(before, slo_ms) if slo_ms is not None else None
    verdict_after = p99_verdict(after, slo_ms) if slo_ms is not None else None
    missed = verdict_before == "met" and verdict_after != "met"
    inconclusive = unmoved
    if inconclusive is None and missed and not slower:
        inconclusive = _missed_by_machine(after, slo_ms, ratios, reference_p99_ratio)
    elif inconclusive is None and over == ["p99"]:
        inconclusive = (
            f"P99 ×{ratios['p99']:.2f} its level (band ×{bands['p99'].threshold:.2f}) with the P50 at ×"
            f"{ratios['p50']:.2f}: a tail that grew tonight only; no verdict (a tail that stays is a change point)"
        )
    reasons = [inconclusive] if inconclusive else [_lost_slo_reason(after, slo_ms, verdict_after)] if missed else []
    if slower:
        found = ", ".join(f"{s.upper()} ×{ratios[s]:.2f} its level (band ×{bands[s].threshold:.2f})" for s in over)
        base_note = f" (the baseline ×{baseline_ratios['p50']:.2f} at P50)" if baseline_ratios is not None else ""
        which = "the model got slower: the baseline too" if kind == "model" else "this configuration got slower"
        reasons.append(f"{found}, with the machine's drift taken out; {which}{base_note}")
    within = ", ".join(f"{s.upper()} ×{ratios[s]:.2f} ≤ ×{bands[s].threshold:.2f}" for s in ("p50", "p99"))
    return Comparison(
        **_measured(trial, description, before, after),
        test=f"noise bands ({bands['p50'].source})",
        p_value=None,
        slower=slower,
        verdict_before=verdict_before,
        verdict_after=verdict_after,
        lost_slo=missed and slower,
        regression=slower,
        reason="; ".join(reasons) or f"within the noise bands ({within})",
        basis="drift-corrected",
        corrected_ratio=ratios["p99"],
        corrected_p50_ratio=ratios["p50"],
        reference_ratio=reference_ratio,
        baseline_ratio=baseline_ratios["p50"] if baseline_ratios is not None else None,
        band=bands["p99"].threshold,
        band_p50=bands["p50"].threshold,
        kind=kind,
        inconclusive=inconclusive,
    )


def _not_slower_as_measured(
    ratios: dict[str, float], raw_p50_ratio: float | None, band: NoiseBand, reference_ratio: float | None
) -> str | None:
    """Why a P50 above its band with the drift taken out is no verdict when its measured P50 is not.

    Dividing by the reference assumes a configuration slows as much as the reference when the machine
    is loaded. A small model's calls (dispatch, cache-resident weights) slow less than the reference's:
    on a night faster than the one its level was set on, dividing by the reference calls an unchanged
    configuration slower, although its measured P50 fell. A configuration that got slower is slower
    both ways (as if it moved with the reference, and as if not at all); one that is slower one way
    only is what the machine's drift does to it, and no verdict.
    """
    if raw_p50_ratio is None or raw_p50_ratio > band.threshold:
        return None
    machine = "the reference" if reference_ratio is None else f"the reference at ×{reference_ratio:.2f} its usual P50"
    return (
        f"P50 ×{ratios['p50']:.2f} its level with the machine's drift taken out, ×{raw_p50_ratio:.2f} as measured "
        f"(band ×{band.threshold:.2f}), {machine}: the machine's drift moved it, not the model; no verdict"
    )


def _missed_by_machine(
    after: dict[str, Any], slo_ms: float | None, ratios: dict[str, float], reference_p99_ratio: float | None
) -> str:
    """Why an SLO missed tonight with the P50 at its level is no verdict, with the P99 at the machine's
    usual speed where the reference's P99 says how much slower the machine was."""
    upper = after.get("latency_p99_upper_ms")
    shown = f"≤ {upper:.3g} ms" if upper is not None else "unbounded"
    usual = ""
    if upper is not None and reference_p99_ratio is not None and reference_p99_ratio > 1.0:
        usual = (
            f", the machine's P99 ×{reference_p99_ratio:.2f} its usual "
            f"(at its usual speed {upper / reference_p99_ratio:.3g} ms)"
        )
    return (
        f"missed the P99 SLO of {slo_ms:g} ms tonight ({shown}) with its drift-corrected P50 at ×{ratios['p50']:.2f} "
        f"its level{usual}: the machine's tail, not the model's; no verdict tonight"
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
