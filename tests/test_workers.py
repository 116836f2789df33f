"""Many workers on one study, as real processes: none lost, none duplicated, none left RUNNING."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages._rdb import models
from sqlalchemy import select

from pareto.store.engine import open_engine, session_scope, upgrade
from pareto.store.models import Measurement, Trial
from pareto.study.studies import optuna_storage
from pareto.study.workers import shares

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--task", "tests.tiny_task:make_task", "--threads", "1", "--device", "cpu", "--warmup", "5"]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("PARETO_DB_URL", None)
    return env


def _pareto(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pareto", *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=600
    )


def _check_study(db_url: str, study: str) -> tuple[list[optuna.trial.FrozenTrial], list[Trial]]:
    """Every trial ended (COMPLETE or FAILED with a reason), and no configuration was measured twice."""
    frozen = optuna.load_study(study_name=study, storage=db_url).get_trials(deepcopy=False)
    # a configuration rejected early is pruned for the sampler; a repeat gets its stored values again
    assert {t.state.name for t in frozen} <= {"COMPLETE", "FAIL", "PRUNED"}, [(t.number, t.state.name) for t in frozen]
    with session_scope(open_engine(db_url)) as session:
        rows = session.scalars(select(Trial).order_by(Trial.optuna_number)).all()
        states = {"COMPLETE", "DUPLICATE", "FAILED", "BUSY", "PRUNED"}
        assert all(r.state in states for r in rows), [r.state for r in rows]
        assert all(r.error for r in rows if r.state != "COMPLETE")
        numbers = [r.optuna_number for r in rows]
        assert len(numbers) == len(set(numbers))
        assert {t.number for t in frozen if t.state.name == "COMPLETE"} <= set(numbers)
        measured = session.scalars(select(Trial.config_key).join(Measurement).where(Measurement.kind == "search")).all()
        assert len(measured) == len(set(measured)), "a configuration was measured twice in one environment"
        session.expunge_all()
    return frozen, list(rows)


def test_shares_split_the_trials() -> None:
    assert shares(10, 3) == [4, 3, 3] and shares(2, 4) == [1, 1, 0, 0] and sum(shares(24, 4)) == 24


def test_workers_get_the_database_url_in_their_environment_not_their_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a command line is every user's to read (ps, /proc/PID/cmdline): a password there is a password shown
    import io

    from pareto.spec import load_spec
    from pareto.study import workers as _workers

    url = "postgresql+psycopg://pareto:s3cr3t-Pa55@db.example:5432/pareto"
    started: list[tuple[list[str], dict[str, str]]] = []

    class FakePopen:
        def __init__(self, args: list[str], **kwargs: Any) -> None:
            started.append((args, kwargs["env"]))
            self.stderr = io.StringIO("")

    monkeypatch.setattr(_workers.subprocess, "Popen", FakePopen)
    spec = load_spec(None, {"task": "tests.tiny_task:make_task", "study": "w"})
    worker = _workers._start_worker(spec, 0, 1, ("cpu", None), url, tmp_path, reporter=None)  # type: ignore[arg-type]
    worker.relay.join(timeout=5)
    [(argv, env)] = started
    assert not any("s3cr3t" in arg for arg in argv), argv
    assert env["PARETO_DB_URL"] == url  # `pareto search --worker` reads --db from PARETO_DB_URL


def test_an_enqueued_trial_is_taken_by_one_worker(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Optuna takes a queued trial by reading it WAITING, then writing RUNNING (optuna/optuna#4002): on
    # SQLite the read took no lock, so two workers could both take it and measure it under one number
    engine = open_engine(db_url)
    study = optuna.create_study(study_name="q", storage=optuna_storage(db_url, engine, 1))
    study.enqueue_trial({"x": 1})
    read = models.TrialModel.find_or_raise_by_id

    def slow_read(*args: Any, **kwargs: Any) -> Any:  # the window between the read and the write, widened
        row = read(*args, **kwargs)
        time.sleep(0.6)
        return row

    monkeypatch.setattr(models.TrialModel, "find_or_raise_by_id", staticmethod(slow_read))
    taken: list[int | None] = []

    def worker() -> None:
        other = optuna.load_study(study_name="q", storage=optuna_storage(db_url, engine, 1))
        taken.append(other._pop_waiting_trial_id())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # the second reads while the first sleeps between its read and its write
    for thread in threads:
        thread.join()
    assert sorted(taken, key=lambda t: t is None) == [study.trials[0]._trial_id, None], taken


def test_local_workers_share_one_study(db_url: str, tmp_path: Path) -> None:
    # SQLite on one host; PostgreSQL for more: twice the cores of the 2-vCPU test machine (each worker's
    # start, importing torch, takes seconds of CPU: 8 workers spent most of the test starting)
    workers = 3 if db_url.startswith("sqlite") else 4
    n_trials = 2 * workers
    proc = _pareto(
        "search",
        *TINY,
        "--study",
        "w",
        "--n-trials",
        str(n_trials),
        "--workers",
        str(workers),
        # the guard on, but not firing for the other workers on 2 cores: a BUSY baseline is proposed again
        "--contention-limit",
        "50",
        "--db",
        db_url,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "database is locked" not in proc.stderr + proc.stdout
    # the whole stderr on failure (the comparison's own repr is truncated): a worker's traceback is in it
    assert f"{workers} workers on study 'w'" in proc.stderr and "[worker 1] trial" in proc.stderr, proc.stderr
    frozen, rows = _check_study(db_url, "w")
    # n_trials new configurations between the workers; repeats answered from the database on top
    assert len(frozen) == len(rows) and sum(r.state not in ("DUPLICATE", "BUSY") for r in rows) == n_trials
    # queued once, not per worker: measured once; a sampler proposing it again gets a DUPLICATE
    baselines = [(r.optuna_number, r.state, r.error) for r in rows if r.is_baseline]
    assert [state for _, state, _ in baselines if state != "DUPLICATE"] == ["COMPLETE"], baselines


def test_a_worker_killed_mid_trial_is_failed_and_retried(db_url: str, tmp_path: Path) -> None:
    # techniques that always apply to the tiny model: the retried trial must be able to complete
    (tmp_path / "space.yaml").write_text(
        "space:\n  techniques:\n    int8_dynamic: {}\n    prune_unstructured:\n      sparsity: {low: 0.5, high: 0.9}\n"
    )
    made = _pareto(
        "studies",
        "create",
        "--config",
        "space.yaml",
        "--task",
        "tests.tiny_task:make_slowable_task",
        "--study",
        "k",
        "--db",
        db_url,
        cwd=tmp_path,
    )
    assert made.returncode == 0 and "ready for workers" in made.stdout, made.stderr
    slow = {"PARETO_HEARTBEAT_S": "1", "PARETO_TEST_SLOWDOWN_MS": "3"}
    args = [
        "search",
        "--config",
        "space.yaml",
        "--task",
        "tests.tiny_task:make_slowable_task",
        "--study",
        "k",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--warmup",
        "5",
        # the guard off: on a loaded CI host it can call the retry BUSY (measured nothing, proposed again)
        "--no-guard",
        "--db",
        db_url,
    ]
    victim = subprocess.Popen(
        [sys.executable, "-m", "pareto", *args, "--n-trials", "3"],
        cwd=tmp_path,
        env=_env(**slow),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engine = open_engine(db_url)
    upgrade(engine)
    deadline = time.monotonic() + 180
    killed = None
    try:
        while time.monotonic() < deadline and killed is None:
            with session_scope(engine) as session:
                running = session.scalars(select(Trial).where(Trial.state == "RUNNING")).first()
                if running is not None:
                    time.sleep(0.5)  # mid-trial
                    victim.send_signal(signal.SIGKILL)
                    killed = running.optuna_number
            time.sleep(0.1)
    finally:
        victim.kill()
        victim.wait()
    assert killed is not None, "the worker never started a trial"
    time.sleep(3)  # past the grace period of 2 heartbeats
    survivor = _pareto(*args, "--n-trials", "2", cwd=tmp_path, **slow)
    assert survivor.returncode == 0, survivor.stderr[-3000:]
    frozen, rows = _check_study(db_url, "k")
    dead = next(t for t in frozen if t.number == killed)
    assert dead.state.name == "FAIL"
    dead_row = next(r for r in rows if r.optuna_number == killed)
    assert dead_row.state == "FAILED" and "its worker stopped" in dead_row.error
    retried = [t for t in frozen if t.system_attrs.get("failed_trial") == killed]
    story = [(r.optuna_number, r.state, r.error) for r in rows]
    assert len(retried) == 1 and retried[0].params == dead.params, story
    assert retried[0].state.name == "COMPLETE", story


def test_studies_create_refuses_other_objectives(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/p.db"
    assert (
        _pareto(
            "studies", "create", "--task", "tests.tiny_task:make_task", "--study", "o", "--db", db, cwd=tmp_path
        ).returncode
        == 0
    )
    other = _pareto(
        "studies",
        "create",
        "--task",
        "tests.tiny_task:make_task",
        "--study",
        "o",
        "--objective",
        "accuracy,memory",
        "--db",
        db,
        cwd=tmp_path,
    )
    assert other.returncode == 2 and "optimizes accuracy,p99, not accuracy,memory" in other.stderr
    assert "Traceback" not in other.stderr


@pytest.mark.parametrize("workers", ["0", "65"])
def test_bad_worker_counts_are_refused(tmp_path: Path, workers: str) -> None:
    proc = _pareto("search", *TINY, "--workers", workers, cwd=tmp_path)
    assert proc.returncode == 2 and "--workers" in proc.stderr and "Traceback" not in proc.stderr


def test_a_worker_that_fails_makes_the_search_fail(tmp_path: Path) -> None:
    # worker 1's task cannot be built: worker 0's trial is stored, and the search says so and exits 1
    (tmp_path / "flaky_task.py").write_text(
        "import os\n"
        "from tests.tiny_task import make_task as tiny\n\n"
        "def make_task():\n"
        "    if os.environ.get('PARETO_WORKER') == '1':\n"
        "        raise RuntimeError('no model on this worker')\n"
        "    return tiny()\n"
    )
    args = [*TINY, "--task", "flaky_task:make_task", "--study", "f", "--n-trials", "2", "--workers", "2", "--no-guard"]
    proc = _pareto("search", *args, "--db", "sqlite:///pareto.db", cwd=tmp_path, PYTHONPATH=f"{ROOT}:{tmp_path}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Worker 1 ended with exit code" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    _, rows = _check_study("sqlite:///" + str(tmp_path / "pareto.db"), "f")
    assert [r.state for r in rows] == ["COMPLETE"] and rows[0].is_baseline  # worker 0's share: the baseline
