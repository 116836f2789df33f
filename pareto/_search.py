"""Optuna orchestration: suggest a configuration, apply it, measure it, store it, repeat."""

from __future__ import annotations

import logging
import signal
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState
from sqlalchemy import select
from sqlalchemy.engine import Engine

from pareto.assess import Assessment, assess, check_input_fits
from pareto.compress import Config, Technique, get_technique
from pareto.errors import NoFeasibleConfiguration, TechniqueError, UsageError
from pareto.frontier import (
    Candidate,
    Constraints,
    evaluate,
    frontier,
    memory_bytes,
    objective_metrics,
    objective_value,
    select_best,
)
from pareto.measure.environment import fingerprint
from pareto.measure.latency import resolve_device
from pareto.measure.memory import theoretical_bytes
from pareto.measure.stats import MIN_SAMPLES_P99
from pareto.spec import Range, SearchSpec
from pareto.store import queries
from pareto.store.engine import check_path, engine_kwargs, open_engine, session_scope, upgrade
from pareto.store.models import Measurement, Study, Trial, utcnow
from pareto.task import Task, load_task

HEARTBEAT_INTERVAL_S = 60


class Reporter(Protocol):
    """What a search tells its caller as it goes (the CLI draws a progress bar from it)."""

    def start(self, *, study: str, task: str, n_trials: int, timeout_s: float | None, stored: int) -> None: ...

    def notice(self, message: str) -> None: ...

    def trial_done(self, outcome: TrialOutcome, best: Candidate | None) -> None: ...


class _Quiet:
    def start(self, **_: Any) -> None:
        pass

    def notice(self, message: str) -> None:
        pass

    def trial_done(self, outcome: TrialOutcome, best: Candidate | None) -> None:
        pass


@dataclass
class TrialOutcome:
    number: int
    state: str  # COMPLETE, FAILED, DUPLICATE
    description: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class SearchResult:
    study: str
    trials_run: int  # finished in this run: measured, duplicate or failed
    measured: int  # of those, measured and stored with a measurement
    interrupted: bool
    frontier: list[Candidate]
    best: Candidate | None
    no_best_reason: str | None
    constraints: Constraints


