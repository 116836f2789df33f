"""Errors a user can cause, each carrying one sentence that says what to do."""

from __future__ import annotations

import re


class ParetoError(Exception):
    """A failure the user can act on; the CLI prints the message and exits with ``exit_code``."""

    exit_code = 1


class UsageError(ParetoError):
    """Bad input: a malformed value, an unknown name, a config that does not validate."""

    exit_code = 2


class NotFound(UsageError):
    """A study or trial the database does not hold (HTTP 404 in ``pareto serve``)."""


class TaskError(UsageError):
    """A task that cannot be found, imported or built."""


class TechniqueError(ParetoError):
    """A compression technique that broke on a model; the trial fails with this reason stored.

    ``layers``: the (technique, layer) pairs the failure came from, where they could be told
    (``pareto.study.layers.culprits``); the technique leaves those layers alone from then on."""

    layers: tuple[tuple[str, str], ...] = ()


class Transient(TechniqueError):
    """A trial's failure that says nothing lasting about its configuration (the device ran out of memory
    while other work shared it, a measure setting such as the throughput sweep): stored FAILED, not
    known, proposed again it is built again."""


class NoEffect(TechniqueError):
    """A technique that would change nothing after the ones before it (low-rank that makes no layer
    smaller): the configuration is its smaller twin, the same without ``technique``."""

    def __init__(self, technique: str, message: str) -> None:
        super().__init__(message)
        self.technique = technique


class BaselineFailed(ParetoError):
    """The uncompressed model cannot be built, run, evaluated or measured on the device: a search has
    nothing to compare its configurations against, so it stops (exit code 4)."""

    exit_code = 4


class StoreError(ParetoError):
    """The database cannot be opened, written or migrated."""


class TrialTakenOver(StoreError):
    """A trial's result came after another worker took it for dead (no heartbeat) and failed it: nothing of
    it is stored, and the search goes on with its next trial."""


class DatabasePathError(StoreError, UsageError):
    """A --db that points nowhere usable: a missing file for a query, a folder that does not exist."""

    exit_code = 2


class NoFeasibleConfiguration(ParetoError):
    """No stored configuration meets the SLOs."""


class MachineBusy(ParetoError):
    """The contention guard discarded more rounds than allowed: no verdict can be given now.

    Exit code 75 (EX_TEMPFAIL, sysexits.h): try again when the machine is quieter.
    """

    exit_code = 75


class TimingLockStuck(MachineBusy):
    """Another process held the device's timing lock past the wait (``pareto.locks.device_lock``): no
    quieter moment helps, so a search stops at it (exit 75) instead of waiting and trying again."""


class LockHeld(ParetoError):
    """Another job holds the lock this one needs (a nightly of the same study).

    Exit code 75 (EX_TEMPFAIL, sysexits.h): the other job is doing the work; try again later.
    """

    exit_code = 75


def message_line(exc: BaseException, *, empty: str = "no message") -> str:
    """The first line of an error's message, without terminal colours (torch.onnx puts them in) or a
    closing period; ``empty`` when it has none. The one way pareto quotes a message in a sentence."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0].strip().rstrip(".") if text else empty


def exception_line(exc: BaseException) -> str:
    """``"TypeName: the first line of its message"``: how a failure inside user code, a library or a
    kernel is quoted in one sentence."""
    return f"{type(exc).__name__}: {message_line(exc)}"


#: A URL's password (``scheme://user:PASSWORD@host``) and a query or option value whose name says it is a
#: secret (``?password=…``, ``sslpassword``, ``token``, ``secret``, ``api_key``).
_URL_PASSWORD = re.compile(r"(\w[\w+.-]*://[^\s:/@]*:)[^\s@]*@")
_SECRET_VALUE = re.compile(r"((?:[?&;\s]|^)[\w.-]*(?:pass|secret|token|key)[\w.-]*=)[^&;\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every URL password and every ``name=value`` whose name says secret (password,
    token, key…) replaced by ``***``: what pareto prints or stores of a URL or a command line."""
    return _SECRET_VALUE.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
