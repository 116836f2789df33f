"""What pays on a GPU, per built-in task: the levers applied alone and together, timed in one interleaved run.

Each task's configurations are built on the GPU by pareto's own pipeline, one at a time: a row whose
build or first call fails keeps its one-sentence reason and the other rows go on. The rows that
built are timed beside the fp32 eager baseline in the same rounds, in a random order each round
(``pareto.study.bench.time_beside``, the interleaved timing ``pareto measure`` and confirmation use, here
given the models already built), then evaluated once for accuracy. When that joint run fails, each
row is timed alone beside the baseline instead, and a row that fails there keeps its reason; so does
a row whose accuracy evaluation fails. The rows a user would try first, ``torch.compile`` in its
default and reduce-overhead modes, are in every table.

Run on a machine with a CUDA GPU (needs torchao for fp8 and int4):

    python benchmarks/gpu_levers.py --tasks demo,transformer,resnet --samples 680 --out levers.json
    python benchmarks/gpu_levers.py --levers large --tasks transformer-large --batches serving,1 --out large.json
    python benchmarks/gpu_levers.py --levers techniques --tasks demo --out techniques.json

``--batches`` takes ``serving`` (the task's own batch) and integers; each batch is its own interleaved run.
``--levers large`` takes the rows that change a compute-bound model's arithmetic (bf16, fp8, int4, 2:4,
with bf16 under ``torch.compile`` and CUDA graphs beside them), for ``transformer-large``.
``--levers techniques`` times every technique that ``pareto techniques`` lists as available on the
device for the task and that serves on eager (``finetune`` aside), each alone, with the parameters
availability was judged with, beside the baseline in one process.

Prints one Markdown table per task (P99, P50, speedups over the baseline timed in the same rounds,
accuracy change, build seconds) and writes the rows as JSON with the environment and the method:
once a task's rows are built (those not timed yet marked ``pending``) and again when it is done, so
a run stopped midway keeps every finished task and the build results of the one it was timing. A
task that fails keeps its reason there and the next task runs. Exits 1 when a row or a task
failed, 0 otherwise; rows that are not available on the device are not failures.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pareto.measure.latency import LatencyResult, RoundPlan, Timed
    from pareto.measure.probe import ContentionProbe
    from pareto.study.bench import Bench, Built

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
BASELINE = "fp32 eager (baseline)"
#: ``--levers large``: the rows that change the arithmetic of a compute-bound model (transformer-large).
LARGE_LEVERS: list[tuple[str, list[str]]] = [
    (BASELINE, []),
    ("bf16 eager", ["bf16"]),
    ("bf16 + torch.compile default", ["bf16", "compile"]),
    ("bf16 + CUDA graphs", ["bf16", "cuda_graphs"]),
    ("fp8 eager", ["fp8"]),
    ("int4 eager", ["int4_weight_only"]),
    ("2:4 + bf16 eager", ["prune_2_4", "bf16"]),
]
#: Techniques ``--levers techniques`` leaves out: finetune only trains the model it is given.
NOT_ALONE = {"finetune"}


def main(argv: list[str] | None = None) -> int:
    """Run every task and batch; the JSON (``--out``) is written again after each one."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", default="demo,transformer,resnet")
    parser.add_argument("--samples", type=int, default=680)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batches", default="serving", help="comma-separated: 'serving' and/or integers")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--levers", choices=("table", "large", "techniques"), default="table", help="the rows (see above)"
    )
    parser.add_argument("--no-guard", action="store_true", help="time without the contention probe")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    batches = [None if b == "serving" else int(b) for b in args.batches.split(",")]
    results: list[dict[str, Any]] = []

    def save(partial: dict[str, Any] | None = None) -> None:
        if args.out:
            _write(args.out, [*results, *([partial] if partial else [])])

    for name in args.tasks.split(","):
        for batch in batches:
            results.append(_task_or_reason(name, args, batch, save))
            save()
    failed = [r for r in results if "error" in r or any("failed" in row for row in r["rows"])]
    return 1 if failed else 0


def _write(path: str, results: list[dict[str, Any]]) -> None:
    """The results so far, replacing the file whole (a reader never sees half of it)."""
    import os

    with open(f"{path}.tmp", "w") as handle:
        json.dump(results, handle, indent=1, default=str)
    os.replace(f"{path}.tmp", path)


