"""Nights compared with the machine's drift taken out: the noise band learned from history, change points.

A nightly times the pick, the baseline and a frozen reference workload (``pareto.measure.reference``)
in the same interleaved rounds. The *drift-corrected* P99 is the pick's P99 divided by the
reference's: a slower machine moves both, a slower model moves only the first. The same is done for
the P50. Nights are compared on the logarithm of these ratios, each statistic on its own:

- **The level** of a configuration is the median of its last ``LEVEL_NIGHTS`` drift-corrected values
  on nights that were not regressions (one odd night does not move it).
- **The noise band** is how far a night falls from the level when nothing changed: the robust spread
  (the median absolute deviation, scaled to a normal's standard deviation) of the residuals of the
  study's past nights, for every configuration re-measured, pooled with the default spread as if
  that were ``MIN_HISTORY`` nights (a short, lucky history does not narrow the band much). A night
  is slower when its residual is above ``z(1 - false_alarm) × spread``. With fewer than
  ``MIN_HISTORY`` residuals (a study's first nights) the spread is the default, ``DEFAULT_SIGMA``,
  measured on a shared 2-core VM (BENCHMARKS.md, "Nightly sensitivity").
- Why the P50 decides: a P99 rests on the slowest 1 % of calls, which the host's preemptions and a
  neighbour's load decide. On a shared 2-core VM the drift-corrected P99 of an unchanged model moved
  by 10–40 % between processes, the P50 by 1.5 % (an eager pruned pick), or about 5 % for an int8
  pick beside a frozen fp32 baseline (BENCHMARKS.md). A model that got slower is slower at every
  quantile and shows in the P50 first; a P99 past its band with the P50 at its level is no verdict
  for one night (``pareto.nightly_job.regression``), and a tail that stays is a change point in the P99 series.
- **Change points**: e-divisive means (Matteson & James, "A nonparametric approach for multiple
  change point analysis of multivariate data", JASA 2014), the method Hunter and Apache Otava use for
  continuous benchmarking, over a configuration's nightly series, with a permutation test. It finds a
  creep of a few percent a night that no pair of nights shows. One counts when the nights after it
  (at least ``CHANGE_MIN_NIGHTS``) are slower than the nights before by more than one night's noise
  band: a shift smaller than that is not one a team can act on, and the drift of a shared machine
  makes such shifts between unchanged segments. Written here (fifty lines of numpy):
  the packages that carry it pin old NumPy releases or bring cloud clients with them.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pareto.spec import DEFAULT_FALSE_ALARM

#: One pass's chance of calling an unchanged night slower (one-sided); the second pass lowers it further.
FALSE_ALARM = DEFAULT_FALSE_ALARM
#: The detection probability at which the smallest detectable slowdown is stated.
POWER = 0.95
#: Fewest residuals from which the band is learned; below, ``DEFAULT_SIGMA``.
MIN_HISTORY = 8
#: Nights whose median is a configuration's level.
LEVEL_NIGHTS = 7
#: The spread of the log drift-corrected statistic around its level between unchanged nights, measured
#: on the shared 2-core AMD EPYC VM and rounded up (BENCHMARKS.md, "Nightly sensitivity"); a study's
#: own history takes over from ``MIN_HISTORY`` residuals.
DEFAULT_SIGMA = {"p50": 0.03, "p99": 0.12}
#: The statistics compared, in the order a finding is reported.
STATISTICS = ("p50", "p99")
#: A learned spread is never taken below this (a run of identical values is not a zero-noise machine).
MIN_SIGMA = 0.01
#: Change points: the permutation test's level, its permutations and the fewest nights on each side.
#: The test runs again every night over a growing series, so its level is well below one pass's
#: false-alarm rate: at 1 % a month of unchanged nights on the shared VM showed three. Up to 9999
#: permutations: at 1999 a split was significant only when no permutation reached it, and one chance
#: permutation dropped a 3 %/night creep (true p about 0.0005) the night after it was found. A split
#: no permutation reaches in the first 1999 is significant without the rest (as fast as before).
CHANGE_P_VALUE = 0.001
CHANGE_PERMUTATIONS = 9999
CHANGE_FIRST_PERMUTATIONS = 1999
CHANGE_MIN_NIGHTS = 3


def nights_to_find_change(p_value: float = CHANGE_P_VALUE, min_size: int = CHANGE_MIN_NIGHTS) -> int:
    """The fewest nights in which a change point can pass the permutation test at ``p_value``: the most
    even split of fewer values has under 1/``p_value`` arrangements (13 nights at 0.001)."""
    n = 2 * min_size
    while math.comb(n, n // 2) * p_value < 1:
        n += 1
    return n


def _z(probability: float) -> float:
    return statistics.NormalDist().inv_cdf(probability)


@dataclass(frozen=True)
class NoiseBand:
    """How far a night's drift-corrected statistic (P50 or P99) may fall above its level and still be noise."""

    statistic: str  #: "p50" or "p99"
    sigma: float  #: robust spread of the log residuals
    threshold: float  #: a ratio to the level above this is slower
    residuals: int  #: how many past nights it was learned from (0: the default)
    source: str  #: "history" or "default"
    false_alarm: float

    @property
    def smallest_detectable(self) -> float:
        """The slowdown one pass is predicted to find with probability ``POWER`` if the residuals are
        normal with the band's spread: the threshold plus ``z(POWER)`` spreads (a prediction, not a count)."""
        return math.exp(math.log(self.threshold) + _z(POWER) * self.sigma)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "smallest_detectable": self.smallest_detectable, "power": POWER}

    def describe(self) -> str:
        learned = f"learned from {self.residuals} past re-measurements" if self.source == "history" else "the default"
        return (
            f"{self.statistic.upper()} noise band ×{self.threshold:.3f} ({learned}: spread {100 * self.sigma:.1f} %, "
            f"{100 * self.false_alarm:g} % false alarms a pass); smallest slowdown predicted to be found in "
            f"{100 * POWER:g} % of passes: ×{self.smallest_detectable:.2f}"
        )


