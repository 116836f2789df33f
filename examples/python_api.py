"""The read side from Python: the same answers as `pareto best|frontier|explain --json`.

Run it after the main job (`pareto search --slo-p99 7ms` stores study "demo" in ./pareto.db):

    python examples/python_api.py [--db sqlite:///pareto.db] [--study demo] [--slo-p99 7ms]
"""

from __future__ import annotations

import argparse

import pareto
from pareto.errors import NoFeasibleConfiguration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="sqlite:///pareto.db")
    parser.add_argument("--study", default="demo")
    parser.add_argument("--slo-p99", default="7ms")
    args = parser.parse_args()

    # every frontier configuration, fastest first, with its verdict against the SLO
    for row in pareto.frontier(study=args.study, slo_p99=args.slo_p99, db=args.db):
        m = row["metrics"]
        verdict = {True: "meets", False: "misses", None: "-"}[row["slo"]["feasible"]]
        bound = m["latency_p99_upper_ms"]
        print(f"trial {row['trial']:>4}  accuracy {m['accuracy']:.4f}  p99 <= {bound:.3g} ms  {verdict}")

    # the pick: highest accuracy whose P99 upper bound is within the SLO
    try:
        pick = pareto.best(study=args.study, slo_p99=args.slo_p99, db=args.db)
        confirmed = "confirmed" if pick["confirmation"] else "not confirmed"
        print(f"pick: trial {pick['trial']} {pick['config']} ({confirmed})")
    except NoFeasibleConfiguration as exc:
        print(f"no pick: {exc}")

    # why each frontier configuration was or was not chosen
    why = pareto.explain(study=args.study, slo_p99=args.slo_p99, db=args.db)
    for item in why["items"]:
        print(f"trial {item['trial']:>4}  {item['verdict']:<12} {item['reason']}")


if __name__ == "__main__":
    main()
