"""Nightly jobs on an unchanged machine, then after a real slowdown of the model.

A study of the demo model (wrapped so that ``PARETO_BENCH_SLOWDOWN_MS`` adds that many
milliseconds of sleep to every call: the model itself gets slower, nothing else changes) is searched
once, then ``pareto nightly`` runs ``--nights`` times unchanged and once more with the slowdown. Each
nightly is its own process with the example config (``configs/nightly.yaml``: 40 rounds a
configuration, threshold 1.25x, Mann-Whitney U at p < 0.002). Prints one row per night: exit code,
status, the pick's P99 before and now, the ratio, the test's p-value and the finding.

    python benchmarks/nightly.py [--nights 3] [--slowdown-ms 3] [--time-budget 90s]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = "benchmarks.nightly:make_task"


def make_task():  # type: ignore[no-untyped-def]
    """The demo task, its model slower by ``PARETO_BENCH_SLOWDOWN_MS`` ms a call when that is set."""
    import torch
    from torch import nn

    from pareto.tasks.demo import make_task as demo

    class Slowed(nn.Module):
        def __init__(self, inner: nn.Module, seconds: float) -> None:
            super().__init__()
            self.inner, self.seconds = inner, seconds

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.seconds:
                time.sleep(self.seconds)
            return self.inner(x)

    task = demo()
    task.model = Slowed(task.model, float(os.environ.get("PARETO_BENCH_SLOWDOWN_MS", "0")) / 1000).eval()
    task.name = "demo-slowable"
    return task


def pareto(*args: str, slowdown_ms: float = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARETO_BENCH_SLOWDOWN_MS": str(slowdown_ms)}
    return subprocess.run([sys.executable, "-m", "pareto", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=3)
    parser.add_argument("--slowdown-ms", type=float, default=3.0)
    parser.add_argument("--time-budget", default="90s")
    parser.add_argument("--n-trials", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = f"sqlite:///{folder}/nightly.db"
        common = ["--task", TASK, "--study", "nightly-bench", "--db", db]
        searched = pareto("search", *common, "--slo-p99", "7ms", "--n-trials", str(args.n_trials), "--json")
        if searched.returncode != 0:
            sys.exit(searched.stderr[-2000:])
        print("| night | slowdown | exit | status | pick | p99 before ms | p99 now ms | ratio | test | finding |")
        print("|---:|---|---:|---|---:|---:|---:|---:|---|---|")
        nights = [0.0] * args.nights + [args.slowdown_ms]
        for night, slowdown in enumerate(nights, 1):
            proc = pareto(
                "nightly",
                "--config",
                "configs/nightly.yaml",
                *common,
                "--time-budget",
                args.time_budget,
                "--json",
                slowdown_ms=slowdown,
            )
            summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
            pick = summary.get("pick_before") or {}
            c = next((c for c in summary.get("comparisons", []) if c["trial"] == pick.get("trial")), None)
            if c is None:
                print(
                    f"| {night} | {slowdown:g} ms | {proc.returncode} | {summary.get('status')} | — | | | | | "
                    f"{proc.stderr.strip().splitlines()[-1:]} |"
                )
                continue
            test = c["test"] + (f" p={c['p_value']:.2g}" if c["p_value"] is not None else "")
            print(
                f"| {night} | {slowdown:g} ms | {proc.returncode} | {summary['status']} | {pick['trial']} | "
                f"{c['p99_before_ms']:.3f} | {c['p99_after_ms']:.3f} | {c['ratio']:.2f} | {test} | {c['reason']} |"
            )


if __name__ == "__main__":
    main()
