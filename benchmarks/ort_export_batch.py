"""Does tracing the ONNX export on two rows (a dynamic batch axis) cost speed at batch 1?

torch.export fixes an axis of size 1, so pareto traces a batch-1 configuration on ``example_input(2)``.
This builds the MiniLM pick (``ort_int8_dynamic(per_channel=True)`` on onnxruntime) both ways and
times them with the eager baseline in 20 interleaved rounds of 34 calls at batch 1.

    python benchmarks/ort_export_batch.py [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import torch

from pareto.compress import Config, apply, get_technique, onnxrt
from pareto.measure.latency import RoundPlan, Timed, measure_interleaved
from pareto.task import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = load_task("minilm")
    config = Config(
        techniques=(get_technique("ort_int8_dynamic", {"per_channel": True}),), batch_size=1, backend="onnxruntime"
    )
    dynamic = apply(task.model, config, task)
    traced_on_two = onnxrt.export_onnx

    def on_one(model: torch.nn.Module, t: Any) -> Any:  # the batch-1 trace: its batch axis is fixed at 1
        return traced_on_two(model, dataclasses.replace(t, batch_size=1, example_input=lambda _: t.example_input(1)))

    onnxrt.export_onnx = on_one
    try:
        fixed = apply(task.model, config, task)
    finally:
        onnxrt.export_onnx = traced_on_two
    x = task.example_input(1)
    plan = RoundPlan(samples=680, rounds=20, warmup=50)
    items = [Timed(task.model, x), *(Timed(s.module, x, ready=s.ready) for s in (dynamic, fixed))]
    timed = measure_interleaved(items, device="cpu", plan=plan)
    base = timed[0].summary
    print("| MiniLM, batch 1 | p50 ms | p99 ms | speedup p50 | speedup p99 | fidelity |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, model, result in zip(
        ["eager baseline", "pick, traced on 2 rows (dynamic batch)", "pick, traced on 1 row (batch fixed)"],
        (task.model, dynamic.module, fixed.module),
        timed,
        strict=True,
    ):
        s = result.summary
        print(
            f"| {name} | {s.p50_ms:.2f} | {s.p99_ms:.2f} | {base.p50_ms / s.p50_ms:.2f}× | "
            f"{base.p99_ms / s.p99_ms:.2f}× | {task.evaluate(model):.4f} |"
        )


if __name__ == "__main__":
    main()
