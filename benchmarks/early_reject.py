"""Early rejection: the share of trial time it saves, and the front it finds, on the same configurations.

Run A is an ordinary TPE search with early rejection off: every configuration measured in full.
Run B measures the same configurations in the same order (enqueued from A) with early rejection on:
a configuration whose first round of latency puts the P99 over the SLO with confidence stops there.
Pairing the configurations keeps the sampler out of the comparison; what B saves is the rounds and
the accuracy evaluation it skipped, and the front B finds shows whether a rejection lost anything.
The front's hypervolume: the feasible trials (P99 upper bound within the SLO), accuracy up and P99
bound down, reference point the lowest accuracy of both runs and the SLO.

    python benchmarks/early_reject.py --task demo --slo 7ms --n-trials 30
    python benchmarks/early_reject.py --task minilm --slo 45ms --n-trials 12
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from pareto.api import create_study, search
from pareto.spec import SearchSpec

sys.path.insert(0, str(Path(__file__).parent))
from replay import hypervolume  # the replay benchmark's, beside this file


def run_spec(task: str, slo: str, n_trials: int, seed: int, early: bool) -> SearchSpec:
    return SearchSpec.model_validate(
        {
            "task": task,
            "study": "er",
            "slo": {"p99": slo},
            "search": {"n_trials": n_trials, "seed": seed, "confirm_top": 0, "early_reject": early},
        }
    )


def trial_seconds(url: str) -> dict[int, tuple[str, float]]:
    """Optuna trial number -> (state, wall seconds) for the trials that were not repeats."""
    from sqlalchemy import select

    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Trial

    frozen = {t.number: t for t in optuna.load_study(study_name="er", storage=url).trials}
    with session_scope(open_engine(url, create=False)) as session:
        rows = session.execute(select(Trial.optuna_number, Trial.state)).all()
    out = {}
    for number, state in rows:
        t = frozen[number]
        if state in ("DUPLICATE", "BUSY") or t.datetime_complete is None or t.datetime_start is None:
            continue
        out[number] = (state, (t.datetime_complete - t.datetime_start).total_seconds())
    return out


def front_hypervolume(url: str, slo_ms: float, acc_ref: float) -> tuple[float, int]:
    import pareto

    points = [
        (t["metrics"]["accuracy"], t["metrics"]["latency_p99_upper_ms"])
        for t in pareto.trials(study="er", db=url)
        if t["metrics"].get("latency_p99_upper_ms") is not None
    ]
    feasible = [(a, p) for a, p in points if p <= slo_ms]
    return hypervolume(feasible, (acc_ref, slo_ms)), len(feasible)


def by_config(url: str) -> dict[str, tuple[str, float | None, float | None]]:
    """Configuration key -> (state, accuracy, P99 upper bound) of each trial that was not a repeat."""
    from sqlalchemy import select

    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Measurement, Trial

    out: dict[str, tuple[str, float | None, float | None]] = {}
    with session_scope(open_engine(url, create=False)) as session:
        for trial in session.scalars(select(Trial).where(Trial.state.in_(("COMPLETE", "PRUNED")))):
            m = session.scalar(
                select(Measurement).where(Measurement.trial_id == trial.id, Measurement.kind == "search")
            )
            out[trial.config_key] = (
                trial.state,
                None if m is None else m.accuracy,
                None if m is None else m.latency_p99_upper_ms,
            )
    return out


def accuracies(url: str) -> list[float]:
    import pareto

    return [t["metrics"]["accuracy"] for t in pareto.trials(study="er", db=url)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="demo")
    parser.add_argument("--slo", default="7ms")
    parser.add_argument("--n-trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    folder = tempfile.mkdtemp(prefix="pareto-early-")
    url_a, url_b = f"sqlite:///{folder}/a.db", f"sqlite:///{folder}/b.db"

    spec_a = run_spec(args.task, args.slo, args.n_trials, args.seed, early=False)
    started = time.perf_counter()
    search(spec_a, db=url_a)
    wall_a = time.perf_counter() - started
    order = [
        t for t in optuna.load_study(study_name="er", storage=url_a).trials if "pareto_baseline" not in t.user_attrs
    ]
    order = [t for t in order if t.state.name == "COMPLETE" and "duplicate_of" not in t.user_attrs]

    spec_b = run_spec(args.task, args.slo, len(order) + 1, args.seed, early=True)  # + the baseline
    create_study(spec_b, db=url_b)
    study_b = optuna.load_study(study_name="er", storage=url_b)
    for t in order:
        study_b.enqueue_trial(t.params)
    started = time.perf_counter()
    search(spec_b, db=url_b)
    wall_b = time.perf_counter() - started

    a, b = trial_seconds(url_a), trial_seconds(url_b)
    slo_ms = spec_a.slo.p99
    assert slo_ms is not None
    acc_ref = min(accuracies(url_a) + accuracies(url_b))
    hv_a, n_a = front_hypervolume(url_a, slo_ms, acc_ref)

    hv_b, n_b = front_hypervolume(url_b, slo_ms, acc_ref)
    rejected = [s for s, _ in b.values() if s == "PRUNED"]
    seconds_a, seconds_b = sum(s for _, s in a.values()), sum(s for _, s in b.values())
    rows: list[tuple[str, Any, Any]] = [
        ("configurations (baseline included)", len(a), len(b)),
        ("rejected early", 0, len(rejected)),
        ("trial time, s (sum over trials)", f"{seconds_a:.1f}", f"{seconds_b:.1f}"),
        ("search wall time, s", f"{wall_a:.1f}", f"{wall_b:.1f}"),
        ("feasible trials", n_a, n_b),
        ("front hypervolume", f"{hv_a:.4g}", f"{hv_b:.4g}"),
    ]
    # what the rejections cost, on run A's own measurements (no noise between runs): A's front
    # without the configurations B rejected
    in_a, in_b = by_config(url_a), by_config(url_b)
    gone = {key for key, (state, _, _) in in_b.items() if state == "PRUNED"}
    kept = [
        (acc, p99) for key, (_, acc, p99) in in_a.items() if key not in gone and acc is not None and p99 is not None
    ]
    hv_kept = hypervolume([(a, p) for a, p in kept if p <= slo_ms], (acc_ref, slo_ms))
    bounds = sorted(p99 for key, (_, _, p99) in in_a.items() if key in gone and p99 is not None)
    rows.append(("front hypervolume of A without what B rejected", f"{hv_kept:.4g}", ""))
    print(f"Task {args.task}, SLO P99 <= {args.slo}, {len(order)} configurations from a TPE search (seed {args.seed})")
    print("| | A: early rejection off | B: on, same configurations |")
    print("|---|---:|---:|")
    for name, x, y in rows:
        print(f"| {name} | {x} | {y} |")
    print(
        f"\nThe configurations B rejected, their P99 upper bound in A: {', '.join(f'{b:.2f} ms' for b in bounds)} "
        f"({sum(b <= slo_ms for b in bounds)} within the SLO in A)"
    )
    print(
        f"Trial time saved: {1 - seconds_b / seconds_a:.1%}; hypervolume B/A: {hv_b / hv_a if hv_a else float('nan'):.3f} "
        f"(measured twice: the machine's noise); A without B's rejections / A: {hv_kept / hv_a if hv_a else float('nan'):.3f}"
    )


if __name__ == "__main__":
    main()
