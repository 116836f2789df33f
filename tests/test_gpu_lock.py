"""Several workers on one GPU: a timing holds the GPU alone, and other GPU work (builds, captures,
evaluations) waits for it and is waited for.

Without a GPU the locks take a GPU's name ("cuda:0": torch sees no CUDA device, so that name is the
GPU's identity). Threads stand for the processes: each thread has its own hold and file descriptor,
and ``flock`` excludes open files, so they exclude each other as processes do.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from pareto.errors import MachineBusy, TimingLockStuck
from pareto.locks import WORK_WAIT_FACTOR, gpu_work, timing_lock
from tests.test_locks import stopped_process

GPU = "cuda:0"


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARETO_LOCK_DIR", str(tmp_path))


class Holder:
    """A thread that enters ``lock`` and stays inside until ``release()``."""

    def __init__(self, lock: Callable[[], AbstractContextManager[Any]]) -> None:
        self.entered, self.leave = threading.Event(), threading.Event()
        self.entered_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(lock,), daemon=True)
        self.thread.start()

    def _run(self, lock: Callable[[], AbstractContextManager[Any]]) -> None:
        try:
            with lock():
                self.entered_at = time.monotonic()
                self.entered.set()
                self.leave.wait(30)
        except BaseException as exc:
            self.error = exc
            self.entered.set()

    def release(self) -> None:
        self.leave.set()
        self.thread.join(30)
        assert not self.thread.is_alive() and self.error is None, self.error


@contextlib.contextmanager
def holding(lock: Callable[[], AbstractContextManager[Any]]) -> Iterator[Holder]:
    holder = Holder(lock)
    assert holder.entered.wait(30) and holder.error is None, holder.error
    try:
        yield holder
    finally:
        holder.release()


def test_a_timing_waits_for_gpu_work_under_way_and_names_it() -> None:
    with holding(lambda: gpu_work(GPU, what="trial 7: int8 build")):
        started = time.monotonic()
        with pytest.raises(TimingLockStuck) as info, timing_lock(GPU, timeout_s=0.2):
            pass
        # work that runs (a compile, a fine-tuning) is waited for longer than the lock's timeout
        assert time.monotonic() - started >= WORK_WAIT_FACTOR * 0.2
    message = str(info.value)
    assert isinstance(info.value, MachineBusy) and "\n" not in message
    assert f"GPU work on {GPU}" in message and f"pid {os.getpid()}" in message and "trial 7: int8 build" in message
    with timing_lock(GPU, timeout_s=5):  # the work ended: the timing takes the GPU at once
        pass


def test_gpu_work_waits_while_a_timing_runs() -> None:
    with holding(lambda: timing_lock(GPU, what="trial 3's rounds")) as timer:
        started = time.monotonic()
        with pytest.raises(MachineBusy, match="this GPU work is given up as busy"), gpu_work(GPU, timeout_s=0.1):
            pass
        assert time.monotonic() - started >= WORK_WAIT_FACTOR * 0.1  # a timer that runs is waited for longer
        late = Holder(lambda: gpu_work(GPU, timeout_s=10))
        time.sleep(0.3)
        assert not late.entered.is_set()  # waits for the timing to end
        ended = time.monotonic()
    assert timer.entered_at is not None and late.entered.wait(10) and late.error is None
    assert late.entered_at is not None and late.entered_at >= ended
    late.release()


def test_a_waiting_timing_is_not_overtaken_by_new_gpu_work() -> None:
    with holding(lambda: gpu_work(GPU)) as work:
        timer = Holder(lambda: timing_lock(GPU, timeout_s=10))
        _wait_for_the_timing_lock()  # the timer holds the timing lock and waits for the work to end
        assert not timer.entered.is_set()
        with pytest.raises(MachineBusy), gpu_work(GPU, timeout_s=0.1):  # a newcomer waits behind the timer
            pass
        work.leave.set()
        assert timer.entered.wait(10) and timer.error is None
    timer.release()


def _wait_for_the_timing_lock() -> None:
    """Until someone holds the GPU's timing lock (its holder's note is written once it is taken)."""
    import re

    from pareto import locks

    name = re.sub(r"[^A-Za-z0-9]", "_", locks._gpu_name(GPU) or GPU)
    note = locks._holder_path(locks.lock_dir() / f"pareto-timing-{name}.lock")
    deadline = time.monotonic() + 30
    while not note.exists():
        assert time.monotonic() < deadline, "no one took the timing lock"
        time.sleep(0.01)


def _time_elsewhere(timeout_s: float) -> BaseException | None:
    """Time on the GPU from another thread; what it raised, or None."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with timing_lock(GPU, timeout_s=timeout_s):
                pass
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return errors[0] if errors else None


def test_gpu_work_that_comes_to_time_lets_its_share_go_and_takes_it_back() -> None:
    with gpu_work(GPU):
        # its own share never holds its own timing up; work nested in its own timing waits for nothing
        with timing_lock(GPU, timeout_s=2), gpu_work(GPU):
            pass
        # after its timing the share is back: another's timing waits for this work again
        assert isinstance(_time_elsewhere(0.1), MachineBusy)
    assert _time_elsewhere(2) is None


