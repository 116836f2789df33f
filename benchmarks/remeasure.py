"""Does the pick hold up? Independent re-measurements of the stored pick, each in its own process.

Asks ``pareto best`` for the pick, then runs ``pareto measure --study S --trial N --json`` ``--repeats``
times, each a fresh process (the configuration rebuilt from the task, timed with the stored method in
interleaved rounds with the baseline), and prints the stored figures beside each re-measurement:
whether the re-measured point P99 is at or under the stored upper bound, and whether it still meets
the SLO.

    python benchmarks/remeasure.py --slo-p99 7ms [--db URL] [--study demo] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pareto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--study", default=None)
    parser.add_argument("--slo-p99", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pick = pareto.best(study=args.study, slo_p99=args.slo_p99, db=args.db)
    stored, slo = pick["metrics"], pick["slo"]["p99_ms"]
    confirmed = "confirmed" if pick["confirmation"] else "not confirmed"
    print(f"pick: trial {pick['trial']} of study {pick['study']} ({confirmed}), SLO P99 <= {slo} ms\n")
    print("| run | p50 ms | p99 ms | p99 upper ms | verdict | p99 <= stored upper | rounds discarded |")
    print("|---|---:|---:|---:|---|---|---:|")
    print(
        f"| stored | {stored['latency_p50_ms']:.3f} | {stored['latency_p99_ms']:.3f} | "
        f"{stored['latency_p99_upper_ms']:.3f} | {pick['slo']['p99_verdict']} | — | {stored.get('discarded_rounds')} |"
    )
    within = met = 0
    for i in range(args.repeats):
        command = [
            sys.executable,
            "-m",
            "pareto",
            "measure",
            "--study",
            pick["study"],
            "--trial",
            str(pick["trial"]),
            "--json",
        ]
        if args.slo_p99:
            command += ["--slo-p99", args.slo_p99]
        if args.db:
            command += ["--db", args.db]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"| re-measure {i + 1} | failed: {proc.stderr.strip().splitlines()[-1]} |")
            continue
        now = json.loads(proc.stdout)["metrics"]
        holds = now["latency_p99_ms"] <= stored["latency_p99_upper_ms"]
        within += holds
        met += now.get("p99_verdict") == "met"
        print(
            f"| re-measure {i + 1} | {now['latency_p50_ms']:.3f} | {now['latency_p99_ms']:.3f} | "
            f"{now['latency_p99_upper_ms'] or float('inf'):.3f} | {now.get('p99_verdict')} | "
            f"{'yes' if holds else 'no'} | {now.get('discarded_rounds')} |"
        )
    print(
        f"\n{within} of {args.repeats} re-measured P99s at or under the stored upper bound; "
        f"{met} of {args.repeats} re-measurements meet the SLO on their own upper bound."
    )


if __name__ == "__main__":
    main()
