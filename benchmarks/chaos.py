"""Workers killed (SIGKILL) at random points of their trials, on PostgreSQL (issue 47): nothing blocked,
nothing measured twice, nothing half-written.

One study of the tiny test model (``tests.tiny_task:make_slowable_task``, every call 3 ms slower so that
a trial's timing lasts long enough to be hit) on a space whose techniques always apply. Each round
starts one worker (``pareto search --study S --n-trials 2``, heartbeat every second), waits a random
time (seeded): uniform over the worker's life (the imports, the claim, the build, the timing, the store),
or up to a second after it is seen holding a claim, or after its confirmation run starts (the rounds take
these in turn); it reads from the database which phase the worker is in (its RUNNING trial, its
unfinished runs), and kills it with SIGKILL, until ``--kills`` workers were killed. The next round's worker is "the next start": it must
find every claim of the dead one released after the heartbeat grace (2 heartbeats), or it waits for it
(``--timeout`` per worker: one that does not end in time counts as blocked). After the last kill one
worker runs to its end. Then, from the database:

- blocked: workers that ran into ``--timeout`` plus trials stored BUSY for waiting on another's claim;
- measured twice: configurations with more than one search measurement in the environment;
- half-written: a COMPLETE trial without a measurement, a measurement of a trial that is not COMPLETE
  answered from (preferred), a measurement with its latency, accuracy or memory empty, or a trial left
  RUNNING (pareto's row or Optuna's) after the last worker ended.

    PARETO_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python benchmarks/chaos.py --kills 50

It prints a Markdown report (machine, date, command, kills by phase, the counts).
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine

from pareto.store.engine import session_scope
from pareto.store.models import Measurement, Run, Study, Trial

ROOT = Path(__file__).resolve().parents[1]
TASK = "tests.tiny_task:make_slowable_task"
SPACE = "space:\n  techniques:\n    int8_dynamic: {}\n    prune_unstructured:\n      sparsity: {low: 0.3, high: 0.9}\n"
HEARTBEAT_S = 1


def _worker(db: str, study: str, config: Path, n_trials: int) -> subprocess.Popen[bytes]:
    args = ["search", "--config", str(config), "--task", TASK, "--study", study, "--threads", "1", "--device", "cpu"]
    # an SLO: a search confirms its best at the end only against one
    args += ["--warmup", "5", "--no-guard", "--slo-p99", "50ms", "--n-trials", str(n_trials)]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PARETO_HEARTBEAT_S": str(HEARTBEAT_S),
        "PARETO_TEST_SLOWDOWN_MS": "3",
        "PARETO_DB_URL": db,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "pareto", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _phase(engine: Engine, study: str, pid: int) -> str:
    """What the worker ``pid`` is doing, from its rows: confirming, in a trial, or neither yet/between."""
    with session_scope(engine) as session:
        study_id = session.scalar(select(Study.id).where(Study.name == study))
        if study_id is None:
            return "starting (no study yet)"
        runs = session.execute(select(Run.kind, Run.finished_at).where(Run.study_id == study_id, Run.pid == pid)).all()
        if any(kind == "confirm" and finished is None for kind, finished in runs):
            return "confirming"
        if not runs:
            return "starting (no run yet)"
        running = session.scalar(
            select(func.count(Trial.id)).where(Trial.study_id == study_id, Trial.state == "RUNNING")
        )
        return "in a trial (claim held)" if running else "between trials (prepare, baselines, sampler)"


#: What each round waits for before its random delay: anything (the delay over the worker's whole life),
#: a trial holding its claim, or the confirmation at the end of the worker's search.
TARGETS = ("anywhere", "a claim held", "the confirmation")


def _reached(engine: Engine, study: str, pid: int, target: str) -> bool:
    with session_scope(engine) as session:
        study_id = session.scalar(select(Study.id).where(Study.name == study))
        if study_id is None:
            return False
        if target == "a claim held":
            running = select(func.count(Trial.id)).where(Trial.study_id == study_id, Trial.state == "RUNNING")
            return bool(session.scalar(running))
        confirming = select(func.count(Run.id)).where(
            Run.study_id == study_id, Run.pid == pid, Run.kind == "confirm", Run.finished_at.is_(None)
        )
        return bool(session.scalar(confirming))


def _kill_round(
    engine: Engine, db: str, study: str, config: Path, rng: random.Random, life_s: float, target: str
) -> str:
    worker = _worker(db, study, config, 2)
    if target == "anywhere":
        time.sleep(rng.uniform(0.5, life_s))
    else:
        while worker.poll() is None and not _reached(engine, study, worker.pid, target):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.0))
    if worker.poll() is not None:
        return "ended before the kill"
    phase = _phase(engine, study, worker.pid)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    time.sleep(2 * HEARTBEAT_S + 0.5)  # past the grace: the next start must find the claims released
    return phase


def _counts(engine: Engine, study: str, db: str) -> dict[str, Any]:
    with session_scope(engine) as session:
        study_id = session.scalar(select(Study.id).where(Study.name == study))
        trials = session.scalars(select(Trial).where(Trial.study_id == study_id)).all()
        states = collections.Counter(t.state for t in trials)
        measured = session.execute(
            select(Trial.config_key, Measurement.environment_id, func.count(Measurement.id))
            .join(Measurement, Measurement.trial_id == Trial.id)
            .where(Trial.study_id == study_id, Measurement.kind == "search")
            .group_by(Trial.config_key, Measurement.environment_id)
        ).all()
        twice = [key for key, _, n in measured if n > 1]
        complete_ids = {t.id for t in trials if t.state == "COMPLETE"}
        rows = session.scalars(select(Measurement).where(Measurement.study_id == study_id)).all()
        with_rows = {m.trial_id for m in rows}
        half = [
            f"trial {t.optuna_number} COMPLETE without a measurement"
            for t in trials
            if t.id not in with_rows and t.state == "COMPLETE"
        ]
        half += [
            f"measurement {m.id} answered from, its trial not COMPLETE"
            for m in rows
            if m.preferred and m.trial_id not in complete_ids
        ]
        half += [
            f"measurement {m.id} with an empty figure"
            for m in rows
            if None in (m.latency_p99_ms, m.latency_p50_ms, m.accuracy, m.memory_bytes)
        ]
        half += [f"trial {t.optuna_number} left RUNNING" for t in trials if t.state == "RUNNING"]
        busy = [t.error for t in trials if t.state == "BUSY" and "claim" in (t.error or "")]
    frozen = optuna.load_study(study_name=study, storage=db).get_trials(deepcopy=False)
    half += [f"Optuna trial {t.number} left RUNNING" for t in frozen if t.state.name == "RUNNING"]
    return {"states": dict(states), "twice": twice, "half": half, "busy_on_claims": busy, "measurements": len(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("PARETO_TEST_POSTGRES_URL"), help="a PostgreSQL URL")
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--life", type=float, default=14.0, help="kill within this many seconds of a start")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the last worker may take")
    args = parser.parse_args()
    if not args.db:
        parser.error("give --db postgresql+psycopg://… (or set PARETO_TEST_POSTGRES_URL)")
    started = time.monotonic()
    rng = random.Random(args.seed)
    study = f"chaos-{datetime.now(timezone.utc):%Y%m%d%H%M%S}"
    engine = create_engine(args.db)
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "space.yaml"
        config.write_text(SPACE)
        phases: collections.Counter[str] = collections.Counter()
        rounds = 0
        while sum(phases.values()) - phases["ended before the kill"] < args.kills and rounds < 3 * args.kills:
            target = TARGETS[rounds % len(TARGETS)]
            phases[_kill_round(engine, args.db, study, config, rng, args.life, target)] += 1
            rounds += 1
        last = _worker(args.db, study, config, 3)
        try:
            _, err = last.communicate(timeout=args.timeout)
            blocked, last_rc = 0, last.returncode
        except subprocess.TimeoutExpired:
            last.kill()
            _, err = last.communicate()
            blocked, last_rc = 1, None
    counts = _counts(engine, study, args.db)
    kills = sum(n for phase, n in phases.items() if phase != "ended before the kill")
    lines = [
        f"## Chaos: {kills} workers killed (SIGKILL) on PostgreSQL, study {study!r}",
        "",
        f"`benchmarks/chaos.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, seed {args.seed}; "
        f"{time.monotonic() - started:.0f} s in all.",
        "",
        "| phase at the kill | kills |",
        "|---|---:|",
        *(f"| {phase} | {n} |" for phase, n in sorted(phases.items())),
        "",
        f"The last worker: exit {last_rc}{' (timed out: blocked)' if blocked else ''}"
        + (f"; its last words: {err.decode()[-300:]!r}" if last_rc else "")
        + ".",
        "",
        "| check | found |",
        "|---|---:|",
        f"| configurations blocked past the heartbeat grace | {blocked + len(counts['busy_on_claims'])} |",
        f"| configurations measured twice | {len(counts['twice'])} |",
        f"| half-written rows | {len(counts['half'])} |",
        "",
        f"Trials by state: {counts['states']}; {counts['measurements']} measurements stored.",
    ]
    lines += [f"- {what}" for what in [*counts["twice"], *counts["half"], *counts["busy_on_claims"]][:20]]
    print("\n".join(lines))
    return 1 if blocked or counts["twice"] or counts["half"] or counts["busy_on_claims"] else 0


if __name__ == "__main__":
    sys.exit(main())
