"""Measuring one configuration beside the uncompressed model, outside a search: what ``pareto measure``
does for a configuration named on the command line and, with ``--trial``, for a stored trial measured
again with its stored method (both through ``bench.time_together``, the one interleaved timing)."""

from __future__ import annotations

from typing import Any

from pareto.errors import UsageError
from pareto.front import Candidate
from pareto.limits import p99_verdict
from pareto.locks import gpu_work
from pareto.machine import environment_key
from pareto.metrics import Metrics
from pareto.slo import DEFAULT_ROUNDS, MIN_CONFIDENCE
from pareto.spec import Measure
from pareto.store.engine import resolve_url
from pareto.study.bench import (
    baseline_trial,
    finish_run,
    open_bench,
    start_run,
    store_measurement,
    stored_metrics,
    time_together,
)


def stored_measure(spec: dict[str, Any], device: str | None, threads: int | None) -> Any:
    """The study's own measurement settings, with the device and threads given here."""
    stored = dict(spec.get("measure") or {})
    stored.update({k: v for k, v in {"device": device, "threads": threads}.items() if v is not None})
    known = set(Measure.model_fields)
    return Measure.model_validate({k: v for k, v in stored.items() if k in known}, context={"stored": True})


def measure_settings(**values: Any) -> Any:
    """Measurement settings checked as a spec's are (durations such as "20s" parsed)."""
    return Measure.model_validate(values)


def measure_beside_baseline(
    task: Any, config: Any, settings: Any, p99_ms: float | None, db: str | None
) -> dict[str, Any]:
    """``config`` and the uncompressed model timed together, then measured on the other axes.

    Raises:
        UsageError: ``config`` cannot run on the device; BaselineFailed: the uncompressed model cannot.
        OutOfMemory: building, warming, timing or evaluating ran out of device memory: one sentence
            naming the configuration, the device and the batch, with the device's memory freed.
    """
    from pareto.compress import Config, why_not_here
    from pareto.study.assess import device_memory, preflight

    bench = open_bench(resolve_url(db), task, settings, read_only=True)
    reason = why_not_here(config, bench.task, bench.device)
    if reason is not None:
        raise UsageError(f"{config.describe()} cannot run here: {reason}.")
    base_config = Config(batch_size=config.batch_size)
    with gpu_work(bench.device, what="pareto measure"):
        preflight(bench.task, [config.batch_size], bench.device)
        with device_memory([config, base_config], bench.device):
            return _measured(bench, config, base_config, settings, p99_ms)


def _measured(bench: Any, config: Any, base_config: Any, settings: Any, p99_ms: float | None) -> dict[str, Any]:
    """``measure_beside_baseline``'s work, in a frame of its own: once an error has left it, its
    models can be let go of."""
    from pareto.measure.memory import theoretical_bytes
    from pareto.study.assess import complete, device_memory, round_plan

    timed = time_together(bench, [config, base_config], plan=round_plan(settings, p99_ms), probe=bench.probe())
    common = dict(
        device=bench.device,
        threads=bench.threads,
        measure=settings,
        slo_ms=p99_ms,
        profile=bench.profile,
        baseline_theoretical_bytes=theoretical_bytes(bench.task.model),
    )
    (built, latency), (base, base_latency) = timed
    with device_memory(config, bench.device):
        result = complete(bench.task, config, built.served, latency, **common)
    with device_memory(base_config, bench.device):
        baseline = (
            result if config.is_baseline else complete(bench.task, base_config, base.served, base_latency, **common)
        )
    metrics = _with_speedups(result.metrics.to_dict(), baseline.metrics.to_dict(), p99_ms)
    metrics["compile_s"] = built.compile_s
    env = bench.fingerprint
    return {
        "config": config.to_dict(),
        "metrics": metrics,
        "environment": {**env, "key": environment_key(env)},
        "notes": result.notes + ([bench.profile_note] if bench.profile_note else []),
    }


def _with_speedups(metrics: dict[str, Any], baseline: dict[str, Any], p99_ms: float | None) -> dict[str, Any]:
    """Speedups and accuracy change over a baseline measured in the same rounds, and the P99 verdict."""
    metrics = dict(metrics)
    metrics["speedup_p50"] = baseline["latency_p50_ms"] / metrics["latency_p50_ms"]
    metrics["speedup_p99"] = baseline["latency_p99_ms"] / metrics["latency_p99_ms"]
    metrics["accuracy_delta"] = metrics["accuracy"] - baseline["accuracy"]
    metrics["baseline_latency_p50_ms"] = baseline["latency_p50_ms"]
    metrics["baseline_latency_p99_ms"] = baseline["latency_p99_ms"]
    if p99_ms is not None:
        metrics["p99_verdict"] = p99_verdict(metrics, p99_ms)
        metrics["slo_p99_ms"] = p99_ms
    return metrics


