"""What ONNX Runtime's idle spinning does to the model timed next: the reason pareto turns it off.

ORT's intra-op workers spin for a while after each run by default. In an interleaved measurement the
next call is another model (or the contention probe), which then shares the cores with spinning
threads. This times the demo model's ORT session with spinning on and off, and after each call a
384x384 fp32 matmul in PyTorch (the contention probe's kind of work), against the matmul alone.

    python benchmarks/ort_spinning.py [--threads 2] [--calls 200]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import numpy as np
import onnxruntime as ort
import torch

from pareto.compress.onnxrt import export_onnx
from pareto.task import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = load_task("demo")
    graph = export_onnx(task.model, task).SerializeToString()
    x = task.example_input(task.batch_size).numpy()
    a = torch.randn(384, 384)

    def matmul_ms() -> float:
        start = time.perf_counter()
        a @ a
        return (time.perf_counter() - start) * 1e3

    print(
        f"{datetime.date.today()} · {platform.machine()} · torch {torch.__version__} · onnxruntime {ort.__version__} · "
        f"{args.threads} threads · {args.calls} calls each (demo model, batch {task.batch_size})\n"
    )
    print("| ORT idle spinning | ORT call p50 ms | p99 ms | matmul right after: p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for spin in ("1", "0"):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        calls, after = [], []
        for _ in range(args.calls):
            start = time.perf_counter()
            session.run(None, feed)
            calls.append((time.perf_counter() - start) * 1e3)
            after.append(matmul_ms())
        print(
            f"| {'on (ORT default)' if spin == '1' else 'off (pareto)'} | {np.percentile(calls, 50):.3f} | "
            f"{np.percentile(calls, 99):.3f} | {np.percentile(after, 50):.3f} | {np.percentile(after, 99):.3f} |"
        )
    alone = [matmul_ms() for _ in range(args.calls)]
    print(f"| (no ORT session) | — | — | {np.percentile(alone, 50):.3f} | {np.percentile(alone, 99):.3f} |")


if __name__ == "__main__":
    main()
