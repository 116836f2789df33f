"""The nightly's drift-corrected history: what past nights in this environment measured beside the reference.

Each nightly writes, in its summary's ``drift`` block, the reference workload it timed and, for every
configuration measured beside it tonight, its P50 and P99, the reference's in the same rounds and
their ratios (the drift-corrected P50 and P99). This module reads those blocks back: the reference to
keep timing, each configuration's levels, the noise bands, and the series change points are looked
for in (``pareto.nightly_job.stats`` holds the statistics).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.errors import message_line
from pareto.locks import gpu_work
from pareto.measure.reference import Reference
from pareto.nightly_job.stats import (
    STATISTICS,
    ChangePoint,
    NoiseBand,
    change_points,
    level,
    nights_to_find_change,
    noise_band,
    residuals,
)
from pareto.store import storage
from pareto.store.records import NightStatus
from pareto.study.bench import build

if TYPE_CHECKING:
    from pareto.measure.latency import Timed


@dataclass(frozen=True)
class Measured:
    """One configuration measured beside the reference tonight."""

    trial: int
    is_baseline: bool
    label: str  #: "first pass", "second pass", "new pick"
    p50_ms: float
    p99_ms: float
    reference_p50_ms: float
    reference_p99_ms: float

    def corrected(self, statistic: str) -> float:
        """The statistic over the reference's, measured in the same rounds."""
        return float(getattr(self, f"{statistic}_ms") / getattr(self, f"reference_{statistic}_ms"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "is_baseline": self.is_baseline,
            "pass": self.label,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "reference_p50_ms": self.reference_p50_ms,
            "reference_p99_ms": self.reference_p99_ms,
            **{f"corrected_{s}": self.corrected(s) for s in STATISTICS},
        }


class DriftHistory:
    """The drift blocks of a study's past nightlies in one environment, oldest first.

    Only nights that timed the same reference count (a reference of another kind or batch is not the
    same yardstick). Nights called a regression are left out of levels and of the noise bands (they
    are changes, not noise), never out of the series change points are looked for in.
    """

    def __init__(self, summaries: list[dict[str, Any]], reference: Reference | None = None) -> None:
        blocks = [(s["status"], {**(s.get("drift") or {}), "started_at": s.get("started_at")}) for s in summaries]
        blocks = [(status, block) for status, block in blocks if Reference.from_dict(block.get("reference"))]
        self.reference = reference or (Reference.from_dict(blocks[-1][1]["reference"]) if blocks else None)
        self._nights = [(status, b) for status, b in blocks if Reference.from_dict(b["reference"]) == self.reference]
        self.last = summaries[-1] if summaries else None

    def __len__(self) -> int:
        return len(self._nights)

    def points(
        self, trial: int, statistic: str, *, skip_regressions: bool = False, corrected: bool = True
    ) -> list[tuple[str, float]]:
        """The trial's log drift-corrected statistic (or, not ``corrected``, as measured), one value a
        night (the median of that night's passes), with the night's start."""
        out = []
        key = f"corrected_{statistic}" if corrected else f"{statistic}_ms"
        for status, block in self._nights:
            if skip_regressions and status == NightStatus.REGRESSION:
                continue
            logs = [math.log(m[key]) for m in block.get("measured", []) if m["trial"] == trial and m.get(key)]
            if logs:
                out.append((block.get("started_at") or "", float(statistics.median(logs))))
        return out

    def series(
        self, trial: int, statistic: str, *, skip_regressions: bool = False, corrected: bool = True
    ) -> list[float]:
        points = self.points(trial, statistic, skip_regressions=skip_regressions, corrected=corrected)
        return [value for _, value in points]

    def level(self, trial: int, statistic: str, *, corrected: bool = True) -> float | None:
        """The trial's level (log), drift-corrected or as measured, or None when no past night measured
        it beside the reference."""
        values = self.series(trial, statistic, skip_regressions=True, corrected=corrected)
        return level(values) if values else None

    def reference_level_ms(self, statistic: str = "p99") -> float | None:
        """The reference's own level: how fast this machine usually runs it (for the machine's drift)."""
        key = f"reference_{statistic}_ms"
        values = [math.log(b[key]) for status, b in self._nights if status != NightStatus.REGRESSION and b.get(key)]
        return math.exp(level(values)) if values else None

    def trials(self) -> list[int]:
        return sorted({m["trial"] for _, b in self._nights for m in b.get("measured", [])})

    def band(self, statistic: str, false_alarm: float) -> NoiseBand:
        """The noise band from every trial's residuals around its level on the nights before."""
        series = [self.series(trial, statistic, skip_regressions=True) for trial in self.trials()]
        return noise_band(residuals(series), statistic, false_alarm=false_alarm)

    def last_change_point(self) -> dict[str, Any] | None:
        """The slower change point the last night reported, in whichever series, if it did."""
        if self.last is None:
            return None
        return (self.last.get("drift") or {}).get("change_point") or None


def slower_change_point(values: list[float], *, min_ratio: float = 1.0, seed: int = 0) -> ChangePoint | None:
    """The series' last change point when the nights after it are slower by more than ``min_ratio`` (one
    night's noise band), else None."""
    found = change_points(values, seed=seed)
    if not found or found[-1].ratio <= min_ratio:
        return None
    return found[-1]


class NightDrift:
    """Tonight's measurements beside the reference, and the history they are compared with.

    Args:
        summaries: The study's finished nightlies in this environment (``store.trials.nightly_summaries``).
        false_alarm: One pass's false-alarm rate for each statistic, which places its noise band.
        references: Builds and loads the reference (``BenchReferences``); None: no reference is timed.
    """

    def __init__(self, summaries: list[dict[str, Any]], *, false_alarm: float, references: Any = None) -> None:
        self.history = DriftHistory(summaries)
        self.bands = {s: self.history.band(s, false_alarm) for s in STATISTICS}
        self.references = references
        self.measured: list[Measured] = []
        self.reference_ms: dict[str, float] = {}
        self.change_point: dict[str, Any] | None = None
        self.pick_trial: int | None = None
        self._timed: Timed | None = None

    @property
    def reference(self) -> Reference | None:
        return self.history.reference

    def timed(self, target: Any) -> Timed | None:
        """The reference to time in tonight's rounds (``references`` builds and loads it): the study's
        first one is frozen from ``target`` (a ``Candidate``). None when there is nothing to build it from."""
        if self._timed is None and self.references is not None:
            if self.reference is not None:
                self._timed = self.references.load(self.reference)
            if self._timed is None and target is not None:
                reference, self._timed = self.references.new(target)
                self.history = DriftHistory([], reference)  # a new yardstick: no history measured with it
                self.bands = {s: self.history.band(s, b.false_alarm) for s, b in self.bands.items()}
        return self._timed

    def record(self, result: Any, label: str) -> dict[int, Measured]:
        """Keep one pass's values (a ``ConfirmResult``): each trial measured, or none when the reference was
        not timed or the contention guard gave up on it."""
        ref = result.reference
        if ref is None or ref["busy"]:
            return {}
        if not self.reference_ms:
            self.reference_ms = {s: ref[f"latency_{s}_ms"] for s in STATISTICS}
        out = {}
        for item in result.items:
            if item.after is not None:
                after = item.after
                m = Measured(
                    item.trial,
                    item.is_baseline,
                    label,
                    after["latency_p50_ms"],
                    after["latency_p99_ms"],
                    ref["latency_p50_ms"],
                    ref["latency_p99_ms"],
                )
                self.measured.append(m)
                out[item.trial] = m
        return out

    def ratios(self, measured: Measured) -> dict[str, float] | None:
        """Each drift-corrected statistic over the trial's level; None when no past night measured it here."""
        out = {}
        for s in STATISTICS:
            lvl = self.history.level(measured.trial, s)
            if lvl is None:
                return None
            out[s] = math.exp(math.log(measured.corrected(s)) - lvl)
        return out

    def measured_ratio(self, measured: Measured, statistic: str = "p50") -> float | None:
        """The statistic tonight over its level as measured, the machine's drift left in; None when no
        past night measured it here."""
        lvl = self.history.level(measured.trial, statistic, corrected=False)
        return None if lvl is None else math.exp(math.log(getattr(measured, f"{statistic}_ms")) - lvl)

    def reference_ratio(self, statistic: str = "p50") -> float | None:
        """The reference's statistic tonight over its level: how much slower the machine is tonight."""
        usual = self.history.reference_level_ms(statistic)
        return None if usual is None or not self.reference_ms else self.reference_ms[statistic] / usual

    def find_change_point(self, trial: int, started_at: str, *, baseline: int | None = None) -> dict[str, Any] | None:
        """A slower change point in the trial's nightly series of either statistic, tonight included.

        A pick that moved lately has too few nights beside the reference for a change point to pass the
        test (``pareto.nightly_job.stats.nights_to_find_change``): a creep that goes on after the pick moved. Then the
        ``baseline``'s series is looked in too: the uncompressed model, measured every night, which a
        slower model slows too. ``new`` when the last night did not report a change point from (about)
        the same night.
        """
        watched = [("pick", trial)]
        too_few = len(self.history.points(trial, "p50")) + 1 < nights_to_find_change()  # tonight's included
        if baseline is not None and baseline != trial and too_few:
            watched.append(("baseline", baseline))
        for of, number in watched:
            for statistic in STATISTICS:
                tonight = [math.log(m.corrected(statistic)) for m in self.measured if m.trial == number]
                if not tonight:
                    break
                points = [*self.history.points(number, statistic), (started_at, float(statistics.median(tonight)))]
                found = slower_change_point([v for _, v in points], min_ratio=self.bands[statistic].threshold)
                if found is not None:
                    self.change_point = self._described(of, number, statistic, [d for d, _ in points], found)
                    return self.change_point
        return None

    def _described(self, of: str, trial: int, statistic: str, nights: list[str], found: ChangePoint) -> dict[str, Any]:
        last = self.history.last_change_point()
        since = nights[found.index]
        before = nights.index(last["since"]) if last and last.get("since") in nights else None
        return {
            "trial": trial,
            "series": of,
            "statistic": statistic,
            "index": found.index,
            "since": since,
            "nights": len(nights),
            "ratio": found.ratio,
            "p_value": found.p_value,
            "new": before is None or abs(before - found.index) > 2,
        }

    def pick_view(self) -> dict[str, Any] | None:
        """The pick's P99 tonight, absolute and at the machine's usual speed, its level and the band's top."""
        tonight = [m for m in self.measured if m.trial == self.pick_trial]
        usual = self.history.reference_level_ms("p99") or self.reference_ms.get("p99")
        if not tonight or usual is None:
            return None
        p99 = float(statistics.median(m.p99_ms for m in tonight))
        corrected = float(statistics.median(m.corrected("p99") for m in tonight)) * usual
        lvl = self.history.level(tonight[0].trial, "p99")
        level_ms = math.exp(lvl) * usual if lvl is not None else None
        return {
            "trial": self.pick_trial,
            "p99_ms": p99,
            "corrected_p99_ms": corrected,
            "level_ms": level_ms,
            "band_upper_ms": level_ms * self.bands["p99"].threshold if level_ms is not None else None,
        }

    def to_dict(self) -> dict[str, Any]:
        reference = self.reference
        return {
            "reference": {**reference.to_dict(), "description": reference.describe()} if reference else None,
            "reference_p50_ms": self.reference_ms.get("p50"),
            "reference_p99_ms": self.reference_ms.get("p99"),
            "reference_ratio": self.reference_ratio(),
            "history_nights": len(self.history),
            "bands": {s: band.to_dict() for s, band in self.bands.items()},
            "pick": self.pick_view(),
            "change_point": self.change_point,
            "measured": [m.to_dict() for m in self.measured],
        }


def drift_lines(summary: dict[str, Any]) -> list[str]:
    """The night's drift-corrected findings in sentences (the card, the Markdown summary)."""
    drift = summary.get("drift") or {}
    reference = drift.get("reference")
    if not reference:
        return []
    lines = []
    machine = drift.get("reference_ratio")
    if machine is not None:
        lines.append(
            f"Machine tonight: the reference ran at ×{machine:.2f} its usual P50 ({reference['description']})."
        )
    else:
        lines.append(
            f"First night timed beside the {reference['description']}: "
            "drift-corrected comparisons start with the next night."
        )
    pick = drift.get("pick")
    if pick and pick.get("level_ms") is not None:
        lines.append(
            f"Pick (trial {pick['trial']}): P99 {pick['p99_ms']:.3g} ms measured, {pick['corrected_p99_ms']:.3g} ms "
            f"at the machine's usual speed; its level {pick['level_ms']:.3g} ms, noise up to "
            f"{pick['band_upper_ms']:.3g} ms."
        )
    bands = drift.get("bands") or {}
    if bands:
        parts = [f"{s.upper()} ×{b['threshold']:.3f} ({_source(b)})" for s, b in bands.items()]
        smallest = ", ".join(f"×{b['smallest_detectable']:.2f} ({s.upper()})" for s, b in bands.items())
        first = next(iter(bands.values()))
        lines.append(
            f"Noise bands: {'; '.join(parts)}. The smallest slowdown predicted (normal model of the "
            f"measured spread) to be found in "
            f"{100 * first['power']:g} % of passes at {100 * first['false_alarm']:g} % false alarms a pass: {smallest}."
        )
    change = summary.get("change_point")
    if change:
        state = "new tonight" if change["new"] else "reported before"
        lines.append(
            f"Change point (e-divisive means, {change['nights']} nights): {whose(change)} drift-corrected "
            f"{change['statistic'].upper()} ×{change['ratio']:.2f} since the night of {change['since'][:10]} "
            f"(permutation p = {change['p_value']:.3g}; {state})."
        )
    return lines


def _source(band: dict[str, Any]) -> str:
    if band["source"] == "history":
        return f"spread {100 * band['sigma']:.1f} % from {band['residuals']} past re-measurements"
    return f"default spread {100 * band['sigma']:.1f} %: too little history yet"


class BenchReferences:
    """Builds, freezes, stores and loads a study's reference on the bench (``pareto.measure.reference``)."""

    def __init__(self, bench: Any, study_id: int, notice: Any) -> None:
        self.bench, self.study_id, self.notice = bench, study_id, notice

    def load(self, reference: Reference) -> Timed | None:
        """The stored reference, ready to time; None when its program is no longer in the database."""
        from pareto.measure.latency import Timed
        from pareto.measure.reference import reference_input, reference_model, thaw

        device = self.bench.device
        if not reference.frozen:
            return Timed(reference_model(device), reference_input(reference, device), label="reference")
        blob = storage.reference_program(self.bench.engine, self.study_id, reference.digest)
        if blob is None:
            self.notice(f"The study's reference program {reference.digest[:12]} is gone: freezing a new one.")
            return None
        if hashlib.sha256(blob).hexdigest() != reference.digest:  # checked before any byte of it is loaded
            self.notice(
                f"The study's reference program {reference.digest[:12]} does not match its digest (changed in the "
                "database): it is not loaded; freezing a new one."
            )
            return None
        # onto the night's device: the program names the device it was frozen on, perhaps another GPU index
        with gpu_work(device, what="the nightly's reference, loaded"):
            module = thaw(blob, reference.kind, device=device)
        return Timed(module, self.bench.task.example_input(reference.batch), label="reference")

    def new(self, target: Any) -> tuple[Reference, Timed]:
        """Freeze ``target`` as served (else the baseline model) at the batch whose call takes as long as
        its P50, store it, and time it from the stored program; a fixed MLP when neither freezes.

        Built and frozen holding the GPU's work lock shared (``pareto.locks.gpu_work``); sized holding it
        exclusively (``size_batch``)."""
        with gpu_work(self.bench.device, what="the nightly's reference, frozen"):
            return self._new(target)

    def _new(self, target: Any) -> tuple[Reference, Timed]:
        from pareto.compress import Config
        from pareto.measure.reference import size_reference

        config = Config.from_dict(target.config)
        target_ms = float(target.metrics["latency_p50_ms"])
        reasons = []
        for source, candidate in (
            (f"trial {target.trial} as served", config),
            ("the baseline model", Config(batch_size=config.batch_size)),
        ):
            try:
                batch, kind = self._freeze(candidate, source, target_ms)
            except Exception as exc:  # torch.export refuses many served forms; the next one is tried
                reasons.append(f"{source}: {message_line(exc)}")
                continue
            reference = Reference(batch=batch, kind=kind, source=source)
            timed = self.load(reference)
            assert timed is not None
            return reference, timed
        self.notice(f"No frozen reference ({'; '.join(reasons)}): the reference is a fixed-seed MLP.")
        reference = size_reference(target_ms, self.bench.device, threads=self.bench.threads)
        timed = self.load(reference)
        assert timed is not None
        return reference, timed

    def _freeze(self, config: Any, source: str, target_ms: float) -> tuple[int, str]:
        from pareto.measure.reference import freeze, size_batch

        bench = self.bench
        module = build(bench, config).served.eager
        batch = size_batch(
            module,
            bench.task.example_input,
            target_ms,
            bench.device,
            threads=bench.threads,
            max_batch=config.batch_size,
        )
        blob, kind = freeze(module, bench.task.example_input(batch))
        storage.save_reference(bench.engine, self.study_id, bench.env_id, Reference(batch, kind).digest, source, blob)
        return batch, kind


def whose(change: dict[str, Any]) -> str:
    """Whose series a change point is in: the pick's, or the model's (the baseline's) after a move."""
    if change.get("series", "pick") == "pick":
        return "the pick's"
    return f"the model's (the baseline, trial {change['trial']}, measured every night; the pick moved lately)"
