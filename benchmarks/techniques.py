"""Compression ratio against measured speedup, per technique, combination and serving backend, per task.

A row starting with ``@compile`` or ``@onnxruntime`` is served on that backend (``torch.compile`` of the
result, or an ONNX export run by ONNX Runtime's CPU execution provider); the baseline is always the
uncompressed model in eager PyTorch. ``--study NAME --db URL`` adds the study's pick (``pareto best``
under the study's SLOs) as a row of the same interleaved measurement.

Every configuration of a task is built first, then all of them are timed together with the
uncompressed baseline in interleaved rounds (20 rounds of 34 calls each, a random order every round,
50 warm-up calls, the given thread count): a slow spell of a shared machine falls on every row alike,
so the ratios compare like with like. Prints a Markdown table per task for BENCHMARKS.md.

    python benchmarks/techniques.py --task demo --task transformer --task minilm --task resnet [--threads 2]
    python benchmarks/techniques.py --task minilm --study minilm --db sqlite:///minilm.db
    python benchmarks/techniques.py --task resnet --rows int8 --rows @compile   # only rows naming these

``int8_static`` rows need torchao (a dependency of pareto); where it does not import they say so.
"""

from __future__ import annotations

import argparse
import datetime
import platform
from typing import cast

import torch

import pareto
from pareto.compress import Backend, Config, Served, backend_reason
from pareto.errors import NoFeasibleConfiguration
from pareto.measure.latency import RoundPlan, Timed, measure_interleaved
from pareto.measure.memory import theoretical_bytes
from pareto.study.assess import build_served
from pareto.study.measure_one import parse_technique_option
from pareto.task import Task, load_task

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
        ["int8_dynamic:kernels=torch.ao"],  # the kernels side by side (torchao's where installed)
        ["int8_dynamic:kernels=torchao"],
        ["bf16"],
        ["fp16"],
        ["distill:width_ratio=0.5,steps=300"],
        ["prune_structured:ratio=0.5", "finetune:steps=100,lr=0.001"],
        ["prune_structured:ratio=0.5", "int8_dynamic"],
        ["prune_unstructured:sparsity=0.9", "int8_dynamic"],
        ["compile"],
        ["@compile"],
        ["@onnxruntime"],
        ["@onnxruntime", "ort_int8_dynamic"],
        ["@onnxruntime", "ort_int8_dynamic:per_channel=True"],
        ["@onnxruntime", "prune_structured:ratio=0.5", "ort_int8_dynamic:per_channel=True"],
        ["@onnxruntime", "ort_int8_static"],
        ["@compile", "int8_static"],
        ["@compile", "prune_structured:ratio=0.5", "int8_static"],
    ],
    "transformer": [
        [],
        ["prune_unstructured:sparsity=0.5"],
        ["prune_structured:ratio=0.5"],
        ["lowrank:rank_ratio=0.25"],
        ["int8_dynamic"],
        ["int8_dynamic:kernels=torch.ao"],  # the kernels side by side (torchao's where installed)
        ["int8_dynamic:kernels=torchao"],
        ["bf16"],
        ["prune_structured:ratio=0.5", "int8_dynamic"],
        ["@compile"],
        ["@onnxruntime"],
        ["@onnxruntime", "ort_int8_dynamic"],
        ["@onnxruntime", "ort_int8_dynamic:per_channel=True"],
        ["@onnxruntime", "ort_int8_dynamic:op_types=all"],  # ONNX Runtime's quantize_dynamic defaults
        ["@compile", "int8_static"],
        # the CPU's own levers: bf16 compiled (native on AMX and AVX-512 BF16), stacked with pruning
        ["@compile", "bf16"],
        ["@compile", "prune_structured:ratio=0.25", "bf16"],
        ["@compile", "prune_structured:ratio=0.4", "finetune:steps=200,lr=0.001", "bf16"],
        ["@compile", "prune_structured:ratio=0.5", "finetune:steps=200,lr=0.001", "bf16"],
        ["@compile", "prune_structured:ratio=0.6", "finetune:steps=400,lr=0.001", "bf16"],
    ],
    "minilm": [
        [],
        ["prune_unstructured:sparsity=0.5"],
        ["prune_structured:ratio=0.25"],
        ["prune_structured:ratio=0.5"],
        ["lowrank:rank_ratio=0.5"],
        ["int8_dynamic"],
        ["int8_dynamic:kernels=torch.ao"],  # the kernels side by side (torchao's where installed)
        ["int8_dynamic:kernels=torchao"],
        ["prune_structured:ratio=0.25", "int8_dynamic"],
        ["prune_structured:ratio=0.25", "finetune:steps=200,lr=0.0001"],
        ["prune_structured:ratio=0.25", "finetune:steps=200,lr=0.0001", "int8_dynamic"],
        ["prune_structured:ratio=0.5", "finetune:steps=400,lr=0.0001", "int8_dynamic"],
        ["@compile"],
        ["@onnxruntime"],
        # ONNX Runtime's quantize_dynamic with its defaults: what a user reaches for without pareto
        ["@onnxruntime", "ort_int8_dynamic:op_types=all"],
        ["@onnxruntime", "ort_int8_dynamic:per_channel=True"],
        ["@onnxruntime", "prune_structured:ratio=0.25", "ort_int8_dynamic:per_channel=True"],
        # ONNX Runtime's transformer optimizer (its fusions) alone and before its int8
        ["@onnxruntime", "ort_fuse"],
        ["@onnxruntime", "ort_fuse", "ort_int8_dynamic:per_channel=True"],
        ["@onnxruntime", "ort_fuse", "ort_int8_dynamic:op_types=all"],
        ["@compile", "int8_static"],
        # the CPU's own levers: bf16 (native on AMX and AVX-512 BF16), best compiled; stacked with
        # light pruning and its recovery
        ["bf16"],
        ["@compile", "bf16"],
        ["@compile", "prune_structured:ratio=0.1", "finetune:steps=100,lr=0.0001", "bf16"],
        ["@compile", "prune_structured:ratio=0.25", "finetune:steps=200,lr=0.0001", "bf16"],
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
        ["@compile"],
        ["@onnxruntime"],
        ["@onnxruntime", "prune_structured:ratio=0.5", "finetune:steps=200,lr=0.001"],
        ["@onnxruntime", "ort_int8_static"],
        ["@onnxruntime", "prune_structured:ratio=0.5", "finetune:steps=200,lr=0.001", "ort_int8_static"],
        # PyTorch's own static int8 (PT2E, X86 Inductor quantizer; needs torchao), compiled with freezing
        ["@compile", "int8_static"],
        ["@compile", "prune_structured:ratio=0.5", "finetune:steps=200,lr=0.001", "int8_static"],
    ],
}


