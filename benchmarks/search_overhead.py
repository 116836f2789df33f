"""Where a search's time goes, per trial: measuring versus everything else.

Reads a study that a search stored (``pareto search`` first) and prints, per trial, the time spent
timing the model (latency), scoring it (accuracy), compressing it, and the rest of the trial's wall
time (sampler, database writes, Optuna bookkeeping), plus the gap between trials.

    python benchmarks/search_overhead.py --db sqlite:///pareto.db --study demo
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import optuna
from sqlalchemy import select

from pareto.store.engine import open_engine, resolve_url, session_scope
from pareto.store.models import Study, Trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--study", default="demo")
    args = parser.parse_args()
    url = resolve_url(args.db)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    frozen = {t.number: t for t in optuna.load_study(study_name=args.study, storage=url).trials}
    with session_scope(open_engine(url, create=False)) as session:
        study = session.scalars(select(Study).where(Study.name == args.study)).one()
        trials = session.scalars(
            select(Trial).where(Trial.study_id == study.id, Trial.state == "COMPLETE").order_by(Trial.optuna_number)
        ).all()
        rows = []
        for t in trials:
            ft = frozen[t.optuna_number]
            wall = (ft.datetime_complete - ft.datetime_start).total_seconds()
            measuring = t.latency_s + t.accuracy_s
            compressing = t.compress_s + (t.compile_s or 0.0)  # compile time is stored apart from latency
            rows.append(
                (
                    t.optuna_number,
                    t.description,
                    wall,
                    t.latency_s,
                    t.accuracy_s,
                    compressing,
                    wall - measuring - compressing,
                )
            )
    print("| trial | configuration | wall s | latency s | accuracy s | compress s | other s | measuring % |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n, desc, wall, lat, acc, comp, other in rows:
        print(
            f"| {n} | {desc} | {wall:.2f} | {lat:.2f} | {acc:.3f} | {comp:.3f} | {other:.3f} | "
            f"{(lat + acc) / wall:.0%} |"
        )
    numbers = sorted(frozen)
    gaps = [
        (frozen[b].datetime_start - frozen[a].datetime_complete).total_seconds()
        for a, b in itertools.pairwise(numbers)
        if frozen[a].datetime_complete and frozen[b].datetime_start
    ]
    total_wall = sum(r[2] for r in rows)
    total_measuring = sum(r[3] + r[4] for r in rows)
    print()
    print(
        f"{len(rows)} measured trials: {total_wall:.1f} s in trials, {total_measuring:.1f} s measuring "
        f"({total_measuring / total_wall:.0%}); median compress {statistics.median(r[5] for r in rows):.3f} s, "
        f"median other {statistics.median(r[6] for r in rows):.3f} s; "
        f"median gap between trials (sampler before the trial starts) {statistics.median(gaps) if gaps else 0:.3f} s"
    )


if __name__ == "__main__":
    main()
