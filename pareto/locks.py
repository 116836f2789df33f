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

On a GPU other work disturbs a timing too: another worker's build, CUDA-graph capture, compile or
evaluation runs its kernels between the timed ones. Each GPU has a second file lock beside the timing
lock, its work lock (``flock``), held as a readers–writer lock: ``timing_lock`` takes the timing lock
and then the work lock exclusively, so it starts once every other process's GPU work has ended and
none starts until it is done; ``gpu_work`` (a trial's build and evaluation, a confirmation's builds,
the nightly's) takes the timing lock for a moment, so it waits while a timing runs and never
overtakes a timing that waits, then the work lock shared, held for its whole block. A thread that
holds the work lock shared and comes to time lets its share go before it waits for the timing lock
and takes it back when its timing ends (under the timing lock, so no other timing comes between):
it never waits for itself, and two workers that both come to time never wait for each other. Each
thread has its own hold (its own file descriptor), so threads of one process exclude each other as
processes do. Whoever does GPU work writes who it is beside the work lock; a timing waits for work
that runs up to ``WORK_WAIT_FACTOR`` times the timeout, for a stopped or unnamed holder the timeout,
then gives up as busy naming them. On the CPU only timing is serialized, as before: the other
workers' work competes with a timing there, and the contention guard discards the rounds it disturbed.
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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout
from sqlalchemy import text
from sqlalchemy.engine import Engine

from pareto.errors import LockHeld, TimingLockStuck, UsageError, redact

if sys.platform != "win32":
    import fcntl

#: How long a process waits for a device's timing lock before it gives its timing up as busy
#: (``PARETO_LOCK_TIMEOUT_S`` overrides). A holder keeps the lock for one timing: seconds for the
#: built-in tasks, about a minute for a 50 ms model timed beside its baseline at the default 662
#: samples, several for a confirmation of the top configurations; ``--workers 4`` on one device
#: queues a worker behind at most three such timings. Five minutes is past that, and half of a
#: nightly's default time budget: a stopped holder (SIGSTOP, a debugger) shows up as BUSY trials
#: that name it, not as a search or a nightly that never ends.
LOCK_TIMEOUT_S = 300.0
#: A timing on a GPU waits for other processes' GPU work that runs (a build, a compile, a fine-tuning:
#: minutes on a large model) up to this many times the lock's timeout (an hour by default); for work
#: by a stopped process, or by one that did not say who it is, only the timeout.
WORK_WAIT_FACTOR = 12


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
    with _named_lock(engine, "nightly", study, message):
        yield


@contextmanager
def confirm_lock(engine: Engine, study: str) -> Iterator[None]:
    """Hold the confirmation lock of ``study`` for the ``with`` block; never waits. Workers of one study
    reach the end of their searches together: one confirms the top configurations, not each.

    Raises:
        LockHeld: another process is confirming the study.
    """
    with _named_lock(engine, "confirm", study, f"Another worker is confirming study {study!r} now."):
        yield


@contextmanager
def _named_lock(engine: Engine, what: str, study: str, message: str) -> Iterator[None]:
    """A lock named ``what`` of ``study``: a PostgreSQL advisory lock, or a file beside the SQLite file."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            key = advisory_key(f"pareto-{what}:{study}")
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
    lock = FileLock(_sqlite_lock_path(engine, study, what), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise LockHeld(message) from None
    try:
        yield
    finally:
        lock.release()


def _sqlite_lock_path(engine: Engine, study: str, what: str = "nightly") -> Path:
    database = engine.url.database
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", study)[:64] + "-" + hashlib.sha256(study.encode()).hexdigest()[:8]
    if database and database != ":memory:":
        return Path(f"{database}.{what}-{slug}.lock")
    return lock_dir() / f"pareto-memory-{what}-{slug}.lock"


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
def device_lock(
    device: str,
    *,
    what: str | None = None,
    timeout_s: float | None = None,
    waiter: str = "this timing",
    patient: bool = False,
) -> Iterator[None]:
    """Time on ``device`` ("cpu", "cuda:0") only while no other pareto process on this host does.

    Waits at most ``timeout_s`` (default ``lock_timeout_s()``); ``patient``: while the holder is a
    process that runs on this host, up to ``WORK_WAIT_FACTOR`` times that (on a GPU the holder may be
    waiting for other processes' GPU work). While held, the holder's pid, host, ``what`` it times
    (default: its command line) and since when are in ``<lock>.holder``. ``waiter`` names what is
    given up in the busy message. On a GPU, time through ``timing_lock``, which holds other
    processes' GPU work off too.

    Raises:
        TimingLockStuck: another process held the lock all that time (a ``MachineBusy``); the message names it.
        UsageError: the lock folder or ``PARETO_LOCK_TIMEOUT_S`` is unusable.
    """
    timeout = lock_timeout_s() if timeout_s is None else timeout_s
    name = re.sub(r"[^A-Za-z0-9]", "_", device)
    path = lock_dir() / f"pareto-timing-{name}.lock"
    lock = FileLock(path, timeout=timeout)
    started, step = time.monotonic(), timeout
    while True:
        try:
            lock.acquire(timeout=step)
            break
        except Timeout:
            waited = time.monotonic() - started
            if not (patient and waited < WORK_WAIT_FACTOR * timeout and _holder_runs(path)):
                raise TimingLockStuck(_busy_message(device, path, waited if patient else timeout, waiter)) from None
            step = min(1.0, WORK_WAIT_FACTOR * timeout - waited)
    holder = _holder_path(path)
    try:
        _write_holder(holder, what)
        yield
    finally:
        # while still held: the next holder writes its own (another user's, in a shared sticky folder, stays)
        with suppress(OSError):
            holder.unlink(missing_ok=True)
        lock.release()


def _holder_runs(path: Path) -> bool:
    """Whether the lock at ``path`` is held by a process that runs on this host (not stopped), by its note."""
    try:
        note = json.loads(_holder_path(path).read_text())
        pid, host = int(note["pid"]), str(note["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return host == socket.gethostname() and _alive(pid) and not _process_state(pid)


@dataclass
class _Hold:
    """One thread's hold on one GPU's work lock: its file descriptor and how it holds it now
    ("shared", "exclusive", or "" while it holds nothing)."""

    fd: int
    mode: str = ""


_held = threading.local()


def _holds() -> dict[str, _Hold]:
    """This thread's holds, by the GPU's lock name."""
    holds: dict[str, _Hold] | None = getattr(_held, "holds", None)
    if holds is None:
        holds = _held.holds = {}
    return holds


def _gpu_name(device: str) -> str | None:
    """The name a GPU's locks go by: its ``pareto.devices.device_identity`` (its UUID, the same whatever
    ``CUDA_VISIBLE_DEVICES`` numbers it; the name itself where torch sees no CUDA device), for "cuda:N"
    or an identity given as it is; None for any other device, and where ``flock`` is missing."""
    if sys.platform == "win32" or not device.startswith(("cuda", "gpu-")):
        return None
    if device.startswith("cuda"):
        from pareto.devices import device_identity

        device = device_identity(device)
    return device


def _work_path(name: str) -> Path:
    return lock_dir() / f"pareto-work-{re.sub(r'[^A-Za-z0-9]', '_', name)}.lock"


def _open_work(name: str) -> _Hold:
    """A new hold (its own open file: ``flock`` excludes open files, not processes) on ``name``'s work lock."""
    return _Hold(os.open(_work_path(name), os.O_RDONLY | os.O_CREAT, 0o644))


def _flock(fd: int, operation: int, timeout: float) -> bool:
    """``flock(fd, operation)`` within ``timeout`` seconds; False when it was not free by then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


@contextmanager
def gpu_work(device: str, *, what: str | None = None, timeout_s: float | None = None) -> Iterator[None]:
    """Work on ``device`` that is not timing (building, capturing, compiling, evaluating) for the
    ``with`` block, while no pareto process on this host times on it; a no-op on any device but a GPU.

    Waits for a timing that runs (at most ``timeout_s``, default ``lock_timeout_s()``, for a stopped
    or unnamed timer; up to ``WORK_WAIT_FACTOR`` times that while the timer runs on this host); then other
    processes' GPU work runs beside this, and a timing waits until this block ends. Inside this
    thread's own ``gpu_work`` or ``timing_lock`` on the device it changes nothing. While held, who
    holds it (pid, host, ``what``, since when) is in a note beside the work lock.

    Raises:
        TimingLockStuck: a timing held the GPU all that time (a ``MachineBusy``); the message names it.
        UsageError: the lock folder or ``PARETO_LOCK_TIMEOUT_S`` is unusable.
    """
    name = _gpu_name(device)
    holds = _holds()
    if name is None or name in holds:
        yield
        return
    hold = holds[name] = _open_work(name)
    path = _work_path(name)
    note = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.holder")
    try:
        _write_holder(note, what)  # before the share: a waiting timing never sees a holder it cannot name
        # the timing lock for a moment: no share is taken while a timing runs or waits
        with device_lock(name, what=what, timeout_s=timeout_s, waiter="this GPU work", patient=True):
            fcntl.flock(hold.fd, fcntl.LOCK_SH)  # free at once: whoever holds it exclusively holds the timing lock
            hold.mode = "shared"
        yield
    finally:
        del holds[name]
        with suppress(OSError):
            note.unlink(missing_ok=True)
        os.close(hold.fd)  # lets the share go


@contextmanager
def timing_lock(device: str, *, what: str | None = None, timeout_s: float | None = None) -> Iterator[None]:
    """Time on ``device`` alone: its timing lock (``device_lock``) and, on a GPU, its work lock exclusively,
    so no other pareto process on this host times, builds, captures or evaluates on it meanwhile.

    A share this thread holds (``gpu_work``) is let go while it waits and times, and taken back after.
    Waits for each lock at most ``timeout_s`` (default ``lock_timeout_s()``) for a holder that is
    stopped or unnamed, and up to ``WORK_WAIT_FACTOR`` times that while the holders run on this host.

    Raises:
        TimingLockStuck: another process held the timing lock, or went on with GPU work, all that time
            (a ``MachineBusy``); the message names it.
        UsageError: the lock folder or ``PARETO_LOCK_TIMEOUT_S`` is unusable.
    """
    name = _gpu_name(device)
    if name is None:
        with device_lock(device, what=what, timeout_s=timeout_s):
            yield
        return
    holds = _holds()
    hold = holds.get(name)
    if hold is not None and hold.mode == "exclusive":  # this thread times already
        yield
        return
    own = hold is None
    if hold is None:
        hold = holds[name] = _open_work(name)
    shared = hold.mode == "shared"
    if shared:  # else a timing that holds the timing lock would wait for this share while this waits for it
        fcntl.flock(hold.fd, fcntl.LOCK_UN)
        hold.mode = ""
    try:
        with device_lock(name, what=what, timeout_s=timeout_s, patient=True):
            _exclusive(hold, device, name, timeout_s)
            try:
                yield
            finally:
                # still under the timing lock: no other timing comes between the timing and the share
                fcntl.flock(hold.fd, fcntl.LOCK_SH if shared else fcntl.LOCK_UN)
                hold.mode = "shared" if shared else ""
    finally:
        if own:
            del holds[name]
            os.close(hold.fd)
        elif shared and hold.mode != "shared" and _flock(hold.fd, fcntl.LOCK_SH, lock_timeout_s()):
            hold.mode = "shared"  # the timing was given up: the work goes on with its share back (else without)


def _exclusive(hold: _Hold, device: str, name: str, timeout_s: float | None) -> None:
    """The work lock exclusively, once every other process's GPU work has ended.

    Work by processes that run on this host is waited for up to ``WORK_WAIT_FACTOR`` times the timeout
    (a compile or a fine-tuning takes minutes); work by a stopped process, or by one that did not say
    who it is, only for the timeout.

    Raises:
        TimingLockStuck: the work went on past that; the message names who does it.
    """
    timeout = lock_timeout_s() if timeout_s is None else timeout_s
    path, started, step = _work_path(name), time.monotonic(), timeout
    while not _flock(hold.fd, fcntl.LOCK_EX, step):
        waited = time.monotonic() - started
        holders = _work_holders(path)
        if not holders or not all(running for _, running in holders) or waited >= WORK_WAIT_FACTOR * timeout:
            raise TimingLockStuck(_work_message(device, path, waited, [who for who, _ in holders]))
        step = min(1.0, WORK_WAIT_FACTOR * timeout - waited)
    hold.mode = "exclusive"


def _work_holders(path: Path) -> list[tuple[str, bool]]:
    """Who does GPU work under the work lock at ``path``, from their notes: each one described, and
    whether it is a process running on this host (not stopped). Notes of dead processes are skipped."""
    here = socket.gethostname()
    holders = []
    for note_path in sorted(path.parent.glob(f"{path.name}.*.holder")):
        try:
            note = json.loads(note_path.read_text())
            pid, host, what = int(note["pid"]), str(note["host"]), str(note["what"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host == here and not _alive(pid):
            continue  # a note a killed process left behind
        state = _process_state(pid) if host == here else ""
        holders.append((f"pid {pid}{state} on host {host} ({what})", host == here and not state))
    return holders


def _work_message(device: str, path: Path, waited: float, holders: list[str]) -> str:
    """One sentence: whose GPU work held a timing off for ``waited`` seconds, and what to do."""
    who = "; ".join(holders) or "a process that did not say who it is"
    return (
        f"GPU work on {device} ({path}) by {who} went on for {waited:.3g} s while this timing waited for it to "
        "end; this timing is given up as busy: end that process if it is stopped or hung, or raise "
        f"PARETO_LOCK_TIMEOUT_S (work that runs is waited for up to {WORK_WAIT_FACTOR} times that)."
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def _holder_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".holder")


def _write_holder(path: Path, what: str | None) -> None:
    """Say who holds the lock (written whole, then renamed: a waiter never reads half of it)."""
    note = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        # a command line may carry a database URL with its password: never in a note other users can read
        "what": redact(what or " ".join(["pareto" if i == 0 else a for i, a in enumerate(sys.argv)]))[:300],
        "since": time.time(),
    }
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(json.dumps(note))
        partial.replace(path)
    except OSError:  # who holds it is a courtesy to the waiters; timing goes on without it
        partial.unlink(missing_ok=True)


def _busy_message(device: str, path: Path, timeout: float, waiter: str = "this timing") -> str:
    """One sentence: whose lock was not free in ``timeout`` seconds, and what to do."""
    try:
        note = json.loads(_holder_path(path).read_text())
        pid, host, what, since = int(note["pid"]), str(note["host"]), str(note["what"]), float(note["since"])
    except (OSError, ValueError, KeyError, TypeError):
        who = "a process that did not say who it is (a pareto older than this one, or one that just took it)"
        return (
            f"The timing lock of {device} ({path}) was held by {who} for over {timeout:g} s; {waiter} is given up "
            "as busy: end that process if it is stopped or hung, or raise PARETO_LOCK_TIMEOUT_S."
        )
    here = host == socket.gethostname()
    state = _process_state(pid) if here else ""
    held = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    return (
        f"The timing lock of {device} ({path}) has been held since {held} by pid {pid}{state} on host {host} "
        f"({what}), over the {timeout:g} s this process waits; {waiter} is given up as busy: "
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
