"""The nightly lock of a study, on SQLite (a file lock) and PostgreSQL (an advisory lock); the device's
timing lock, which gives up on a holder that never lets go."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pareto.errors import LockHeld, MachineBusy, UsageError
from pareto.locks import confirm_lock, device_lock, lock_dir, study_lock
from pareto.store.engine import open_engine, upgrade


def test_second_lock_of_a_study_is_refused_at_once(db_url: str) -> None:
    engine = open_engine(db_url)
    upgrade(engine)
    with study_lock(engine, "s"):
        with pytest.raises(LockHeld, match="Another nightly of study 's' is running"), study_lock(engine, "s"):
            pass
        with study_lock(engine, "other"):  # per study
            pass
    with study_lock(engine, "s"):  # released
        pass


def test_one_worker_confirms_a_study_at_a_time(db_url: str) -> None:
    engine = open_engine(db_url)
    upgrade(engine)
    with confirm_lock(engine, "s"):
        with pytest.raises(LockHeld, match="Another worker is confirming study 's' now"), confirm_lock(engine, "s"):
            pass
        with study_lock(engine, "s"), confirm_lock(engine, "other"):  # the nightly's lock and other studies' apart
            pass
    with confirm_lock(engine, "s"):  # released
        pass


ROOT = Path(__file__).resolve().parents[1]
HOLDER = """
import sys
from pareto.locks import device_lock
with device_lock("cpu", what="the holder of test_locks"):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it (or kills this process)
"""


@pytest.fixture
def holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[str]]:
    """Another process that takes the CPU's timing lock in ``tmp_path`` and is then stopped (SIGSTOP)."""
    monkeypatch.setenv("PARETO_LOCK_DIR", str(tmp_path))
    with stopped_process(HOLDER, env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        yield proc


@contextlib.contextmanager
def stopped_process(code: str, *args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A Python process that runs ``code``, prints "held" once it holds its lock, and is then stopped (SIGSTOP)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        proc.send_signal(signal.SIGSTOP)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_stopped_holder_makes_the_waiter_give_up_as_busy_naming_it(holder: subprocess.Popen[str]) -> None:
    started = time.monotonic()
    with pytest.raises(MachineBusy) as info, device_lock("cpu", timeout_s=0.5):
        pass
    waited = time.monotonic() - started
    message = str(info.value)
    assert f"by pid {holder.pid} (stopped) on host " in message and "the holder of test_locks" in message
    assert "kill" in message and "PARETO_LOCK_TIMEOUT_S" in message and "\n" not in message
    assert 0.5 <= waited < 10
    holder.kill()  # the kernel drops its lock: the next one takes it at once
    holder.wait(timeout=60)
    with device_lock("cpu", timeout_s=10):
        pass


def test_the_wait_for_the_timing_lock_is_configurable(
    holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARETO_LOCK_TIMEOUT_S", "0.3")
    with pytest.raises(MachineBusy, match=f"pid {holder.pid} "), device_lock("cpu"):
        pass
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv("PARETO_LOCK_TIMEOUT_S", bad)
        with pytest.raises(UsageError, match="PARETO_LOCK_TIMEOUT_S must be a positive number"), device_lock("cpu"):
            pass


def test_the_timing_lock_says_who_holds_it_only_while_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARETO_LOCK_DIR", str(tmp_path))
    note = tmp_path / "pareto-timing-cuda_0.lock.holder"
    with device_lock("cuda:0", what="trial 3"):
        assert f'"pid": {os.getpid()}' in note.read_text() and "trial 3" in note.read_text()
    assert not note.exists()


def test_the_default_lock_folder_is_the_users_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARETO_LOCK_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    previous = os.umask(0o022)
    try:
        folder = lock_dir()
    finally:
        os.umask(previous)
    assert folder == tmp_path / f"pareto-{os.getuid()}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    with device_lock("cpu"):
        assert (folder / "pareto-timing-cpu.lock").exists()
    folder.chmod(0o777)  # made by someone's umask, or an older pareto: closed again
    assert stat.S_IMODE(lock_dir().stat().st_mode) == 0o700
    shutil.rmtree(folder)
    folder.symlink_to(tmp_path)  # another's folder in its place: refused, not followed
    with pytest.raises(UsageError, match="is not a folder of this user's own"):
        lock_dir()
    monkeypatch.setenv("PARETO_LOCK_DIR", str(tmp_path / "shared" / "locks"))  # still overrides, made when missing
    assert lock_dir() == tmp_path / "shared" / "locks" and lock_dir().is_dir()


def test_a_search_stops_at_a_timing_lock_that_is_never_let_go(
    holder: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a quieter machine would not help: no waiting and trying again, no configuration failed for it
    from sqlalchemy import select

    from pareto.store.engine import session_scope
    from pareto.store.models import Trial

    db = f"sqlite:///{tmp_path / 'p.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARETO_LOCK_TIMEOUT_S": "1"}
    env.pop("PARETO_DB_URL", None)
    started = time.monotonic()
    search = ["search", "--task", "tests.tiny_task:make_task", "--threads", "1", "--device", "cpu", "--warmup", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "pareto", *search, "--n-trials", "4", "--keep", "int8_dynamic", "--db", db],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert f"pid {holder.pid} (stopped)" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - started < 120
    with session_scope(open_engine(db)) as session:
        states = set(session.scalars(select(Trial.state)))
    assert "FAILED" not in states and "COMPLETE" not in states, states


def test_a_worker_leaves_the_confirmation_to_the_one_that_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pareto.study import search

    @contextlib.contextmanager
    def held(_engine: object, study: str) -> Iterator[None]:
        raise LockHeld(f"Another worker is confirming study {study!r} now.")
        yield  # pragma: no cover

    def confirm_pick(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a second worker confirmed too")

    monkeypatch.setattr(search, "confirm_lock", held)
    monkeypatch.setattr(search, "confirm_pick", confirm_pick)
    notices: list[str] = []
    reporter = SimpleNamespace(notice=notices.append, confirmed=lambda _result: None)
    setup = SimpleNamespace(
        spec=SimpleNamespace(search=SimpleNamespace(confirm_top=3), study_name="s"),
        constraints=SimpleNamespace(p99_ms=7.0),
        bench=SimpleNamespace(engine=None),
    )
    assert search.confirm_search(setup, SimpleNamespace(probe=None), reporter) is None  # type: ignore[arg-type]
    assert notices == ["Another worker is confirming study 's' now. This worker leaves the confirmation to it."]