def run_search(spec: SearchSpec, *, db_url: str, reporter: Reporter | None = None) -> SearchResult:
    """Run (or continue) the study ``spec.study_name`` and return its frontier and pick.

    Raises:
        UsageError: bad task, device or spec; StoreError: the database cannot be used.
    """
    reporter = reporter or _Quiet()
    check_path(db_url)  # before a task that may train for a while
    task = load_task(spec.task)
    device = resolve_device(spec.measure.device)
    import torch

    threads = spec.measure.threads or torch.get_num_threads()
    batch_sizes = spec.space.batch_size or [task.batch_size]
    techniques, skipped = _available_techniques(spec, device, task)
    for name, reason in skipped:
        reporter.notice(f"Skipping technique {name}: {reason}")
    check_input_fits(task)

    env_fp = fingerprint(device, threads)
    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        env_id = queries.environment_id(session, env_fp)
        spec = _adopt_stored_objectives(session, spec)
        study_row = _get_or_create_study(session, spec)
        study_id, stored = study_row.id, len(study_row.trials)
        profile, note = queries.resolve_profile(session, spec.measure.hardware, fingerprint=env_fp)
    if note:
        reporter.notice(note)

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # heartbeats let another worker's search mark this one's trials FAILED if this process dies
        storage = optuna.storages.RDBStorage(
            db_url, engine_kwargs=engine_kwargs(db_url), heartbeat_interval=HEARTBEAT_INTERVAL_S
        )
    constraints = Constraints(
        p99_ms=spec.slo.p99_ms,
        min_accuracy=spec.slo.min_accuracy,
        max_memory_bytes=spec.budget.max_memory,
        min_throughput_per_s=spec.slo.min_throughput,
        min_samples=MIN_SAMPLES_P99,
    )
    study = optuna.create_study(
        study_name=spec.study_name,
        storage=storage,
        directions=["maximize" if up else "minimize" for _, up in objective_metrics(spec.objectives)],
        sampler=_sampler(spec),
        load_if_exists=True,
    )
    queued = _enqueue_baselines(engine, study, study_id, env_id, batch_sizes, techniques)
    if queued >= spec.search.n_trials:
        reporter.notice(
            f"The first {queued} trials measure the uncompressed model at each batch size; "
            f"with --n-trials {spec.search.n_trials} no compression is tried in this run."
        )

    objective = _Objective(
        engine=engine,
        study_id=study_id,
        env_id=env_id,
        task=task,
        spec=spec,
        device=device,
        threads=threads,
        batch_sizes=batch_sizes,
        techniques=techniques,
        constraints=constraints,
        profile=profile,
        baseline_theoretical_bytes=theoretical_bytes(task.model),
    )
    with session_scope(engine) as session:
        seen = queries.candidates(session, session.get(Study, study_id))

    finished: list[TrialOutcome] = []

    def on_trial(_study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        outcome = objective.last
        if outcome is None:
            return
        finished.append(outcome)
        if outcome.state == "COMPLETE":
            seen.append(_candidate(spec.study_name, outcome))
        reporter.trial_done(outcome, _best_or_none(seen, constraints, spec.study_name))
        objective.last = None

    reporter.start(
        study=spec.study_name,
        task=task.name,
        n_trials=spec.search.n_trials,
        timeout_s=spec.search.timeout / 1000 if spec.search.timeout else None,
        stored=stored,
    )
    interrupted = False
    try:
        with _StopOnInterrupt(study, reporter) as stop:
            study.optimize(
                objective,
                n_trials=spec.search.n_trials,
                timeout=spec.search.timeout / 1000 if spec.search.timeout else None,
                catch=(TechniqueError,),
                callbacks=[on_trial, stop.after_trial],
            )
        interrupted = stop.requested
    except KeyboardInterrupt:
        interrupted = True
    with session_scope(engine) as session:
        everything = queries.candidates(session, session.get(Study, study_id))
    best, reason = None, None
    try:
        best = select_best(everything, constraints, study=spec.study_name)
    except NoFeasibleConfiguration as exc:
        reason = str(exc)
    front = frontier(everything, objective_metrics(spec.objectives))
    for candidate in front:
        evaluate(candidate, constraints)
    return SearchResult(
        study=spec.study_name,
        trials_run=len(finished),
        measured=sum(o.state == "COMPLETE" for o in finished),
        interrupted=interrupted,
        frontier=front,
        best=best,
        no_best_reason=reason,
        constraints=constraints,
    )


class _StopOnInterrupt:
    """First Ctrl-C: finish the trial in progress, then stop. Second Ctrl-C: abandon it at once.

    A KeyboardInterrupt raised at an arbitrary point can land in a finalizer during garbage
    collection, where Python prints and swallows it; a flag checked between trials cannot be lost.
    """

    def __init__(self, study: optuna.Study, reporter: Reporter) -> None:
        self.study, self.reporter = study, reporter
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.study.stop()

    def after_trial(self, _study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        if self.requested:
            self.reporter.notice("Ctrl-C: stopped after the trial in progress.")


class _Objective:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)
        self.last: TrialOutcome | None = None

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        config = suggest(trial, self.batch_sizes, self.techniques)
        key = config.key()
        with session_scope(self.engine) as session:
            row = Trial(
                study_id=self.study_id,
                optuna_number=trial.number,
                config=config.to_dict(),
                config_key=key,
                description=config.describe(),
                is_baseline=config.is_baseline,
                batch_size=config.batch_size,
                environment_id=self.env_id,
            )
            session.add(row)
            session.flush()
            row_id = row.id
            earlier = _measured_twin(session, self.study_id, self.env_id, key, row_id)
            if earlier is not None:
                # the same configuration measured in the same environment: reuse it, do not re-measure
                twin = earlier.trial.optuna_number
                row.state, row.finished_at = "DUPLICATE", utcnow()
                row.error = f"same configuration as trial {twin}; not measured again"
                metrics = _metrics_of(earlier)
        if earlier is not None:
            trial.set_user_attr("duplicate_of", twin)
            return self._finish(trial, TrialOutcome(trial.number, "DUPLICATE", config.describe(), metrics))
        try:
            metrics, phases = self._measure(config)
        except BaseException as exc:
            reason = str(exc) if isinstance(exc, TechniqueError) else _interrupted(exc)
            with session_scope(self.engine) as session:
                row = session.get(Trial, row_id)
                row.state, row.error, row.finished_at = "FAILED", reason, utcnow()
            self.last = TrialOutcome(trial.number, "FAILED", config.describe(), error=reason)
            raise
        with session_scope(self.engine) as session:
            row = session.get(Trial, row_id)
            row.state, row.finished_at = "COMPLETE", utcnow()
            session.get(Study, self.study_id).updated_at = row.finished_at
            row.compress_s, row.compile_s = phases.compress_s, phases.compile_s
            row.latency_s, row.accuracy_s = phases.latency_s, phases.accuracy_s
            session.add(Measurement(trial_id=row_id, environment_id=self.env_id, **metrics))
        return self._finish(trial, TrialOutcome(trial.number, "COMPLETE", config.describe(), metrics))

    def _finish(self, trial: optuna.Trial, outcome: TrialOutcome) -> tuple[float, ...]:
        m = outcome.metrics
        for name, value in _constraint_values(m, self.constraints).items():
            trial.set_constraint(name, value)
        self.last = outcome
        return tuple(_objective_value(m, metric) for metric, _ in objective_metrics(self.spec.objectives))

    def _measure(self, config: Config) -> tuple[dict[str, Any], Assessment]:
        result = assess(
            self.task,
            config,
            device=self.device,
            threads=self.threads,
            measure=self.spec.measure,
            slo_ms=self.spec.slo.p99_ms,
            profile=self.profile,
            baseline_theoretical_bytes=self.baseline_theoretical_bytes,
        )
        return result.metrics, result


def suggest(trial: optuna.Trial, batch_sizes: list[int], techniques: dict[str, dict[str, Any]]) -> Config:
    """Draw one configuration; a technique's parameters exist only when the technique is on."""
    batch_size = trial.suggest_categorical("batch_size", batch_sizes)
    chosen: list[Technique] = []
    for name, space in techniques.items():
        if not trial.suggest_categorical(name, [False, True]):
            continue
        params = {}
        for pname, pspace in space.items():
            label = f"{name}.{pname}"
            if isinstance(pspace, Range):
                params[pname] = trial.suggest_float(label, pspace.low, pspace.high, step=pspace.step, log=pspace.log)
            else:
                params[pname] = trial.suggest_categorical(label, pspace)
        chosen.append(get_technique(name, params))
    return Config(techniques=tuple(chosen), batch_size=batch_size)


def _available_techniques(spec: SearchSpec, device: str, task: Task) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    usable, skipped = {}, []
    for name, space in spec.space.techniques.items():
        probe = {p: (s.low if isinstance(s, Range) else s[0]) for p, s in space.items()}
        reason = get_technique(name, probe).available(device, task)
        if reason is None:
            usable[name] = space
        else:
            skipped.append((name, reason))
    return usable, skipped


def _sampler(spec: SearchSpec) -> optuna.samplers.BaseSampler:
    """Samplers read each trial's constraints (``Trial.set_constraint``) from the storage."""
    seed = spec.search.seed
    if spec.search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.search.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # multivariate + group: technique parameters exist only when their technique is on
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=8)


