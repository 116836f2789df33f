"""Nightly sensitivity: unchanged nights, nights with the model made slower, and a slow creep.

A study of the demo model is searched once; then ``pareto nightly`` runs, each night its own process
with the example config (``configs/nightly.yaml``: 40 rounds a configuration) and no time left for new
trials, so the pick stays the same all along:

1. ``--unchanged`` nights with nothing changed; every ``--load-every``-th one with an unrelated process
   loading one core at half duty (a 300×300 matmul loop) for the whole night;
2. slowed nights: for each factor of ``--slowed`` (``1.25:20,1.5:10`` is 20 nights at 1.25× and 10 at
   1.5×), each night starts from a copy of the database as phase 1 left it, so every one is judged
   against the same history; every ``--load-every``-th with the load too;
3. a creep: from another copy, ``--creep-nights`` nights, each ``--creep`` slower than the one before.

A slower model is more compute in its forward, not a sleep. The study's model is the demo MLP whose
forward also runs the same layers again on the first r rows of the batch taken twice (r up to twice
the batch), r = ``BASE_ROWS`` on every
unchanged night (and in the search); a slower model has a larger r: the same operations on more rows,
so the machine's drift acts on the extra work as on the rest and no operation is added (an added
operation's fixed dispatch cost alone is several per cent of a 1 ms call). Before the nights, r is
found for each factor by bisection on the pick, each step timed as the nights time it (interleaved
rounds beside the pick as it is), and the factors reached are printed.

    python benchmarks/nightly_sensitivity.py [--unchanged 30] [--slowed 1.25:20,1.5:10] [--creep 0.03]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASK = "benchmarks.nightly_sensitivity:make_task"
STUDY = "sensitivity"
LOAD = (
    "import numpy as np, time\n"
    "a = np.random.default_rng(0).random((300, 300))\n"
    "while True:\n"
    "    end = time.perf_counter() + 0.05\n"
    "    while time.perf_counter() < end:\n"
    "        a @ a\n"
    "    time.sleep(0.05)\n"
)


def make_task():  # type: ignore[no-untyped-def]
    """The demo task; its forward also runs the model on the first ``PARETO_BENCH_ROWS`` rows of the batch
    taken twice (default ``BASE_ROWS``)."""
    import torch
    from torch import nn

    from pareto.tasks.demo import make_task as demo

    class Slower(nn.Module):
        def __init__(self, inner: nn.Module, extra_rows: int) -> None:
            super().__init__()
            self.inner, self.extra_rows = inner, extra_rows

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            twice = torch.cat([x, x])  # up to twice the batch again
            return self.inner(x) + 0.0 * self.inner(twice[: self.extra_rows]).sum()

    task = demo()
    task.model = Slower(task.model, int(os.environ.get("PARETO_BENCH_ROWS", BASE_ROWS))).eval()
    task.name = "demo-slower"
    return task


#: The model as it is on an unchanged night runs its layers again on this many rows of its 256.
BASE_ROWS = 48


def calibrate(db: str, factors: list[float]) -> dict[float, int]:
    """For each factor, the rows that make the pick's P50 that many times its P50 at ``BASE_ROWS``: a grid
    of row counts timed as the nights time it (40 interleaved rounds), interpolated (time is close to
    linear in rows), then the chosen ones timed in the same 80 rounds, printed."""
    import numpy as np

    from pareto.api import best
    from pareto.compress import Config, apply

    task = make_task()
    config = Config.from_dict(best(study=STUDY, db=db)["config"])
    x = task.example_input(config.batch_size)
    grid = [float(r) for r in range(BASE_ROWS + 32, 2 * config.batch_size + 1, 32)]
    models = [apply(task.model, config, task, device="cpu").module for _ in range(len(grid) + 1)]
    measured = _p50_ratios(models, x, {g: int(g) for g in grid}, grid, rounds=40)
    reached = np.maximum.accumulate([1.0] + [measured[g][0] for g in grid])  # time only grows with rows
    points = [float(BASE_ROWS), *grid]
    rows = {f: round(float(np.interp(f, reached, points))) for f in factors}
    chosen = models[: len(factors) + 1]
    ratios = _p50_ratios(chosen, x, rows, factors, rounds=80)
    print("\n| factor asked | rows run again | P50 × unchanged | P99 × unchanged |")
    print("|---:|---:|---:|---:|")
    for f in factors:
        print(f"| {f:.4g} | {rows[f]} | {ratios[f][0]:.3f} | {ratios[f][1]:.3f} |", flush=True)
    return rows


def _p50_ratios(
    models: list[Any], x: Any, rows: dict[float, int], factors: list[float], *, rounds: int
) -> dict[float, tuple[float, float]]:
    """Each factor's (P50, P99) over the unchanged pick's, all timed in the same interleaved rounds."""
    import torch

    from pareto.measure.latency import RoundPlan, Timed, measure_interleaved

    for model, f in zip(models, [1.0, *factors], strict=True):
        setattr(model, "extra_rows", rows.get(f, BASE_ROWS))  # noqa: B010 - a module attribute mypy does not know
    items = [Timed(model, x, label=str(i)) for i, model in enumerate(models)]
    plan = RoundPlan(samples=rounds * 17, rounds=rounds)
    results = [r.summary for r in measure_interleaved(items, device="cpu", plan=plan, threads=torch.get_num_threads())]
    return {
        f: (s.p50_ms / results[0].p50_ms, s.p99_ms / results[0].p99_ms)
        for f, s in zip(factors, results[1:], strict=True)
    }


def pareto(*args: str, rows: int = BASE_ROWS, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARETO_BENCH_ROWS": str(rows)}
    env.pop("PARETO_DB_URL", None)
    return subprocess.run([sys.executable, "-m", "pareto", *args], capture_output=True, text=True, env=env, cwd=cwd)


def night(db: str, factor: float, rows: int, load: bool, folder: Path) -> dict[str, Any]:
    """One nightly process (its summaries written under ``folder``); the row the tables print."""
    loader = (
        subprocess.Popen([sys.executable, "-c", LOAD], env={**os.environ, "OMP_NUM_THREADS": "1"}) if load else None
    )
    started = time.monotonic()
    try:
        proc = pareto(
            "nightly", "--config", str(ROOT / "configs" / "nightly.yaml"), "--task", TASK, "--study", STUDY, "--db", db,
            "--time-budget", "1s", "--json", rows=rows, cwd=folder,
        )  # fmt: skip
    finally:
        if loader is not None:
            loader.kill()
            loader.wait()
    summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
    row: dict[str, Any] = {
        "factor": factor,
        "rows": rows,
        "load": load,
        "exit": proc.returncode,
        "status": summary.get("status"),
        "seconds": round(time.monotonic() - started, 1),
        "error": None if summary else proc.stderr.strip().splitlines()[-1:],
    }
    pick = summary.get("pick_before") or {}
    comparison = next((c for c in summary.get("comparisons", []) if c["trial"] == pick.get("trial")), None)
    drift = summary.get("drift") or {}
    row.update(
        pick=pick.get("trial"),
        p99_ms=comparison["p99_after_ms"] if comparison else None,
        basis=comparison["basis"] if comparison else None,
        p50_ratio=comparison.get("corrected_p50_ratio") if comparison else None,
        p99_ratio=comparison.get("corrected_ratio") if comparison else None,
        band_p50=comparison.get("band_p50") if comparison else None,
        band_p99=comparison.get("band") if comparison else None,
        machine=drift.get("reference_ratio"),
        kind=comparison.get("kind") if comparison else None,
        reproduced=summary.get("reproduced"),
        first_pass=(summary.get("first_pass") or {}).get("reason"),
        change_point=summary.get("change_point"),
        reason=comparison["reason"] if comparison else None,
        smallest=((drift.get("bands") or {}).get("p50") or {}).get("smallest_detectable"),
    )
    return row


def copy_db(source: Path, target: Path) -> None:
    """A copy of a SQLite database with what its write-ahead log holds (a file copy misses that)."""
    import sqlite3
    from contextlib import closing

    target.unlink(missing_ok=True)
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def print_row(label: str, n: int, row: dict[str, Any]) -> None:
    cp = row["change_point"]
    change = (
        f"×{cp['ratio']:.2f} {cp['statistic']} of {cp.get('series', 'pick')} {cp['trial']} since night "
        f"{cp['index'] + 1}{' (new)' if cp['new'] else ''}"
        if cp
        else "—"
    )
    print(
        f"| {label} | {n} | {row['factor']:.3f} | {'yes' if row['load'] else ''} | {row['exit']} | {row['status']} | "
        f"{_fmt(row['p99_ms'])} | {_fmt(row['machine'], '.2f')} | {_fmt(row['p50_ratio'])} ≤ {_fmt(row['band_p50'])} | "
        f"{_fmt(row['p99_ratio'])} ≤ {_fmt(row['band_p99'])} | {row['kind'] or '—'} | "
        f"{'—' if row['reproduced'] is None else row['reproduced']} | {change} | {row['seconds']} |",
        flush=True,
    )


HEADER = (
    "| phase | night | factor | load | exit | status | pick P99 ms | machine × | P50 drift-corrected × ≤ band | "
    "P99 drift-corrected × ≤ band | kind | 2nd pass | change point | s |\n"
    "|---|---:|---:|---|---:|---|---:|---:|---|---|---|---|---|---:|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unchanged", type=int, default=30)
    parser.add_argument("--slowed", default="1.25:20,1.5:10", help="factor:nights,...")
    parser.add_argument("--creep", type=float, default=0.03)
    parser.add_argument("--creep-nights", type=int, default=10)
    parser.add_argument("--load-every", type=int, default=4, help="every k-th night runs beside a load (0: never)")
    parser.add_argument("--n-trials", type=int, default=12)
    parser.add_argument("--folder", help="keep the databases here [default: a temporary folder]")
    parser.add_argument("--out", default="nightly_sensitivity.jsonl")
    args = parser.parse_args()
    # a stopped run (kill, Ctrl-C) ends its night's load process too: SIGTERM unwinds like Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    slowed = [(float(f), int(n)) for f, n in (part.split(":") for part in args.slowed.split(",") if part)]
    folder = Path(args.folder or tempfile.mkdtemp(prefix="pareto-sensitivity-"))
    folder.mkdir(parents=True, exist_ok=True)
    out = open(args.out, "a")  # noqa: SIM115 - appended as nights end
    history = folder / "history.db"
    db = f"sqlite:///{history}"
    if not history.exists():  # a kept folder's study is searched once
        common = ("--task", TASK, "--study", STUDY, "--db", db)
        searched = pareto("search", *common, "--slo-p99", "7ms", "--n-trials", str(args.n_trials))
        if searched.returncode != 0:
            sys.exit(searched.stderr[-2000:])
    creep = [(1 + args.creep) ** n for n in range(1, args.creep_nights + 1)]
    rows = calibrate(db, sorted({f for f, _ in slowed} | set(creep)))

    def run(label: str, n: int, path: Path, factor: float) -> None:
        load = bool(args.load_every) and n % args.load_every == 0
        row = night(f"sqlite:///{path}", factor, rows.get(factor, BASE_ROWS), load, folder)
        print_row(label, n, row)
        out.write(json.dumps({"phase": label, "night": n, **row}) + "\n")
        out.flush()

    print("\n" + HEADER, flush=True)
    for n in range(1, args.unchanged + 1):
        run("unchanged", n, history, 1.0)
    for factor, nights in slowed:
        for n in range(1, nights + 1):
            scratch = folder / "scratch.db"
            copy_db(history, scratch)
            run(f"{factor:g}× slower", n, scratch, factor)
    creep_db = folder / "creep.db"
    copy_db(history, creep_db)
    for n, factor in enumerate(creep, 1):
        run(f"creep {100 * args.creep:g} %/night", n, creep_db, factor)
    print(f"\nDatabases in {folder}; rows in {args.out}.")


if __name__ == "__main__":
    main()
