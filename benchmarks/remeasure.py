"""Independent re-measurement of the stored pick: does the stored P99 hold up?

Loads the configuration ``pareto best`` returns, rebuilds it from the task, times it again with a
fresh process and the same method, and prints stored versus re-measured percentiles side by side.

    python benchmarks/remeasure.py --slo-p99 7ms [--db URL] [--study demo] [--repeats 3]
"""

from __future__ import annotations

import argparse

import pareto
from pareto.compress import Config, apply
from pareto.measure.latency import measure_latency
from pareto.task import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--study", default=None)
    parser.add_argument("--slo-p99", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pick = pareto.best(study=args.study, slo_p99=args.slo_p99, db=args.db)
    stored = pick["metrics"]
    task_of = {s["study"]: s["task"] for s in pareto.studies(db=args.db)}
    task = load_task(task_of[pick["study"]])
    config = Config.from_dict(pick["config"])
    model = apply(task.model, config, task)
    print(f"trial {pick['trial']}: {config.describe()}")
    print("| run | p50 ms | p99 ms | p99 upper ms | p99 / stored p99 |")
    print("|---|---:|---:|---:|---:|")
    print(f"| stored | {stored['latency_p50_ms']:.3f} | {stored['latency_p99_ms']:.3f} | "
          f"{stored['latency_p99_upper_ms']:.3f} | 1.00 |")
    for i in range(args.repeats):
        r = measure_latency(model, task.example_input(config.batch_size), device=pick["environment"]["device"],
                            samples=stored["samples"], warmup=stored["warmup"],
                            threads=pick["environment"]["threads"], confidence=stored["confidence"]).summary
        print(f"| re-measure {i + 1} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.p99_upper_ms:.3f} | "
              f"{r.p99_ms / stored['latency_p99_ms']:.2f} |")


if __name__ == "__main__":
    main()