def _build_rows(task: Task, configs: list[Config]) -> list[tuple[str, Served | str]]:
    """Each configuration built on the CPU, or why it is not (unavailable here, or it failed)."""
    rows: list[tuple[str, Served | str]] = []
    for config in configs:
        reason = backend_reason(config.backend, "cpu") or next(
            (t.available("cpu", task) for t in config.techniques if t.available("cpu", task)), None
        )
        if reason:
            rows.append((config.describe(), f"unavailable: {reason}"))
            continue
        try:
            served, _ = build_served(task, config, "cpu")
        except Exception as exc:  # report the failure in the table and carry on with the next row
            rows.append((config.describe(), f"failed: {type(exc).__name__}: {exc}"))
            continue
        rows.append((config.describe(), served))
    return rows


def main() -> None:
    from pareto.measure.environment import separate_compiled_code

    separate_compiled_code()  # as the bench does: code compiled under other kernel limits stays apart
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", default=None, choices=sorted(CONFIGS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--samples", type=int, default=680)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--study", help="also time this study's pick (pareto best under its SLOs)")
    parser.add_argument("--db", help="the study's database URL")
    parser.add_argument(
        "--rows",
        action="append",
        default=None,
        help="only rows whose options contain this text (repeatable; the baseline always)",
    )
    args = parser.parse_args()
    plan = RoundPlan(samples=args.samples, rounds=args.rounds, warmup=50)
    print(
        f"{datetime.date.today()} · {platform.processor() or platform.machine()} · torch {torch.__version__} · "
        f"{args.threads} threads · {args.samples} timed calls per row in {args.rounds} rounds, every row "
        "interleaved with the others in a random order each round"
    )
    torch.set_num_threads(args.threads)
    _allow_recompiles()
    for name in args.task or ["demo"]:
        task = load_task(name)
        base_bytes = theoretical_bytes(task.model)
        rows = _build_rows(task, _configs(name, task.batch_size, args))
        built = [(d, s) for d, s in rows if isinstance(s, Served)]
        x = task.example_input(task.batch_size)
        items = [Timed(s.module, x, ready=s.ready) for _, s in built]  # ONNX Runtime opens its session first
        timed = measure_interleaved(items, device="cpu", plan=plan, threads=args.threads)
        latency = {d: r.summary for (d, _), r in zip(built, timed, strict=True)}
        base = latency[built[0][0]]  # the first row is the baseline
        base_accuracy = task.evaluate(built[0][1].module)
        print(f"\n### {name} (batch {task.batch_size})\n")
        print(
            "| configuration | compression (theory) | p50 ms | p99 ms | speedup p50 | speedup p99 | accuracy | Δ accuracy |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for description, served in rows:
            if not isinstance(served, Served):
                print(f"| {description} | — | — | — | — | — | — | {served} |")
                continue
            model = served.module
            lat = latency[description]
            accuracy = task.evaluate(model)
            print(
                f"| {description} | {base_bytes / theoretical_bytes(model):.2f}× | {lat.p50_ms:.3f} | "
                f"{lat.p99_ms:.3f} | {base.p50_ms / lat.p50_ms:.2f}× | {base.p99_ms / lat.p99_ms:.2f}× | "
                f"{accuracy:.4f} | {accuracy - base_accuracy:+.4f} |",
                flush=True,
            )


def _allow_recompiles() -> None:
    """Every compiled row of a task shares its wrappers' ``forward`` (bf16's cast, say), and each row
    compiles it again for every input shape (the timed batch, then the evaluation's): past Dynamo's
    limit of 8 it would run a row's later calls eagerly, silently. Raised, and made an error."""
    import torch._dynamo.config as dynamo_config

    from pareto.devices import recompile_settings

    for name, value in recompile_settings(256).items():
        setattr(dynamo_config, name, value)


def _configs(name: str, batch_size: int, args: argparse.Namespace) -> list[Config]:
    """The task's rows that ``--rows`` chose, and the ``--study``'s pick when it is of this task."""
    chosen_rows = [
        options
        for options in CONFIGS[name]
        if not options or args.rows is None or any(text in " ".join(options) for text in args.rows)
    ]
    configs = [_config(options, batch_size) for options in chosen_rows]
    tasks_of = {s["study"]: s["task"] for s in pareto.studies(db=args.db)} if args.study else {}
    if args.study and tasks_of.get(args.study) == name:  # the pick joins its own task's table only
        try:
            pick = pareto.best(study=args.study, db=args.db)
        except NoFeasibleConfiguration as exc:  # the table is still worth having: said, not raised
            print(f"no pick of study {args.study!r} to add: {exc}")
            return configs
        chosen = Config.from_dict(pick["config"])
        print(f"pick of study {args.study!r}: trial {pick['trial']}, {chosen.describe()}")
        if chosen not in configs:  # a row already: timed once
            configs.append(chosen)
    return configs


def _config(options: list[str], batch_size: int) -> Config:
    backend = cast("Backend", options[0][1:] if options and options[0].startswith("@") else "eager")
    rest = options[1:] if backend != "eager" else options
    return Config(techniques=tuple(parse_technique_option(o) for o in rest), batch_size=batch_size, backend=backend)


if __name__ == "__main__":
    main()
