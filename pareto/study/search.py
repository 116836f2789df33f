"""Optuna orchestration: suggest a configuration, apply it, measure it, store it, repeat; then confirm.

``run_search`` → ``_prepare`` (task, bench, study) → ``_time_baselines`` (the uncompressed model, timed
again in every run) → ``_optimize`` (Optuna's loop over ``_Objective``) → ``_confirm`` (the best
configurations re-measured in interleaved rounds with the baseline) → ``_result``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import optuna

from pareto.compress import BACKENDS, Backend, Config, backend_reason
from pareto.compress.base import Pairs, install_conflicts
from pareto.compress.onnxrt import is_graph_file
from pareto.errors import (
    BaselineFailed,
    LockHeld,
    MachineBusy,
    NoEffect,
    NoFeasibleConfiguration,
    TechniqueError,
    TimingLockStuck,
    Transient,
    TrialTakenOver,
    UsageError,
)
from pareto.front import (
    Candidate,
    best_or_none,
    frontier,
    judged,
    objective_metrics,
    objective_value,
    select_best,
)
from pareto.limits import Constraints, constraint_gaps
from pareto.locks import confirm_lock, gpu_work
from pareto.signals import StopOnInterrupt
from pareto.spec import SearchSpec
from pareto.store import storage
from pareto.store.engine import check_path
from pareto.store.records import NewTrial, TrialState
from pareto.store.writes import writing
from pareto.study import layers
from pareto.study.assess import Rejected, assess, preflight
from pareto.study.bench import (
    Bench,
    RunHandle,
    baseline_trial,
    finish_run,
    open_bench,
    retime_baseline,
    start_run,
    wait_for_quiet,
)
from pareto.study.claims import Claims, Twin
from pareto.study.confirmation import ConfirmResult, confirm_pick, load_candidates
from pareto.study.load_runs import LoadContext, decide
from pareto.study.result import SearchResult, TrialOutcome
from pareto.study.samplers import FLAT, failed_values, failure_gaps, make_sampler, space_size, start_trial, suggest
from pareto.study.samplers import grid as grid_of
from pareto.study.space_checks import available_techniques, space_for_device, steer_space
from pareto.study.studies import (
    adopt_stored_objectives,
    adopt_stored_traffic,
    directions,
    fail_stale_trials,
    get_or_create_study,
    optuna_storage,
    stored_sampler,
)
from pareto.study.traffic import DEFAULT_MAX_BATCHES
from pareto.task import check_evaluation_rows, load_task

#: After a trial the contention guard gave up on, wait this long at most for the machine to quiet
#: down before the next trial; still busy then, the search stops (trials stored, exit code 75).
BUSY_WAIT_S = 120.0
#: Another worker measuring the same configuration is waited for this long at most, polled this often.
#: A sampler that proposes this many configurations in a row that were measured already has nothing
#: new left to propose: the search stops.
REPEATS_IN_A_ROW = 50


class Reporter(Protocol):
    """What a search tells its caller as it goes (the CLI draws a progress bar from it)."""

    def start(self, *, study: str, task: str, n_trials: int, timeout_s: float | None, stored: int) -> None: ...

    def notice(self, message: str) -> None: ...

    def trial_done(self, outcome: TrialOutcome, best: Candidate | None) -> None: ...

    def confirmed(self, result: ConfirmResult) -> None: ...


class Quiet:
    def start(self, **_: Any) -> None:
        pass

    def notice(self, message: str) -> None:
        pass

    def trial_done(self, outcome: TrialOutcome, best: Candidate | None) -> None:
        pass

    def confirmed(self, result: ConfirmResult) -> None:
        pass


@dataclass
class SearchSetup:
    """Everything a search run decided before its first trial."""

    spec: SearchSpec
    bench: Bench
    study_id: int
    stored: int
    batch_sizes: list[int]
    techniques: dict[str, dict[str, Any]]
    constraints: Constraints
    baseline_theoretical_bytes: int
    #: where the configurations are served and measured (the baseline is always eager)
    backends: tuple[Backend, ...] = ("eager",)
    #: pairs of techniques this install cannot run together (never drawn together, skipped by the grid)
    conflicts: Pairs = frozenset()
    #: the confirmations are stored held: answered from only once promoted (the nightly's, at its verdict)
    held: bool = False


def run_search(spec: SearchSpec, *, db_url: str, reporter: Reporter | None = None, held: bool = False) -> SearchResult:
    """Run (or continue) the study ``spec.study_name`` and return its frontier and pick. ``held``: the
    confirmation at the end is stored held (``SearchSetup.held``); its runs are in the result's.

    Raises:
        UsageError: bad task, device or spec; StoreError: the database cannot be used.
    """
    reporter = reporter or Quiet()
    check_path(db_url)  # before a task that may train for a while
    setup = dataclasses.replace(prepare(spec, db_url, reporter), held=held)
    study = optuna_study(setup, db_url)
    # a dead worker's trial: failed and queued again before this run starts; a claim left behind: released
    fail_stale_trials(study, setup.bench.engine, setup.study_id)
    preflight_baseline(setup, study)
    run = start_run(setup.bench, kind="search", study_id=setup.study_id)
    _time_baselines(setup, run, study, reporter)
    loop = _optimize(setup, run, study, reporter)
    outcomes = loop.outcomes
    finish_run(setup.bench, run, trials=len(outcomes), interrupted=loop.interrupted, stopped_busy=loop.stopped_busy)
    if loop.baseline_failed is not None:
        raise BaselineFailed(loop.baseline_failed)
    confirmation = None if loop.interrupted or loop.stopped_busy else confirm_search(setup, run, reporter)
    make = functools.partial(
        search_result,
        setup,
        trials_run=len(outcomes),
        measured=sum(o.state == TrialState.COMPLETE for o in outcomes),
        busy=sum(o.state == TrialState.BUSY for o in outcomes),
        interrupted=loop.interrupted,
        confirmation=confirmation,
    )
    result = make() if loop.interrupted or loop.stopped_busy else served_pick(setup, run, make, reporter)
    result.stopped_busy = loop.stopped_busy
    result.repeats = sum(o.state == TrialState.DUPLICATE for o in outcomes)
    result.rejected = sum(o.state == TrialState.PRUNED for o in outcomes)
    result.exhausted = loop.exhausted
    return result


def prepare(spec: SearchSpec, db_url: str, reporter: Reporter) -> SearchSetup:
    task = load_task(spec.task)
    check_evaluation_rows(task, spec.slo.min_accuracy)
    bench = open_bench(db_url, task, spec.measure)
    spec = space_for_device(spec, bench.device, reporter.notice)
    # in one fixed order: Optuna refuses a categorical whose choices change order within a study
    backends: tuple[Backend, ...] = tuple(b for b in BACKENDS if b in (spec.space.backend or ["eager"]))
    for backend in backends:
        reason = backend_reason(backend, bench.device)
        if reason is not None:
            raise UsageError(f"Backend {backend} cannot serve here: {reason.rstrip('.')}.")
    probes = f"study {spec.study_name!r}: the techniques' probes"
    with gpu_work(bench.device, what=probes):  # kernel probes run on the device
        techniques, skipped = available_techniques(spec, bench.device, bench.task, backends)
    for name, reason in skipped:
        reporter.notice(f"Skipping technique {name}: {reason}")
    with writing(bench.engine) as w:
        spec = adopt_stored_traffic(w, adopt_stored_objectives(w, spec))
        previous = stored_sampler(w, spec.study_name)
        study_row = get_or_create_study(w, spec)
        study_id, stored = study_row.id, w.trial_count(study_row)
    batch_sizes = spec.space.batch_size or (DEFAULT_MAX_BATCHES if spec.traffic.qps else [task.batch_size])
    techniques = steer_space(
        bench,
        study_id,
        techniques,
        backends=backends,
        batch_size=batch_sizes[0],
        keep=spec.search.keep,
        notice=reporter.notice,
        task_ref=spec.task,
    )
    with gpu_work(bench.device, what=probes):
        conflicts = install_conflicts(techniques, bench.device, backends)
    for a, b, why in conflicts:
        with_what = f"on the {b.removeprefix('backend:')} backend" if b.startswith("backend:") else f"with {b}"
        reporter.notice(f"Never drawing {a} {with_what} here: {why}.")
    if previous is not None and previous != spec.search.sampler:
        reporter.notice(
            f"Study {spec.study_name!r} was searched with the {previous} sampler; this run continues it with "
            f"{spec.search.sampler}, which sees every earlier trial."
        )
    if bench.profile_note:
        reporter.notice(bench.profile_note)
    from pareto.measure.memory import theoretical_bytes

    return SearchSetup(
        spec=spec,
        bench=bench,
        study_id=study_id,
        stored=stored,
        batch_sizes=batch_sizes,
        techniques=techniques,
        constraints=spec.constraints(),
        baseline_theoretical_bytes=theoretical_bytes(task.model),
        backends=backends,
        conflicts=frozenset(frozenset((a, b)) for a, b, _ in conflicts),
    )


def optuna_study(setup: SearchSetup, db_url: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    search = setup.spec.search
    sampler = make_sampler(
        search.sampler,
        seed=search.seed,
        batch_sizes=setup.batch_sizes,
        techniques=setup.techniques,
        grid_points=search.grid_points,
        backends=setup.backends,
        conflicts=setup.conflicts,
    )
    study = optuna.create_study(
        study_name=setup.spec.study_name,
        storage=optuna_storage(db_url, setup.bench.engine, setup.study_id),
        directions=directions(setup.spec),
        sampler=sampler,
        load_if_exists=True,
    )
    study.set_user_attr("pareto_sampler", search.sampler)  # shown by optuna-dashboard beside the trials
    return study


def preflight_baseline(setup: SearchSetup, study: optuna.Study) -> None:
    """Before any trial: the uncompressed model built on the device, run at every batch size, evaluated
    once and counted once (``pareto.study.assess.preflight``). When that fails, the baseline is stored as one
    FAILED trial with the reason, in Optuna's table and in pareto's, and the search stops.

    Raises:
        BaselineFailed: the uncompressed model cannot be measured here.
    """
    try:
        with gpu_work(setup.bench.device, what=f"study {setup.spec.study_name!r}: the baseline's preflight"):
            preflight(setup.bench.task, setup.batch_sizes, setup.bench.device)
    except BaselineFailed as exc:
        batch_size = setup.batch_sizes[0]
        params = {"batch_size": batch_size, **{name: False for name in setup.techniques}}
        study.enqueue_trial(params, user_attrs={"pareto_baseline": batch_size})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Optuna's note that heartbeats go with optimize()
            trial = study.ask()
        config = suggest(trial, setup.batch_sizes, setup.techniques, backends=setup.backends, conflicts=setup.conflicts)
        storage.add_trial(
            setup.bench.engine,
            trial_row(
                setup,
                trial.number,
                config,
                state=TrialState.FAILED,
                error=str(exc),
                finished_at=datetime.now(timezone.utc),
            ),
        )
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise


def trial_row(setup: SearchSetup, number: int, config: Config, **fields: Any) -> NewTrial:
    """A new row of pareto's trial table for Optuna's trial ``number`` of ``config``, measured on the bench."""
    return NewTrial(
        study_id=setup.study_id,
        optuna_number=number,
        config=config.to_dict(),
        config_key=config.key(),
        description=config.describe(),
        is_baseline=config.is_baseline,
        batch_size=config.batch_size,
        environment_id=setup.bench.env_id,
        **fields,
    )


def _time_baselines(setup: SearchSetup, run: RunHandle, study: optuna.Study, reporter: Reporter) -> None:
    """Time the uncompressed model at every batch size in this run: speedups divide by it.

    A batch size without a baseline trial in this environment gets one, queued as the first trial;
    an existing baseline trial is timed again now and kept as this run's baseline measurement.
    """
    existing = enqueue_baselines(setup, study)
    started = enqueue_start(setup, study)
    for batch_size, trial_id in existing.items():
        with gpu_work(setup.bench.device, what=f"study {setup.spec.study_name!r}: the baseline @ batch {batch_size}"):
            retime_baseline(setup.bench, run, trial_id, batch_size, reporter.notice)
    queued, n_trials = len(setup.batch_sizes) - len(existing), setup.spec.search.n_trials
    if queued >= n_trials:
        reporter.notice(
            f"The first {queued} trials measure the uncompressed model at each batch size; "
            f"with --n-trials {n_trials} no compression is tried in this run."
        )
    elif started and queued + started >= n_trials:
        reporter.notice(
            f"The first {queued + started} trials are the baselines and the start points (search.start_with); "
            f"with --n-trials {n_trials} the sampler proposes nothing in this run."
        )


def enqueue_baselines(setup: SearchSetup, study: optuna.Study) -> dict[int, int]:
    """Queue a baseline trial for every batch size that has none in this environment (unless one is
    queued or running already); return the batch sizes that have one, with its trial id."""
    pending = {
        t.user_attrs.get("pareto_baseline") for t in study.get_trials(deepcopy=False, states=(_WAITING, _RUNNING))
    }
    existing = {}
    for batch_size in setup.batch_sizes:
        trial_id = _baseline_here(setup, batch_size)
        if trial_id is not None:
            existing[batch_size] = trial_id
        elif batch_size not in pending:
            params = {"batch_size": batch_size, **{name: False for name in setup.techniques}}
            study.enqueue_trial(params, user_attrs={"pareto_baseline": batch_size})
    return existing


def enqueue_start(setup: SearchSetup, study: optuna.Study) -> int:
    """Queue the spec's start points (``search.start_with``), after the baselines: each one not tried in
    this environment and not queued already. Returns how many were queued."""
    pending = {t.user_attrs.get("pareto_start") for t in study.get_trials(deepcopy=False, states=(_WAITING, _RUNNING))}
    queued = 0
    for point in setup.spec.search.start_with:
        start = start_trial(point, setup.batch_sizes, setup.techniques, setup.backends, setup.conflicts)
        if start is None:
            continue  # a technique or backend this search left out (the reason was said then)
        config, params = start
        key = config.key()
        tried = storage.configuration_tried(setup.bench.engine, setup.study_id, setup.bench.env_id, key)
        if not tried and key not in pending:
            study.enqueue_trial(params, user_attrs={"pareto_start": key})
            pending.add(key)
            queued += 1
    return queued


def _baseline_here(setup: SearchSetup, batch_size: int) -> int | None:
    trial_id = baseline_trial(setup.bench, setup.study_id, batch_size)
    if trial_id is None:
        return None
    return trial_id if storage.measured_in(setup.bench.engine, trial_id, setup.bench.env_id) else None


@dataclass
class _Loop:
    """How ``_optimize`` ended."""

    outcomes: list[TrialOutcome]
    interrupted: bool = False
    stopped_busy: bool = False
    exhausted: str | None = None
    #: the uncompressed model's trial failed: why (the search stops, nothing left to compare with)
    baseline_failed: str | None = None


def _optimize(setup: SearchSetup, run: RunHandle, study: optuna.Study, reporter: Reporter) -> _Loop:
    """Optuna's loop, until ``--n-trials`` new configurations were tried (measured, rejected early or
    failed: a repeat of one measured already is answered from the database, and a trial the contention
    guard gave up on measured nothing; neither counts), the timeout, Ctrl-C, a machine that stays
    busy, the uncompressed model's own trial failing, or nothing new left to propose."""
    objective = _Objective(setup, run, reporter)
    after = _AfterTrial(setup, run, objective, reporter)
    timeout = setup.spec.search.timeout / 1000 if setup.spec.search.timeout else None
    reporter.start(
        study=setup.spec.study_name,
        task=setup.bench.task.name,
        n_trials=setup.spec.search.n_trials,
        timeout_s=timeout,
        stored=setup.stored,
    )
    try:
        with StopOnInterrupt(study, reporter) as stop:
            study.optimize(
                objective,
                n_trials=None,  # the callback stops the study: repeats do not count
                timeout=timeout,
                # a worker resumed after SIGSTOP finds its trial taken over: that trial fails, the search goes on
                catch=(TechniqueError, MachineBusy, TrialTakenOver),
                callbacks=[after, stop.after_trial],
            )
        after.loop.interrupted = stop.requested
    except KeyboardInterrupt:
        after.loop.interrupted = True
    return after.loop


