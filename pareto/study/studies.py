"""A study in two tables: pareto's row and Optuna's, on one database, created once and shared by workers.

Optuna's storage carries heartbeats, so a trial whose worker died is failed (in both tables) by the
next worker that starts one, and retried once.
"""

from __future__ import annotations

import math
import os
import warnings
from datetime import datetime
from typing import Any

import optuna
from sqlalchemy.engine import Engine

from pareto.errors import UsageError
from pareto.front import DEFAULT_OBJECTIVE_NAMES, objective_metrics
from pareto.spec import SearchSpec
from pareto.store import storage
from pareto.store.engine import check_path, engine_kwargs, existing_engine, immediate_transactions, open_engine, upgrade
from pareto.store.records import StudyRecord
from pareto.store.writes import STUDY_NAME_LENGTH, Writer, writing
from pareto.tasks.source import DIGEST_CHARS, ModelSource, is_source_ref
from pareto.units import format_ms

HEARTBEAT_INTERVAL_S = 60


def directions(spec: SearchSpec) -> list[optuna.study.StudyDirection]:
    up, down = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    return [up if maximize else down for _, maximize in objective_metrics(spec.objectives)]


def heartbeat_interval_s() -> int:
    """Seconds between a worker's heartbeats (``PARETO_HEARTBEAT_S``; tests shorten it).

    Raises:
        UsageError: ``PARETO_HEARTBEAT_S`` is not a whole number of seconds from 1 to a day.
    """
    raw = (os.environ.get("PARETO_HEARTBEAT_S") or "").strip()
    if not raw:
        return HEARTBEAT_INTERVAL_S
    if not raw.isdigit() or not 1 <= int(raw) <= 86_400:
        raise UsageError(f"PARETO_HEARTBEAT_S is {raw[:40]!r}; give whole seconds from 1 to 86400, or unset it.")
    return int(raw)


def optuna_storage(db_url: str, engine: Engine, study_id: int) -> optuna.storages.RDBStorage:
    """Optuna's storage on the same database, with heartbeats: a trial whose worker died (kill -9, a
    lost node) is failed by the next worker that starts a trial, in Optuna's table and in ours, and
    retried once as a new trial with the same parameters."""
    interval = heartbeat_interval_s()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            db_url,
            engine_kwargs=engine_kwargs(db_url),
            heartbeat_interval=interval,
            grace_period=2 * interval,
            heartbeat_stale_trial_callback=_StaleTrial(engine, study_id, 2 * interval),
        )
    immediate_transactions(storage.engine)  # one worker takes a queued trial, not two
    return storage


class _StaleTrial:
    """Optuna's ``heartbeat_stale_trial_callback``: a trial whose worker stopped beating."""

    def __init__(self, engine: Engine, study_id: int, grace_s: int) -> None:
        self.engine, self.study_id, self.grace_s = engine, study_id, grace_s

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        why = f"its worker stopped (no heartbeat for {self.grace_s} s); retried as a new trial"
        storage.fail_stale_trial(self.engine, self.study_id, trial.number, why)  # only a RUNNING row
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.RetryFailedTrialCallback(max_retry=1)(study, trial)


