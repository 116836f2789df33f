"""Signals during a long run: Ctrl-C finishes the trial in progress, SIGTERM ends the run now.

A KeyboardInterrupt raised by a handler at an arbitrary point can land in a finalizer during garbage
collection, where Python prints and swallows it: while a handler is installed such an interrupt is
not printed, and the callers keep the stop in a flag of their own.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


def quiet_interrupts(hook: Any) -> Any:
    """An ``sys.unraisablehook`` that drops a KeyboardInterrupt Python could not raise (it landed in
    a finalizer): the stop it stands for is kept in a flag, and the user sees no traceback."""

    def unraisable(info: Any) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            hook(info)

    return unraisable


@contextmanager
def handled(handler: Callable[[int, Any], None], *signums: signal.Signals) -> Iterator[None]:
    """``handler`` for ``signums`` while the block runs (main thread only: elsewhere nothing is
    installed), with interrupts lost in finalizers kept quiet; the previous handlers restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    hook = sys.unraisablehook
    sys.unraisablehook = quiet_interrupts(hook)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        sys.unraisablehook = hook


class StopOnInterrupt:
    """First Ctrl-C: finish the trial in progress, then stop. Second Ctrl-C, or SIGTERM (systemd
    stopping a service, Kubernetes ending a pod): abandon it at once.

    A KeyboardInterrupt raised at an arbitrary point can land in a finalizer during garbage
    collection, where Python prints and swallows it; the stop requested first cannot be lost.
    """

    def __init__(self, study: Any, reporter: Any) -> None:
        self.study, self.reporter = study, reporter
        self.requested = False
        self._installed = ExitStack()

    def __enter__(self) -> StopOnInterrupt:
        self._installed.enter_context(handled(self._handle, signal.SIGINT, signal.SIGTERM))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._installed.close()

    def _handle(self, signum: int, frame: Any) -> None:
        already = self.requested
        self.requested = True
        self.study.stop()
        if already or signum == signal.SIGTERM:
            raise KeyboardInterrupt

    def after_trial(self, _study: Any, _trial: Any) -> None:
        if self.requested:
            self.reporter.notice("Ctrl-C: stopped after the trial in progress.")
