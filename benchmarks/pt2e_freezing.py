"""Why ``int8_static`` is compiled with Inductor's freezing: one PT2E graph served several ways, in one run.

Builds the resnet task's PT2E int8 graph once (``int8_static``: torch.export, X86 Inductor
quantizer, calibration, convert) and times, interleaved with the uncompressed baseline in the same
rounds (20 rounds of 34 calls, a random order each round, 50 warm-up calls):

- the converted graph run eagerly (reference quantize/dequantize ops in float);
- ``torch.compile`` of it without freezing (what a plain compile backend would do);
- pareto's ``FrozenCompiled`` (freezing on while a new input shape compiles, static shapes);
- the same compiled function called directly, without ``FrozenCompiled``'s per-call signature
  check (what a server that sets freezing globally runs): the wrapper's own cost;
- ``torch.compile`` of the float model (the compile backend's uncompressed row).

Needs torchao (``pip install -e '.[torchao]'``). Prints a Markdown table for BENCHMARKS.md.

    python benchmarks/pt2e_freezing.py [--task resnet] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import platform

import torch

from pareto.compress import Config, get_technique
from pareto.compress.compile import FrozenCompiled
from pareto.measure.latency import RoundPlan, Timed, measure_interleaved
from pareto.study.assess import build
from pareto.task import load_task


class _Direct(torch.nn.Module):
    """Calls a ``FrozenCompiled``'s compiled function directly (already compiled for the timed shape)."""

    def __init__(self, frozen: FrozenCompiled) -> None:
        super().__init__()
        self.frozen = frozen

    def forward(self, *args: object) -> object:
        return self.frozen._compiled(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="resnet")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = load_task(args.task)
    batch = task.batch_size
    served, _, _ = build(
        task, Config(techniques=(get_technique("int8_static"),), batch_size=batch, backend="compile"), "cpu"
    )
    assert isinstance(served, FrozenCompiled)
    graph = served._orig_mod
    # a copy: Dynamo keeps compiled code per code object and guards on the module, so compiling the
    # same graph module again would reuse FrozenCompiled's frozen code
    plain = torch.compile(copy.deepcopy(graph), dynamic=False)  # no freezing
    compiled_fp32, _, _ = build(task, Config(batch_size=batch, backend="compile"), "cpu")
    x = task.example_input(batch)
    with torch.inference_mode():
        served(x)  # compiled for this shape (again, after the fp32 build reset the compiler)
    rows = [
        ("baseline (eager fp32)", task.model.eval()),
        ("fp32 on compile", compiled_fp32),
        ("PT2E int8 graph, eager (reference ops)", graph),
        ("PT2E int8, torch.compile without freezing", plain),
        ("PT2E int8, FrozenCompiled (pareto's int8_static)", served),
        ("PT2E int8, the same compiled function called directly", _Direct(served)),
    ]
    plan = RoundPlan(samples=680, rounds=20, warmup=50)
    timed = measure_interleaved([Timed(m, x) for _, m in rows], device="cpu", plan=plan, threads=args.threads)
    base = timed[0].summary
    print(
        f"{datetime.date.today()} · {platform.processor() or platform.machine()} · torch {torch.__version__} · "
        f"{args.threads} threads · {args.task} at batch {batch} · 680 timed calls per row in 20 interleaved rounds"
    )
    print("\n| serving of the same graph | p50 ms | p99 ms | speedup p50 | speedup p99 | accuracy |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, model), result in zip(rows, timed, strict=True):
        s = result.summary
        accuracy = task.evaluate(model)
        print(
            f"| {name} | {s.p50_ms:.3f} | {s.p99_ms:.3f} | {base.p50_ms / s.p50_ms:.2f}× | "
            f"{base.p99_ms / s.p99_ms:.2f}× | {accuracy:.4f} |"
        )


if __name__ == "__main__":
    main()
