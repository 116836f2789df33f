"""Latency and throughput of ``pareto serve`` answering ``best`` on a study of 100 000 stored trials.

Builds (or reuses) the synthetic study of ``benchmarks/big_study.py`` in a SQLite file, starts
``python -m pareto serve`` on a free loopback port as its own process, and sends
``GET /studies/{study}/best?slo_p99_ms=7`` from ``--clients`` threads, each with its own keep-alive
httpx connection and each sending its next request as soon as the last one is answered (a closed
loop). ``--warmup`` requests are sent and not counted; then ``--requests`` are timed client-side with
``time.perf_counter`` around each request (so a latency includes the client's own work and the wait
in the server's queue). Percentiles are by nearest rank over the timed requests; requests/s is the
timed requests over the wall time of the timed phase. The clients run in this process, on the same
machine as the server: on a machine with few cores they compete with it for the CPU.

It also times ``pareto.api.best`` called in this process (the median of 20 calls after one), the
work each request does, to tell a slow query from a slow server.

Prints one Markdown table row with the command, the machine, the date, the commit and the 1-minute
load average before and after the timed phase (the machines are shared: a load above the core
count means other work took CPU from the server and the clients).

    python benchmarks/serve.py [--db sqlite:///big.db] [--trials 100000] [--clients 16] [--requests 2000]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from big_study import build  # beside this script: `python benchmarks/serve.py` puts this folder on sys.path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(db: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pareto", "serve", "--db", db, "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"pareto serve did not come up:\n{log.read_text()[-3000:]}")


def hammer(base: str, path: str, clients: int, total: int) -> tuple[list[float], int, float]:
    """``total`` requests from ``clients`` threads; (latencies in ms, non-200 answers, wall seconds)."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    left = [total]
    start = threading.Barrier(clients + 1)

    def client() -> None:
        with httpx.Client(base_url=base, timeout=120) as http:
            http.get("/healthz")  # open the connection before the clock starts
            start.wait()
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                t0 = time.perf_counter()
                response = http.get(path)
                elapsed = (time.perf_counter() - t0) * 1000
                with lock:
                    latencies.append(elapsed)
                    failures[0] += response.status_code != 200

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return latencies, failures[0], time.perf_counter() - t0


def with_wrk(base: str, path: str, clients: int, seconds: int) -> dict[str, float] | None:
    """The same closed loop from ``wrk`` (a C client: it takes far less CPU from the server than
    Python threads do), when it is installed: its p50/p99 latency and requests/s."""
    if shutil.which("wrk") is None:
        return None
    proc = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "--latency", base + path],
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, float] = {}
    units = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in {"50%", "99%"}:
            number = parts[1].rstrip("usm")
            unit = parts[1][len(number) :]
            found[parts[0]] = float(number) * units[unit]
        if line.startswith("Requests/sec:"):
            found["rps"] = float(parts[1])
        if "Non-2xx" in line:
            sys.exit(f"wrk saw answers other than 200: {line.strip()}")
    return found


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def in_process_ms(db: str, study: str, slo_p99_ms: float) -> float:
    from pareto.api import best

    best(study=study, slo_p99=slo_p99_ms, db=db)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        best(study=study, slo_p99=slo_p99_ms, db=db)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {usable} cores"


def load_average() -> str:
    """The 1-minute load average: the machines are shared, and other work inflates every latency."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def commit() -> str:
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return described.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="SQLite URL of the big study [default: a file in the temp folder]")
    parser.add_argument("--study", default="big")
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--slo-p99-ms", type=float, default=7.0)
    args = parser.parse_args()
    db = args.db or f"sqlite:///{Path(tempfile.gettempdir()) / f'pareto-bench-{args.study}-{args.trials}.db'}"
    built = build(db, study=args.study, trials=args.trials)
    print(f"study {args.study!r}: {args.trials} trials in {db}" + (f" (built in {built:.0f} s)" if built else ""))
    service_ms = in_process_ms(db, args.study, args.slo_p99_ms)
    print(f"pareto.api.best in this process: {service_ms:.2f} ms (median of 20 calls after one)")
    path = f"/studies/{args.study}/best?slo_p99_ms={args.slo_p99_ms:g}"
    load_before = load_average()
    with tempfile.TemporaryDirectory() as folder:
        proc, base = start_server(db, Path(folder) / "serve.log")
        try:
            hammer(base, path, args.clients, args.warmup)
            latencies, failures, wall = hammer(base, path, args.clients, args.requests)
            load_after = load_average()
            wrk = with_wrk(base, path, args.clients, 10)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    if failures:
        sys.exit(f"{failures} of {len(latencies)} requests were not answered 200")
    command = "python benchmarks/serve.py " + " ".join(sys.argv[1:])
    print()
    print(
        "| command | machine | date | commit | trials | clients | requests | p50 ms | p99 ms | max ms | requests/s | api.best in-process ms | load 1-min before→after |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print(
        f"| `{command.strip()}` | {machine()} | {datetime.date.today()} | {commit()} | {args.trials} | {args.clients} "
        f"| {len(latencies)} | {nearest_rank(latencies, 0.5):.1f} | {nearest_rank(latencies, 0.99):.1f} "
        f"| {max(latencies):.1f} | {len(latencies) / wall:.0f} | {service_ms:.1f} | {load_before}→{load_after} |"
    )
    if wrk is not None:
        print(
            f"| same, from `wrk -t2 -c{args.clients} -d10s --latency` | | | | | {args.clients} | {wrk['rps'] * 10:.0f} "
            f"| {wrk['50%']:.1f} | {wrk['99%']:.1f} | | {wrk['rps']:.0f} | | {load_average()} after |"
        )


if __name__ == "__main__":
    main()