def remeasure_trial(
    url: str,
    task: Any,
    study_id: int,
    study: str,
    trial: tuple[int, int],
    stored: list[Candidate],
    p99_ms: float | None,
    device: str | None,
) -> dict[str, Any]:
    """Time a stored trial (number, row id) and the baseline in interleaved rounds; store; compare."""
    from pareto.compress import Config, why_not_here
    from pareto.study.assess import remeasured, round_plan

    settings = _method_of(stored[0], device)
    bench = open_bench(url, task, settings, with_profile=False)
    here = [c for c in stored if c.environment["key"] == _key_of(bench.fingerprint)]
    before = (here or stored)[0]
    config = Config.from_dict(before.config)
    why = why_not_here(config, bench.task, bench.device)
    if why is not None:
        raise UsageError(f"Trial {trial[0]} ({before.description}) cannot be measured here: {why}.")
    run = start_run(bench, kind="remeasure", study_id=study_id)
    (number, trial_id), base_id = trial, baseline_trial(bench, study_id, config.batch_size)
    configs = [config]
    if base_id is not None and base_id != trial_id:
        configs.append(Config(batch_size=config.batch_size))
    latencies = [
        latency for _, latency in time_together(bench, configs, plan=round_plan(settings, None), probe=run.probe)
    ]
    now = remeasured(Metrics.from_dict(before.metrics), latencies[0])
    store_measurement(bench, run, trial_id, now, kind="remeasure")
    base_now, notes = now, []
    base_stored = stored_metrics(bench, base_id) if len(latencies) > 1 and base_id is not None else None
    if base_stored is not None and base_id is not None:
        if latencies[1].busy:
            notes.append("The baseline's rounds were given up as busy: no speedups this time.")
        else:
            base_now = remeasured(base_stored, latencies[1])
            store_measurement(bench, run, base_id, base_now, kind="baseline")
    finish_run(bench, run, remeasured=number)
    if not here:
        notes.append(
            f"Trial {number} was measured in environment {before.environment['key']}, not this one "
            f"({_key_of(bench.fingerprint)}): the figures are not strictly comparable."
        )
    return _remeasure_card(study, number, before, now, base_now, p99_ms, bench.fingerprint, notes)


def _remeasure_card(
    study: str,
    number: int,
    before: Candidate,
    now: Any,
    base_now: Any,
    p99_ms: float | None,
    fingerprint: dict[str, Any],
    notes: list[str],
) -> dict[str, Any]:
    metrics = _with_speedups(now.to_dict(), base_now.to_dict(), p99_ms)
    if base_now is now:
        metrics["speedup_p50"] = metrics["speedup_p99"] = metrics["accuracy_delta"] = None
    verdicts = {"stored": p99_verdict(before.metrics, p99_ms) if p99_ms else None, "now": metrics.get("p99_verdict")}
    return {
        "config": before.config,
        "metrics": metrics,
        "environment": {**fingerprint, "key": _key_of(fingerprint)},
        "stored": {**before.metrics, "environment": before.environment, "confirmation": before.confirmation},
        "verdict": verdicts,
        "verdict_holds": verdicts["stored"] == verdicts["now"] if p99_ms else None,
        "study": study,
        "trial": number,
        "notes": notes,
    }


def _method_of(stored: Candidate, device: str | None) -> Any:
    """A stored measurement's method as settings: its rounds, calls, warm-up, confidence, threads."""
    m = stored.metrics
    samples = int(m["samples"])
    return Measure(
        device=device or stored.environment["device"],
        threads=stored.environment["threads"],
        samples=samples,
        rounds=min(m.get("rounds") or DEFAULT_ROUNDS, samples),
        warmup=m["warmup"],
        confidence=max(m["confidence"], MIN_CONFIDENCE),
        hardware=None,
    )


def _key_of(fingerprint: dict[str, Any]) -> str:
    return environment_key(fingerprint)


def parse_technique_option(option: str) -> Any:
    """``"prune_structured:ratio=0.5"`` → the technique; values are read as int, float, bool or text.

    Raises:
        UsageError: a malformed option, an unknown technique or parameter, or a value out of range.
    """
    from pareto.compress import get_technique

    name, _, rest = option.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UsageError(f"Cannot read technique option {option!r}; write it like 'prune_structured:ratio=0.5'.")
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
