"""``pareto search --workers N``: N local processes adding trials to one study.

The study is created once, here, before any worker starts. Each worker is a ``pareto search``
process with its share of ``--n-trials``, on Optuna's RDB storage with heartbeats (a worker that
dies has its trial failed and retried by the others). Building and compressing models and
evaluating accuracy run in parallel; latency timing takes the device's timing lock
(``pareto.locks.timing_lock``), so it runs one worker at a time per device, or, with ``--device
cuda`` and several GPUs, one worker per GPU. Workers that share a GPU also hold its work lock
shared across each trial's build, capture and evaluation (``pareto.locks.gpu_work``), which a timing
takes exclusively: while one worker times, the others' GPU work waits, and a timing starts once the
GPU work under way has ended. When every worker has ended, this process confirms the best
configurations with the baseline and reports the study, as a single search does.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pareto.errors import UsageError
from pareto.spec import SearchSpec
from pareto.study.bench import finish_run, start_run
from pareto.study.result import SearchResult
from pareto.study.search import (
    Reporter,
    confirm_search,
    enqueue_baselines,
    enqueue_start,
    optuna_study,
    prepare,
    search_result,
    served_pick,
)

#: The most local workers: beyond a few per core they only queue for the timing lock.
MAX_WORKERS = 64


def shares(n_trials: int, workers: int) -> list[int]:
    """``n_trials`` split as evenly as possible over ``workers`` (the first ones take the remainder)."""
    base, extra = divmod(n_trials, workers)
    return [base + (1 if k < extra else 0) for k in range(workers)]


def worker_devices(device: str, workers: int) -> list[tuple[str, str | None]]:
    """Each worker's device and the ``CUDA_VISIBLE_DEVICES`` it starts with (None: this process's).

    With ``cuda`` (no index) and several GPUs, the workers take one GPU each in turn: a worker sees only
    its own, as ``cuda:0``, so nothing it allocates lands on another worker's GPU. Otherwise every
    worker shares the device, timing one at a time (the device lock, keyed by the GPU's UUID).
    """
    if device.strip().lower() == "cuda":
        import torch

        count = torch.cuda.device_count()
        if count > 1:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = [v.strip() for v in visible.split(",")][:count] if visible else [str(k) for k in range(count)]
            return [("cuda:0", ids[k % count]) for k in range(workers)]
    return [(device, None)] * workers


def run_workers(spec: SearchSpec, *, db_url: str, workers: int, reporter: Reporter) -> SearchResult:
    """Run ``workers`` local search processes on ``spec``'s study, then confirm and report.

    Raises:
        UsageError: a bad worker count, or a spec the study cannot take.
    """
    if not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be between 1 and {MAX_WORKERS}, got {workers}.")
    # the study is created (pareto's row in prepare, Optuna's in optuna_study), the task loaded (the demo
    # model trained on first use) and the baselines queued once, here, before any worker starts
    setup = prepare(spec, db_url, reporter)
    study = optuna_study(setup, db_url)
    enqueue_baselines(setup, study)
    enqueue_start(setup, study)
    devices = worker_devices(spec.measure.device, workers)
    shared_gpu = any(d.startswith("cuda") for d, _ in devices) and len(set(devices)) < len(devices)
    reporter.notice(
        f"{workers} workers on study {spec.study_name!r}: compression and accuracy in parallel, "
        "latency timed one worker at a time per device"
        + ("; while one times on the GPU, the others' GPU work waits." if shared_gpu else ".")
    )
    with tempfile.TemporaryDirectory(prefix="pareto-workers-") as folder:
        procs = []
        for k, (share, (device, visible)) in enumerate(
            zip(shares(spec.search.n_trials, workers), devices, strict=True)
        ):
            if share:
                procs.append(_start_worker(setup.spec, k, share, (device, visible), db_url, Path(folder), reporter))
        reports = _wait(procs)
    run = start_run(setup.bench, kind="search", study_id=setup.study_id)
    results = [r.result for r in reports if r.result is not None]
    interrupted = any(r.interrupted for r in results) or any(r.exit_code == 130 for r in reports)
    stopped_busy = any(r.stopped_busy for r in results)
    finish_run(setup.bench, run, workers=workers, interrupted=interrupted, stopped_busy=stopped_busy)
    confirmation = None if interrupted or stopped_busy else confirm_search(setup, run, reporter)
    make = functools.partial(
        search_result,
        setup,
        trials_run=sum(r.trials_run for r in results),
        measured=sum(r.measured for r in results),
        busy=sum(r.busy for r in results),
        interrupted=interrupted,
        confirmation=confirmation,
    )
    result = make() if interrupted or stopped_busy else served_pick(setup, run, make, reporter)
    result.stopped_busy = stopped_busy
    result.repeats = sum(r.repeats for r in results)
    result.rejected = sum(r.rejected for r in results)
    result.exhausted = next((r.exhausted for r in results if r.exhausted), None)
    result.failed_workers = [r.worker for r in reports if r.exit_code not in (0, 75, 130)]
    for r in reports:
        if r.worker in result.failed_workers:
            reporter.notice(f"Worker {r.worker} ended with exit code {r.exit_code}: {r.error or 'see above'}")
    return result


class _Worker:
    def __init__(self, number: int, proc: subprocess.Popen[str], relay: threading.Thread) -> None:
        self.number, self.proc, self.relay = number, proc, relay
        self.last_error = ""


def _start_worker(
    spec: SearchSpec,
    number: int,
    share: int,
    placement: tuple[str, str | None],
    db_url: str,
    folder: Path,
    reporter: Reporter,
) -> _Worker:
    """One ``pareto search`` process with its share of the trials; it confirms nothing (we do, after)."""
    # each worker its own seed: the same seed would make every worker propose the same configurations
    seed = spec.search.seed + number if spec.search.seed is not None else None
    search = spec.search.model_copy(update={"n_trials": share, "confirm_top": 0, "seed": seed})
    device, visible = placement
    measure = spec.measure.model_copy(update={"device": device})
    traffic = spec.traffic.model_copy(update={"load_runs": False})  # the parent load-runs the pick, after
    child = spec.model_copy(update={"search": search, "measure": measure, "traffic": traffic})
    path = folder / f"worker-{number}.json"
    path.write_text(json.dumps(child.model_dump(mode="json")))
    # the URL travels in the environment, which only its user can read: a command line, password
    # included, would show in every user's ps
    env = {**os.environ, "PARETO_WORKER": str(number), "PARETO_DB_URL": db_url}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    proc = subprocess.Popen(
        [sys.executable, "-m", "pareto", "search", "--spec-json", str(path), "--worker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    worker = _Worker(number, proc, threading.Thread())
    assert proc.stderr is not None
    worker.relay = threading.Thread(target=_relay, args=(worker, proc.stderr, reporter), daemon=True)
    worker.relay.start()
    return worker


def _relay(worker: _Worker, stream: IO[str], reporter: Reporter) -> None:
    """Each line a worker writes to stderr, shown here with its number."""
    for line in stream:
        text = line.rstrip()
        if text:
            worker.last_error = text
            reporter.notice(f"[worker {worker.number}] {text}")


@dataclass
class _Report:
    """How a worker ended: its search result (None when it wrote none), exit code and last error line."""

    worker: int
    exit_code: int
    result: SearchResult | None
    error: str | None


def _wait(procs: list[_Worker]) -> list[_Report]:
    """Wait for every worker; each one's search result (its stdout, as JSON), number and exit code."""
    reports = []
    for worker in procs:
        out = _communicate(worker, procs)
        worker.relay.join(timeout=5)
        try:
            result = SearchResult.from_dict(json.loads(out)) if out.strip() else None
        except (json.JSONDecodeError, KeyError, TypeError):
            result = None
        code = worker.proc.returncode
        reports.append(_Report(worker.number, code, result, None if code in (0, 75, 130) else worker.last_error))
    return reports


def _communicate(worker: _Worker, procs: list[_Worker]) -> str:
    """A worker's stdout once it ended. Ctrl-C reaches the workers too (one process group): each
    finishes its trial and stops, and this process waits for them; a second Ctrl-C ends them now."""
    interrupted = False
    while True:
        try:
            out, _ = worker.proc.communicate()
            return out
        except KeyboardInterrupt:
            if interrupted:
                for other in procs:
                    if other.proc.poll() is None:
                        other.proc.kill()
                raise
            interrupted = True
