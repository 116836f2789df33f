"""The fuzz test at length (issue 47): ``tests/test_fuzz.py`` with many more cases, over several seeds.

Each seed runs the suite's two fuzz tests (every command, every serve endpoint) with ``--cases`` cases
and prints what they saw: how many cases ended in a one-sentence error, exit 0 or the stubbed work, the
serve answers by status, and the failures (a traceback, a 500, a read that changed a row). Run it from
the repository root::

    .venv/bin/python benchmarks/fuzz.py [--cases 5000] [--seeds 1,2]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seeds", default="1,2")
    args = parser.parse_args()
    print(
        f"`benchmarks/fuzz.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
        "| seed | command cases | command outcomes | serve calls by status | failures | seconds |\n|---|---|---|---|---|---|"
    )
    worst = 0
    for seed in (int(s) for s in args.seeds.split(",")):
        env = {**os.environ, "PARETO_FUZZ_CASES": str(args.cases), "PARETO_FUZZ_SEED": str(seed)}
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_fuzz.py"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        text = done.stdout + done.stderr
        command = re.search(r"fuzz seed \d+: \d+ cases, (\{[^}]*\}), (\d+) failures", text)
        serve = re.search(r"serve fuzz seed \d+: \d+ endpoints, (\{[^}]*\})", text)
        failed = "0" if done.returncode == 0 else f"exit {done.returncode}: see pytest's output"
        worst = max(worst, done.returncode)
        print(
            f"| {seed} | {args.cases:,} | {command.group(1) if command else '?'} | {serve.group(1) if serve else '?'} "
            f"| {failed} | {time.monotonic() - started:.0f} |"
        )
        if done.returncode:
            print(text[-4000:], file=sys.stderr)
    return worst


if __name__ == "__main__":
    sys.exit(main())
