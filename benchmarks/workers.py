"""Wall time of one search with 1, 2 and 4 local workers, and where the time goes.

Each run is a fresh study of ``--n-trials`` demo trials (P99 SLO 7 ms) in its own SQLite file,
started as ``python -m pareto search --workers W``; the runs go in the order 1, 2, 4, 4, 2, 1 so that
a slow spell of the shared machine hits every worker count alike. Beside the wall time it sums, over
the study's trials, the seconds spent compressing, timing latency and evaluating accuracy (from the
trials table), and counts the rounds the contention guard discarded.

    python benchmarks/workers.py [--n-trials 24] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(workers: int, n_trials: int, folder: Path) -> dict[str, float]:
    db = folder / f"w{workers}-{time.monotonic_ns()}.db"
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pareto",
            "search",
            "--slo-p99",
            "7ms",
            "--n-trials",
            str(n_trials),
            "--workers",
            str(workers),
            "--db",
            f"sqlite:///{db}",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"workers={workers} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    con = sqlite3.connect(db)
    compress, latency, accuracy = con.execute(
        "SELECT sum(compress_s), sum(latency_s), sum(accuracy_s) FROM pareto_trials"
    ).fetchone()
    discarded = con.execute(
        "SELECT coalesce(sum(discarded_rounds), 0) FROM pareto_measurements WHERE kind = 'search'"
    ).fetchone()[0]
    measured = con.execute("SELECT count(*) FROM pareto_trials WHERE state = 'COMPLETE'").fetchone()[0]
    return {
        "wall": wall,
        "compress": compress or 0.0,
        "latency": latency or 0.0,
        "accuracy": accuracy or 0.0,
        "discarded": discarded,
        "measured": measured,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-trials", type=int, default=24)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    order = args.workers + args.workers[::-1]
    results: dict[int, list[dict[str, float]]] = {w: [] for w in args.workers}
    with tempfile.TemporaryDirectory() as folder:
        for workers in order:
            results[workers].append(run(workers, args.n_trials, Path(folder)))
            r = results[workers][-1]
            print(f"workers={workers}: {r['wall']:.1f} s", file=sys.stderr)
    base = statistics.mean(r["wall"] for r in results[args.workers[0]])
    print(
        "| workers | wall s (each run) | vs 1 worker | compress s | latency timing s | accuracy s | "
        "measured trials | rounds discarded |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for workers, runs in results.items():
        mean = statistics.mean(r["wall"] for r in runs)
        walls = " / ".join(f"{r['wall']:.1f}" for r in runs)
        print(
            f"| {workers} | {walls} | {base / mean:.2f}x | "
            f"{statistics.mean(r['compress'] for r in runs):.1f} | {statistics.mean(r['latency'] for r in runs):.1f} | "
            f"{statistics.mean(r['accuracy'] for r in runs):.1f} | "
            f"{statistics.mean(r['measured'] for r in runs):.0f} | "
            f"{statistics.mean(r['discarded'] for r in runs):.0f} |"
        )


if __name__ == "__main__":
    main()
