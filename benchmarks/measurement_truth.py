"""Is pareto's latency what torch.utils.benchmark says, and how much does its P99 move run to run?

1. The median from pareto's per-call timer (`measure_latency`) and from `torch.utils.benchmark.Timer`
   (blocked_autorange) on the same model and input, side by side, alternating, in one run.
2. The same configuration measured five times in a row: the spread of p50 and p99.

    python benchmarks/measurement_truth.py [--task demo] [--technique prune_structured:ratio=0.5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as tbench

from pareto.compress import Config, apply
from pareto.measure.latency import measure_latency
from pareto.study.measure_one import parse_technique_option
from pareto.task import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="demo")
    parser.add_argument("--technique", action="append", default=[])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    task = load_task(args.task)
    config = Config(techniques=tuple(parse_technique_option(t) for t in args.technique), batch_size=task.batch_size)
    model = apply(task.model, config, task).module
    x = task.example_input(config.batch_size)
    print(f"{config.describe()} on task {task.name}, {args.threads} threads\n")
    print("| round | pareto p50 ms (662 calls) | torch.utils.benchmark median ms | ratio pareto / torch |")
    print("|---:|---:|---:|---:|")
    ratios = []
    for i in range(3):
        ours = measure_latency(model, x, device="cpu", samples=662, warmup=50, threads=args.threads).summary.p50_ms
        torch.set_num_threads(args.threads)
        with torch.inference_mode():
            timer = tbench.Timer(stmt="model(x)", globals={"model": model, "x": x}, num_threads=args.threads)
            theirs = timer.blocked_autorange(min_run_time=3.0).median * 1e3
        ratios.append(ours / theirs)
        print(f"| {i + 1} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.3f} |")
    print(f"\nmedian ratio {statistics.median(ratios):.3f}\n")
    print("| repeat | p50 ms | p99 ms | p99 95% CI ms | p99 / first p99 |")
    print("|---:|---:|---:|---|---:|")
    p99s = []
    for i in range(args.repeats):
        s = measure_latency(model, x, device="cpu", samples=662, warmup=50, threads=args.threads).summary
        p99s.append(s.p99_ms)
        print(
            f"| {i + 1} | {s.p50_ms:.3f} | {s.p99_ms:.3f} | [{s.p99_lower_ms:.3f}, {s.p99_upper_ms:.3f}] | "
            f"{s.p99_ms / p99s[0]:.2f} |"
        )
    spread = (max(p99s) - min(p99s)) / statistics.median(p99s)
    print(
        f"\np99 over {args.repeats} runs: min {min(p99s):.3f}, median {statistics.median(p99s):.3f}, "
        f"max {max(p99s):.3f} ms; spread (max-min)/median = {spread:.0%}"
    )


if __name__ == "__main__":
    main()
