"""``pareto nightly``: re-measure a study's pick and frontier, search on, and report regressions.

One job, for one study, holding the study's nightly lock (``pareto.locks.study_lock``):

1. marks any nightly of the study still "running" as interrupted (its process died: the lock is ours);
2. compares this environment with the last nightly's, and says what changed;
3. re-measures the pick and the frontier of the last environment in interleaved rounds with the
   baseline and the study's frozen reference, here (``pareto.study.confirmation.confirm``): stored as
   confirmations of this environment;
4. compares each with its level over past nights with the machine's drift taken out, against the
   noise band the study's history shows (``pareto.nightly_job.history``, ``pareto.nightly_job.regression``), and looks
   for a change point in the pick's series;
5. spends the rest of its time budget on new trials (``pareto.study.search.run_search``);
6. writes a Markdown and a JSON summary, and the history row ``pareto history`` shows.

The pick is the last nightly's pick, what the team serves, while it is stored; it moves to the best
configuration when the night found a new one or called a regression, not with the confirmations'
noise of one night.

The job's status: ok (exit 0); regression, the pick got slower (found again by a second pass), lost
its SLO with it, or shows a new slower change point (exit 3); noisy, the contention guard gave up on
the pick, a second pass did not find what the first did, or the pick's P99 or its SLO moved while its
P50 stayed at its level, so nothing can be said about it tonight (exit 75); a job stopped by Ctrl-C or
SIGTERM is stored as interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pareto.errors import UsageError
from pareto.front import Candidate, best_or_none, frontier, objective_metrics
from pareto.limits import Constraints
from pareto.locks import study_lock
from pareto.nightly_job.history import BenchReferences, Measured, NightDrift, drift_lines, whose
from pareto.nightly_job.regression import Comparison, compare, compare_corrected, not_compared
from pareto.signals import handled
from pareto.spec import NightlySettings, SearchSpec
from pareto.store import storage
from pareto.store.engine import check_path, open_engine, upgrade
from pareto.store.records import EnvironmentRecord, NightStatus
from pareto.store.writes import writing
from pareto.study.bench import open_bench
from pareto.task import load_task

#: Exit codes: sysexits.h's EX_TEMPFAIL for "try again later" (lock held, noisy night).
EXIT_REGRESSION = 3
EXIT_TEMPFAIL = 75
#: Below this much time left after re-measuring, the job runs no new trials.
MIN_SEARCH_S = 30.0
#: The fingerprint fields whose change makes a new environment, with their names in the summary.
ENVIRONMENT_FIELDS = (
    "device_name",
    "driver",
    "torch_version",
    "cpu_model",
    "cpu_features",
    "cpu_id",
    "cpu_capability",
    "cpu_isa_limits",
    "threads",
    "hostname",
    "onnxruntime_version",
    "torchao_version",
    "cuda_math",
)


@dataclass
class NightlyResult:
    study: str
    status: str  # ok, regression, noisy
    exit_code: int
    summary: dict[str, Any]
    markdown_path: Path
    json_path: Path
    notes: list[str] = field(default_factory=list)


Notice = Callable[[str], None]


def run_nightly(
    spec: SearchSpec, settings: NightlySettings, *, db_url: str, reporter: Any = None, notice: Notice = print
) -> NightlyResult:
    """Run one nightly job of ``spec.study_name`` (see the module docstring).

    Raises:
        LockHeld: another nightly of the study runs (exit 75); UsageError, StoreError: bad input.
    """
    started = time.monotonic()
    check_path(db_url)
    engine = open_engine(db_url)
    upgrade(engine)
    holder = _holder(engine, spec.study_name)
    with study_lock(engine, spec.study_name, holder=holder), _Terminated().installed() as terminated:
        return _Job(spec, settings, db_url, engine, notice, reporter, started, terminated).run()


class _Terminated:
    """SIGTERM (systemd stop, a Kubernetes deadline) ends the job like Ctrl-C: history kept, lock freed.

    The handler raises KeyboardInterrupt; one that lands in a garbage-collection finalizer is
    swallowed by Python, so the flag is checked again between the job's steps.
    """

    def __init__(self) -> None:
        self.received = False

    def check(self) -> None:
        if self.received:
            raise KeyboardInterrupt

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True
        raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[_Terminated]:
        with handled(self._handle, signal.SIGTERM):
            yield self


def _holder(engine: Any, study: str) -> str:
    """Who holds the study's nightly lock, from its history row (written right after taking it)."""
    try:
        row = storage.running_nightly(engine, study)
        if row is None:
            return ""
        return f"host {row.hostname}, pid {row.pid}, since {row.started_at:%Y-%m-%d %H:%M:%S} UTC"
    except Exception:  # the holder is a courtesy in a message; never fail on it
        return ""


