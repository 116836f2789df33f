"""Locks between processes: one nightly job per study, one latency timing at a time per device.

The study lock is the database's where the database can hold one: on PostgreSQL a session-level
advisory lock on a connection the job keeps open (the server drops it when the connection dies, so
a killed job never leaves it behind); on SQLite a file lock beside the database file (``flock``:
the kernel drops it when the process dies; it serializes processes on one host, which is all a
SQLite file can serve). Who holds a lock is read from the nightly history, which the holder writes
right after taking it.

The device lock serializes timing: two processes timing on one CPU or GPU slow each other's calls
and corrupt both P99s. It is a file lock per device in ``PARETO_LOCK_DIR`` (default: ``pareto-<uid>``
in the system's temporary folder, a folder of the user's own, mode 0700), so every pareto process of
the user on the host shares it; other users share it through a ``PARETO_LOCK_DIR`` they can all
write. Whoever takes it writes who it is (pid, host, command, since when) beside it; a process that
waits longer than ``PARETO_LOCK_TIMEOUT_S`` (default ``LOCK_TIMEOUT_S``) gives its timing up as busy,
naming that holder, instead of waiting forever behind a stopped or hung one.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout
from sqlalchemy import text
from sqlalchemy.engine import Engine

from pareto.errors import LockHeld, TimingLockStuck, UsageError

#: How long a process waits for a device's timing lock before it gives its timing up as busy
#: (``PARETO_LOCK_TIMEOUT_S`` overrides). A holder keeps the lock for one timing: seconds for the
#: built-in tasks, about a minute for a 50 ms model timed beside its baseline at the default 662
#: samples, several for a confirmation of the top configurations; ``--workers 4`` on one device
#: queues a worker behind at most three such timings. Five minutes is past that, and half of a
#: nightly's default time budget: a stopped holder (SIGSTOP, a debugger) shows up as BUSY trials
#: that name it, not as a search or a nightly that never ends.
LOCK_TIMEOUT_S = 300.0


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_try_advisory_lock`` (the same in every process)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def study_lock(engine: Engine, study: str, *, holder: str = "") -> Iterator[None]:
    """Hold the nightly lock of ``study`` for the ``with`` block; never waits.

    Raises:
        LockHeld: another process holds it (``holder`` describes it, when known).
    """
    held_by = f" ({holder})" if holder else ""
    message = f"Another nightly of study {study!r} is running{held_by}; this one exits without doing anything."
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            key = advisory_key(f"pareto-nightly:{study}")
            got = connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
            connection.commit()
            if not got:
                raise LockHeld(message)
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                connection.commit()
        return
    lock = FileLock(_sqlite_lock_path(engine, study), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise LockHeld(message) from None
    try:
        yield
    finally:
        lock.release()


def _sqlite_lock_path(engine: Engine, study: str) -> Path:
    database = engine.url.database
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", study)[:64] + "-" + hashlib.sha256(study.encode()).hexdigest()[:8]
    if database and database != ":memory:":
        return Path(f"{database}.nightly-{slug}.lock")
    return lock_dir() / f"pareto-memory-nightly-{slug}.lock"


def lock_dir() -> Path:
    """Where the lock files are: ``PARETO_LOCK_DIR``, else ``pareto-<uid>`` in the system's temporary
    folder (created 0700: a world-writable folder would let any user take or hold the locks).

    Raises:
        UsageError: the folder cannot be created, or the default one is not this user's own.
    """
    configured = os.environ.get("PARETO_LOCK_DIR")
    if configured:
        return _lock_folder(Path(configured), private=False)
    return _lock_folder(Path(tempfile.gettempdir()) / f"pareto-{_user_id()}", private=True)


def _user_id() -> str:
    return str(os.getuid()) if hasattr(os, "getuid") else re.sub(r"[^A-Za-z0-9_.-]", "_", getpass.getuser())


def _lock_folder(path: Path, *, private: bool) -> Path:
    """``path``, created when missing; when ``private``, a folder of this user's with mode 0700."""
    fix = "set PARETO_LOCK_DIR to a folder of your own"
    try:
        path.mkdir(mode=0o700 if private else 0o777, parents=not private, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise UsageError(f"The lock folder {path} cannot be created ({exc.strerror or exc}): {fix}.") from None
    if not private:
        return path
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        raise UsageError(f"The lock folder {path} is not a folder of this user's own: remove it, or {fix}.")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)  # mkdir's mode is masked by the umask; an older pareto made it with the default
    return path


