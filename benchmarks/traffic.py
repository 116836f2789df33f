"""P99 at the user's traffic (issue 38): simulated capacity against real load runs, and a rate the pick holds.

For one task, it runs a search at a request rate (``pareto search --qps``), then for the pick and the baseline
(the uncompressed model at the pick's batch size, and the baseline of highest simulated capacity when that is
another one):

* the capacity at the SLO, simulated (stored with the trial) and from real load runs (``pareto load --capacity``:
  bisection on the rate, each run a seeded Poisson schedule sent by a generator thread to the served model
  behind the batcher), with their ratio;
* a rate between the baseline's capacity and the pick's (their geometric mean, from the load runs), where both
  are load-run: the baseline should miss the SLO and the pick meet it.

Run it from the repository root (the database is kept: ``pareto best``/``pareto load`` answer from it after)::

    .venv/bin/python benchmarks/traffic.py --task demo --slo 7ms --qps 3000/s --n-trials 16 --batch-sizes 1,4 \\
        --db sqlite:////tmp/traffic-demo.db
    .venv/bin/python benchmarks/traffic.py --task minilm --config configs/minilm.yaml --slo 100ms --qps 30/s \\
        --n-trials 8 --batch-sizes 1,4 --requests 800 --db sqlite:////tmp/traffic-minilm.db

It prints a Markdown report (machine, date, command, the tables).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime, timezone
from typing import Any

import torch

import pareto
from pareto.machine import describe_cpu_features
from pareto.measure.environment import fingerprint
from pareto.spec import SearchSpec, load_spec
from pareto.units import format_ms, parse_duration_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="demo")
    parser.add_argument("--config", help="a search spec (YAML) to start from: its space, backends, start points")
    parser.add_argument("--slo", default="7ms")
    parser.add_argument("--qps", default="2000/s")
    parser.add_argument("--n-trials", type=int, default=16)
    parser.add_argument("--requests", type=int, default=3000, help="requests per load run")
    parser.add_argument("--batch-sizes", default="1,4,16", help="the batcher's largest batch, searched")
    parser.add_argument("--db", required=True)
    parser.add_argument("--no-guard", action="store_true", help="time without the contention probe between rounds")
    args = parser.parse_args()
    started = time.monotonic()
    spec = load_spec(
        args.config,
        {
            "task": args.task,
            "study": f"traffic-{args.task}",
            "objectives": ["accuracy", "capacity"],
            "slo.p99": args.slo,
            "traffic.qps": args.qps,
            "traffic.load_requests": args.requests,
            "search.n_trials": args.n_trials,
            "search.confirm_top": 0,
            "space.batch_size": [int(b) for b in args.batch_sizes.split(",")],
        },
    )
    if args.no_guard:
        spec = spec.model_copy(update={"measure": spec.measure.model_copy(update={"contention_limit": None})})
    result = pareto.search(spec, db=args.db)
    if result.best is None:
        print(f"no pick: {result.no_best_reason}")
        return 1
    slo = parse_duration_ms(args.slo)
    study = spec.study_name
    rows = [_capacity(study, args.db, result.best.trial, "pick", args.requests)]
    for trial, role in _baselines(study, args.db, result.best.config["batch_size"]):
        rows.append(_capacity(study, args.db, trial, role, args.requests))
    print(_report(args, spec, result, rows, slo, time.monotonic() - started))
    return 0


def _baselines(study: str, db: str, batch_size: int) -> list[tuple[int, str]]:
    """The baseline at the pick's batch size, and the baseline of highest simulated capacity if another."""
    everything = pareto.trials(study=study, db=db)
    bases = [t for t in everything if not t["config"]["techniques"] and t["config"]["backend"] == "eager"]
    same = [t["trial"] for t in bases if t["config"]["batch_size"] == batch_size]
    found = [(same[0], f"baseline @ batch {batch_size}")] if same else []
    best = max(bases, key=lambda t: (t.get("metrics") or {}).get("capacity_qps") or 0.0, default=None)
    if best is not None and (not same or best["trial"] != same[0]):
        found.append((best["trial"], f"baseline of highest capacity (@ batch {best['config']['batch_size']})"))
    return found


def _capacity(study: str, db: str, trial: int, role: str, requests: int) -> dict[str, Any]:
    answer = pareto.load_run(study=study, trial=trial, capacity=True, requests=requests, db=db)
    metrics = next(t["metrics"] for t in pareto.trials(study=study, db=db) if t["trial"] == trial)
    alone = {str(row["batch"]): row["mean_ms"] for row in metrics["service_curve"]}
    return {**answer, "role": role, "alone_ms": alone, "threads": metrics.get("serve_threads")}