class _Job:
    def __init__(
        self,
        spec: SearchSpec,
        settings: NightlySettings,
        db_url: str,
        engine: Any,
        notice: Notice,
        reporter: Any,
        started: float,
        terminated: _Terminated,
    ) -> None:
        self.spec, self.settings, self.db_url, self.engine = spec, settings, db_url, engine
        self.notice, self.reporter, self.started = notice, reporter, started
        self.terminated = terminated
        self.constraints: Constraints = spec.constraints()
        self.summary: dict[str, Any] = {"study": spec.study_name, "task": spec.task}
        self.closed = False  # the history row has its status
        self.last_pick: int | None = None  #: the last nightly's pick (``_open_history``)
        #: the runs of tonight's re-measurements: stored held, promoted when the night ends with a verdict
        self.runs: list[int] = []

    def run(self) -> NightlyResult:
        self.check_summary_dir()
        bench = open_bench(self.db_url, load_task(self.spec.task), self.spec.measure)
        study_id, row_id, reference = self._open_history(bench)
        try:
            result = self._run(bench, study_id, row_id, reference)
        except BaseException as exc:
            ended = NightStatus.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else NightStatus.FAILED
            if not self.closed:  # a verdict stored before the summary failed to write stays the verdict
                self._close_history(row_id, ended, error=exc)
            raise
        return result

    def _run(self, bench: Any, study_id: int, row_id: int, reference: int | None) -> NightlyResult:
        before = _load(bench, study_id, reference)
        pick_before = self._served(before, best_or_none(before, self.constraints, study=self.spec.study_name))
        front_before = frontier(before, objective_metrics(self.spec.objectives))
        self.drift = self._open_drift(bench, study_id, pick_before)
        comparisons, noisy = self._remeasure(bench, study_id, pick_before, front_before, "first pass")
        self.terminated.check()
        comparisons, noisy = self._reproduce(bench, study_id, pick_before, comparisons, noisy)
        self.terminated.check()
        trials_run, stopped_busy = self._search_on()
        self.terminated.check()
        pick_comparison = next((c for c in comparisons if pick_before and c.trial == pick_before.trial), None)
        change = self._change_point(pick_before, before)
        if pick_comparison is not None and pick_comparison.inconclusive:
            noisy = True  # its P99 or its SLO moved while its P50 stayed: no verdict tonight
        regression = (pick_comparison is not None and pick_comparison.regression) or (
            change is not None and change["new"] and not noisy
        )
        status = NightStatus.REGRESSION if regression else NightStatus.NOISY if noisy else NightStatus.OK
        if status is NightStatus.NOISY:
            self._withdraw(bench)
        after = _load(bench, study_id, bench.env_id, promoted=[] if status is NightStatus.NOISY else self.runs)
        best_after = best_or_none(after, self.constraints, study=self.spec.study_name)
        pick_after = self._next_pick(pick_before, best_after, before, after, regression)
        front_after = frontier(after, objective_metrics(self.spec.objectives))
        self._measure_new_pick(bench, study_id, pick_after)
        self.summary.update(
            status=status.value,
            pick_before=_brief(pick_before),
            pick_after=_brief(pick_after),
            frontier_before=[c.trial for c in front_before],
            frontier_after=[c.trial for c in front_after],
            frontier_added=sorted({c.trial for c in front_after} - {c.trial for c in front_before}),
            frontier_removed=sorted({c.trial for c in front_before} - {c.trial for c in front_after}),
            comparisons=[c.to_dict() for c in comparisons],
            regressions=[c.to_dict() for c in comparisons if c.regression and c is pick_comparison],
            slower_elsewhere=[c.to_dict() for c in comparisons if c.regression and c is not pick_comparison],
            change_point=change,
            drift=self.drift.to_dict(),
            trials_run=trials_run,
            search_stopped_busy=stopped_busy,
            elapsed_s=round(time.monotonic() - self.started, 1),
        )
        return self._close(row_id, status, pick_before, pick_after, trials_run)

    def _close(
        self,
        row_id: int,
        status: NightStatus,
        pick_before: Candidate | None,
        pick_after: Candidate | None,
        trials_run: int,
    ) -> NightlyResult:
        markdown_path, json_path = self._summary_paths()
        change = self.summary.get("change_point")
        self._close_history(
            row_id,
            status,
            pick_before=pick_before.trial if pick_before else None,
            pick_after=pick_after.trial if pick_after else None,
            trials_run=trials_run,
            regressions=len(self.summary["regressions"]) + int(bool(change and change["new"])),
            summary_path=str(json_path),
        )
        self._write_summary(markdown_path, json_path)
        code = {NightStatus.REGRESSION: EXIT_REGRESSION, NightStatus.NOISY: EXIT_TEMPFAIL}.get(status, 0)
        return NightlyResult(self.spec.study_name, status.value, code, self.summary, markdown_path, json_path)

    def _open_history(self, bench: Any) -> tuple[int, int, int | None]:
        """Mark dead jobs interrupted, find the environment compared with, and start this job's row."""
        from pareto.study.studies import get_or_create_study

        with writing(self.engine) as w:
            study = get_or_create_study(w, self.spec)
            for dead in w.interrupt_nightlies(study.id, "its process ended without finishing"):
                self.notice(
                    f"The nightly started {dead.started_at:%Y-%m-%d %H:%M} UTC on {dead.hostname} (pid {dead.pid}) "
                    "died without finishing; its lock is taken over and its history entry marked interrupted."
                )
            last = w.last_finished_nightly(study.id)
            self.last_pick = last.pick_after if last is not None else None
            reference = last.environment_id if last is not None else None
            if reference is None:
                env = w.choose_environment(study, "latest")
                reference = env.id if env is not None else None
            here = w.environment_by_id(bench.env_id)
            assert here is not None
            before = w.environment_by_id(reference) if reference else None
            changed = _environment_changes(before, here)
            self.summary.update(
                started_at=datetime.now(timezone.utc).isoformat(),
                host=socket.gethostname(),
                environment=here.key,
                previous_environment=before.key if before is not None else None,
                environment_changes=changed,
                previous_nightly=last.started_at.isoformat() if last is not None else None,
            )
            for line in changed:
                self.notice(f"Environment changed since the last measurements: {line}.")
            row_id = w.add_nightly(
                study_id=study.id, environment_id=bench.env_id, hostname=socket.gethostname(), pid=os.getpid()
            )
            return study.id, row_id, reference

    def _served(self, candidates: list[Candidate], best: Candidate | None) -> Candidate | None:
        """The pick compared tonight: the last nightly's pick (what the team serves), else the best now."""
        kept = next((c for c in candidates if c.trial == self.last_pick), None)
        if kept is not None and best is not None and best.trial != kept.trial:
            self.notice(
                f"The pick stays trial {kept.trial}, the last nightly's; by the stored measurements trial "
                f"{best.trial} is best now (the pick changes with a new configuration or a regression)."
            )
        return kept or best

    def _next_pick(
        self,
        pick: Candidate | None,
        best: Candidate | None,
        before: list[Candidate],
        after: list[Candidate],
        regression: bool,
    ) -> Candidate | None:
        """Tomorrow's pick: the best now when tonight found a new configuration or a regression, or when
        there was none; else tonight's pick, so that one night's noise in the confirmations does not move
        it and restart its history. When nothing meets the SLOs tonight (a loaded night's confirmations),
        the pick stays: it is still what is served, and still watched."""
        known = {c.trial for c in before}
        kept = next((c for c in after if pick is not None and c.trial == pick.trial), None)
        if best is None or kept is None:  # nothing meets the SLOs tonight: the pick is still what is served
            return kept or best
        if regression or best.trial not in known:
            return best
        return kept

    def _open_drift(self, bench: Any, study_id: int, pick: Candidate | None) -> NightDrift:
        """Past nights in this environment, the reference workload and the noise band they give."""
        summaries = storage.nightly_summaries(self.engine, study_id, bench.env_id)
        references = BenchReferences(bench, study_id, self.notice)
        drift = NightDrift(summaries, false_alarm=self.settings.false_alarm, references=references)
        drift.pick_trial = pick.trial if pick is not None else None
        if pick is not None:
            for band in drift.bands.values():
                self.notice(f"Drift-corrected comparison: {band.describe()}.")
        return drift

    def _remeasure(
        self, bench: Any, study_id: int, pick: Candidate | None, front: list[Candidate], label: str
    ) -> tuple[list[Comparison], bool]:
        """Re-measure the pick and the frontier here, with the baseline and the reference; compare with before."""
        from pareto.study.confirmation import confirm

        chosen = ([pick] if pick else []) + [c for c in front if pick is None or c.trial != pick.trial]
        chosen = chosen[: 1 + self.settings.remeasure_top]
        if not chosen:
            self.notice("Nothing to re-measure yet: the study has no measured configurations.")
            return [], False
        self.notice(
            f"Re-measuring {len(chosen)} configurations with the baseline and the reference in interleaved rounds."
        )
        reference = self.drift.timed(chosen[0])
        result = confirm(
            bench, study_id, chosen, self.constraints, seed=self.spec.search.seed, reference=reference, held=True
        )
        self.summary["remeasure_guard"] = result.guard
        self.runs += result.runs
        measured = self.drift.record(result, label)
        baselines = [m for m in measured.values() if m.is_baseline]
        by_trial = {c.trial: c for c in chosen}
        comparisons, noisy = [], False
        for item in result.items:
            if item.is_baseline and item.trial not in by_trial:
                continue
            if item.after is None:
                noisy = noisy or (pick is not None and item.trial == pick.trial)
                self.notice(f"Trial {item.trial} could not be re-measured: {item.busy_reason}.")
                continue
            after = _measurement_of(bench, study_id, item.trial, result.runs)
            before = by_trial[item.trial].metrics
            comparisons.append(self._compare(item.trial, item.description, before, after, measured, baselines))
        return comparisons, noisy

    def _compare(
        self,
        trial: int,
        description: str,
        before: dict[str, Any],
        after: dict[str, Any],
        measured: dict[int, Measured],
        baselines: list[Measured],
    ) -> Comparison:
        """Drift-corrected when this trial has a level here, else absolute; never across environments."""
        ratios = self.drift.ratios(measured[trial]) if trial in measured else None
        if ratios is not None:
            known = [r for r in map(self.drift.ratios, baselines) if r is not None]
            return compare_corrected(
                trial,
                description,
                before,
                after,
                ratios=ratios,
                bands=self.drift.bands,
                reference_ratio=self.drift.reference_ratio(),
                reference_p99_ratio=self.drift.reference_ratio("p99"),
                raw_p50_ratio=self.drift.measured_ratio(measured[trial]),
                baseline_ratios=known[0] if known else None,
                slo_ms=self.constraints.p99_ms,
            )
        if self.summary.get("environment_changes"):
            why = "last measured in another environment: not compared; its history here starts tonight"
            return not_compared(trial, description, before, after, why)
        return compare(
            trial,
            description,
            before,
            after,
            slo_ms=self.constraints.p99_ms,
            threshold=self.settings.threshold,
            p_value=self.settings.p_value,
        )

    def _reproduce(
        self, bench: Any, study_id: int, pick: Candidate | None, comparisons: list[Comparison], noisy: bool
    ) -> tuple[list[Comparison], bool]:
        """A regression of the pick counts only when a second pass, right after, finds it again.

        On a shared machine a slow spell of a minute can pass the contention guard (the probe runs
        between rounds, a spike can fall inside one) and move a P99 many times over; a model that got
        slower is slower in every pass. A regression the second pass does not reproduce makes the
        night noisy (exit 75), not a regression.
        """
        first = next((c for c in comparisons if pick is not None and c.trial == pick.trial), None)
        if first is None or not first.regression:
            return comparisons, noisy
        self.notice(f"The pick (trial {first.trial}) looks like a regression ({first.reason}); measuring it again.")
        again, busy = self._remeasure(bench, study_id, pick, [], "second pass")
        second = next((c for c in again if c.trial == first.trial), None)
        self.summary["first_pass"] = first.to_dict()
        if second is not None and second.regression and not busy:
            self.summary["reproduced"] = True
            return [second if c is first else c for c in comparisons], noisy
        self.summary["reproduced"] = False
        self.notice("The second pass did not find it again: a noisy night, not a regression.")
        # the second pass is the later measurement; the first is kept in the summary as "first_pass"
        kept = dataclasses.replace(
            second or first, regression=False, reason=f"a first pass found, a second did not: {first.reason}"
        )
        return [kept if c is first else c for c in comparisons], True

    def _withdraw(self, bench: Any) -> None:
        """A noisy night concludes nothing: what it measured stays stored (its summary, the history), held,
        and ``best`` and ``frontier`` keep answering from the measurements before it."""
        withdrawn = storage.held_count(bench.engine, self.runs) if self.runs else 0
        self.runs = []  # nothing of tonight's is promoted
        self.summary["withdrawn"] = withdrawn
        if withdrawn:
            self.notice(
                f"Tonight's {withdrawn} re-measurements are kept, but not answered from: 'pareto best' "
                "answers from the measurements before tonight."
            )

    def _measure_new_pick(self, bench: Any, study_id: int, pick: Candidate | None) -> None:
        """A pick found tonight is measured beside the reference now, so tomorrow compares it drift-corrected."""
        from pareto.study.confirmation import confirm

        if pick is None or any(m.trial == pick.trial for m in self.drift.measured):
            return
        reference = self.drift.timed(pick)
        if reference is None:
            return
        self.notice(f"Measuring the new pick (trial {pick.trial}) beside the reference, for tomorrow's comparison.")
        result = confirm(
            bench, study_id, [pick], self.constraints, seed=self.spec.search.seed, reference=reference, held=True
        )
        self.runs += result.runs
        self.drift.record(result, "new pick")

    def _change_point(self, pick: Candidate | None, stored: list[Candidate]) -> dict[str, Any] | None:
        """A slower change point in the pick's drift-corrected series (e-divisive means), tonight included."""
        if pick is None:
            return None
        # the model's series: the baseline at the pick's batch size (confirm times one per batch size)
        batches = {c.trial: c.config["batch_size"] for c in stored}
        baselines = [m.trial for m in self.drift.measured if m.is_baseline]
        baseline = next((t for t in baselines if batches.get(t) == pick.config["batch_size"]), None)
        found = self.drift.find_change_point(pick.trial, self.summary["started_at"], baseline=baseline)
        if found is not None:
            since = found["since"][:10] or "?"
            state = "new tonight" if found["new"] else "reported before"
            self.notice(
                f"Change point in {whose(found)} drift-corrected {found['statistic'].upper()}: ×{found['ratio']:.2f} "
                f"since the night of {since} ({state}, permutation p = {found['p_value']:.3g})."
            )
        return found

    def _search_on(self) -> tuple[int, bool]:
        """New trials for the time left."""
        from pareto.study.search import run_search

        left_s = self.settings.time_budget / 1000 - (time.monotonic() - self.started)
        if left_s < MIN_SEARCH_S:
            self.notice(f"{max(left_s, 0):.0f} s of the time budget left: no new trials tonight.")
            return 0, False
        self.notice(f"Searching for {left_s:.0f} s (at most {self.spec.search.n_trials} new trials).")
        search = self.spec.search.model_copy(update={"timeout": left_s * 1000})
        # its confirmations held as tonight's re-measurements are: promoted only with the night's verdict
        spec = self.spec.model_copy(update={"search": search})
        result = run_search(spec, db_url=self.db_url, reporter=self.reporter, held=True)
        if result.confirmation is not None:
            self.runs += result.confirmation.runs
        if result.interrupted:
            raise KeyboardInterrupt
        return result.trials_run - result.repeats - result.busy, result.stopped_busy  # new configurations

    def check_summary_dir(self) -> None:
        """Raises UsageError before the night when its summary folder cannot be made or written to (a
        night's work is not run to lose its summary at the end)."""
        folder = Path(self.settings.summary_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".pareto-write-check-"):
                pass
        except OSError as exc:
            raise UsageError(
                f"Cannot write the nightly summary to {folder}: {exc.strerror or exc}; set nightly.summary_dir "
                "to a folder this job can write."
            ) from exc

    def _summary_paths(self) -> tuple[Path, Path]:
        stamp = datetime.fromisoformat(self.summary["started_at"]).strftime("%Y%m%dT%H%M%SZ")
        base = Path(self.settings.summary_dir) / f"nightly-{_slug(self.spec.study_name)}-{stamp}"
        json_path, markdown_path = base.with_suffix(".json"), base.with_suffix(".md")
        self.summary["summary_markdown"], self.summary["summary_json"] = str(markdown_path), str(json_path)
        return markdown_path, json_path

    def _write_summary(self, markdown_path: Path, json_path: Path) -> None:
        """Raises UsageError when the folder stopped taking writes during the night (the verdict is stored)."""
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(self.summary, indent=2, default=str) + "\n")
            markdown_path.write_text(summary_markdown(self.summary))
        except OSError as exc:
            raise UsageError(
                f"The night's verdict ({self.summary.get('status')}) is stored, but its summary could not be written "
                f"to {json_path.parent}: {exc.strerror or exc}."
            ) from exc

    def _close_history(
        self, row_id: int, status: NightStatus, *, error: BaseException | None = None, **values: Any
    ) -> None:
        """The night's history row closed; a night that ended with a verdict (not interrupted, failed or
        noisy) has its re-measurements promoted in the same transaction, so an interrupted night changes
        no answer of ``best`` or ``frontier``."""
        with writing(self.engine) as w:
            if not w.nightly_exists(row_id):
                return
            if status in (NightStatus.OK, NightStatus.REGRESSION) and self.runs:
                self.summary["promoted"] = w.promote(self.runs)
            summary = dict(self.summary)
            if error is not None:
                summary["error"] = "interrupted" if isinstance(error, KeyboardInterrupt) else f"{error}"
            w.close_nightly(row_id, status.value, values, json.loads(json.dumps(summary, default=str)))
        self.closed = True


