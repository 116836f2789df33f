"""A configuration's load-run capacity over several arrival seeds (issue 45: "capacity over 3 seeds").

For a stored configuration of a study searched at a rate (the pick by default), it finds the load-run
capacity as the search does (bisection on the rate around the simulated capacity, the study's
``traffic.load_replications`` runs per rate, the served batcher and threads), once per study seed:
each seed gives other schedules to every run. The runs are stored as load runs of the configuration; its
load-run capacity stays the one the search found. It prints the capacities, their spread (max/min − 1) and the simulated capacity.

    .venv/bin/python benchmarks/capacity_seeds.py --db sqlite:////tmp/traffic-demo.db --study traffic-demo \\
        [--trial 6] [--seeds 0,1,2] [--requests 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from pareto.errors import ParetoError
from pareto.front import Candidate, select_best
from pareto.limits import Constraints, Limits
from pareto.machine import describe_cpu_features
from pareto.measure.environment import fingerprint
from pareto.measure.queue import Batcher
from pareto.spec import Traffic
from pareto.store import storage
from pareto.store.engine import existing_engine, resolve_url
from pareto.store.reads import reading
from pareto.store.records import StudyRecord
from pareto.study.bench import Bench, open_bench
from pareto.study.load_runs import Target
from pareto.study.measure_one import stored_measure
from pareto.task import load_task
from pareto.units import format_ms


def open_stored(db: str, study: str, trial: int | None) -> tuple[StudyRecord, Constraints, Bench, Candidate]:
    """A study at a rate, its limits, a bench on its task, and its trial ``trial`` (else the pick)."""
    url = resolve_url(db)
    with reading(existing_engine(url)) as r:
        row = r.study(study)
    constraints = Limits(study=study).constraints(row.spec)
    bench = open_bench(url, load_task(row.task), stored_measure(row.spec, None, None), with_profile=False)
    everything = storage.study_candidates(bench.engine, row.id, bench.env_id)
    if trial is None:
        return row, constraints, bench, select_best(everything, constraints, study=row.name)
    return row, constraints, bench, next(c for c in everything if c.trial == trial)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--trial", type=int, help="default: the pick at the study's rate")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--requests", type=int, help="requests per run; default: the study's load_requests")
    args = parser.parse_args()
    started = time.monotonic()
    row, constraints, bench, pick = open_stored(args.db, args.study, args.trial)
    traffic = Traffic.model_validate(row.spec.get("traffic") or {}, context={"stored": True})
    slo = constraints.p99_ms or 0.0
    m = pick.metrics
    batcher = Batcher(int(m["capacity_max_batch"]), float(m["capacity_max_wait_ms"]))
    simulated = float(m["capacity_qps"])
    target = Target(bench, pick, batcher, min_s=traffic.load_min_s)
    found = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        qps, _ = target.capacity(
            slo,
            0.8 * simulated,
            1.25 * simulated,
            requests=args.requests or traffic.load_requests,
            seed=seed,
            replications=traffic.load_replications,
        )
        found[seed] = qps or 0.0
    env = fingerprint("cpu", bench.threads)
    values = [v for v in found.values() if v]
    spread = f"{max(values) / min(values) - 1:.1%}" if len(values) > 1 else "—"
    print(
        f"## Load-run capacity over arrival seeds: study {row.name!r}, trial {pick.trial} {pick.description}\n\n"
        f"`benchmarks/capacity_seeds.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{env['cpu_model']}, {describe_cpu_features(env['cpu_features'])}, torch {torch.__version__}, "
        f"{target.threads} intra-op threads served; {time.monotonic() - started:.0f} s.\n\n"
        f"P99 ≤ {format_ms(slo)}, max batch {batcher.max_batch}, wait {format_ms(batcher.max_wait_ms)}, "
        f"{traffic.load_replications} runs per rate; simulated capacity {simulated:,.0f}/s.\n\n"
        "| seed | load-run capacity | / simulated |\n|---|---|---|\n"
        + "".join(f"| {s} | {v:,.0f}/s | {v / simulated:.2f}× |\n" for s, v in found.items())
        + f"\nSpread over seeds (max / min − 1): {spread}."
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ParetoError as exc:  # a busy machine, a study without a rate: one sentence, no traceback
        sys.exit(f"{Path(__file__).name}: {exc}")
