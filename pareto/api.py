"""The Python API: the same answers as the CLI, as plain dicts.

Example::

    import pareto
    pick = pareto.best(study="demo", slo_p99="7ms")
    print(pick["config"], pick["metrics"]["latency_p99_upper_ms"], pick["confirmation"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pareto.errors import NoFeasibleConfiguration, StoreError, UsageError
from pareto.explanation import NEAREST, explain_choice
from pareto.front import (
    DEFAULT_OBJECTIVE_NAMES,
    Candidate,
    fastest_first,
    judged,
    no_feasible,
    non_dominated,
    objective_columns,
    objective_metrics,
)
from pareto.limits import Constraints, Limits, distance_names, distances, slo_ms
from pareto.measure.environment import fingerprint
from pareto.measure.roofline import layer_types, list_profiles, load_profile, resolve_profile
from pareto.naming import BACKENDS
from pareto.slo import (
    DEFAULT_CONFIDENCE,
    DEFAULT_CONTENTION_LIMIT,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    MIN_SAMPLES_P99,
)
from pareto.store.engine import existing_engine, open_engine, read_engine, resolve_url, upgrade
from pareto.store.reads import Reader, reading
from pareto.store.records import EnvironmentRecord, StudyRecord
from pareto.store.storage import save_calibration
from pareto.study.bench import open_bench
from pareto.task import load_task
from pareto.tasks.source import score_name

if TYPE_CHECKING:
    from pareto.nightly_job.job import NightlyResult
    from pareto.spec import NightlySettings, SearchSpec
    from pareto.study.search import Reporter, SearchResult


def best(limits: Limits | None = None, /, *, db: str | None = None, **keywords: Any) -> dict[str, Any]:
    """The stored configuration with the highest accuracy that meets the SLOs (conservative bounds).

    Measurements are compared within one environment only; a trial's confirmed measurement (from
    ``confirm`` or the end of a search) is used over its search measurement. The database filters
    and orders the trials (one indexed query), so the answer does not load the study.

    Args:
        limits: The study, environment and limits (``pareto.Limits``); or give its fields as keywords:
            ``study``, ``environment``, ``slo_p99`` (``"7ms"``), ``min_accuracy``, ``max_memory``
            (``"2GB"``), ``min_throughput`` (``"500/s"``). Limits not given are the study's own.
        db: Database URL; defaults to ``PARETO_DB_URL`` or ``sqlite:///pareto.db``.

    Returns:
        ``{"study", "trial", "config", "metrics", "slo", "confirmation", "environment"}``;
        ``confirmation`` is None when the pick was never confirmed.

    Raises:
        NoFeasibleConfiguration: nothing stored meets the SLOs (the message names the closest).
        NotFound: no such study. UsageError: unknown environment, malformed SLO, or ``environment="all"``.
    """
    asked = Limits.of(limits, **keywords)
    if asked.environment == "all":
        raise UsageError("A pick compares measurements within one environment; name one with --environment KEY.")
    asked.given()  # a malformed limit is refused before the database is opened
    with reading(read_engine(db)) as r:
        row, env, known = _study_and_environment(r, asked)
        constraints = asked.constraints(row.spec)
        pick = r.best_candidate(row, env, constraints) if env is not None else None
        if pick is None:
            raise _nothing_feasible(r, row, env, constraints)
        result = judged(pick, constraints).to_dict()
    result["environment"] = {**result["environment"], **_environment_note(row.name, env.key if env else None, known)}
    return result


def frontier(limits: Limits | None = None, /, *, db: str | None = None, **keywords: Any) -> list[dict[str, Any]]:
    """The Pareto frontier (the study's objectives), fastest first, each with its SLO verdict.

    With ``environment="all"`` one frontier per environment, the latest first; otherwise the
    frontier of one environment (default: the study's latest). Only the objective columns of every
    trial are read; whole rows only for the frontier's members.
    """
    asked = Limits.of(limits, **keywords)
    asked.given()
    with reading(read_engine(db)) as r:
        row, env, known = _study_and_environment(r, asked)
        constraints = asked.constraints(row.spec)
        objectives = objective_metrics(row.spec.get("objectives", list(DEFAULT_OBJECTIVE_NAMES)))
        if env is not None:
            groups = [env]
        elif asked.environment == "all":
            found = (r.choose_environment(row, e["key"], known) for e in known)
            groups = [e for e in found if e is not None]
        else:
            groups = []
        note = _environment_note(row.name, env.key if env else None, known)
        rows = []
        for group in groups:
            for c in fastest_first(_front(r, row, group, objectives)):
                item = judged(c, constraints).to_dict()
                item["environment"] = {**item["environment"], **note}
                rows.append(item)
    return rows


def explain(limits: Limits | None = None, /, *, db: str | None = None, **keywords: Any) -> dict[str, Any]:
    """Why each frontier configuration was or was not chosen for these limits (``pareto.explain``).

    Returns:
        ``{"study", "environment", "constraints", "pick", "items", "nearest"}``: one item per frontier
        configuration, fastest first, with its verdict (chosen, misses, dominated, tie, incomparable)
        and one sentence; when nothing qualifies, ``nearest`` says what the closest configurations
        would need and the limits under which each would qualify.

    Raises:
        NotFound: no such study. UsageError: unknown environment, malformed SLO, ``environment="all"``.
    """
    asked = Limits.of(limits, **keywords)
    if asked.environment == "all":
        raise UsageError(
            "An explanation compares measurements within one environment; name one with --environment KEY."
        )
    asked.given()
    with reading(read_engine(db)) as r:
        row, env, known = _study_and_environment(r, asked)
        constraints = asked.constraints(row.spec)
        objectives = objective_metrics(row.spec.get("objectives", list(DEFAULT_OBJECTIVE_NAMES)))
        front = fastest_first(_front(r, row, env, objectives)) if env is not None else []
        pick = r.best_candidate(row, env, constraints) if env is not None else None
        nearest = _nearest(r, row, env, constraints, NEAREST) if pick is None else []
    result = explain_choice(front, pick, constraints, nearest)
    env_note = {"key": env.key if env else None, **_environment_note(row.name, env.key if env else None, known)}
    return {"study": row.name, "score": score_name(row.task), "environment": env_note, **result}


def _front(
    r: Reader, row: StudyRecord, env: EnvironmentRecord, objectives: tuple[tuple[str, bool], ...]
) -> list[Candidate]:
    """The frontier's members in one environment: the sweep runs on the objective columns of every
    trial, and only its members are read whole."""
    import numpy as np

    ids, columns = r.light_columns(row, env, [metric for metric, _ in objectives])
    points = objective_columns(columns, objectives)
    usable = np.flatnonzero(~np.isnan(points).any(axis=1)) if len(ids) else np.array([], dtype=int)
    chosen = non_dominated(points[usable], [maximize for _, maximize in objectives]) if len(usable) else []
    return r.candidates(row, env, measurement_ids=[ids[int(usable[i])] for i in chosen])


def _nothing_feasible(
    r: Reader, row: StudyRecord, env: EnvironmentRecord | None, constraints: Constraints
) -> NoFeasibleConfiguration:
    """The error for a study where nothing meets the constraints, naming the closest trial."""
    closest = _nearest(r, row, env, constraints, 1)
    if not closest:
        return NoFeasibleConfiguration(f"Study {row.name!r} has no completed trial to choose from yet.")
    return no_feasible(row.name, constraints, closest[0])


def _nearest(
    r: Reader, row: StudyRecord, env: EnvironmentRecord | None, constraints: Constraints, count: int
) -> list[Candidate]:
    """The ``count`` configurations closest to meeting the constraints (lowest distance, then the
    lowest trial number), read whole only once chosen."""
    import numpy as np

    ids, columns = r.light_columns(row, env, distance_names(constraints)) if env else ([], {})
    if not ids:
        return []
    gaps = distances(columns, constraints) if columns else np.zeros(len(ids))
    cutoff = np.sort(gaps)[min(count, len(gaps)) - 1]
    near = [ids[int(i)] for i in np.flatnonzero(gaps <= cutoff)]  # every tie at the cutoff, then by trial
    found = r.candidates(row, env, measurement_ids=near)
    by_id = dict(zip(ids, gaps, strict=True))
    found.sort(key=lambda c: (by_id[c.measurement_id or 0], c.trial))
    return found[:count]


def _study_and_environment(
    r: Reader, limits: Limits
) -> tuple[StudyRecord, EnvironmentRecord | None, list[dict[str, Any]]]:
    row = r.study(limits.study)
    known = r.environments(row)
    return row, r.choose_environment(row, limits.environment, known), known


def trials(limits: Limits | None = None, /, *, db: str | None = None, **keywords: Any) -> list[dict[str, Any]]:
    """Every completed trial of a study measured in one environment (default: the latest), in trial
    order, each with its SLO judgement (``slo``) and its preferred measurement (confirmed first).

    With ``environment="all"`` each trial once per environment it was measured in.
    """
    asked = Limits.of(limits, **keywords)
    asked.given()
    with reading(read_engine(db)) as r:
        row, env, known = _study_and_environment(r, asked)
        constraints = asked.constraints(row.spec)
        found = r.candidates(row, env) if env is not None or asked.environment == "all" else []
        note = _environment_note(row.name, env.key if env else None, known)
    result = []
    for c in found:
        item = judged(c, constraints).to_dict()
        item["environment"] = {**item["environment"], **note}
        result.append(item)
    return result


def studies(*, db: str | None = None) -> list[dict[str, Any]]:
    """Every study in the database with its trial counts."""
    with reading(read_engine(db)) as r:
        return r.study_summaries()


def search(
    spec: SearchSpec | None = None, *, db: str | None = None, reporter: Reporter | None = None, workers: int = 1
) -> SearchResult:
    """Run or continue a search (imports torch and Optuna); see ``pareto.spec.SearchSpec``.

    With ``workers`` > 1, that many local processes share ``spec.search.n_trials`` on one study
    (``pareto.study.workers``); the database must take several writers (SQLite on one host, PostgreSQL).
    """
    from pareto.spec import SearchSpec
    from pareto.study.search import run_search

    if workers > 1:
        from pareto.study.search import Quiet
        from pareto.study.workers import run_workers

        return run_workers(spec or SearchSpec(), db_url=resolve_url(db), workers=workers, reporter=reporter or Quiet())
    return run_search(spec or SearchSpec(), db_url=resolve_url(db), reporter=reporter)


def nightly(
    spec: SearchSpec,
    settings: NightlySettings | None = None,
    *,
    db: str | None = None,
    reporter: Reporter | None = None,
    notice: Any = None,
) -> NightlyResult:
    """Run one nightly job of ``spec.study_name`` (imports torch and Optuna); see ``pareto.nightly_job.job``.

    Raises:
        LockHeld: another nightly of the study is running (exit code 75).
    """
    from pareto.nightly_job.job import run_nightly
    from pareto.spec import NightlySettings

    return run_nightly(
        spec,
        settings or NightlySettings(),
        db_url=resolve_url(db),
        reporter=reporter,
        notice=notice or (lambda _: None),
    )


def create_study(spec: SearchSpec, *, db: str | None = None) -> str:
    """Create ``spec``'s study (pareto's row and Optuna's) before workers start; returns its name.

    Raises:
        UsageError: the study exists with another task or other objectives.
    """
    from pareto.study.studies import create_study as _create

    return _create(spec, db_url=resolve_url(db))


def history(*, study: str | None = None, db: str | None = None) -> list[dict[str, Any]]:
    """Every nightly run of a study, oldest first: status, pick before and after, regressions."""
    engine = existing_engine(resolve_url(db))
    with reading(engine) as r:
        return r.nightly_history(r.study(study))


def delete_study(name: str, *, db: str | None = None) -> dict[str, Any]:
    """Remove a study: pareto's rows (trials, measurements, runs, nightly history) and Optuna's study.

    Raises:
        UsageError: no such study.
    """
    from pareto.study.studies import delete_study as _delete  # pareto's rows and Optuna's, in one transaction

    return _delete(name, db_url=resolve_url(db))


def _environment_note(study: str, used: str | None, known: list[dict[str, Any]]) -> dict[str, Any]:
    """How many environments the study holds and, with several, which one is used and how to pick another."""
    note: dict[str, Any] = {"study_environments": len(known)}
    if len(known) > 1:
        others = ", ".join(e["key"] for e in known if e["key"] != used)
        which = f"environment {used}" if used else "each environment separately"
        note["note"] = (
            f"Study {study!r} was measured in {len(known)} environments; comparing within {which}. "
            f"Choose with --environment KEY (others: {others}) or --environment all (frontier only)."
        )
    return note


def confirm(
    limits: Limits | None = None,
    /,
    *,
    top: int = 3,
    margin: float = 1.5,
    device: str | None = None,
    threads: int | None = None,
    db: str | None = None,
    **keywords: Any,
) -> dict[str, Any]:
    """Re-measure a study's best feasible and near-feasible configurations with the baseline.

    The ``top`` frontier configurations that meet every limit but the P99 and whose P99 upper bound
    is within ``margin`` times the SLO are rebuilt from the task and timed with the baseline in
    interleaved rounds, in random order each round, in one process; the results are stored as
    confirmations, which ``best`` then prefers. Imports torch.

    Returns:
        ``{"study", "run", "environment", "guard", "note", "items"}``: each item with its trial,
        description, latency before and after, and P99 verdict before and after.

    ``limits`` (or its fields as keywords: ``study``, ``environment``, ``slo_p99``…) as ``best`` takes them.

    Raises:
        UsageError: unknown study, bad SLO, ``top < 1`` or ``margin < 1``.
    """
    from pareto.study.confirmation import confirm_study

    asked = Limits.of(limits, **keywords)
    if top < 1 or not margin >= 1:
        raise UsageError(f"--top must be at least 1 and --margin at least 1, got {top} and {margin}.")
    if asked.environment == "all":
        raise UsageError("Confirmation compares measurements within one environment; name one with --environment KEY.")
    url = resolve_url(db)
    engine = existing_engine(url)
    with reading(engine) as r:
        row = r.study(asked.study)
    name, spec = row.name, row.spec
    constraints = asked.constraints(spec)
    bench = _study_bench(url, row, device, threads)
    result = confirm_study(bench, name, constraints, top=top, margin=margin, environment=asked.environment)
    return result.to_dict()


def load_run(
    limits: Limits | None = None,
    /,
    *,
    trial: int | None = None,
    capacity: bool = False,
    requests: int | None = None,
    device: str | None = None,
    threads: int | None = None,
    db: str | None = None,
    **keywords: Any,
) -> dict[str, Any]:
    """A real load run of a configuration of a study searched at a request rate (``pareto load``).

    Requests of one sample arrive on a seeded Poisson schedule at the rate (``qps``; default the study's),
    sent by a generator thread to the configuration (trial ``trial``, else the pick) served behind the
    dynamic batcher with the settings its simulation chose, each timed from its scheduled arrival to its
    batch's completion; stored. With ``capacity``, the highest rate whose run is valid with its request
    P99 bound within the SLO, by load runs bisecting around the simulated capacity. Imports torch.

    Returns:
        ``{"study", "trial", "description", "slo_ms", "qps", "simulated_p99_upper_ms", "meets", "load_run"}``,
        or with ``capacity`` ``{..., "simulated_capacity_qps", "load_capacity_qps", "max_batch",
        "max_wait_ms", "runs"}``.

    Raises:
        UsageError: a study searched without a rate, no such trial, a bad limit.
        NoFeasibleConfiguration: no trial named and nothing meets the limits.
    """
    from pareto.study.load_runs import load_study

    asked = Limits.of(limits, **keywords)
    asked.given()
    url = resolve_url(db)
    with reading(existing_engine(url)) as r:
        row = r.study(asked.study)
    constraints = asked.constraints(row.spec)
    bench = _study_bench(url, row, device, threads)
    return load_study(bench, row, constraints, trial=trial, capacity=capacity, requests=requests)


def _study_bench(url: str, row: StudyRecord, device: str | None, threads: int | None) -> Any:
    """The bench a stored study measures on: its task, its stored method (``device``, ``threads`` may
    override where it runs)."""
    from pareto.study.measure_one import stored_measure

    return open_bench(url, load_task(row.task), stored_measure(row.spec, device, threads), with_profile=False)


def measure(
    task: str = "demo",
    *,
    techniques: list[str] | tuple[str, ...] = (),
    batch_size: int | None = None,
    backend: str = "eager",
    slo_p99: str | float | None = None,
    hardware: str | None = "auto",
    device: str = "auto",
    threads: int | None = None,
    samples: int = MIN_SAMPLES_P99,
    rounds: int = DEFAULT_ROUNDS,
    warmup: int = DEFAULT_WARMUP,
    confidence: float = DEFAULT_CONFIDENCE,
    contention_limit: float | None = DEFAULT_CONTENTION_LIMIT,
    sweep: bool = False,
    adaptive_budget: str | None = "20s",
    db: str | None = None,
) -> dict[str, Any]:
    """Measure one configuration outside any study, in interleaved rounds with the uncompressed model.

    Args:
        task: Built-in task name or ``package.module:factory``.
        techniques: ``"name"`` or ``"name:key=value,key=value"`` each, e.g. ``"prune_structured:ratio=0.5"``.
        batch_size: Defaults to the task's own.
        backend: Where the configuration is served and measured: ``"eager"``, ``"compile"`` or
            ``"onnxruntime"`` (the baseline beside it is always the uncompressed model on eager).
        hardware: Roofline profile: a name from ``pareto hardware``, ``host``, ``auto`` or None.
        rounds: Rounds the ``samples`` calls are split into; the contention probe runs between them.
        contention_limit: Probe slowdown over its quiet time that discards a round; None: no guard.
        adaptive_budget: With an SLO, keep timing past ``samples`` until the P99 verdict is decided,
            up to this long (``"20s"``); None times ``samples`` calls only.
        db: Where ``host`` calibrations and the probe's quiet time are read from (nothing is written).

    Returns:
        ``{"config", "metrics", "environment", "notes"}``; ``metrics`` adds ``speedup_p50``/``speedup_p99``
        over the baseline timed in the same rounds and, with an SLO, ``p99_verdict``.

    Raises:
        UsageError: bad task, option, batch size or device; MachineBusy: the machine stayed busy.
    """
    from pydantic import ValidationError

    from pareto.compress import Config
    from pareto.study.measure_one import measure_beside_baseline, measure_settings, parse_technique_option

    p99_ms = slo_ms(slo_p99)
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"Batch size must be at least 1, got {batch_size}.")
    chosen = tuple(parse_technique_option(option) for option in techniques)
    loaded = load_task(task)
    settings = measure_settings(
        device=device,
        threads=threads,
        samples=samples,
        rounds=min(rounds, samples),
        warmup=warmup,
        confidence=confidence,
        contention_limit=contention_limit,
        throughput_sweep=sweep,
        hardware=hardware,
        adaptive_budget=adaptive_budget,
    )
    if backend not in BACKENDS:
        raise UsageError(f"Unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}.")
    try:
        config = Config(techniques=chosen, batch_size=batch_size or loaded.batch_size, backend=backend)
    except ValueError as exc:  # a technique that does not run on this backend
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise UsageError(message.removeprefix("Value error, ").rstrip(".") + ".") from None
    return measure_beside_baseline(loaded, config, settings, p99_ms, db)


def remeasure(
    *,
    study: str | None = None,
    trial: int,
    slo_p99: str | float | None = None,
    device: str | None = None,
    db: str | None = None,
) -> dict[str, Any]:
    """Measure a stored trial again with its stored method, beside its stored figures.

    The trial's configuration is rebuilt from the study's task and timed with the baseline in
    interleaved rounds (the stored rounds, calls, warm-up, confidence and thread count). The
    measurement is stored (kind "remeasure") and compared with the stored one.

    Returns:
        ``{"config", "metrics", "environment", "stored", "verdict_holds", "verdict", "notes"}``:
        ``stored`` is the measurement ``best`` would use, ``verdict`` the P99 verdicts stored and now,
        ``verdict_holds`` whether they agree (None without an SLO).

    Raises:
        UsageError: unknown study or trial, a trial that was never measured; MachineBusy: the
            machine stayed busy through the rounds.
    """
    from pareto.study.measure_one import remeasure_trial

    url = resolve_url(db)
    engine = existing_engine(url)
    with reading(engine) as r:
        row = r.study(study)
        trial_id, stored = r.trial_measurements(row, trial)
    name, task_name, spec, study_id = row.name, row.task, row.spec, row.id
    p99_ms = slo_ms(slo_p99) if slo_p99 is not None else spec.get("slo", {}).get("p99")
    task = load_task(task_name)
    return remeasure_trial(url, task, study_id, name, (trial, trial_id), stored, p99_ms, device)


def _profile_for(hardware: str | None, db: str | None, env: dict[str, Any]) -> Any:
    """Resolve a roofline profile, reading calibrations from the database when one exists."""
    calibration = None
    if hardware in {"auto", "host"}:
        try:
            engine = read_engine(db)
            with reading(engine) as r:
                calibration = r.host_calibration(env)[0]
        except StoreError:
            calibration = None
    return resolve_profile(hardware, fingerprint=env, calibration=calibration)[0]


def calibrate(
    *, device: str = "auto", threads: int | None = None, seconds: float = 5.0, db: str | None = None
) -> dict[str, Any]:
    """Measure this machine's peak FLOP/s per dtype and its memory bandwidth; store them as its profile.

    Returns:
        The profile as a dict (with ``ridge_flop_per_byte`` per dtype) and the environment key.
    """
    from pareto.devices import resolve_device
    from pareto.measure.calibrate import calibrate as run

    resolved = resolve_device(device)
    import torch

    used_threads = threads or torch.get_num_threads()
    engine = open_engine(resolve_url(db))
    upgrade(engine)
    profile = run(resolved, seconds_budget=seconds, threads=used_threads)
    env = fingerprint(resolved, used_threads)
    save_calibration(
        engine,
        env,
        peak_flops=dict(profile.peak_flops),
        bandwidth=profile.memory_bandwidth_bytes_per_s,
        method=profile.method or "",
    )
    return {**profile.to_dict(), "environment": env}


def hardware() -> list[dict[str, Any]]:
    """The datasheet profiles in configs/hardware, each with ``ridge_flop_per_byte`` per dtype."""
    return [load_profile(name).to_dict() for name in list_profiles()]


def techniques(*, device: str = "auto", task: str | None = None) -> list[dict[str, Any]]:
    """Every technique with ``name``, ``family``, ``available`` and ``reason`` on ``device`` (for ``task``)."""
    from pareto.compress import describe_techniques
    from pareto.devices import resolve_device

    return describe_techniques(resolve_device(device), load_task(task) if task else None)


def roofline(
    task: str = "demo",
    *,
    hardware: str | None = "auto",
    batch_size: int | None = None,
    device: str = "auto",
    db: str | None = None,
) -> dict[str, Any]:
    """Where each layer type of a model sits on the roofline: FLOPs, bytes, intensity, regime.

    Raises:
        UsageError: no profile could be found (name one, or run ``pareto calibrate``).
    """
    import torch

    from pareto.devices import on_device, resolve_device
    from pareto.measure.compute import compute_dtype, layer_costs

    resolved = resolve_device(device)
    # the environment `pareto calibrate` stored: same device, torch's default thread count
    env = fingerprint(resolved, torch.get_num_threads())
    profile = _profile_for(hardware, db, env)
    if profile is None:
        raise UsageError("No hardware profile: pass --hardware NAME (see 'pareto hardware') or run 'pareto calibrate'.")
    loaded = on_device(load_task(task), resolved)  # the user's model stays where it is; the view's copy is here
    model = loaded.model
    dtype = compute_dtype(model)
    if dtype not in profile.peak_flops:
        raise UsageError(f"Profile {profile.name!r} has no {dtype} peak; pick another with --hardware.")
    rows = layer_types(layer_costs(model, loaded.example_input(batch_size or loaded.batch_size)), profile, dtype)
    return {
        "task": loaded.name,
        "batch_size": batch_size or loaded.batch_size,
        "dtype": dtype,
        "hardware": profile.to_dict(),
        "ridge_flop_per_byte": profile.ridge_flop_per_byte(dtype),
        "layers": rows,
    }