def test_two_workers_that_both_come_to_time_do_not_wait_for_each_other() -> None:
    barrier = threading.Barrier(2, timeout=10)
    timed: list[float] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with gpu_work(GPU):
                barrier.wait()  # both hold their shares before either times
                with timing_lock(GPU, timeout_s=1):
                    timed.append(time.monotonic())
                    time.sleep(0.1)
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(timed) == 2 and max(timed) - started < 4


def test_the_cpu_keeps_one_lock_for_timing_only() -> None:
    with holding(lambda: gpu_work("cpu")), timing_lock("cpu", timeout_s=2):  # work on the CPU holds nothing
        pass
    with holding(lambda: timing_lock("cpu")), pytest.raises(MachineBusy), timing_lock("cpu", timeout_s=0.2):
        pass


def test_latency_timing_on_a_gpu_waits_for_other_gpu_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.measure import latency
    from pareto.measure.latency import RoundPlan, measure_interleaved

    monkeypatch.setattr(latency, "_measure_held", lambda *args: [])
    monkeypatch.setenv("PARETO_LOCK_TIMEOUT_S", "0.1")
    with holding(lambda: gpu_work(GPU, what="another worker's capture")), pytest.raises(MachineBusy) as info:
        measure_interleaved([], device=GPU, plan=RoundPlan(samples=1, rounds=1))
    assert "another worker's capture" in str(info.value)
    assert measure_interleaved([], device=GPU, plan=RoundPlan(samples=1, rounds=1)) == []
    assert "the GPU's timing and work locks held" in latency.GPU_LOCK_METHOD


def test_a_search_builds_and_evaluates_inside_gpu_work(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.spec import SearchSpec
    from pareto.study import confirmation
    from pareto.study import search as search_module
    from pareto.study.search import run_search

    inside: list[str] = []
    depth = [0]

    @contextlib.contextmanager
    def spy(device: str, **_: Any) -> Iterator[None]:
        inside.append(device)
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    calls: list[tuple[str, int]] = []

    def watched(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, depth[0]))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(search_module, "gpu_work", spy)
    monkeypatch.setattr(confirmation, "gpu_work", spy)
    for module, name in ((search_module, "assess"), (search_module, "preflight"), (confirmation, "time_beside")):
        monkeypatch.setattr(module, name, watched(name, getattr(module, name)))
    spec = SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_task",
            "study": "tiny",
            "slo": {"p99": "1s"},
            "search": {"n_trials": 2, "seed": 1, "confirm_top": 1},
            "measure": {"device": "cpu", "threads": 1, "warmup": 2, "contention_limit": 50},
            "space": {"techniques": {"prune_structured": {"ratio": [0.5]}}},
        }
    )
    run_search(spec, db_url=db_url)
    assert {name for name, _ in calls} == {"assess", "preflight", "time_beside"}, calls
    assert all(level == 1 for _, level in calls), calls
    assert set(inside) == {"cpu"}


HOLDER = """
import sys
from pareto.locks import gpu_work, timing_lock
lock = gpu_work if sys.argv[1] == "work" else timing_lock
with lock("cuda:0", what="a worker's " + sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it (or kills this process)
"""


@contextlib.contextmanager
def stopped_holder(kind: str, folder: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the GPU (``kind``: "work" or "timing") and is then stopped (SIGSTOP)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PARETO_LOCK_DIR": str(folder)}
    with stopped_process(HOLDER, kind, env=env) as proc:
        yield proc


def test_another_process_gpu_work_holds_a_timing_off_until_it_ends(tmp_path: Path) -> None:
    with stopped_holder("work", tmp_path) as proc:
        started = time.monotonic()
        with pytest.raises(MachineBusy) as info, timing_lock(GPU, timeout_s=0.5):
            pass
        assert time.monotonic() - started < WORK_WAIT_FACTOR * 0.5 / 2  # a stopped holder: the timeout only
        assert f"pid {proc.pid} (stopped)" in str(info.value) and "a worker's work" in str(info.value)
    with timing_lock(GPU, timeout_s=5):  # the kernel dropped the dead worker's share
        pass
    assert list(tmp_path.glob("pareto-work-*.holder"))  # its note stays behind, and is not named any more
    live = holding(lambda: gpu_work(GPU, what="the live one"))
    with live, pytest.raises(MachineBusy) as info, timing_lock(GPU, timeout_s=0.1):
        pass
    assert f"pid {proc.pid}" not in str(info.value) and "the live one" in str(info.value)


def test_a_stopped_timer_makes_gpu_work_give_up_after_the_timeout(tmp_path: Path) -> None:
    with stopped_holder("timing", tmp_path) as proc:
        started = time.monotonic()
        with pytest.raises(MachineBusy) as info, gpu_work(GPU, timeout_s=0.5):
            pass
        assert time.monotonic() - started < WORK_WAIT_FACTOR * 0.5 / 2
        assert f"pid {proc.pid} (stopped)" in str(info.value) and "this GPU work is given up" in str(info.value)
    with gpu_work(GPU, timeout_s=5):
        pass
