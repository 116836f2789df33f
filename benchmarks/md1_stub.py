"""The load run against queueing theory: a stub model of fixed call time D, max batch 1, Poisson arrivals.

That is the M/D/1 queue, whose mean wait (Pollaczek–Khinchine) and P99 wait (Erlang's exact
distribution) are known. ``pareto.measure.load.load_run`` sends the schedule through its generator and
batcher threads to ``fixed_time_call``; the table puts each run's mean and P99 wait beside M/D/1's at
the load measured (ρ = rate × the server's mean time per request, the batcher thread's wake-up
included), and beside the same schedule simulated (``pareto.measure.queue.simulate``), which says how
far this one sample of arrivals strays from the theory by itself. The issue asks for "within 10 %".

    python benchmarks/md1_stub.py [--requests 20000] [--service-ms 2] [--rho 0.5 0.8] [--seed 0]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

import numpy as np

from pareto.measure.load import LoadRun, fixed_time_call, load_run
from pareto.measure.queue import (
    Batcher,
    ServiceTimes,
    md1_mean_wait_s,
    md1_wait_quantile_s,
    poisson_arrivals,
    simulate,
)

#: The stub needs no core: the generator spins the last 0.5 ms before each arrival, an exact Poisson source.
SPIN_S = 0.5e-3


def served_s(run: LoadRun) -> float:
    """The server's mean time per request: from the moment it could start (request issued, previous call
    done) to completion, so that the batcher thread's wake-up counts as service."""
    req = run.requests
    previous = np.concatenate([[-np.inf], req.done_s[:-1]])
    return float((req.done_s - np.maximum(run.issue_s, previous)).mean())


def row(rho: float, service_s: float, requests: int, seed: int) -> str:
    rate = rho / service_s
    arrivals = poisson_arrivals(rate, requests, seed)
    run = load_run(fixed_time_call({1: service_s}), arrivals, Batcher(1, 0.0), confidence=0.99, spin_s=SPIN_S)
    warm = requests // 20
    wait = run.requests.wait_s[warm:]
    call_s = float((run.requests.done_s - run.requests.start_s).mean())
    served = served_s(run)
    theory_mean, theory_p99 = md1_mean_wait_s(rate, served), md1_wait_quantile_s(rate, served, 0.99)
    mean, p99 = float(wait.mean()), float(np.quantile(wait, 0.99, method="inverted_cdf"))
    alone = simulate(arrivals, ServiceTimes.fixed({1: served}), Batcher(1, 0.0), seed=seed).wait_s[warm:]
    alone_mean = float(alone.mean()) / theory_mean
    alone_p99 = float(np.quantile(alone, 0.99, method="inverted_cdf")) / theory_p99
    return (
        f"| {rho:g} | {requests} | {call_s * 1e3:.3f} | {served * 1e3:.3f} | {rate * served:.3f} | "
        f"{mean * 1e3:.3f} | {theory_mean * 1e3:.3f} | **{mean / theory_mean:.3f}** | "
        f"{p99 * 1e3:.3f} | {theory_p99 * 1e3:.3f} | **{p99 / theory_p99:.3f}** | "
        f"{alone_mean:.3f} / {alone_p99:.3f} | {run.issue_lag_p99_ms:.3f} | {'yes' if run.kept_up else 'no'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--service-ms", type=float, default=2.0)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.5, 0.8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"{datetime.date.today()} · {platform.processor() or platform.machine()} · {os.cpu_count()} CPUs · "
        f"Python {platform.python_version()} · stub call {args.service_ms:g} ms, max batch 1, wait 0 · "
        f"{args.requests} requests per row, the first {args.requests // 20} left out · seed {args.seed}\n"
    )
    print(
        "| ρ offered | requests | call ms | served ms | ρ measured | mean wait ms | M/D/1 | ratio | "
        "P99 wait ms | M/D/1 | ratio | schedule alone / M/D/1 (mean / P99) | issue lag P99 ms | kept up |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for rho in args.rho:
        print(row(rho, args.service_ms / 1e3, args.requests, args.seed), flush=True)


if __name__ == "__main__":
    main()