def noise_band(
    residuals: Sequence[float],
    statistic: str = "p99",
    *,
    false_alarm: float = FALSE_ALARM,
    default_sigma: float | None = None,
    min_history: int = MIN_HISTORY,
) -> NoiseBand:
    """The band from past residuals (a log drift-corrected statistic minus its level), or the default."""
    from scipy.stats import median_abs_deviation

    default_sigma = DEFAULT_SIGMA[statistic] if default_sigma is None else default_sigma
    if len(residuals) >= min_history:
        # the spread of a few dozen nights is itself uncertain: pooled with the default as if it
        # were ``min_history`` nights' worth, so a short lucky history does not narrow the band much
        learned = float(median_abs_deviation(residuals, scale="normal"))
        n = len(residuals)
        sigma = max(math.sqrt((min_history * default_sigma**2 + n * learned**2) / (min_history + n)), MIN_SIGMA)
        source, used = "history", n
    else:
        sigma, source, used = default_sigma, "default", 0
    threshold = math.exp(_z(1 - false_alarm) * sigma)
    return NoiseBand(statistic, sigma, threshold, used, source, false_alarm)


def level(values: Sequence[float]) -> float:
    """A configuration's level: the median of its last ``LEVEL_NIGHTS`` log values."""
    return float(statistics.median(values[-LEVEL_NIGHTS:]))


def residuals(series: Sequence[Sequence[float]]) -> list[float]:
    """Each night's log value minus the level of the nights before it, over several configurations' series."""
    out: list[float] = []
    for values in series:
        out += [values[k] - level(values[:k]) for k in range(1, len(values))]
    return out