def _load(bench: Any, study_id: int, env_id: int | None, *, promoted: list[int] | None = None) -> list[Candidate]:
    """The study's candidates in ``env_id``; with ``promoted``, as they will be once those runs' held
    measurements are promoted (read in a transaction that is rolled back: nothing changes yet)."""
    from pareto.study.confirmation import load_candidates

    if env_id is None:
        return []
    if not promoted:
        return load_candidates(bench, study_id, env_id)
    return storage.candidates_if_promoted(bench.engine, study_id, env_id, promoted)


def _measurement_of(bench: Any, study_id: int, number: int, runs: list[int]) -> dict[str, Any]:
    """The metrics a confirmation run just stored for trial ``number``."""
    return storage.measurement_in_runs(bench.engine, study_id, number, runs).to_dict()


def _environment_changes(before: EnvironmentRecord | None, now: EnvironmentRecord) -> list[str]:
    if before is None or before.id == now.id:
        return []
    old, new = before.details or {}, now.details or {}
    return [
        f"{name} {old.get(name)!s} → {new.get(name)!s}" for name in ENVIRONMENT_FIELDS if old.get(name) != new.get(name)
    ] or [f"environment {before.key} → {now.key}"]


def _brief(candidate: Candidate | None) -> dict[str, Any] | None:
    if candidate is None:
        return None
    m = candidate.metrics
    return {
        "trial": candidate.trial,
        "description": candidate.description,
        "accuracy": m.get("accuracy"),
        "latency_p99_ms": m.get("latency_p99_ms"),
        "latency_p99_upper_ms": m.get("latency_p99_upper_ms"),
        "confirmed": candidate.confirmation is not None,
    }


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:80]