class _AfterTrial:
    """Optuna's callback after each trial: report it, then stop the study when the search is done."""

    def __init__(self, setup: SearchSetup, run: RunHandle, objective: _Objective, reporter: Reporter) -> None:
        self.setup, self.run, self.objective, self.reporter = setup, run, objective, reporter
        self.loop = _Loop([])
        self.seen = storage.study_candidates(setup.bench.engine, setup.study_id, setup.bench.env_id)
        self.budget = setup.spec.search.n_trials
        self.size = _space_size(setup)
        self.repeats = self.new = 0

    def __call__(self, study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        outcome, self.objective.last = self.objective.last, None
        if outcome is None:
            return
        self.loop.outcomes.append(outcome)
        name = self.setup.spec.study_name
        if outcome.state == TrialState.COMPLETE:
            self.seen.append(Candidate(name, outcome.number, {}, outcome.description, dict(outcome.metrics), {}))
        self.reporter.trial_done(outcome, best_or_none(self.seen, self.setup.constraints, study=name))
        if outcome.state == TrialState.FAILED and outcome.baseline:
            self.loop.baseline_failed = (
                f"Trial {outcome.number}, the uncompressed model ({outcome.description}), failed: "
                f"{(outcome.error or 'no reason').rstrip('.')}; the search stops, every trial stored."
            )
            study.stop()
        elif outcome.state == TrialState.BUSY and self.objective.lock_stuck:  # a quieter machine would not help
            self.reporter.notice("The search stops here, every trial stored; run it again once that process is gone.")
            self.loop.stopped_busy = True
            study.stop()
        elif outcome.state == TrialState.BUSY and not wait_for_quiet(self.run, self.reporter.notice, BUSY_WAIT_S):
            self.loop.stopped_busy = True
            study.stop()
        elif self._done(outcome):
            study.stop()

    def _done(self, outcome: TrialOutcome) -> bool:
        """Count the trial; True when the budget is spent or nothing new is left to propose."""
        if outcome.state == TrialState.DUPLICATE:
            self.repeats += 1
        elif outcome.state != TrialState.BUSY:  # a busy trial measured nothing: proposed again, it is measured then
            self.repeats, self.new = 0, self.new + 1
        if self.new >= self.budget:
            return True
        reason = None
        if self.size is not None and _tried_here(self.setup) >= self.size:
            reason = f"all {self.size} configurations of the search space were tried in this environment"
        elif self.repeats >= REPEATS_IN_A_ROW:
            reason = (
                f"the {self.setup.spec.search.sampler} sampler proposed {REPEATS_IN_A_ROW} configurations in a row "
                "that were tried already"
            )
        if reason is None:
            return False
        self.loop.exhausted = reason
        self.reporter.notice(
            f"Nothing new left to propose: {reason}. Stopped after {self.new} new configurations "
            f"of the {self.budget} asked for."
        )
        return True


def _space_size(setup: SearchSetup) -> int | None:
    """Distinct configurations a search can store: what the sampler can propose, and the eager baselines
    when eager is not one of its backends (they are stored, and counted as tried, all the same);
    None when unbounded (a range without a step)."""
    if setup.spec.search.sampler == "grid":
        size: int | None = len(
            grid_of(setup.batch_sizes, setup.techniques, setup.spec.search.grid_points, setup.backends, setup.conflicts)
        )
    else:
        size = space_size(setup.batch_sizes, setup.techniques, setup.backends, setup.conflicts)
    return size + len(setup.batch_sizes) if size is not None and "eager" not in setup.backends else size


def _tried_here(setup: SearchSetup) -> int:
    """Distinct configurations of the study measured, rejected early or failed in this environment."""
    return storage.configurations_tried(setup.bench.engine, setup.study_id, setup.bench.env_id)


def confirm_search(setup: SearchSetup, run: RunHandle, reporter: Reporter) -> ConfirmResult | None:
    """Re-measure the best feasible and near-feasible configurations with the baseline, in this environment."""
    search = setup.spec.search
    if search.confirm_top == 0 or setup.constraints.p99_ms is None:
        return None
    if run.probe is not None and run.probe.read_after_work().ratio > run.probe.limit:
        reporter.notice("The machine is busy: no confirmation now; run 'pareto confirm' when it is quiet.")
        return None
    try:
        with confirm_lock(setup.bench.engine, setup.spec.study_name):  # workers end together: one confirms
            result = confirm_pick(
                setup.bench,
                setup.study_id,
                lambda: load_candidates(setup.bench, setup.study_id, setup.bench.env_id),
                setup.constraints,
                list(setup.spec.objectives),
                top=search.confirm_top,
                margin=search.confirm_margin,
                seed=search.seed,
                held=setup.held,
            )
    except LockHeld as exc:
        reporter.notice(f"{exc} This worker leaves the confirmation to it.")
        return None
    reporter.confirmed(result)
    return result


def served_pick(
    setup: SearchSetup, run: RunHandle, make: Callable[[], SearchResult], reporter: Reporter
) -> SearchResult:
    """At a request rate the load runs decide (``pareto.study.load_runs.decide``); else ``make()``."""
    return decide(
        LoadContext(setup.bench, setup.study_id, setup.spec.study_name, setup.spec.traffic, setup.constraints),
        make,
        reporter.notice,
        run_id=run.run_id,
    )


def search_result(
    setup: SearchSetup,
    *,
    trials_run: int,
    measured: int,
    busy: int,
    interrupted: bool,
    confirmation: ConfirmResult | None,
) -> SearchResult:
    """The study's frontier and pick in this environment, after a run of ``trials_run`` trials."""
    everything = storage.study_candidates(setup.bench.engine, setup.study_id, setup.bench.env_id)
    best, reason = None, None
    try:
        best = select_best(everything, setup.constraints, study=setup.spec.study_name)
    except NoFeasibleConfiguration as exc:
        reason = str(exc)
    front = [judged(c, setup.constraints) for c in frontier(everything, objective_metrics(setup.spec.objectives))]
    return SearchResult(
        study=setup.spec.study_name,
        trials_run=trials_run,
        measured=measured,
        interrupted=interrupted,
        frontier=front,
        best=best,
        no_best_reason=reason,
        constraints=setup.constraints,
        confirmation=confirmation,
        busy=busy,
        sampler=setup.spec.search.sampler,
    )


class _Objective:
    """One Optuna trial: suggest, answer a repeat from the database or measure, store, report."""

    def __init__(self, setup: SearchSetup, run: RunHandle, reporter: Reporter) -> None:
        self.setup, self.run, self.reporter = setup, run, reporter
        self.bench = setup.bench
        self.last: TrialOutcome | None = None
        self.flat = setup.spec.search.sampler in FLAT
        self.lock_stuck = False  #: the last BUSY trial waited out the device's timing lock

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        config = suggest(
            trial,
            self.setup.batch_sizes,
            self.setup.techniques,
            flat=self.flat,
            backends=self.setup.backends,
            conflicts=self.setup.conflicts,
        )
        config = self._as_known(config)
        row_id, twin = self._start(trial, config)
        while twin is None:
            try:
                # the GPU's work lock, shared, across the build, capture and evaluation (its own timing
                # takes it exclusively meanwhile): no other worker's timing runs beside them
                with gpu_work(self.bench.device, what=f"trial {trial.number}: {config.describe()}"):
                    result = self._assess(config)
                self._store(row_id, result)  # inside: a store that fails leaves no RUNNING row behind
            except NoEffect as exc:
                # a technique that changed nothing after the ones before it: the configuration is its
                # smaller twin, measured as that (or answered as a repeat of it), and known to be from now on
                config, row_id, twin = self._retarget(trial, row_id, config, exc)
                continue
            except Rejected as exc:
                slo = self.setup.constraints.p99_ms
                assert slo is not None
                self._reject(row_id, trial, config, exc, slo)
                raise optuna.TrialPruned(str(exc)) from None
            except TechniqueError as exc:
                return self._failed(row_id, trial, config, exc)
            except BaseException as exc:
                self._end(row_id, trial, config, exc)
                raise
            outcome = TrialOutcome(trial.number, TrialState.COMPLETE, config.describe(), result.metrics.to_dict())
            return self._finish(trial, outcome)
        return self._repeat(trial, config, twin)

    def _assess(self, config: Config) -> Any:
        """Measure ``config`` (rejected early unless the baseline); raises TechniqueError, Rejected, MachineBusy."""
        slo = self.setup.constraints.p99_ms
        result = assess(
            self.bench.task,
            config,
            device=self.bench.device,
            threads=self.bench.threads,
            measure=self.setup.spec.measure,
            slo_ms=slo,
            profile=self.bench.profile,
            baseline_theoretical_bytes=self.setup.baseline_theoretical_bytes,
            probe=self.run.probe,
            # at a rate a largest batch over the SLO alone can still serve: smaller batches run at smaller buckets
            reject_above_ms=slo if self._rejects_early(config) else None,
            traffic=self.setup.spec.traffic,
            seed=self.setup.spec.traffic.seed,
        )
        unmeasured = [
            metric
            for metric, _ in objective_metrics(self.setup.spec.objectives)
            if objective_value(result.metrics.to_dict(), metric) is None
        ]
        if unmeasured:  # failed as a whole, in both tables, before anything is stored as complete
            raise TechniqueError(f"objective {', '.join(unmeasured)} could not be measured for this configuration")
        return result

    def _rejects_early(self, config: Config) -> bool:
        spec = self.setup.spec
        return spec.search.early_reject and not config.is_baseline and spec.traffic.qps is None

    def _repeat(self, trial: optuna.Trial, config: Config, twin: Twin) -> tuple[float, ...]:
        """A repeat, answered from the database and not counted: told to the sampler as the first time (its
        stored values; infeasible; pruned with its P99 constraint). Shown as pruned, a measured repeat is
        lost to a Gaussian process, which then keeps proposing it."""
        trial.set_user_attr("duplicate_of", twin.number)
        description = config.describe()
        if twin.failed is not None:
            note = f"repeat of trial {twin.number}, which failed here: {twin.failed.rstrip('.')}; not built again"
            return self._infeasible(
                trial, TrialOutcome(trial.number, TrialState.DUPLICATE, description, {}, note, twin.number)
            )
        outcome = TrialOutcome(trial.number, TrialState.DUPLICATE, description, twin.metrics, repeat_of=twin.number)
        if twin.metrics:
            return self._finish(trial, outcome)
        self.last = outcome
        slo = self.setup.constraints.p99_ms
        if twin.p99_lower_ms is not None and slo is not None:
            # the constraint the first time proved, again: pruned without it, TPE counts the trial
            # as feasible and may propose the same configuration over and over
            trial.set_constraint("p99_ms", (twin.p99_lower_ms - slo) / slo)
        raise optuna.TrialPruned(f"same configuration as trial {twin.number}, rejected early already")

    def _start(self, trial: optuna.Trial, config: Config, replacing: int | None = None) -> tuple[int, Twin | None]:
        """Claim ``config`` here for this trial (its row RUNNING), or answer it from its twin: measured,
        broken or rejected early here, or measured by another worker meanwhile (``pareto.study.claims``)."""
        claims = Claims(self.bench.engine, self.setup.study_id, self.bench.env_id, self.setup.constraints.p99_ms)
        try:
            return claims.claim(
                lambda **fields: trial_row(self.setup, trial.number, config, **fields),
                config.key(),
                replacing=replacing,
                # a twin whose worker died, or whose trial ended without a verdict: failed, the claim released
                waiting=lambda: fail_stale_trials(trial.study, self.bench.engine, self.setup.study_id),
            )
        except MachineBusy as exc:
            self.last = TrialOutcome(trial.number, TrialState.BUSY, config.describe(), error=str(exc))
            raise

    def _as_known(self, config: Config) -> Config:
        """``config`` with the layers learned to be left alone (``pareto.study.layers``), or what it turned out
        to be here (a technique that changed nothing left out; an ONNX file bare on ONNX Runtime: its baseline)."""
        where = (self.bench.engine, self.setup.study_id, self.bench.env_id)
        if not config.techniques and config.backend == "onnxruntime" and is_graph_file(self.bench.task.model):
            config = Config(batch_size=config.batch_size)
        config = layers.with_learned(config, layers.learned(*where))
        smaller = storage.same_as_chain(
            self.bench.engine, self.setup.study_id, self.bench.env_id, config.key(), lambda c: Config.from_dict(c).key()
        )
        return config if smaller is None else Config.from_dict(smaller)

    def _retarget(
        self, trial: optuna.Trial, row_id: int, config: Config, exc: NoEffect
    ) -> tuple[Config, int, Twin | None]:
        """The trial becomes ``config`` without the technique that changed nothing (known to be: a later
        proposal is not built again): claimed again as that, or answered by its twin."""
        smaller = config.without(exc.technique)
        where = (self.setup.study_id, self.bench.env_id)
        storage.save_same_as(self.bench.engine, *where, config.key(), exc.technique, str(exc), smaller.to_dict())
        row_id, twin = self._start(trial, smaller, replacing=row_id)
        then = f"a repeat of trial {twin.number}" if twin is not None else f"measured as {smaller.describe()}"
        self.reporter.notice(f"Trial {trial.number}: {str(exc).rstrip('.')}; {then}.")
        return smaller, row_id, twin

    def _failed(self, row_id: int, trial: optuna.Trial, config: Config, exc: TechniqueError) -> tuple[float, ...]:
        """The configuration broke here: FAILED, known from now on, told to the sampler as infeasible (the
        uncompressed model's own failure is a failure: the search stops on it). A failure traced to layers
        leaves them alone for the rest of the study, said in one line."""
        self._end(row_id, trial, config, exc)
        if exc.layers:
            layers.remember(self.bench.engine, self.setup.study_id, self.bench.env_id, exc.layers, str(exc))
            self.reporter.notice(f"Trial {trial.number}: {layers.said(exc.layers)}")
        if config.is_baseline or isinstance(exc, Transient):  # a failure to Optuna: proposed again, built again
            raise exc
        assert self.last is not None
        return self._infeasible(trial, self.last)

    def _infeasible(self, trial: optuna.Trial, outcome: TrialOutcome) -> tuple[float, ...]:
        """Tell the sampler that ``outcome``'s configuration cannot run here (``pareto.study.samplers.failed_values``,
        ``failure_gaps``), marked ``pareto_failed`` for Optuna's tools."""
        self.last = outcome
        values = failed_values(trial.study, len(self.setup.spec.objectives))
        if values is None:  # nothing measured yet to compare with: told as a failure
            raise TechniqueError(outcome.error or "the configuration failed")
        trial.set_user_attr("pareto_failed", outcome.error or True)
        for name, gap in failure_gaps(trial.study, self.setup.constraints).items():
            trial.set_constraint(name, gap)
        return values

    def _end(self, row_id: int, trial: optuna.Trial, config: Config, exc: BaseException) -> None:
        """A trial that did not complete: FAILED with its reason (known when the configuration itself broke:
        a ``TechniqueError``), or BUSY (no verdict, never shown to the sampler)."""
        state = TrialState.BUSY if isinstance(exc, MachineBusy) else TrialState.FAILED
        self.lock_stuck = isinstance(exc, TimingLockStuck)
        reason = str(exc) if isinstance(exc, (TechniqueError, MachineBusy)) else _interrupted(exc)
        known = isinstance(exc, TechniqueError) and not isinstance(exc, Transient) and not config.is_baseline
        storage.finish_trial(self.bench.engine, row_id, state, reason, config_failed=known)
        self.last = TrialOutcome(trial.number, state, config.describe(), error=reason, baseline=config.is_baseline)

    def _reject(self, row_id: int, trial: optuna.Trial, config: Config, exc: Rejected, slo_ms: float) -> None:
        """Rejected early: PRUNED in both tables, with the first round's latency; the sampler sees the
        P99 constraint that round proves (its lower bound over the SLO), never an accuracy."""
        early = exc.early_latency(slo_ms)
        timings = {"compress_s": exc.compress_s, "compile_s": exc.compile_s, "latency_s": exc.latency.elapsed_s}
        storage.reject_trial(self.bench.engine, row_id, str(exc), timings=timings, early=early)
        trial.set_user_attr("early_latency", early)
        lower = early["latency_p99_lower_ms"]
        if lower is not None:
            trial.set_constraint("p99_ms", (lower - slo_ms) / slo_ms)
        self.last = TrialOutcome(trial.number, TrialState.PRUNED, config.describe(), {}, error=str(exc))

    def _store(self, row_id: int, result: Any) -> None:
        """COMPLETE and its measurement, in one transaction (a twin never sees the one without the other)."""
        profile = self.bench.profile
        suspect = None
        if result.suspect_profile and profile is not None and profile.calibration_id:
            suspect = (profile.calibration_id, result.suspect_profile)
        timings = {name: getattr(result, name) for name in ("compress_s", "compile_s", "latency_s", "accuracy_s")}
        storage.complete_trial(
            self.bench.engine,
            row_id,
            study_id=self.setup.study_id,
            timings=timings,
            measurement=(self.bench.env_id, self.run.run_id, result.metrics),
            suspect=suspect,
        )

    def _finish(self, trial: optuna.Trial, outcome: TrialOutcome) -> tuple[float, ...]:
        for name, gap in constraint_gaps(outcome.metrics, self.setup.constraints).items():
            trial.set_constraint(name, gap)
        self.last = outcome
        return tuple(
            _objective_value(outcome.metrics, metric) for metric, _ in objective_metrics(self.setup.spec.objectives)
        )


def _objective_value(metrics: dict[str, Any], metric: str) -> float:
    value = objective_value(metrics, metric)
    if value is None:
        raise TechniqueError(f"metric {metric!r} could not be measured for this configuration")
    return value


def _interrupted(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by the user"
    return f"{type(exc).__name__}: {exc}"


_WAITING, _RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING

logging.getLogger("alembic").setLevel(logging.WARNING)
