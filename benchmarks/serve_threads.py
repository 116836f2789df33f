"""Intra-op threads and the thread pool's wait policy under load (issue 45): one configuration of the demo
served behind the batcher at a few Poisson rates, per (threads, OMP_WAIT_POLICY), each in a fresh process
(libgomp reads its wait policy once, at start).

Per row: a call timed alone (500 calls after 50 warm-up), the mean call inside the last load run, and the
request P99 of ``--runs`` load runs (``--requests`` each, seeds 0..) per rate. Run it from the repository
root::

    .venv/bin/python benchmarks/serve_threads.py [--batch 1] [--wait-ms 0] [--rates 500,1000,1500]

It prints a Markdown table (machine, date, command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone


def child(threads: int, batch: int, wait_ms: float, rates: list[float], runs: int, requests: int) -> dict:
    import torch

    from pareto.compress import Config
    from pareto.measure.load import load_run
    from pareto.measure.queue import Batcher, poisson_arrivals
    from pareto.study.assess import build_served
    from pareto.study.traffic import served_call
    from pareto.task import load_task

    torch.set_num_threads(threads)
    task = load_task("demo")
    served, _ = build_served(task, Config.from_dict({"batch_size": batch, "techniques": {}}), "cpu", threads)
    call = served_call(served, task, batch, "cpu")
    for _ in range(50):
        call(batch)
    started = time.perf_counter()
    for _ in range(500):
        call(batch)
    alone_ms = (time.perf_counter() - started) / 500 * 1e3
    rows, in_run = {}, {}
    for rate in rates:
        p99 = []
        for seed in range(runs):
            run = load_run(
                call, poisson_arrivals(rate, requests, seed), Batcher(batch, wait_ms), confidence=0.99, timeout_s=60
            )
            p99.append(round(run.summary.p99_ms, 2) if run.valid else None)
        rows[str(rate)], in_run = p99, run.call_ms()
    return {"alone_ms": alone_ms, "in_run_ms": in_run, "p99_ms": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--wait-ms", type=float, default=0.0)
    parser.add_argument("--rates", default="500,1000,1500")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    if args.child:
        print(json.dumps(child(int(args.child), args.batch, args.wait_ms, rates, args.runs, args.requests)))
        return 0
    lines = [
        f"`benchmarks/serve_threads.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs; the demo's baseline @ batch {args.batch}, wait {args.wait_ms:g} ms.",
        "",
        "| threads | OMP_WAIT_POLICY | call alone | call in the last run | "
        + " | ".join(f"P99 at {r:g}/s (ms, per run)" for r in rates)
        + " |",
        "|---|---|---|---|" + "---|" * len(rates),
    ]
    for policy in ("", "PASSIVE"):
        for threads in (1, 2):
            env = {**os.environ, "OMP_WAIT_POLICY": policy} if policy else {**os.environ}
            env.pop("OMP_WAIT_POLICY", None) if not policy else None
            cmd = [sys.executable, __file__, "--child", str(threads), "--batch", str(args.batch), "--wait-ms",
                   str(args.wait_ms), "--rates", args.rates, "--runs", str(args.runs), "--requests", str(args.requests)]  # fmt: skip
            out = (
                subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            )
            r = json.loads(out)
            calls = ", ".join(f"{v:.3f}" for v in r["in_run_ms"].values())
            cells = [", ".join("over" if v is None else f"{v:g}" for v in r["p99_ms"][str(rate)]) for rate in rates]
            lines.append(
                f"| {threads} | {policy or 'default'} | {r['alone_ms']:.3f} ms | {calls} ms | "
                + " | ".join(cells)
                + " |"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
