"""Locks between processes: one nightly job per study, one latency timing at a time per device.

The study lock is the database's where the database can hold one: on PostgreSQL a session-level
advisory lock on a connection the job keeps open (the server drops it when the connection dies, so
a killed job never leaves it behind); on SQLite a file lock beside the database file (``flock``:
the kernel drops it when the process dies; it serializes processes on one host, which is all a
SQLite file can serve). Who holds a lock is read from the nightly history, which the holder writes
right after taking it.

The device lock serializes timing: two processes timing on one CPU or GPU slow each other's calls
and corrupt both P99s. It is a file lock per device in ``PARETO_LOCK_DIR`` (default: the system's
temporary folder), so every pareto process on the host shares it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout
from sqlalchemy import text
from sqlalchemy.engine import Engine

from pareto.errors import LockHeld


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
    return Path(os.environ.get("PARETO_LOCK_DIR") or tempfile.gettempdir())


@contextmanager
def device_lock(device: str) -> Iterator[None]:
    """Time on ``device`` ("cpu", "cuda:0") only while no other pareto process on this host does."""
    name = re.sub(r"[^A-Za-z0-9]", "_", device)
    with FileLock(lock_dir() / f"pareto-timing-{name}.lock"):
        yield