def fail_stale_trials(study: optuna.Study, engine: Engine | None = None, study_id: int | None = None) -> None:
    """Optuna's trials whose workers stopped beating, failed (and retried); with ``engine`` and
    ``study_id``, also pareto's claims that their trials left behind (``fail_orphaned_claims``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    if engine is not None and study_id is not None:
        fail_orphaned_claims(engine, study_id, study)


#: How long after its Optuna trial ended a RUNNING row counts as left behind: its worker stores the
#: verdict within moments of the trial's end, so this is only ever reached by a worker that failed.
ORPHAN_GRACE_S = 120.0


def fail_orphaned_claims(engine: Engine, study_id: int, study: optuna.Study) -> list[int]:
    """pareto's RUNNING rows whose Optuna trial ended over ``ORPHAN_GRACE_S`` ago, FAILED: a handler that
    raised while the trial ended (a locked database, Ctrl-C, SIGTERM) or a process killed between
    Optuna's stale-trial failure and pareto's would otherwise hold the configuration's claim until
    ``TWIN_WAIT_S`` ran out for every later proposal of it. Returns the numbers failed."""
    failed = []
    now = datetime.now()  # Optuna stamps its trials in local time, without a zone
    for number in storage.running_numbers(engine, study_id):
        try:
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
            trial = study._storage.get_trial(trial_id)
        except (KeyError, AttributeError):  # no such trial in Optuna's tables (or an Optuna without the lookup)
            continue
        ended = trial.datetime_complete
        if trial.state.is_finished() and ended is not None and (now - ended).total_seconds() > ORPHAN_GRACE_S:
            why = f"its trial ended ({trial.state.name}) without storing a verdict here; the claim was released"
            storage.fail_stale_trial(engine, study_id, number, why)
            failed.append(number)
    return failed


def create_study(spec: SearchSpec, *, db_url: str) -> str:
    """Create the study (pareto's row and Optuna's, with its directions) before any worker starts:
    workers that race to create one study is a known failure of Optuna's RDB storage.

    Returns:
        The study's name. An existing study is checked against the spec (task, objectives) and kept.
    """
    check_study_name(spec)
    check_path(db_url)
    engine = open_engine(db_url)
    upgrade(engine)
    with writing(engine) as w:
        spec = adopt_stored_objectives(w, spec)
        study_id = get_or_create_study(w, spec).id
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(
        study_name=spec.study_name,
        storage=optuna_storage(db_url, engine, study_id),
        directions=directions(spec),
        load_if_exists=True,
    )
    return spec.study_name


def adopt_stored_objectives(w: Writer, spec: SearchSpec) -> SearchSpec:
    """Continuing a study without naming objectives keeps the study's own."""
    if "objectives" in spec.model_fields_set:
        return spec
    row = w.study_named(spec.study_name)
    if row is None or "objectives" not in row.spec:
        return spec
    return spec.model_copy(update={"objectives": row.spec["objectives"]})


#: What makes a traffic study's schedules and simulation: every trial of a study shares them.
SCHEDULE_FIELDS = (
    "seed",
    "max_wait",
    "requests",
    "replications",
    "settle",
    "sweep_samples",
    "serve_runs",
    "serve_requests",
    "serve_threads",
    "serve_instances",
    "load_min_s",
)
#: A setting a study stored before it existed: the value that keeps its simulation as it was then (calls
#: timed alone, one replication, no minimum span, one model instance, no settling rule).
BEFORE_SETTING: dict[str, object] = {
    "replications": 1,
    "serve_runs": 0,
    "load_min_s": 0.0,
    "serve_instances": [1],
    "settle": 0.0,
}


def adopt_stored_traffic(w: Writer, spec: SearchSpec) -> SearchSpec:
    """Continuing a study at a rate keeps its schedule settings (``SCHEDULE_FIELDS``), so that later trials
    run on the same arrivals and simulation as earlier ones; the settings it does not name are taken from it.

    Raises:
        UsageError: the spec names another value for one of them.
    """
    row = w.study_named(spec.study_name)
    stored = (row.spec.get("traffic") or {}) if row is not None else {}
    if spec.traffic.qps is None or not stored.get("qps"):
        return spec
    update: dict[str, object] = {}
    for name in SCHEDULE_FIELDS:
        if name not in stored and name not in BEFORE_SETTING:  # stored before it existed: the default
            continue
        was = stored.get(name, BEFORE_SETTING.get(name))
        if name in spec.traffic.model_fields_set and getattr(spec.traffic, name) != was:
            raise UsageError(
                f"Study {spec.study_name!r} was searched with traffic.{name} = {was!r}, not "
                f"{getattr(spec.traffic, name)!r}; every trial of a study shares it, so leave it out to continue, "
                "or pick another --study name."
            )
        update[name] = was
    return spec.model_copy(update={"traffic": spec.traffic.model_copy(update=update)})


def stored_sampler(w: Writer, study_name: str) -> str | None:
    """The sampler the study's last run used (stored with its spec), or None for a new study."""
    row = w.study_named(study_name)
    return None if row is None else str((row.spec.get("search") or {}).get("sampler", "tpe"))


#: The longest study name the database holds (``pareto_studies.name``).
MAX_STUDY_NAME: int = STUDY_NAME_LENGTH


def check_study_name(spec: SearchSpec) -> None:
    """Raises UsageError for a study name the database cannot hold, or an empty one (which would
    silently mean the task's name)."""
    if spec.study is not None and not spec.study.strip():
        raise UsageError("A study name cannot be empty; pass --study NAME, or leave it out for the task's name.")
    if len(spec.study_name) > MAX_STUDY_NAME:
        raise UsageError(f"A study name has at most {MAX_STUDY_NAME} characters; this one has {len(spec.study_name)}.")