def lock_timeout_s() -> float:
    """Seconds to wait for a device's timing lock: ``PARETO_LOCK_TIMEOUT_S``, else ``LOCK_TIMEOUT_S``.

    Raises:
        UsageError: ``PARETO_LOCK_TIMEOUT_S`` is not a positive number.
    """
    raw = os.environ.get("PARETO_LOCK_TIMEOUT_S", "").strip()
    if not raw:
        return LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"PARETO_LOCK_TIMEOUT_S must be a positive number of seconds, not {raw!r}.")
    return value


@contextmanager
def device_lock(device: str, *, what: str | None = None, timeout_s: float | None = None) -> Iterator[None]:
    """Time on ``device`` ("cpu", "cuda:0") only while no other pareto process on this host does.

    Waits at most ``timeout_s`` (default ``lock_timeout_s()``). While held, the holder's pid, host,
    ``what`` it times (default: its command line) and since when are in ``<lock>.holder``.

    Raises:
        TimingLockStuck: another process held the lock all that time (a ``MachineBusy``); the message names it.
        UsageError: the lock folder or ``PARETO_LOCK_TIMEOUT_S`` is unusable.
    """
    timeout = lock_timeout_s() if timeout_s is None else timeout_s
    name = re.sub(r"[^A-Za-z0-9]", "_", device)
    path = lock_dir() / f"pareto-timing-{name}.lock"
    lock = FileLock(path, timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise TimingLockStuck(_busy_message(device, path, timeout)) from None
    holder = _holder_path(path)
    try:
        _write_holder(holder, what)
        yield
    finally:
        # while still held: the next holder writes its own (another user's, in a shared sticky folder, stays)
        with suppress(OSError):
            holder.unlink(missing_ok=True)
        lock.release()


def _holder_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".holder")


def _write_holder(path: Path, what: str | None) -> None:
    """Say who holds the lock (written whole, then renamed: a waiter never reads half of it)."""
    note = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "what": what or " ".join(["pareto" if i == 0 else a for i, a in enumerate(sys.argv)])[:300],
        "since": time.time(),
    }
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(json.dumps(note))
        partial.replace(path)
    except OSError:  # who holds it is a courtesy to the waiters; timing goes on without it
        partial.unlink(missing_ok=True)


def _busy_message(device: str, path: Path, timeout: float) -> str:
    """One sentence: whose lock was not free in ``timeout`` seconds, and what to do."""
    try:
        note = json.loads(_holder_path(path).read_text())
        pid, host, what, since = int(note["pid"]), str(note["host"]), str(note["what"]), float(note["since"])
    except (OSError, ValueError, KeyError, TypeError):
        who = "a process that did not say who it is (a pareto older than this one, or one that just took it)"
        return (
            f"The timing lock of {device} ({path}) was held by {who} for over {timeout:g} s; this timing is given up "
            "as busy: end that process if it is stopped or hung, or raise PARETO_LOCK_TIMEOUT_S."
        )
    here = host == socket.gethostname()
    state = _process_state(pid) if here else ""
    held = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    return (
        f"The timing lock of {device} ({path}) has been held since {held} by pid {pid}{state} on host {host} "
        f"({what}), over the {timeout:g} s this process waits; this timing is given up as busy: "
        + (f"end that process (kill {pid}) if it is stopped or hung" if here else "end that process if it is hung")
        + ", or raise PARETO_LOCK_TIMEOUT_S."
    )


def _process_state(pid: int) -> str:
    """' (stopped)' for a process stopped by a signal or a debugger; '' otherwise, or where unknown (no /proc)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat_line.rpartition(")")[2].split()
    return " (stopped)" if fields and fields[0] in ("T", "t") else ""
