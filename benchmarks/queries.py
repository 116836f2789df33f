"""Read-side speed on a study of 100 000 trials: `pareto best --json` end to end, `pareto.best` and
`pareto.frontier` in a warm process, and the frontier sweep against Optuna's own Pareto-front code.

The study comes from ``benchmarks/big_study.py`` (built once into the database given, reused after).
Every figure is the median (and the slowest) of repeated runs, in one run of this script, so that
the ratios compare like with like on a shared machine.

    python benchmarks/queries.py [--db sqlite:///big.db] [--runs 15]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from big_study import build

import pareto
from pareto.errors import NoFeasibleConfiguration


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def row(what: str, times_ms: list[float], note: str = "") -> str:
    return f"| {what} | {len(times_ms)} | {statistics.median(times_ms):.1f} | {max(times_ms):.1f} | {note} |"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def sweep_against_optuna(points: Any, maximize: list[bool], runs: int) -> tuple[list[float], list[float]]:
    """Our sweep and Optuna's ``_is_pareto_front`` on the same points, alternating, checked equal."""
    import numpy as np
    from optuna.study._multi_objective import _is_pareto_front

    from pareto.front import non_dominated

    loss = points * np.where(np.asarray(maximize), -1.0, 1.0)  # Optuna minimizes every column
    ours_ms, optuna_ms = [], []
    for _ in range(runs):
        started = time.perf_counter()
        ours = non_dominated(points, maximize)
        ours_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        theirs = np.flatnonzero(_is_pareto_front(loss, assume_unique_lexsorted=False)).tolist()
        optuna_ms.append((time.perf_counter() - started) * 1000)
        assert ours == theirs, "the two fronts differ"
    return ours_ms, optuna_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="sqlite:///big.db")
    parser.add_argument("--study", default="big")
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    built = build(args.db, study=args.study, trials=args.trials)
    if built:
        print(f"built study {args.study!r} with {args.trials} trials in {built:.0f} s")
    lines = ["| what | runs | median ms | slowest ms | note |", "|---|---:|---:|---:|---|"]

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "pareto", "best", "--db", args.db, "--study", args.study, "--json"]
    cli = []
    for _ in range(args.runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env)
        cli.append((time.perf_counter() - started) * 1000)
    lines.append(row("`pareto best --json` (process start to exit)", cli, "target < 1000 ms"))
    start_only = timed(lambda: subprocess.run([sys.executable, "-c", "import pareto._cli.cli"], check=True), args.runs)
    lines.append(row("of which: starting Python and importing the CLI", start_only, ""))

    pareto.best(study=args.study, db=args.db)  # the engine is opened once per process
    lines.append(
        row("`pareto.best` warm", timed(lambda: pareto.best(study=args.study, db=args.db), 50), "target < 50 ms")
    )

    def infeasible() -> None:
        with contextlib.suppress(NoFeasibleConfiguration):
            pareto.best(study=args.study, db=args.db, slo_p99=0.1)

    lines.append(row("`pareto.best`, nothing meets 0.1 ms (names the closest)", timed(infeasible, args.runs), ""))
    front = pareto.frontier(study=args.study, db=args.db)
    lines.append(
        row(
            "`pareto.frontier` warm",
            timed(lambda: pareto.frontier(study=args.study, db=args.db), args.runs),
            f"{len(front)} on the front",
        )
    )

    import numpy as np

    from pareto.front import objective_columns
    from pareto.store import queries
    from pareto.store.engine import open_engine, session_scope

    with session_scope(open_engine(args.db, create=False)) as session:
        study = queries.get_study(session, args.study)
        environment = queries.choose_environment(session, study, None)
        assert environment is not None
        _, columns = queries.light_columns(session, study, environment, ["accuracy", "latency_p99_upper_ms"])
    points = objective_columns(columns, [("accuracy", True), ("latency_p99_upper_ms", False)])
    rng = np.random.default_rng(0)
    cases = [
        ("the study's points (accuracy, P99 bound)", points, [True, False]),
        ("100 000 random points, 2 objectives", rng.random((100_000, 2)), [True, False]),
        ("100 000 random points, 3 objectives", rng.random((100_000, 3)), [True, False, False]),
    ]
    for name, values, maximize in cases:
        ours, theirs = sweep_against_optuna(values, maximize, args.runs)
        ratio = statistics.median(theirs) / statistics.median(ours)
        lines.append(row(f"frontier sweep, pareto — {name}", ours, f"{ratio:.1f}x Optuna's speed"))
        lines.append(row(f"frontier sweep, Optuna `_is_pareto_front` — {name}", theirs, "same front"))

    print(
        f"`python benchmarks/queries.py --db {args.db}`, {cpu_model()}, {os.cpu_count()} cores, "
        f"{datetime.date.today().isoformat()}, {args.trials} trials"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
