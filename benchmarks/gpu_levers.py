"""What pays on a GPU, per built-in task: the levers applied alone and together, timed in one interleaved run.

Each task's configurations are built on the GPU by pareto's own pipeline and timed beside the fp32
eager baseline in the same rounds, in a random order each round (``pareto._runs.time_together``: the
path ``pareto measure`` and confirmation take), then evaluated once for accuracy. The rows a user
would try first, ``torch.compile`` in its default and reduce-overhead modes, are in every table.

Run on a machine with a CUDA GPU (needs torchao for fp8 and int4):

    python benchmarks/gpu_levers.py --tasks demo,transformer,resnet --samples 680 --out levers.json
    python benchmarks/gpu_levers.py --tasks transformer-large --batches serving,1 --out large.json

``--batches`` takes ``serving`` (the task's own batch) and integers; each batch is its own interleaved run.

Prints one Markdown table per task (P99, P50, speedups over the baseline, accuracy change, build
seconds), and writes the rows as JSON with the environment and the method.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

#: Rows per task: (label, techniques as "name" or "name:key=value"). The first is the baseline.
LEVERS: list[tuple[str, list[str]]] = [
    ("fp32 eager (baseline)", []),
    ("bf16 eager", ["bf16"]),
    ("torch.compile default", ["compile"]),
    ("torch.compile reduce-overhead", ["compile:mode=reduce-overhead"]),
    ("CUDA graphs (eager capture)", ["cuda_graphs"]),
    ("bf16 + CUDA graphs", ["bf16", "cuda_graphs"]),
    ("bf16 + torch.compile reduce-overhead", ["bf16", "compile:mode=reduce-overhead"]),
    ("fp8 eager", ["fp8"]),
    ("fp8 + CUDA graphs", ["fp8", "cuda_graphs"]),
    ("int4 eager", ["int4_weight_only"]),
    ("int4 + CUDA graphs", ["int4_weight_only", "cuda_graphs"]),
    ("2:4 + bf16 eager", ["prune_2_4", "bf16"]),
    ("2:4 + bf16 + CUDA graphs", ["prune_2_4", "bf16", "cuda_graphs"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="demo,transformer,resnet")
    parser.add_argument("--samples", type=int, default=680)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batches", default="serving", help="comma-separated: 'serving' and/or integers")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    batches = [None if b == "serving" else int(b) for b in args.batches.split(",")]
    results = [run_task(name, args, batch) for name in args.tasks.split(",") for batch in batches]
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1, default=str)


def run_task(name: str, args: argparse.Namespace, batch_size: int | None) -> dict[str, Any]:
    from pareto._runs import open_bench, time_together
    from pareto.api import parse_technique_option
    from pareto.assess import round_plan
    from pareto.compress import Config
    from pareto.compress.pipeline import why_not_here
    from pareto.spec import Measure
    from pareto.task import load_task

    measure = Measure(device=args.device, samples=args.samples, rounds=args.rounds, warmup=50, hardware=None)
    bench = open_bench(None, load_task(name), measure, with_profile=False, read_only=True)
    batch = batch_size or bench.task.batch_size
    skipped: dict[str, dict[str, Any]] = {}
    configs = []
    for label, options in LEVERS:
        config = Config(techniques=tuple(parse_technique_option(o) for o in options), batch_size=batch)
        why = why_not_here(config, bench.task, bench.device)
        if why is not None:
            skipped[label] = {"label": label, "skipped": why}
            continue
        configs.append((label, config))
    start = time.perf_counter()
    timed = time_together(bench, [c for _, c in configs], plan=round_plan(measure, None), probe=bench.probe())
    measured: dict[str, dict[str, Any]] = {}
    for (label, _), (built, latency) in zip(configs, timed, strict=True):
        measured[label] = {
            "label": label,
            "p50_ms": latency.summary.p50_ms,
            "p99_ms": latency.summary.p99_ms,
            "p99_upper_ms": latency.summary.p99_upper_ms,
            "accuracy": float(bench.task.evaluate(built.model)),
            "build_s": built.compress_s + (built.compile_s or 0.0),
            "method": latency.method,
        }
    rows = [measured.get(label) or skipped[label] for label, _ in LEVERS]
    _print(name, batch, rows, time.perf_counter() - start)
    return {"task": name, "batch_size": batch, "environment": bench.fingerprint, "rows": rows}


def _print(name: str, batch: int, rows: list[dict[str, Any]], seconds: float) -> None:
    base = next(r for r in rows if "p99_ms" in r)
    print(f"\n### {name} @ batch {batch} ({seconds:.0f} s, one interleaved run)\n")
    print("| configuration | P99 ms | P50 ms | P99 speedup | P50 speedup | accuracy Δ (points) | build s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['label']} | — | — | — | — | — | not available: {r['skipped']} |")
            continue
        print(
            f"| {r['label']} | {r['p99_ms']:.3f} | {r['p50_ms']:.3f} | {base['p99_ms'] / r['p99_ms']:.2f}x | "
            f"{base['p50_ms'] / r['p50_ms']:.2f}x | {100 * (r['accuracy'] - base['accuracy']):+.2f} | {r['build_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
