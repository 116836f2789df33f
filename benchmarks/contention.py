"""The main job with a CPU hog started halfway: does the contention guard keep wrong verdicts out?

Runs ``pareto search --slo-p99 7ms`` on a fresh database; once ``--hog-after`` trials are stored it
starts one CPU-bound process (a busy Python loop) and stops it ``--hog-seconds`` later (or when the
search ends). Then it prints
every trial with the rounds the guard discarded and its verdict, marks the trials that ran while the
hog was on, and re-measures the final pick on the quiet machine (``pareto measure --trial``).

    python benchmarks/contention.py [--db contention.db] [--hog-after 12] [--hog-seconds 60] [--n-trials 30]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone


def hog() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="contention.db")
    parser.add_argument("--hog-after", type=int, default=12)
    parser.add_argument("--hog-seconds", type=float, default=60.0)
    parser.add_argument("--n-trials", type=int, default=30)
    args = parser.parse_args()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(args.db + suffix):
            os.remove(args.db + suffix)
    cli = [sys.executable, "-m", "pareto"]
    search = subprocess.Popen(
        [*cli, "search", "--slo-p99", "7ms", "--n-trials", str(args.n_trials), "--db", args.db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    hog_process, hog_on, hog_off = None, None, None
    while search.poll() is None:
        time.sleep(0.5)
        if hog_process is None and _stored(args.db) >= args.hog_after:
            hog_process = multiprocessing.Process(target=hog, daemon=True)
            hog_process.start()
            hog_on = datetime.now(timezone.utc)
        if hog_on and hog_off is None and (datetime.now(timezone.utc) - hog_on).total_seconds() > args.hog_seconds:
            hog_process.terminate()
            hog_off = datetime.now(timezone.utc)
    _out, err = search.communicate()
    if hog_process is not None and hog_off is None:
        hog_process.terminate()
        hog_off = datetime.now(timezone.utc)
    wall = time.monotonic() - started
    print(f"search: exit {search.returncode}, {wall:.0f} s; hog from {hog_on} to {hog_off}\n")
    print(
        "\n".join(
            line for line in err.splitlines() if line.startswith(("trial", "Confirmed", "Baseline", "The machine"))
        )
    )
    _table(args.db, hog_on, hog_off)
    pick = subprocess.run([*cli, "best", "--db", args.db, "--json"], capture_output=True, text=True)
    if pick.returncode != 0:
        print(f"\nno pick: {pick.stderr.strip()}")
        return
    chosen = json.loads(pick.stdout)
    print(
        f"\npick: trial {chosen['trial']}, stored P99 {chosen['metrics']['latency_p99_ms']:.3f} ms "
        f"(upper {chosen['metrics']['latency_p99_upper_ms']:.3f} ms), confirmed: {chosen['confirmation'] is not None}"
    )
    again = subprocess.run(
        [*cli, "measure", "--db", args.db, "--trial", str(chosen["trial"]), "--json"], capture_output=True, text=True
    )
    if again.returncode == 0:
        m = json.loads(again.stdout)
        print(
            f"re-measured on the quiet machine: P99 {m['metrics']['latency_p99_ms']:.3f} ms, upper "
            f"{m['metrics']['latency_p99_upper_ms']:.3f} ms, verdict {m['verdict']['now']} "
            f"(stored verdict holds: {m['verdict_holds']})"
        )
    else:
        print(f"re-measurement failed: {again.stderr.strip()}")


def _stored(db: str) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM pareto_trials WHERE state <> 'RUNNING'").fetchone()[0]
    except sqlite3.Error:
        return 0


def _table(db: str, hog_on: datetime | None, hog_off: datetime | None) -> None:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT t.optuna_number, t.state, t.started_at, t.finished_at, m.discarded_rounds, m.probe_ratio_max, "
            "m.latency_p99_ms, m.latency_p99_lower_ms, m.latency_p99_upper_ms, t.error FROM pareto_trials t "
            "LEFT JOIN pareto_measurements m ON m.trial_id = t.id AND m.kind = 'search' ORDER BY t.optuna_number"
        ).fetchall()
    print(
        "\n| trial | during hog | state | rounds discarded | probe max / quiet | p99 ms | p99 upper ms | verdict at 7 ms |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---|")
    for number, state, start, end, discarded, ratio, p99, lower, upper, _error in rows:
        during = _overlaps(start, end, hog_on, hog_off)
        verdict = "—"
        if state == "COMPLETE":
            verdict = (
                "met"
                if upper is not None and upper <= 7
                else "missed"
                if lower is not None and lower > 7
                else "uncertain"
            )
        elif state == "BUSY":
            verdict = "none (machine busy)"
        print(
            f"| {number} | {'yes' if during else ''} | {state} | {discarded if discarded is not None else '—'} | "
            f"{f'{ratio:.2f}' if ratio else '—'} | {f'{p99:.2f}' if p99 else '—'} | "
            f"{f'{upper:.2f}' if upper else '—'} | {verdict} |"
        )


def _overlaps(start: str | None, end: str | None, on: datetime | None, off: datetime | None) -> bool:
    if not (start and end and on and off):
        return False
    parse = lambda text: datetime.fromisoformat(text).replace(tzinfo=timezone.utc)  # noqa: E731
    return parse(start) < off and parse(end) > on


if __name__ == "__main__":
    main()