def _overhead(row: dict[str, Any]) -> str:
    """At the highest rate a load run met the SLO: the largest bucket's call in the run against alone, and
    the generator's lateness."""
    met = [r for r in row["runs"] if r["valid"] and r["qps"] <= (row["load_capacity_qps"] or 0)]
    if not met:
        return "—"
    run = max(met, key=lambda r: r["qps"])
    bucket = max(run["call_ms"], key=int)
    ratio = run["call_ms"][bucket] / row["alone_ms"][bucket]
    return (
        f"batch {bucket}: {run['call_ms'][bucket]:.3f} ms in the run, {row['alone_ms'][bucket]:.3f} ms alone "
        f"({ratio:.2f}×); issue lag P99 {run['issue_lag_p99_ms']:.2f} ms"
    )


def _rate_check(study: str, db: str, rows: list[dict[str, Any]], requests: int) -> list[str]:
    """Load runs of every row at a rate between the baseline's load capacity and the pick's."""
    pick, base = rows[0].get("load_capacity_qps"), rows[1].get("load_capacity_qps") if len(rows) > 1 else None
    if not pick or (base and pick <= base) or len(rows) < 2:
        return [f"(no rate between: the pick's load capacity {pick} is not above the baseline's {base})"]
    rate, how = (math.sqrt(pick * base), "the geometric mean of the two") if base else (0.8 * pick, "0.8× the pick's")
    lines = [f"At {rate:,.0f} requests/s ({how} load-run capacities):", ""]
    lines += ["| configuration | request P99 | P99 bound | kept up | valid | verdict |", "|---|---|---|---|---|---|"]
    for row in rows[:2]:
        answer = pareto.load_run(study=study, trial=row["trial"], qps=rate, requests=requests, db=db)
        r = answer["load_run"]
        lines.append(
            f"| {row['role']}: trial {row['trial']} {row['description']} | {format_ms(r['p99_ms'])} | "
            f"{format_ms(r.get('p99_upper_ms'))} | {r['kept_up']} | {r['valid']} | "
            f"{'meets' if answer['meets'] else 'misses'} |"
        )
    return lines


def _report(
    args: argparse.Namespace, spec: SearchSpec, result: Any, rows: list[dict[str, Any]], slo: float, took: float
) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    env = fingerprint("cpu", torch.get_num_threads())
    machine = (
        f"{env['cpu_model']} ({env['cpu_id']}), {env['cpu_count']} vCPUs, {describe_cpu_features(env['cpu_features'])}, "
        f"torch {env['torch_version']}, {env['threads']} threads"
    )
    lines = [
        f"## Traffic: task {args.task}, P99 ≤ {format_ms(slo)} at {spec.traffic.qps:,.0f} requests/s",
        "",
        f"`{' '.join(sys.argv)}` — {now}, {machine}; {took:.0f} s in all.",
        "",
        f"Pick: trial {result.best.trial} {result.best.description}; {result.measured} configurations measured.",
        "",
        "| configuration | batcher at capacity, threads | simulated capacity | load-run capacity | load / simulated "
        "| at the load-run capacity: mean call, in the run and alone |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        sim, load = row["simulated_capacity_qps"], row["load_capacity_qps"]
        lines.append(
            f"| {row['role']}: trial {row['trial']} {row['description']} | max {row['max_batch']}, wait "
            f"{format_ms(row['max_wait_ms'])}, {row['threads']} | {sim:,.0f}/s | {f'{load:,.0f}/s' if load else 'none'} | "
            f"{f'{load / sim:.2f}×' if load else '—'} | {_overhead(row)} |"
        )
    load = result.best.load_run
    if load is not None:
        lines += [
            "",
            f"The pick's load run at the study's rate after the search ({load['qps']:,.0f}/s, "
            f"{load.get('replications', 1)} runs): request P99 {format_ms(load['p99_ms'])}, bound "
            f"{format_ms(load.get('p99_upper_ms'))}, valid {load['valid']}; the pick's capacity as reported: "
            f"{result.best.slo.get('capacity_qps') or 0:,.0f}/s ({result.best.slo.get('capacity_source')}).",
        ]
    lines += ["", *_rate_check(spec.study_name, args.db, rows, args.requests)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