def _task_or_reason(
    name: str, args: argparse.Namespace, batch: int | None, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """``run_task``, or the task with the one-sentence reason it could not be run."""
    from pareto.errors import exception_line

    try:
        return run_task(name, args, batch, save)
    except Exception as exc:
        reason = exception_line(exc)
        print(f"\n### {name}: not run ({reason})\n", flush=True)
        return {"task": name, "batch_size": batch, "error": reason, "complete": False, "rows": []}
    finally:
        _free()


def run_task(
    name: str, args: argparse.Namespace, batch_size: int | None, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Build each row on its own, time the rows that built together, evaluate them; the task's result.
    Once the rows are built, ``save`` gets the task so far (its built rows ``pending``, ``complete`` false):
    a process stopped while it times them leaves which rows built and which failed."""
    from pareto.spec import Measure
    from pareto.study.assess import round_plan
    from pareto.study.bench import open_bench
    from pareto.task import load_task

    measure = Measure(
        device=args.device,
        samples=args.samples,
        rounds=args.rounds,
        warmup=args.warmup,
        hardware=None,
        contention_limit=None if args.no_guard else Measure().contention_limit,
    )
    bench = open_bench(None, load_task(name), measure, with_profile=False, read_only=True)
    batch = batch_size or bench.task.batch_size
    levers = {"table": LEVERS, "large": LARGE_LEVERS}.get(args.levers) or technique_levers(bench)
    rows: dict[str, dict[str, Any]] = {}
    built: list[tuple[str, Built]] = []
    for label, options in levers:
        rows[label], model = build_row(bench, label, options, batch)
        if model is not None:
            built.append((label, model))
    task = {"task": name, "batch_size": batch, "environment": bench.fingerprint, "complete": False}
    pending = {"pending": "built; the run stopped before it was timed"}
    save({**task, "rows": [{**rows[label], **(pending if model else {})} for label, model in _each(levers, built)]})
    start = time.perf_counter()
    timing = time_rows(bench, built, round_plan(measure, None), bench.probe())
    for label, model in built:
        rows[label].update(timing[label])
        if "failed" not in rows[label]:
            rows[label].update(_accuracy(bench, model))
    ordered = [rows[label] for label, _ in levers]
    _print(name, batch, ordered, time.perf_counter() - start)
    return {**task, "complete": True, "rows": ordered}


def _each(levers: list[tuple[str, list[str]]], built: list[tuple[str, Built]]) -> list[tuple[str, Built | None]]:
    """Every row's label, with its model where it built."""
    models = dict(built)
    return [(label, models.get(label)) for label, _ in levers]


def technique_levers(bench: Bench) -> list[tuple[str, list[str]]]:
    """The baseline, then every technique available on the bench's device for its task that serves
    on eager, alone, with the parameters its availability was judged with."""
    from pareto.compress import describe_techniques

    levers: list[tuple[str, list[str]]] = [(BASELINE, [])]
    for entry in describe_techniques(bench.device, bench.task):
        if entry["available"] and "eager" in entry["backends"] and entry["name"] not in NOT_ALONE:
            params = ",".join(f"{key}={value}" for key, value in entry["judged_with"].items())
            option = entry["name"] + (f":{params}" if params else "")
            levers.append((option, [option]))
    return levers


def build_row(bench: Bench, label: str, options: list[str], batch: int) -> tuple[dict[str, Any], Built | None]:
    """The row and its model built and called once; ``skipped`` (not available on the device) or
    ``failed`` (its one-sentence reason) and no model when it cannot be timed."""
    from pareto.compress import Config, why_not_here
    from pareto.errors import exception_line
    from pareto.study.assess import device_memory
    from pareto.study.bench import build

    row: dict[str, Any] = {"label": label, "techniques": options}
    try:
        config = Config(techniques=tuple(_technique(o) for o in options), batch_size=batch)
        why = why_not_here(config, bench.task, bench.device)
        if why is not None:
            row["skipped"] = why
            return row, None
        with device_memory(config, bench.device):  # out of memory: one sentence, the memory given back
            built = build(bench, config)
            _call_once(bench, _timed(bench, label, built))
    except Exception as exc:
        row["failed"] = exception_line(exc)
        print(f"{label}: failed to build ({row['failed']})", file=sys.stderr, flush=True)
        _free()
        return row, None
    row["build_s"] = built.compress_s + (built.compile_s or 0.0)
    return row, built


def _technique(option: str) -> Any:
    from pareto.study.measure_one import parse_technique_option

    return parse_technique_option(option)


def _timed(bench: Bench, label: str, built: Built) -> Timed:
    """What the interleaved timing takes for ``built``: its model, its inputs at its batch, its label."""
    from pareto.measure.latency import Timed

    inputs = bench.task.example_input(built.config.batch_size)
    return Timed(built.model, inputs, label=label, ready=built.served.ready)


def _call_once(bench: Bench, item: Timed) -> None:
    """One call of the model on its inputs, waited for on the device: the build's check."""
    import torch

    from pareto.devices import as_args

    item.model.eval()
    if item.ready is not None:
        item.ready()
    with torch.inference_mode():
        item.model(*as_args(item.inputs))
    if bench.device.startswith("cuda"):
        torch.cuda.synchronize(bench.device)


def time_rows(
    bench: Bench, built: list[tuple[str, Built]], plan: RoundPlan, probe: ContentionProbe | None
) -> dict[str, dict[str, Any]]:
    """Each built row's latency figures beside the baseline timed in the same rounds, or its ``failed``
    reason: all rows together; when that run fails, each row alone beside the baseline."""
    from pareto.errors import exception_line

    if not built:
        return {}
    items = [_timed(bench, label, model) for label, model in built]
    try:
        latencies = _time(bench, items, plan, probe)
    except Exception as exc:
        joint = exception_line(exc)
        print(f"the joint timing failed ({joint}); each row is timed alone beside the baseline", file=sys.stderr)
        _free()
        return _time_pairs(bench, items, plan, probe, joint)
    base = _baseline_of(built, latencies)
    return {label: _figures(latency, base, "together") for (label, _), latency in zip(built, latencies, strict=True)}


def _time(bench: Bench, items: list[Timed], plan: RoundPlan, probe: ContentionProbe | None) -> list[LatencyResult]:
    """``items`` (built already) timed in interleaved rounds by pareto's own path."""
    from pareto.study.bench import time_beside

    return time_beside(bench, [], items, plan=plan, probe=probe)[1]


def _time_pairs(
    bench: Bench, items: list[Timed], plan: RoundPlan, probe: ContentionProbe | None, joint: str
) -> dict[str, dict[str, Any]]:
    """Each row timed in its own run beside the baseline (the first item when it is the baseline)."""
    from pareto.errors import exception_line

    base = items[0] if items[0].label == BASELINE else None
    how = f"alone beside the baseline (the joint run failed: {joint})"
    timing: dict[str, dict[str, Any]] = {}
    for item in items:
        pair = [item] if base is None or item is base else [base, item]
        try:
            latencies = _time(bench, pair, plan, probe)
        except Exception as exc:
            timing[item.label] = {"failed": f"timing: {exception_line(exc)}"}
            _free()
            continue
        timing[item.label] = _figures(latencies[-1], latencies[0] if base is not None else None, how)
    return timing


def _baseline_of(built: list[tuple[str, Built]], latencies: list[LatencyResult]) -> LatencyResult | None:
    return next((latency for (label, _), latency in zip(built, latencies, strict=True) if label == BASELINE), None)


def _figures(latency: LatencyResult, base: LatencyResult | None, timed: str) -> dict[str, Any]:
    """A row's latency figures, with the baseline's from the same rounds (speedups divide by those)."""
    figures: dict[str, Any] = {
        "p50_ms": latency.summary.p50_ms,
        "p99_ms": latency.summary.p99_ms,
        "p99_upper_ms": latency.summary.p99_upper_ms,
        "busy": latency.busy,
        "method": latency.method,
        "timed": timed,
    }
    if base is not None:
        figures["baseline_p50_ms"] = base.summary.p50_ms
        figures["baseline_p99_ms"] = base.summary.p99_ms
    return figures


def _accuracy(bench: Bench, built: Built) -> dict[str, Any]:
    """``{"accuracy": ...}``, or ``{"failed": reason}`` when the evaluation fails."""
    from pareto.errors import exception_line

    try:
        return {"accuracy": float(bench.task.evaluate(built.model))}
    except Exception as exc:
        return {"failed": f"accuracy: {exception_line(exc)}"}


def _free() -> None:
    """Give the memory of models that are gone back (the device's cached blocks too)."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # freeing is best effort; a broken CUDA context shows in the next row's reason
        pass


def _print(name: str, batch: int, rows: list[dict[str, Any]], seconds: float) -> None:
    base = next((r for r in rows if r["label"] == BASELINE and "accuracy" in r), None)
    alone = any(r.get("timed", "").startswith("alone") for r in rows)
    how = "each row in its own run beside the baseline" if alone else "one interleaved run"
    print(f"\n### {name} @ batch {batch} ({seconds:.0f} s, {how})\n")
    print("| configuration | P99 ms | P50 ms | P99 speedup | P50 speedup | accuracy Δ (points) | build s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(table_line(r, base))
    sys.stdout.flush()


def table_line(r: dict[str, Any], base: dict[str, Any] | None) -> str:
    """One row of the Markdown table: its figures, or why it has none."""
    if "skipped" in r:
        return f"| {r['label']} | — | — | — | — | — | not available: {r['skipped']} |"
    if "p99_ms" not in r:
        return f"| {r['label']} | — | — | — | — | — | failed: {r['failed']} |"
    if r["p99_ms"] != r["p99_ms"]:  # NaN: no round was kept
        return f"| {r['label']} | — | — | — | — | — | busy: the contention guard discarded every round |"
    p99 = f"{r['baseline_p99_ms'] / r['p99_ms']:.2f}x" if "baseline_p99_ms" in r else "—"
    p50 = f"{r['baseline_p50_ms'] / r['p50_ms']:.2f}x" if "baseline_p50_ms" in r else "—"
    if "accuracy" in r and base is not None:
        accuracy = f"{100 * (r['accuracy'] - base['accuracy']):+.2f}"
    else:
        accuracy = f"failed: {r['failed']}" if "failed" in r else "—"
    return f"| {r['label']} | {r['p99_ms']:.3f} | {r['p50_ms']:.3f} | {p99} | {p50} | {accuracy} | {r['build_s']:.1f} |"


if __name__ == "__main__":
    sys.exit(main())
