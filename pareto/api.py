"""The Python API: the same answers as the CLI, as plain dicts.

Example::

    import pareto
    pick = pareto.best(study="demo", slo_p99="7ms")
    print(pick["config"], pick["metrics"]["latency_p99_upper_ms"])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.frontier import Candidate, Constraints, objective_metrics, select_best
from pareto.frontier import frontier as _frontier
from pareto.measure.stats import MIN_SAMPLES_P99
from pareto.store import queries
from pareto.store.engine import open_engine, require_schema, resolve_url, session_scope
from pareto.store.models import Study
from pareto.units import parse_duration_ms, parse_size_bytes

if TYPE_CHECKING:
    from pareto.search import Reporter, SearchResult
    from pareto.spec import SearchSpec


def best(
    *,
    study: str | None = None,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    db: str | None = None,
) -> dict[str, Any]:
    """The stored configuration with the highest accuracy that meets the SLOs (conservative bounds).

    Args:
        study: Study name; may be omitted when the database holds one study.
        slo_p99: P99 bound, ``"7ms"`` or milliseconds; defaults to the study's own SLO.
        min_accuracy: Accuracy floor; defaults to the study's.
        max_memory: Parameter memory budget, ``"2GB"`` or bytes; defaults to the study's.
        db: Database URL; defaults to ``PARETO_DB_URL`` or ``sqlite:///pareto.db``.

    Raises:
        NoFeasibleConfiguration: nothing stored meets the SLOs (the message names the closest).
        UsageError: unknown study or malformed SLO.
    """
    loaded = _load(study, slo_p99, min_accuracy, max_memory, db)
    return select_best(loaded.candidates, loaded.constraints, study=loaded.name).to_dict()


def frontier(
    *,
    study: str | None = None,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    db: str | None = None,
) -> list[dict[str, Any]]:
    """The Pareto frontier (accuracy up, P99 upper bound down), fastest first, each with its SLO verdict."""
    from pareto.frontier import evaluate

    loaded = _load(study, slo_p99, min_accuracy, max_memory, db)
    front = _frontier(loaded.candidates, objective_metrics(loaded.objectives))
    for c in front:
        evaluate(c, loaded.constraints)
    return [c.to_dict() for c in front]


def studies(*, db: str | None = None) -> list[dict[str, Any]]:
    """Every study in the database with its trial counts."""
    engine = open_engine(resolve_url(db), create=False)
    require_schema(engine)
    with session_scope(engine) as session:
        return queries.study_summaries(session)


def search(spec: SearchSpec | None = None, *, db: str | None = None, reporter: Reporter | None = None) -> SearchResult:
    """Run or continue a search (imports torch and Optuna); see ``pareto.spec.SearchSpec``."""
    from pareto.search import run_search
    from pareto.spec import SearchSpec as _Spec

    return run_search(spec or _Spec(), db_url=resolve_url(db), reporter=reporter)


@dataclass
class _Loaded:
    candidates: list[Candidate]
    constraints: Constraints
    name: str
    objectives: list[str]


def _load(
    study: str | None,
    slo_p99: str | float | None,
    min_accuracy: float | None,
    max_memory: str | int | None,
    db: str | None,
) -> _Loaded:
    p99_ms = _duration(slo_p99)
    memory = parse_size_bytes(max_memory) if isinstance(max_memory, str) else max_memory
    engine = open_engine(resolve_url(db), create=False)
    require_schema(engine)
    with session_scope(engine) as session:
        row: Study = queries.get_study(session, study) if study else queries.default_study(session)
        stored_slo = row.spec.get("slo", {})
        stored_budget = row.spec.get("budget", {})
        constraints = Constraints(
            p99_ms=p99_ms if p99_ms is not None else stored_slo.get("p99"),
            min_accuracy=min_accuracy if min_accuracy is not None else stored_slo.get("min_accuracy"),
            max_memory_bytes=memory if memory is not None else stored_budget.get("max_memory"),
            min_throughput_per_s=stored_slo.get("min_throughput"),
            min_samples=MIN_SAMPLES_P99,
        )
        return _Loaded(
            candidates=queries.candidates(session, row),
            constraints=constraints,
            name=row.name,
            objectives=row.spec.get("objectives", ["accuracy", "p99"]),
        )


def _duration(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration_ms(value)
    if value <= 0:
        from pareto.errors import UsageError

        raise UsageError(f"P99 SLO {value!r} ms must be positive.")
    return float(value)


def measure(
    task: str = "demo",
    *,
    techniques: list[str] | tuple[str, ...] = (),
    batch_size: int | None = None,
    slo_p99: str | float | None = None,
    hardware: str | None = "auto",
    device: str = "auto",
    threads: int | None = None,
    samples: int = 662,
    warmup: int = 50,
    sweep: bool = False,
    adaptive_budget: str | None = "20s",
    db: str | None = None,
) -> dict[str, Any]:
    """Measure one configuration outside any study, beside the uncompressed model measured in the same run.

    Args:
        task: Built-in task name or ``package.module:factory``.
        techniques: ``"name"`` or ``"name:key=value,key=value"`` each, e.g. ``"prune_structured:ratio=0.5"``.
        batch_size: Defaults to the task's own.
        hardware: Roofline profile: a name from ``pareto hardware``, ``host``, ``auto`` or None.
        adaptive_budget: With an SLO, keep timing past ``samples`` until the P99 verdict is decided,
            up to this long (``"20s"``); None times ``samples`` calls only.
        db: Where ``host`` calibrations are read from (nothing is written).

    Returns:
        ``{"config", "metrics", "environment"}``; ``metrics`` adds ``speedup_p50``/``speedup_p99`` over
        the baseline and, with an SLO, ``p99_verdict``.

    Raises:
        UsageError: bad task, technique option, batch size or device.
    """
    from pareto.assess import assess, check_input_fits
    from pareto.compress import Config
    from pareto.measure.environment import environment_key, fingerprint
    from pareto.measure.latency import resolve_device
    from pareto.measure.memory import theoretical_bytes
    from pareto.spec import Measure
    from pareto.task import load_task

    p99_ms = _duration(slo_p99)
    if batch_size is not None and batch_size < 1:
        from pareto.errors import UsageError

        raise UsageError(f"Batch size must be at least 1, got {batch_size}.")
    chosen = tuple(parse_technique_option(option) for option in techniques)
    loaded = load_task(task)
    resolved = resolve_device(device)
    import torch

    used_threads = threads or torch.get_num_threads()
    config = Config(techniques=chosen, batch_size=batch_size or loaded.batch_size)
    for technique in config.techniques:
        reason = technique.available(resolved, loaded)
        if reason is not None:
            from pareto.errors import UsageError

            raise UsageError(f"Technique {technique.name!r} cannot run here: {reason.rstrip('.')}.")
    check_input_fits(loaded)
    env = fingerprint(resolved, used_threads)
    profile = _profile_for(hardware, db, env, resolved)
    settings = Measure(device=resolved, threads=used_threads, samples=samples, warmup=warmup,
                       throughput_sweep=sweep, hardware=hardware, adaptive_budget=adaptive_budget)
    base_bytes = theoretical_bytes(loaded.model)
    kwargs = dict(device=resolved, threads=used_threads, measure=settings, slo_ms=p99_ms, profile=profile,
                  baseline_theoretical_bytes=base_bytes)
    result = assess(loaded, config, **kwargs)  # type: ignore[arg-type]
    baseline = result if config.is_baseline else assess(loaded, Config(batch_size=config.batch_size), **kwargs)  # type: ignore[arg-type]
    metrics = dict(result.metrics)
    metrics["speedup_p50"] = baseline.metrics["latency_p50_ms"] / metrics["latency_p50_ms"]
    metrics["speedup_p99"] = baseline.metrics["latency_p99_ms"] / metrics["latency_p99_ms"]
    metrics["accuracy_delta"] = metrics["accuracy"] - baseline.metrics["accuracy"]
    metrics["baseline_latency_p50_ms"] = baseline.metrics["latency_p50_ms"]
    metrics["baseline_latency_p99_ms"] = baseline.metrics["latency_p99_ms"]
    metrics["compile_s"] = result.compile_s
    if p99_ms is not None:
        from pareto.frontier import p99_verdict

        metrics["p99_verdict"] = p99_verdict(metrics, p99_ms)
        metrics["slo_p99_ms"] = p99_ms
    return {
        "config": config.to_dict(),
        "metrics": metrics,
        "environment": {**env, "key": environment_key(env)},
        "notes": result.notes,
    }


def parse_technique_option(option: str) -> Any:
    """``"prune_structured:ratio=0.5"`` → the technique; values are read as int, float, bool or text.

    Raises:
        UsageError: a malformed option, an unknown technique or parameter, or a value out of range.
    """
    from pareto.compress import get_technique
    from pareto.errors import UsageError

    name, _, rest = option.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UsageError(
                f"Cannot read technique option {option!r}; write it like 'prune_structured:ratio=0.5'."
            )
        params[key.strip()] = _scalar(value.strip())
    return get_technique(name.strip(), params)


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    if lowered in {"none", "null"}:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _profile_for(hardware: str | None, db: str | None, env: dict[str, Any], device: str) -> Any:
    """Resolve a roofline profile, reading calibrations from the database when one exists."""
    from pareto.errors import StoreError

    session_engine = None
    if hardware in {"auto", "host"}:
        try:
            session_engine = open_engine(resolve_url(db), create=False)
            require_schema(session_engine)
        except StoreError:
            session_engine = None
    if session_engine is None:
        return queries.resolve_profile(None, hardware, fingerprint=env)[0]
    with session_scope(session_engine) as session:
        return queries.resolve_profile(session, hardware, fingerprint=env)[0]


def calibrate(*, device: str = "auto", threads: int | None = None, seconds: float = 5.0,
              db: str | None = None) -> dict[str, Any]:
    """Measure this machine's peak FLOP/s per dtype and its memory bandwidth; store them as its profile.

    Returns:
        The profile as a dict (with ``ridge_flop_per_byte`` per dtype) and the environment key.
    """
    from pareto.measure.calibrate import calibrate as run
    from pareto.measure.environment import fingerprint
    from pareto.measure.latency import resolve_device
    from pareto.store.engine import upgrade
    from pareto.store.models import HardwareCalibration

    resolved = resolve_device(device)
    import torch

    used_threads = threads or torch.get_num_threads()
    engine = open_engine(resolve_url(db))
    upgrade(engine)
    profile = run(resolved, seconds_budget=seconds, threads=used_threads)
    env = fingerprint(resolved, used_threads)
    with session_scope(engine) as session:
        env_id = queries.environment_id(session, env)
        session.add(HardwareCalibration(
            environment_id=env_id,
            peak_flops=dict(profile.peak_flops),
            memory_bandwidth_bytes_per_s=profile.memory_bandwidth_bytes_per_s,
            method=profile.method or "",
        ))
    return {**profile.to_dict(), "environment": env}


def hardware() -> list[dict[str, Any]]:
    """The datasheet profiles in configs/hardware, each with ``ridge_flop_per_byte`` per dtype."""
    from pareto.measure.roofline import list_profiles, load_profile

    return [load_profile(name).to_dict() for name in list_profiles()]


def techniques(*, device: str = "auto", task: str | None = None) -> list[dict[str, Any]]:
    """Every technique with ``name``, ``family``, ``available`` and ``reason`` on ``device`` (for ``task``)."""
    from pareto.compress.base import describe_techniques
    from pareto.measure.latency import resolve_device
    from pareto.task import load_task

    return describe_techniques(resolve_device(device), load_task(task) if task else None)


def roofline(
    task: str = "demo", *, hardware: str | None = "auto", batch_size: int | None = None, device: str = "auto",
    db: str | None = None,
) -> dict[str, Any]:
    """Where each layer type of a model sits on the roofline: FLOPs, bytes, intensity, regime.

    Raises:
        UsageError: no profile could be found (name one, or run ``pareto calibrate``).
    """
    from collections import defaultdict

    from pareto.errors import UsageError
    from pareto.measure.compute import compute_dtype, layer_costs
    from pareto.measure.environment import fingerprint
    from pareto.measure.latency import resolve_device
    from pareto.measure.roofline import regime
    from pareto.task import load_task

    import torch

    resolved = resolve_device(device)
    # the environment `pareto calibrate` stored: same device, torch's default thread count
    env = fingerprint(resolved, torch.get_num_threads())
    profile = _profile_for(hardware, db, env, resolved)
    if profile is None:
        raise UsageError("No hardware profile: pass --hardware NAME (see 'pareto hardware') or run 'pareto calibrate'.")
    loaded = load_task(task)
    model = loaded.model.to(resolved).eval()
    dtype = compute_dtype(model)
    if dtype not in profile.peak_flops:
        raise UsageError(f"Profile {profile.name!r} has no {dtype} peak; pick another with --hardware.")
    ridge = profile.ridge_flop_per_byte(dtype)
    by_type: dict[str, dict[str, Any]] = defaultdict(lambda: {"layers": 0, "flops": 0, "bytes_moved": 0})
    for layer in layer_costs(model, loaded.example_input(batch_size or loaded.batch_size)):
        if layer.flops == 0 and layer.weight_bytes == 0:
            continue  # containers and free elementwise ops: nothing to place on the roofline
        row = by_type[layer.type]
        row["layers"] += 1
        row["flops"] += layer.flops
        row["bytes_moved"] += layer.bytes_moved
    rows = []
    for layer_type, row in sorted(by_type.items(), key=lambda kv: -kv[1]["flops"]):
        intensity = row["flops"] / row["bytes_moved"] if row["bytes_moved"] else float("inf")
        kind = regime(intensity, profile, dtype)
        rows.append({
            "type": layer_type, **row, "arithmetic_intensity": intensity, "regime": kind,
            "pays_off": "fewer bytes: quantization, smaller layers" if kind == "memory-bound"
            else "fewer FLOPs: structured pruning, low-rank, distillation",
        })
    return {"task": loaded.name, "batch_size": batch_size or loaded.batch_size, "dtype": dtype,
            "hardware": profile.to_dict(), "ridge_flop_per_byte": ridge, "layers": rows}
