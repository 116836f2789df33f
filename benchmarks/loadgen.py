"""MLPerf LoadGen's Server scenario as the yardstick of pareto's capacity (issue 45).

LoadGen (``pip install mlcommons-loadgen``, the reference load generator of MLPerf Inference) sends
Poisson queries from its own C++ thread at ``server_target_qps``, times each from its *scheduled* issue to
its completion, and reports the 99th percentile with its own validity rules (early stopping). Here it
drives a stored configuration of a study searched at a rate, served exactly as pareto serves it in a load
run: the same model build, the same padded buckets, a batcher thread with the same policy (one batch at a
time; a full batch at once, otherwise what is queued when the oldest query has waited the longest wait).
What differs from ``pareto load``: the generator (LoadGen's thread, not pareto's), the clock (LoadGen's),
and the percentile (LoadGen's own, no confidence bound).

For each rate asked (default: the study's rate, and the configuration's reported capacity), it prints
LoadGen's P99 and validity beside pareto's own load run at the same rate (``pareto load``, on its seeded
schedule), and whether each is within the SLO. Run it from the repository root on a study that
``benchmarks/traffic.py`` (or ``pareto search --qps``) made::

    .venv/bin/python benchmarks/loadgen.py --db sqlite:////tmp/traffic-demo.db --study traffic-demo
    .venv/bin/python benchmarks/loadgen.py --db sqlite:////tmp/traffic-demo.db --study traffic-demo --trial 3 \\
        --rates 1500,2000,2500 --duration 20

It prints a Markdown report (machine, date, command, the table).
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import sys
import tempfile
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import mlperf_loadgen as lg  # type: ignore[import-not-found]
import torch
from capacity_seeds import open_stored  # type: ignore[import-not-found]  # beside this script

import pareto
from pareto.errors import ParetoError
from pareto.machine import describe_cpu_features
from pareto.measure.environment import fingerprint
from pareto.measure.queue import Batcher
from pareto.metrics import served_capacity
from pareto.study.load_runs import Target, served_batcher
from pareto.units import format_ms


class BatcherSUT:
    """Queries queue for the served instances' batcher threads (one call at a time each), which run
    pareto's policy; ``complete`` gets each finished batch's samples."""

    def __init__(self, call: Callable[[int], object], batcher: Batcher, complete: Callable[[list[Any]], None]) -> None:
        self.call, self.batcher, self.complete = call, batcher, complete
        self.queue: deque[tuple[float, Any]] = deque()
        self.cond = threading.Condition()
        self.stopped = False
        self.threads = [
            threading.Thread(target=self._serve, name=f"loadgen-batcher-{i}", daemon=True)
            for i in range(batcher.instances)
        ]
        for thread in self.threads:
            thread.start()

    def issue(self, samples: list[Any]) -> None:
        now = time.perf_counter()
        with self.cond:
            for sample in samples:
                self.queue.append((now, sample))
            self.cond.notify()

    def flush(self) -> None:
        pass

    def _take(self) -> list[Any] | None:
        top, wait = self.batcher.max_batch, self.batcher.max_wait_ms / 1e3
        with self.cond:
            while True:
                if self.stopped:
                    return None
                if len(self.queue) >= top:
                    break
                if not self.queue:
                    self.cond.wait()
                    continue
                remaining = self.queue[0][0] + wait - time.perf_counter()
                if remaining <= 0:
                    break
                self.cond.wait(remaining)
            return [self.queue.popleft()[1] for _ in range(min(top, len(self.queue)))]

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            self.call(self.batcher.bucket(len(batch)))
            self.complete(batch)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join()


def _completed(samples: list[Any]) -> None:
    lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in samples])


def _warm(call: Callable[[int], object], batcher: Batcher, calls: int = 20) -> None:
    """Each padded bucket called a few times before LoadGen starts (pareto's load runs warm up too)."""
    for size in sorted({batcher.bucket(n) for n in range(1, batcher.max_batch + 1)}):
        for _ in range(calls):
            call(size)


def served_target(db: str, study: str, trial: int | None) -> Target:
    """The stored configuration built and served as its load runs serve it: its batcher, its layout's
    instances and intra-op threads, warmed up."""
    _, _, bench, pick = open_stored(db, study, trial)
    batcher = served_batcher(pick) or Batcher(int(pick.metrics["max_batch"]), float(pick.metrics["max_wait_ms"]))
    target = Target(bench, pick, batcher)
    _warm(target.call, target.batcher)
    return target


def _serve_remote(db: str, study: str, trial: int | None, queries: Any, completions: Any) -> None:
    """The model's process: sample ids arrive on ``queries``, finished ones go back on ``completions``."""
    target = served_target(db, study, trial)
    torch.set_num_threads(target.threads)  # this process serves only
    sending = threading.Lock()

    def complete(ids: list[int]) -> None:
        with sending:
            completions.send_bytes(array("Q", ids).tobytes())

    sut = BatcherSUT(target.call, target.batcher, complete)
    completions.send_bytes(b"ready")
    while data := queries.recv_bytes():
        sut.issue(list(array("Q", data)))
    sut.stop()
    completions.send_bytes(b"")


class RemoteSUT:
    """LoadGen's SUT in this process, the served model and its batcher in a spawned one: LoadGen's issue
    path writes sample ids to a pipe and a thread here reports what comes back, so that LoadGen's
    threads and the model's share no interpreter lock (a server's clients are other processes too)."""

    def __init__(self, db: str, study: str, trial: int | None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._queries_in, self._queries = ctx.Pipe(duplex=False)
        self._completions, completions_out = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_serve_remote, args=(db, study, trial, self._queries_in, completions_out), daemon=True
        )
        self.process.start()
        if self._completions.recv_bytes() != b"ready":
            raise RuntimeError("the model's process did not start")
        self.thread = threading.Thread(target=self._complete, name="loadgen-completions", daemon=True)
        self.thread.start()

    def issue(self, samples: list[Any]) -> None:
        self._queries.send_bytes(array("Q", [s.id for s in samples]).tobytes())

    def flush(self) -> None:
        pass

    def _complete(self) -> None:
        while data := self._completions.recv_bytes():
            lg.QuerySamplesComplete([lg.QuerySampleResponse(i, 0, 0) for i in array("Q", data)])

    def stop(self) -> None:
        self._queries.send_bytes(b"")
        self.thread.join()
        self.process.join()


def loadgen_server(sut_impl: Any, rate: float, slo_ms: float, duration_s: float, seed: int) -> dict[str, Any]:
    """One LoadGen Server run at ``rate`` against ``sut_impl`` (``issue``, ``flush``): its summary's P99,
    validity and achieved rate."""
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = rate
    settings.server_target_latency_ns = int(slo_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = int(duration_s * 1e3)
    settings.min_query_count = 1
    settings.schedule_rng_seed = seed + 1
    sut = lg.ConstructSUT(sut_impl.issue, sut_impl.flush)
    qsl = lg.ConstructQSL(1024, 1024, lambda _: None, lambda _: None)
    with tempfile.TemporaryDirectory() as out:
        log = lg.LogSettings()
        log.log_output.outdir = out
        log.log_output.copy_summary_to_stdout = False
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        summary = (Path(out) / "mlperf_log_summary.txt").read_text()
    return _parse(summary)


def _parse(summary: str) -> dict[str, Any]:
    def number(label: str) -> float | None:
        found = re.search(rf"^{re.escape(label)}\s*:\s*([0-9.eE+-]+)", summary, re.M)
        return float(found.group(1)) if found else None

    valid = re.search(r"^Result is\s*:\s*(\w+)", summary, re.M)
    p99 = number("99.00 percentile latency (ns)")
    return {
        "p99_ms": p99 / 1e6 if p99 is not None else None,
        "p50_ms": (number("50.00 percentile latency (ns)") or 0) / 1e6,
        "completed_qps": number("Completed samples per second"),
        "scheduled_qps": number("Scheduled samples per second"),
        "valid": valid.group(1) if valid else "?",
    }


def _in_process(target: Target, rate: float, slo_ms: float, duration_s: float) -> dict[str, Any]:
    """LoadGen in the model's process, the batcher threads at the layout's intra-op threads (set, as
    pareto's load runs set them, before the threads start; restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(target.threads)
    sut = BatcherSUT(target.call, target.batcher, _completed)
    try:
        return loadgen_server(sut, rate, slo_ms, duration_s, seed=0)
    finally:
        sut.stop()
        torch.set_num_threads(threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--trial", type=int, help="default: the pick at the study's rate")
    parser.add_argument("--rates", help="comma-separated requests/s; default: the study's rate and the capacity")
    parser.add_argument("--duration", type=float, default=20.0, help="LoadGen's minimum duration per run (s)")
    parser.add_argument("--requests", type=int, default=3000, help="requests of pareto's own load runs")
    parser.add_argument("--where", default="in,out", help="LoadGen in the model's process (in), outside it (out)")
    args = parser.parse_args()
    started = time.monotonic()
    row, constraints, _, pick = open_stored(args.db, args.study, args.trial)
    slo, rate = constraints.p99_ms or 0.0, constraints.qps or 0.0
    capacity, source = served_capacity(pick.metrics)
    target = served_target(args.db, args.study, pick.trial)
    batcher = target.batcher
    rates = [float(x) for x in args.rates.split(",")] if args.rates else [rate, *([capacity] if capacity else [])]
    where = args.where.split(",")
    env = fingerprint("cpu", target.threads)
    lines = [
        f"## LoadGen's Server scenario against pareto: study {row.name!r}, trial {pick.trial} {pick.description}",
        "",
        f"`benchmarks/loadgen.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{env['cpu_model']}, {describe_cpu_features(env['cpu_features'])}, "
        f"torch {torch.__version__}; mlcommons-loadgen {_version()}.",
        "",
        f"Served with max batch {batcher.max_batch}, wait {format_ms(batcher.max_wait_ms)}, {batcher.instances} "
        f"instance(s) × {target.threads} intra-op thread(s); SLO P99 ≤ {format_ms(slo)}; reported capacity "
        f"{capacity:,.0f}/s ({source}).",
        "",
        "| rate | LoadGen | P99 | result | completed/s | pareto load-run P99 (bound) | pareto valid |",
        "|---|---|---|---|---|---|---|",
    ]
    remote = RemoteSUT(args.db, args.study, pick.trial) if "out" in where else None
    try:
        for qps in rates:
            own = pareto.load_run(study=row.name, trial=pick.trial, qps=qps, requests=args.requests, db=args.db)
            ours = own["load_run"]
            for side in where:
                gen = _in_process(target, qps, slo, args.duration) if side == "in" else None
                gen = gen or loadgen_server(remote, qps, slo, args.duration, seed=0)
                within = "within" if gen["p99_ms"] is not None and gen["p99_ms"] <= slo else "over"
                lines.append(
                    f"| {qps:,.0f}/s | {'in the model' if side == 'in' else 'own'} process | "
                    f"{format_ms(gen['p99_ms'])} ({within} the SLO) | {gen['valid']} | {gen['completed_qps'] or 0:,.0f} | "
                    f"{format_ms(ours['p99_ms'])} (≤ {format_ms(ours.get('p99_upper_ms'))}) | {ours['valid']} |"
                )
    finally:
        if remote is not None:
            remote.stop()
    lines += ["", f"{time.monotonic() - started:.0f} s in all."]
    print("\n".join(lines))
    return 0


def _version() -> str:
    from importlib.metadata import version

    return version("mlcommons-loadgen")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ParetoError as exc:  # a busy machine, a study without a rate: one sentence, no traceback
        sys.exit(f"{Path(__file__).name}: {exc}")
