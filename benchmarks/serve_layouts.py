"""Capacity by serving layout (issue 45): model instances × intra-op threads, simulated on served costs
against load runs, one configuration at a time, each layout in a fresh process (libgomp reads its wait
policy once, at start; ``--wait-policy`` sets ``OMP_WAIT_POLICY`` for every child).

Per layout, as a search's trial and its after-search load runs do it: each bucket's call timed alone
(``--alone`` calls after 50 warm-up), ``traffic.serve_runs`` serving runs in the layout (served costs),
the simulated capacity on them (6 replications, ``pareto.study.traffic.Simulation``), then the load-run
capacity: bisection on the rate from 0.8× to 1.25× the simulated one (widened when needed) to 5 %, each
rate ``--replications`` load runs of at least ``--min-s`` seconds and ``--requests`` requests on their own
seeded schedules, met when every run counted and the pooled P99 bound is within the SLO. Run it from the
repository root::

    .venv/bin/python benchmarks/serve_layouts.py --task demo --batch 4 --slo 7ms --qps 2000
    .venv/bin/python benchmarks/serve_layouts.py --task minilm --batch 1 --slo 100ms --qps 20 \\
        --requests 500 --replications 5 [--config '{"backend": "onnxruntime"}']

It prints a Markdown table (machine, date, command), the layouts side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any


def child(args: argparse.Namespace, instances: int, threads: int) -> dict[str, Any]:
    import torch

    from pareto.compress import Config
    from pareto.measure.load import load_run
    from pareto.measure.queue import ServiceTimes, buckets, poisson_arrivals, replica_seed
    from pareto.spec import Traffic
    from pareto.study.assess import build_served
    from pareto.study.load_runs import bisect_rate, combine_runs, load_meets
    from pareto.study.traffic import Simulation, _serve_at, batchers, served_call
    from pareto.task import load_task
    from pareto.units import parse_duration_ms

    torch.set_num_threads(threads)
    slo = parse_duration_ms(args.slo)
    task = load_task(args.task)
    config = Config.from_dict({"batch_size": args.batch, "techniques": [], **json.loads(args.config)})
    served, _ = build_served(task, config, "cpu", threads)
    if served.ready is not None:
        served.ready()
    call = served_call(served, task, args.batch, "cpu")
    alone: dict[int, list[float]] = {}
    for bucket in buckets(args.batch):
        for _ in range(50):
            call(bucket)
        times = []
        for _ in range(args.alone):
            start = time.perf_counter()
            call(bucket)
            times.append(time.perf_counter() - start)
        alone[bucket] = times
    traffic = Traffic(qps=args.qps, serve_instances=[instances], serve_threads=[threads])
    quick, full = (Simulation.of(traffic, args.seed, 0.99, quick=q) for q in (True, False))
    started = time.perf_counter()
    service, _ = _serve_at(
        call, ServiceTimes(alone), args.batch, traffic, slo, quick, device="cpu", layout=(instances, threads)
    )
    point = full.capacity(service, slo, batchers(args.batch, traffic, slo, instances))
    serving_s = time.perf_counter() - started
    if point is None:
        return {"alone_ms": {b: 1e3 * sum(v) / len(v) for b, v in alone.items()}, "simulated": None}
    runs: list[dict[str, Any]] = []

    def meets(rate: float) -> bool:
        count = max(args.requests, int(rate * args.min_s))
        done = []
        for replica in range(args.replications):
            arrivals = poisson_arrivals(rate, count, replica_seed(args.seed, replica))
            done.append(load_run(call, arrivals, point.batcher, confidence=0.99, timeout_s=arrivals[-1] * 3 + 5))
            if not done[-1].valid:
                break
        runs.append(combine_runs(done, rate, args.replications))
        return load_meets(runs[-1], slo)

    started = time.perf_counter()
    found = bisect_rate(meets, 0.8 * point.qps, 1.25 * point.qps, rel_tol=0.05)
    return {
        "alone_ms": {b: 1e3 * sum(v) / len(v) for b, v in alone.items()},
        "served_ms": {b: service.mean_s(b) * 1e3 for b in service.batches},
        "simulated": point.qps,
        "batcher": point.batcher.describe(),
        "load": found,
        "rates_run": len(runs),
        "serving_s": serving_s,
        "load_s": time.perf_counter() - started,
    }


LAYOUTS = ((1, 1), (1, 2), (2, 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="demo")
    parser.add_argument(
        "--config", default="{}", help="the configuration's JSON beside its batch size (techniques, backend)"
    )
    parser.add_argument("--batch", type=int, default=4, help="the batcher's largest batch")
    parser.add_argument("--slo", default="7ms")
    parser.add_argument("--qps", type=float, default=2000.0, help="the study's rate (the first serving run's)")
    parser.add_argument("--layouts", default=",".join(f"{i}x{t}" for i, t in LAYOUTS), help="instances x threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", type=int, default=300)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--replications", type=int, default=5)
    parser.add_argument("--min-s", type=float, default=1.0)
    parser.add_argument("--wait-policy", choices=("", "PASSIVE", "ACTIVE"), default="")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        instances, threads = (int(x) for x in args.child.split("x"))
        print(json.dumps(child(args, instances, threads)))
        return 0
    import torch

    from pareto.machine import describe_cpu_features
    from pareto.measure.environment import fingerprint

    machine = fingerprint("cpu", 1)
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if args.wait_policy:
        env["OMP_WAIT_POLICY"] = args.wait_policy
    lines = [
        f"`benchmarks/serve_layouts.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{machine['cpu_model']} ({describe_cpu_features(machine['cpu_features'])}), {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, OMP_WAIT_POLICY {args.wait_policy or 'unset'}.",
        "",
        "| instances × threads | call alone (ms by bucket) | served cost | batcher at capacity | simulated | "
        "load-run | load / simulated | rates run | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for layout in args.layouts.split(","):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", layout]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            lines.append(f"| {layout} | failed: {done.stderr.strip().splitlines()[-1]} |")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        alone = ", ".join(f"{v:.3g}" for v in r["alone_ms"].values())
        if r["simulated"] is None:
            lines.append(f"| {layout.replace('x', ' × ')} | {alone} | | | none within the SLO | | | | |")
            continue
        served = ", ".join(f"{v:.3g}" for v in r["served_ms"].values())
        load = f"{r['load']:,.0f}/s" if r["load"] else "none"
        ratio = f"{r['load'] / r['simulated']:.2f}×" if r["load"] else ""
        lines.append(
            f"| {layout.replace('x', ' × ')} | {alone} | {served} | {r['batcher']} | {r['simulated']:,.0f}/s | "
            f"{load} | {ratio} | {r['rates_run']} | {r['serving_s'] + r['load_s']:.0f} s |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