def get_or_create_study(w: Writer, spec: SearchSpec) -> StudyRecord:
    """The study, created when new (another worker creating it at the same moment is fine), its spec the
    latest run's.

    Raises:
        UsageError: the study exists for another task or other objectives; a name the database cannot hold.
    """
    check_study_name(spec)
    spec = adopt_stored_traffic(w, spec)  # every writer of the spec (search, nightly, studies create)
    row = w.study_named(spec.study_name)
    spec_json = spec.model_dump(mode="json")
    if row is None:
        row, created = w.create_study(name=spec.study_name, task=spec.task, spec=spec_json)
        if created:
            return row
    if row.task != spec.task:
        change = source_change(row.task, spec.task)
        if change:
            raise UsageError(f"Study {spec.study_name!r} {change}; start a new study (--study NAME) for these.")
        raise UsageError(
            f"Study {spec.study_name!r} belongs to task {row.task!r}, not {spec.task!r}; pick another --study name."
        )
    _same_traffic(spec, row.spec)
    stored = ",".join(row.spec.get("objectives", DEFAULT_OBJECTIVE_NAMES))
    if stored != ",".join(spec.objectives):
        raise UsageError(
            f"Study {spec.study_name!r} optimizes {stored}, not {','.join(spec.objectives)}; continue it with "
            f"--objective {stored}, or pick another --study name."
        )
    return w.update_study(row, spec_json)  # the latest SLO and space; every trial keeps its own config


def source_change(stored_ref: str, ref: str) -> str | None:
    """What differs between two model references (the files' contents, or how the data is read), as the
    end of a sentence; None when either is not one or they name other files."""
    if not (is_source_ref(stored_ref) and is_source_ref(ref)):
        return None
    was, now = ModelSource.from_ref(stored_ref), ModelSource.from_ref(ref)
    if (was.model, was.data) != (now.model, now.data):
        return None
    pairs = ((was.model, was.model_sha256, now.model_sha256), (was.data, was.data_sha256, now.data_sha256))
    changed = [path for path, a, b in pairs if a[:DIGEST_CHARS] != b[:DIGEST_CHARS]]
    if changed:
        return f"measured other contents of {' and '.join(changed)} (a study measures one model on one data file)"
    settings = [
        f"{name}={getattr(was, name)!r}"
        for name in ("text_field", "image_field", "label_field", "metric", "padding", "max_length", "trust_remote_code")
        if getattr(was, name) != getattr(now, name)
    ]
    return f"read its data with {', '.join(settings)}" if settings else None


def _same_traffic(spec: SearchSpec, stored: dict[str, Any]) -> None:
    """A study is judged one call at a time or at a rate for good, and a study at a rate at one SLO: its
    trials' capacities were found at it.

    Raises:
        UsageError: the spec changes either.
    """
    rate, was = spec.traffic.qps, (stored.get("traffic") or {}).get("qps")
    name = spec.study_name
    if (rate is None) != (was is None):
        how = "one call at a time" if was is None else f"at {was:,.4g} requests/s"
        raise UsageError(f"Study {name!r} was searched {how}; pick another --study name to search it the other way.")
    if rate is not None and was is not None and not math.isclose(rate, was):
        raise UsageError(
            f"Study {name!r} was searched at {was:,.4g} requests/s; continue it at that rate (the reads answer any "
            "rate from its capacities: pareto best --qps), or pick another --study name."
        )
    slo = (stored.get("slo") or {}).get("p99")
    if rate is not None and slo is not None and not math.isclose(spec.slo.p99 or 0.0, slo):
        raise UsageError(
            f"Study {name!r} found its capacities at P99 ≤ {format_ms(slo)}; continue it at that SLO, or pick another "
            "--study name for another."
        )


def delete_study(name: str, *, db_url: str) -> dict[str, Any]:
    """Remove a study, pareto's rows (trials, measurements, runs, nightly history) and Optuna's study of
    that name, in one transaction: a failure halfway leaves both as they were.

    Raises:
        UsageError: no such study. StoreError: the database cannot be written.
    """
    engine = existing_engine(db_url)
    try:
        return storage.delete_study(engine, name)
    finally:
        engine.dispose()