@dataclass(frozen=True)
class ChangePoint:
    """A night from which a configuration's drift-corrected P99 differs from the nights before it."""

    index: int  #: the first night of the new segment (0-based in the series given)
    p_value: float
    ratio: float  #: the later segment's median over the earlier one's (on the drift-corrected P99)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def change_points(
    values: Sequence[float],
    *,
    p_value: float = CHANGE_P_VALUE,
    permutations: int = CHANGE_PERMUTATIONS,
    min_size: int = CHANGE_MIN_NIGHTS,
    seed: int = 0,
) -> list[ChangePoint]:
    """E-divisive means over ``values`` (log values, oldest first): every significant change point.

    Each step finds, in every segment between the change points so far, the split that maximizes the
    energy statistic Q̂ (α = 1); the largest is kept when fewer than ``p_value`` of the series permuted
    within those segments reach it.
    """
    z = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    found: dict[int, float] = {}
    while True:
        bounds = [0, *sorted(found), len(z)]
        segments = list(itertools.pairwise(bounds))
        q, where = _best_split(z, segments, min_size)
        if where is None:
            break
        p = _permutation_p(z, segments, min_size, q, rng, permutations, p_value)
        if p >= p_value:
            break
        found[where] = p
    return [_described(z, sorted(found), index, found[index]) for index in sorted(found)]


def _permutation_p(
    z: np.ndarray,
    segments: list[tuple[int, int]],
    min_size: int,
    q: float,
    rng: np.random.Generator,
    permutations: int,
    p_value: float,
) -> float:
    """The share of permutations (within the segments) whose best split reaches ``q``, counting the series
    itself; it stops once the share can no longer fall below ``p_value`` (then a lower bound: not
    significant either way), and after ``CHANGE_FIRST_PERMUTATIONS`` when none reached it (significant)."""
    reached = 0
    for done in range(1, permutations + 1):
        shuffled = z.copy()
        for start, end in segments:
            rng.shuffle(shuffled[start:end])
        reached += _best_split(shuffled, segments, min_size)[0] >= q
        if (reached + 1) / (permutations + 1) >= p_value:
            break
        if done == CHANGE_FIRST_PERMUTATIONS and reached == 0 and 1 / (done + 1) < p_value:
            return 1 / (done + 1)
    return (reached + 1) / (permutations + 1)


def _described(z: np.ndarray, found: list[int], index: int, p_value: float) -> ChangePoint:
    bounds = [0, *found, len(z)]
    at = bounds.index(index)
    before, after = z[bounds[at - 1] : index], z[index : bounds[at + 1]]
    return ChangePoint(index=index, p_value=p_value, ratio=math.exp(float(np.median(after) - np.median(before))))


def _best_split(z: np.ndarray, segments: list[tuple[int, int]], min_size: int) -> tuple[float, int | None]:
    """The largest Q̂ over the segments, and where its split is (None when no segment can split)."""
    best, where = -math.inf, None
    for start, end in segments:
        q, tau = _segment_split(z[start:end], min_size)
        if tau is not None and q > best:
            best, where = q, start + tau
    return best, where


def _segment_split(z: np.ndarray, min_size: int) -> tuple[float, int | None]:
    """Max over τ, κ of Q̂(z[:τ], z[τ:κ]) with at least ``min_size`` values on each side (Matteson & James)."""
    n = len(z)
    if n < 2 * min_size:
        return -math.inf, None
    distance = np.abs(z[:, None] - z[None, :])
    prefix = np.zeros((n + 1, n + 1))
    prefix[1:, 1:] = distance.cumsum(0).cumsum(1)
    tau, kappa = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    valid = (tau >= min_size) & (kappa - tau >= min_size)

    def block(a: Any, b: Any, c: Any, d: Any) -> Any:
        return prefix[b, d] - prefix[a, d] - prefix[b, c] + prefix[a, c]

    left, right = np.maximum(tau, 2), np.maximum(kappa - tau, 2)
    between = block(0, tau, tau, kappa)
    within_left = block(0, tau, 0, tau) / 2
    within_right = block(tau, kappa, tau, kappa) / 2
    energy = (
        2 * between / (left * right) - within_left / (left * (left - 1) / 2) - within_right / (right * (right - 1) / 2)
    )
    q = np.where(valid, left * right / (left + right) * energy, -np.inf)
    i, _ = np.unravel_index(int(np.argmax(q)), q.shape)
    return float(q.max()), int(i)