def summary_markdown(summary: dict[str, Any]) -> str:
    """The nightly summary as Markdown (the JSON beside it holds the same and more)."""
    lines = [f"# Nightly of study `{summary['study']}`: {summary['status']}", ""]
    lines.append(
        f"Started {summary['started_at']} on {summary['host']}, {summary.get('elapsed_s', '?')} s; "
        f"environment `{summary['environment']}`."
    )
    if summary.get("environment_changes"):
        lines += [
            "",
            "**Environment changed** since the last measurements (earlier measurements are kept, "
            "but not mixed into this environment's frontier):",
            "",
        ]
        lines += [f"- {change}" for change in summary["environment_changes"]]
    lines += ["", "## Pick", ""]
    for label in ("before", "after"):
        pick = summary.get(f"pick_{label}")
        if pick is None:
            lines.append(f"- {label}: none")
        else:
            bound = pick["latency_p99_upper_ms"]
            lines.append(
                f"- {label}: trial {pick['trial']} {pick['description']}: accuracy {pick['accuracy']:.4f}, "
                f"P99 {pick['latency_p99_ms']:.3g} ms (≤ {bound:.3g} ms)"
                if bound is not None
                else f"- {label}: trial {pick['trial']} {pick['description']}"
            )
    lines += _comparison_markdown(summary.get("comparisons") or [])
    drift = drift_lines(summary)
    if drift:
        lines += ["", "## Drift-corrected", "", *(f"- {line}" for line in drift)]
    lines += [
        "",
        "## Frontier",
        "",
        f"- before: trials {summary.get('frontier_before')}",
        f"- after: trials {summary.get('frontier_after')} (added {summary.get('frontier_added')}, "
        f"removed {summary.get('frontier_removed')})",
        f"- new trials tonight: {summary.get('trials_run', 0)}",
    ]
    if summary["status"] == NightStatus.NOISY:
        lines += [
            "",
            "The machine was too noisy to judge the pick tonight: the contention guard gave up on it, a "
            "regression one pass found was not found again by a second, or its P99 or its SLO moved while "
            "its P50 stayed at its level. Nothing was concluded.",
        ]
    return "\n".join(lines) + "\n"


def _comparison_markdown(comparisons: list[dict[str, Any]]) -> list[str]:
    if not comparisons:
        return []
    lines = [
        "",
        "## Re-measured (interleaved with the baseline and the reference)",
        "",
        "| trial | configuration | P99 before | P99 now | ratio | drift-corrected × (P50, P99) | test | verdict "
        "| finding |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        test = c["test"] + (f" p={c['p_value']:.2g}" if c["p_value"] is not None else "")
        verdict = f"{c['verdict_before']} → {c['verdict_after']}" if c["verdict_before"] else "—"
        lines.append(
            f"| {c['trial']} | {c['description']} | {c['p99_before_ms']:.3g} ms | {c['p99_after_ms']:.3g} ms | "
            f"{c['ratio']:.2f} | {corrected_text(c)} | {test} | {verdict} | {c['reason']} |"
        )
    return lines


def corrected_text(comparison: dict[str, Any]) -> str:
    """ "×1.02, ×1.10" for a drift-corrected comparison, "—" for another."""
    if comparison.get("corrected_ratio") is None:
        return "—"
    return f"×{comparison['corrected_p50_ratio']:.2f}, ×{comparison['corrected_ratio']:.2f}"