def _constraint_values(metrics: dict[str, Any], constraints: Constraints) -> dict[str, float]:
    """Optuna's convention: a value <= 0 is satisfied."""
    values = {}
    if constraints.p99_ms is not None:
        upper = metrics.get("latency_p99_upper_ms")
        bound = upper if upper is not None else metrics["latency_p99_ms"]
        gap = bound - constraints.p99_ms
        if metrics["samples"] < constraints.min_samples:
            gap = max(gap, 1e-9)  # too few samples for a P99 claim: never counts as met
        values["p99_ms"] = gap
    if constraints.min_accuracy is not None:
        values["min_accuracy"] = constraints.min_accuracy - metrics["accuracy"]
    if constraints.max_memory_bytes is not None:
        values["max_memory_bytes"] = float(memory_bytes(metrics) - constraints.max_memory_bytes)
    if constraints.min_throughput_per_s is not None:
        values["min_throughput_per_s"] = constraints.min_throughput_per_s - metrics["throughput_per_s"]
    return values


def _objective_value(metrics: dict[str, Any], metric: str) -> float:
    value = objective_value(metrics, metric)
    if value is None:
        raise TechniqueError(f"metric {metric!r} could not be measured for this configuration")
    return value


def _enqueue_baselines(
    engine: Engine, study: optuna.Study, study_id: int, env_id: int, batch_sizes: list[int], techniques: dict
) -> int:
    """The uncompressed model at every batch size is measured first, in this environment."""
    with session_scope(engine) as session:
        measured = set(
            session.scalars(
                select(Trial.batch_size).where(
                    Trial.study_id == study_id,
                    Trial.is_baseline,
                    Trial.environment_id == env_id,
                    Trial.state == "COMPLETE",
                )
            ).all()
        )
    waiting = {
        t.params.get("batch_size", t.system_attrs.get("fixed_params", {}).get("batch_size"))
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    }
    queued = 0
    for batch_size in batch_sizes:
        if batch_size not in measured and batch_size not in waiting:
            study.enqueue_trial({"batch_size": batch_size, **{name: False for name in techniques}})
            queued += 1
    return queued


