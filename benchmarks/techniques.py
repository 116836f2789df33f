"""Compression ratio against measured speedup, per technique and for a few combinations, per task.

Every configuration is measured in one process beside the uncompressed baseline measured in the
same run (same method: 662 timed calls, 50 warm-up, the given thread count), so the ratios compare
like with like on a noisy machine. Prints a Markdown table per task for BENCHMARKS.md.

    python benchmarks/techniques.py --task demo --task transformer --task minilm --task resnet [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import platform

import torch

from pareto.api import parse_technique_option
from pareto.assess import assess
from pareto.compress import Config
from pareto.measure.memory import theoretical_bytes
from pareto.spec import Measure
from pareto.task import load_task

CONFIGS = {
    "demo": [
        [],
        ["prune_unstructured:sparsity=0.5"],
        ["prune_unstructured:sparsity=0.9"],
        ["prune_structured:ratio=0.5"],
        ["prune_structured:ratio=0.75"],
        ["lowrank:rank_ratio=0.25"],
        ["lowrank:energy=0.9"],
        ["int8_dynamic"],
        ["bf16"],
        ["fp16"],
        ["distill:width_ratio=0.5,steps=300"],
        ["prune_structured:ratio=0.5", "finetune:steps=100,lr=0.001"],
        ["prune_structured:ratio=0.5", "int8_dynamic"],
        ["prune_unstructured:sparsity=0.9", "int8_dynamic"],
        ["compile"],
    ],
    "transformer": [
        [],
        ["prune_unstructured:sparsity=0.5"],
        ["prune_structured:ratio=0.5"],
        ["lowrank:rank_ratio=0.25"],
        ["int8_dynamic"],
        ["bf16"],
        ["prune_structured:ratio=0.5", "int8_dynamic"],
    ],
    "minilm": [
        [],
        ["prune_unstructured:sparsity=0.5"],
        ["prune_structured:ratio=0.25"],
        ["prune_structured:ratio=0.5"],
        ["lowrank:rank_ratio=0.5"],
        ["int8_dynamic"],
        ["prune_structured:ratio=0.25", "int8_dynamic"],
        ["prune_structured:ratio=0.25", "finetune:steps=200,lr=0.0001"],
        ["prune_structured:ratio=0.25", "finetune:steps=200,lr=0.0001", "int8_dynamic"],
        ["prune_structured:ratio=0.5", "finetune:steps=400,lr=0.0001", "int8_dynamic"],
    ],
    "resnet": [
        [],
        ["prune_unstructured:sparsity=0.5"],
        ["prune_structured:ratio=0.5"],
        ["prune_structured:ratio=0.5", "finetune:steps=200,lr=0.001"],
        ["prune_structured:ratio=0.625", "finetune:steps=400,lr=0.001"],
        ["lowrank:rank_ratio=0.25"],
        ["int8_dynamic"],
        ["compile"],
        ["prune_structured:ratio=0.5", "finetune:steps=200,lr=0.001", "compile"],
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", default=None, choices=sorted(CONFIGS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--samples", type=int, default=662)
    args = parser.parse_args()
    measure = Measure(device="cpu", threads=args.threads, samples=args.samples, warmup=50, hardware=None)
    print(
        f"{datetime.date.today()} · {platform.processor() or platform.machine()} · torch {torch.__version__} · "
        f"{args.threads} threads · {args.samples} timed calls per row"
    )
    for name in args.task or ["demo"]:
        task = load_task(name)
        base_bytes = theoretical_bytes(task.model)
        print(f"\n### {name} (batch {task.batch_size})\n")
        print(
            "| configuration | compression (theory) | p50 ms | p99 ms | speedup p50 | speedup p99 | accuracy | Δ accuracy |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        baseline = None
        for options in CONFIGS[name]:
            config = Config(techniques=tuple(parse_technique_option(o) for o in options), batch_size=task.batch_size)
            reason = next((t.available("cpu", task) for t in config.techniques if t.available("cpu", task)), None)
            if reason:
                print(f"| {config.describe()} | — | — | — | — | — | — | unavailable: {reason} |")
                continue
            try:
                m = assess(
                    task,
                    config,
                    device="cpu",
                    threads=args.threads,
                    measure=measure,
                    baseline_theoretical_bytes=base_bytes,
                ).metrics
            except Exception as exc:  # report the failure in the table and carry on with the next row
                print(f"| {config.describe()} | — | — | — | — | — | — | failed: {type(exc).__name__}: {exc} |")
                continue
            baseline = baseline or m
            print(
                f"| {config.describe()} | {m.compression_ratio:.2f}× | {m.latency_p50_ms:.3f} | "
                f"{m.latency_p99_ms:.3f} | {baseline.latency_p50_ms / m.latency_p50_ms:.2f}× | "
                f"{baseline.latency_p99_ms / m.latency_p99_ms:.2f}× | {m.accuracy:.4f} | "
                f"{m.accuracy - baseline.accuracy:+.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
