"""A study of 100 000 stored trials for the read-side benchmarks (queries, ``pareto serve``).

The rows are synthetic — nothing is measured here; the benchmarks time reading them — but shaped
like a real study's: one baseline, accuracy rising with latency plus noise (so the frontier holds a
few dozen configurations, as real ones do), every stored metric filled, one trial in twenty
confirmed (a second measurement that queries must prefer), failed and repeated trials with no
measurement, and a second environment holding a tenth of the trials.

    python benchmarks/big_study.py --db sqlite:///big.db [--trials 100000] [--study big]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import insert, select

from pareto.metrics import FIELD_NAMES
from pareto.store.engine import open_engine, resolve_url, upgrade
from pareto.store.models import Environment, Measurement, Run, Study, Trial

TECHNIQUES = ("prune_structured", "prune_unstructured", "lowrank", "int8_dynamic", "fp16", "compile")


def _environment(key: str, host: str) -> dict[str, Any]:
    details = {"device": "cpu", "device_name": "cpu", "cpu_model": "AMD EPYC (synthetic)", "threads": 2}
    return {
        "key": key,
        "device": "cpu",
        "device_name": "cpu",
        "driver": None,
        "torch_version": "2.13.0+cpu",
        "cpu_model": "AMD EPYC (synthetic)",
        "threads": 2,
        "hostname": host,
        "details": details,
    }


def _metrics(rng: random.Random, p99: float, accuracy: float, batch: int) -> dict[str, Any]:
    p50 = p99 / rng.uniform(1.2, 1.6)
    params = int(8_000_000 * p99 / 10)
    rounds = [p50 * rng.uniform(0.95, 1.05) for _ in range(20)]
    values: dict[str, Any] = {
        "accuracy": accuracy,
        "batch_size": batch,
        "latency_mean_ms": p50 * 1.05,
        "latency_p50_ms": p50,
        "latency_p50_lower_ms": p50 * 0.98,
        "latency_p50_upper_ms": p50 * 1.02,
        "latency_p90_ms": p50 * 1.2,
        "latency_p99_ms": p99,
        "latency_p99_lower_ms": p99 * 0.95,
        "latency_p99_upper_ms": p99 * rng.uniform(1.05, 1.4),
        "latency_p999_ms": p99 * 1.3,
        "p99_p50_ratio": p99 / p50,
        "samples": 680,
        "warmup": 50,
        "confidence": 0.99,
        "method": "synthetic rows for the read-side benchmarks; nothing was timed",
        "throughput_per_s": batch / (p50 * 1.05 / 1000),
        "params_bytes": params,
        "theoretical_bytes": params,
        "compression_ratio": 8_000_000 / max(params, 1),
        "activation_bytes": 262_144,
        "kv_cache_bytes": 0,
        "memory_bytes": params + 262_144,
        "flops": 2 * params,
        "bytes_moved": params + 262_144,
        "arithmetic_intensity": 2 * params / (params + 262_144),
        "rounds": 20,
        "discarded_rounds": 0,
        "round_spread": 0.03,
        "p99_bound": "pooled",
        "round_medians_ms": rounds,
    }
    return {name: values.get(name) for name in FIELD_NAMES}


def build(db: str, *, study: str = "big", trials: int = 100_000, seed: int = 0) -> float:
    """Create ``study`` with ``trials`` trials in ``db`` (nothing when it exists); returns the seconds taken."""
    started = time.perf_counter()
    url = resolve_url(db)
    engine = open_engine(url)
    upgrade(engine)
    rng = random.Random(seed)
    with engine.begin() as conn:
        if conn.scalar(select(Study.id).where(Study.name == study)) is not None:
            return 0.0
        env_ids = []
        for key, host in ((f"{study}-env-a", "bench-a"), (f"{study}-env-b", "bench-b")):
            found = conn.scalar(select(Environment.id).where(Environment.key == key))
            env_ids.append(
                found or conn.execute(insert(Environment).values(**_environment(key, host))).inserted_primary_key[0]
            )
        spec = {"task": "demo", "slo": {"p99": 7.0}, "objectives": ["accuracy", "p99"], "study_name": study}
        study_id = conn.execute(insert(Study).values(name=study, task="demo", spec=spec)).inserted_primary_key[0]
        run_ids = [
            conn.execute(
                insert(Run).values(
                    study_id=study_id, kind="search", environment_id=env, hostname="bench", pid=1, details={}
                )
            ).inserted_primary_key[0]
            for env in env_ids
        ]
        t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
        trial_rows, measurement_rows = [], []
        for number in range(trials):
            baseline = number == 0
            state = "COMPLETE" if baseline or rng.random() > 0.04 else rng.choice(["FAILED", "DUPLICATE"])
            if baseline:
                techniques: list[dict[str, Any]] = []
            else:
                chosen = rng.sample(TECHNIQUES, rng.randint(1, 3))
                techniques = [{"name": t, "params": {"ratio": round(rng.random(), 3)}} for t in chosen]
            config = {"techniques": techniques, "batch_size": 256}
            description = " + ".join(f"{t['name']}(ratio={t['params']['ratio']})" for t in techniques) or "baseline"
            trial_rows.append(
                {
                    "study_id": study_id,
                    "optuna_number": number,
                    "state": state,
                    "config": config,
                    "config_key": hashlib.sha256(f"{study}/{number}".encode()).hexdigest()[:16],
                    "description": f"{description} @ batch 256",
                    "is_baseline": baseline,
                    "batch_size": 256,
                    "started_at": t0 + timedelta(seconds=number),
                    "finished_at": t0 + timedelta(seconds=number + 1),
                }
            )
            if state != "COMPLETE":
                continue
            p99 = 10.0 if baseline else math.exp(rng.uniform(math.log(0.5), math.log(15.0)))
            accuracy = 0.978 if baseline else max(0.05, 0.98 - 0.45 * math.exp(-p99 / 1.5) - abs(rng.gauss(0, 0.08)))
            env = 1 if (not baseline and rng.random() < 0.1) else 0
            kinds = ("search", "confirm") if (baseline or rng.random() < 0.05) else ("search",)
            for kind in kinds:
                wobble = 1.0 if kind == "search" else rng.uniform(0.8, 1.25)
                measurement_rows.append(
                    {
                        "trial_id": number,
                        "environment_id": env_ids[env],
                        "run_id": run_ids[env],
                        "kind": kind,
                        "study_id": study_id,
                        # what the ORM sets on insert (pareto.store.models): the confirmation over the search
                        "preferred": kind == "confirm" or len(kinds) == 1,
                        # the second environment is the older one: queries default to the first
                        "created_at": t0 + timedelta(seconds=number + (1 if kind == "search" else trials), days=-env),
                        **_metrics(rng, p99 * wobble, accuracy, 256),
                    }
                )
            if baseline:  # the baseline of the second environment
                measurement_rows.append(
                    {
                        "trial_id": 0,
                        "environment_id": env_ids[1],
                        "run_id": run_ids[1],
                        "kind": "search",
                        "study_id": study_id,
                        "preferred": True,
                        "created_at": t0 - timedelta(days=1),
                        **_metrics(rng, 11.0, accuracy, 256),
                    }
                )
        ids = dict(
            conn.execute(
                insert(Trial).returning(Trial.optuna_number, Trial.id, sort_by_parameter_order=True), trial_rows
            ).all()
        )
        for row in measurement_rows:  # optuna number → the trial's row id; the older environment first
            row["trial_id"] = ids[row["trial_id"]]
        measurement_rows.sort(key=lambda row: (row["environment_id"] != env_ids[1], row["created_at"]))
        for start in range(0, len(measurement_rows), 10_000):
            conn.execute(insert(Measurement), measurement_rows[start : start + 10_000])
    engine.dispose()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="sqlite:///big.db")
    parser.add_argument("--study", default="big")
    parser.add_argument("--trials", type=int, default=100_000)
    args = parser.parse_args()
    seconds = build(args.db, study=args.study, trials=args.trials)
    print(f"study {args.study!r} with {args.trials} trials in {args.db} ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