def _adopt_stored_objectives(session: Any, spec: SearchSpec) -> SearchSpec:
    """Continuing a study without naming objectives keeps the study's own."""
    if "objectives" in spec.model_fields_set:
        return spec
    row = session.scalars(select(Study).where(Study.name == spec.study_name)).one_or_none()
    if row is None or "objectives" not in row.spec:
        return spec
    return spec.model_copy(update={"objectives": row.spec["objectives"]})


def _get_or_create_study(session: Any, spec: SearchSpec) -> Study:
    row = session.scalars(select(Study).where(Study.name == spec.study_name)).one_or_none()
    spec_json = spec.model_dump(mode="json")
    if row is None:
        row = Study(name=spec.study_name, task=spec.task, spec=spec_json)
        session.add(row)
        session.flush()
    elif row.task != spec.task:
        raise UsageError(
            f"Study {spec.study_name!r} belongs to task {row.task!r}, not {spec.task!r}; pick another --study name."
        )
    elif row.spec.get("objectives", ["accuracy", "p99"]) != list(spec.objectives):
        raise UsageError(
            f"Study {spec.study_name!r} optimizes {','.join(row.spec.get('objectives', ['accuracy', 'p99']))}, "
            f"not {','.join(spec.objectives)}; continue it with --objective "
            f"{','.join(row.spec.get('objectives', ['accuracy', 'p99']))}, or pick another --study name."
        )
    else:
        row.spec = spec_json  # the latest SLO and space; every trial keeps its own config
        row.updated_at = utcnow()
    return row


def _measured_twin(session: Any, study_id: int, env_id: int, key: str, exclude_id: int) -> Measurement | None:
    return session.scalars(
        select(Measurement)
        .join(Trial)
        .where(
            Trial.study_id == study_id,
            Trial.config_key == key,
            Trial.state == "COMPLETE",
            Measurement.environment_id == env_id,
            Trial.id != exclude_id,
        )
        .limit(1)
    ).one_or_none()


def _metrics_of(m: Measurement) -> dict[str, Any]:
    return {name: getattr(m, name) for name in queries.MEASUREMENT_METRICS}


def _candidate(study: str, outcome: TrialOutcome) -> Candidate:
    return Candidate(study, outcome.number, {}, outcome.description, dict(outcome.metrics), {})


def _best_or_none(seen: list[Candidate], constraints: Constraints, study: str) -> Candidate | None:
    try:
        return select_best(seen, constraints, study=study)
    except NoFeasibleConfiguration:
        return None


def _interrupted(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by the user"
    return f"{type(exc).__name__}: {exc}"


logging.getLogger("alembic").setLevel(logging.WARNING)
