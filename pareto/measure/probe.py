"""The contention guard's reference probe: a fixed small workload timed between latency rounds.

On a shared machine another process can take cores or memory bandwidth in the middle of a
measurement. The probe is the same work every time (a square fp32 matmul and a memory copy), so its
time moves only with the machine: a round whose probe before or after it is slower than the quiet
reference by more than the limit ran on a busy machine and is discarded. The probe runs right after
model calls, with the same thread count, so the scheduler treats it as it treats the calls (a probe
after an idle pause is favoured by the scheduler and would look faster than it is).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pareto.devices import torch_threads
from pareto.slo import DEFAULT_CONTENTION_LIMIT

_CPU_MATMUL_N, _CUDA_MATMUL_N = 384, 2048
_CPU_COPY_BYTES, _CUDA_COPY_BYTES = 16 * 2**20, 256 * 2**20
#: On CUDA, tiny kernels launched one after another: their time is the host's launch time, which a busy
#: CPU slows (a launch-bound model is slowed the same way), while the matmul and the copy see the GPU.
_CUDA_LAUNCHES = 100
_REPEATS = 3
_REFERENCE_PROBES = 9
_REFERENCE_WORK_S = 0.02


#: Readings of one run after which their 10th percentile may lower the quiet time.
ROLLING_QUIET_READINGS = 10


@dataclass(frozen=True)
class ProbeReading:
    """A probe's time and its ratio to the quiet reference."""

    ms: float
    ratio: float


class ContentionProbe:
    """Times the reference workload on ``device``; compares it with the environment's quiet time.

    Building one measures this run's reference (``run_reference_ms``); the quiet time is the lower of
    it and the environment's stored quiet time (the median reference of its recent runs), so a run
    that starts on a busy machine still compares with the machine's normal state.

    What it costs: a reading (``read``, taken between rounds) is ``_REPEATS`` (3) runs of the
    workload, about 3x ``quiet_ms``; ``read_after_work`` adds ``_REFERENCE_WORK_S`` (20 ms) of busy
    matmuls, each waited for, so on CUDA the busy work ends when its time does instead of queueing
    kernels that run on after it. The reference is one untimed run and ``_REFERENCE_PROBES`` (9)
    readings after busy work: about 0.18 s plus 28 runs of the workload (``reference_s`` is what it took).

    Args:
        device: A resolved device ("cpu", "cuda:N").
        threads: The intra-op thread count the measurements use (the probe must use the same).
        stored_quiet_ms: The environment's quiet probe time so far; None when it has none yet.
        limit: Ratio to the quiet time above which the machine counts as busy.
    """

    def __init__(
        self,
        device: str,
        *,
        threads: int | None = None,
        stored_quiet_ms: float | None = None,
        limit: float = DEFAULT_CONTENTION_LIMIT,
    ) -> None:
        if not limit > 1.0:
            raise ValueError(f"the contention limit must be above 1, got {limit}")
        self.device, self.limit = device, limit
        on_cuda = device.startswith("cuda")
        n = _CUDA_MATMUL_N if on_cuda else _CPU_MATMUL_N
        nbytes = _CUDA_COPY_BYTES if on_cuda else _CPU_COPY_BYTES
        generator = torch.Generator().manual_seed(0)
        self._a = torch.randn(n, n, generator=generator).to(device)
        self._b = torch.randn(n, n, generator=generator).to(device)
        self._src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        self._dst = torch.empty_like(self._src)
        self._launches = _CUDA_LAUNCHES if on_cuda else 0
        self._tiny = torch.zeros(1, device=device)
        self._sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if on_cuda else (lambda: None)
        self.threads = threads
        started = time.perf_counter()
        self.run_reference_ms = self._reference()
        #: seconds this run's reference took to measure
        self.reference_s = time.perf_counter() - started
        self.quiet_ms = min(self.run_reference_ms, stored_quiet_ms or self.run_reference_ms)
        launches = f" + {self._launches} one-element kernel launches (host-bound), synchronized" if on_cuda else ""
        self._workload = f"{n}x{n} fp32 matmul + {nbytes // 2**20} MiB copy{launches}, median of {_REPEATS}"
        self._readings: list[float] = []

    @property
    def description(self) -> str:
        return (
            f"contention probe ({self._workload}; reference {self.reference_s:.2g} s) between rounds; a round is "
            f"discarded when its probe is over {self.limit:g}x the quiet {self.quiet_ms:.3g} ms"
        )

    def time_ms(self) -> float:
        """The probe's time now: the median of a few runs, in milliseconds."""
        runs = []
        with torch.inference_mode(), torch_threads(self.threads):
            for _ in range(_REPEATS):
                self._sync()
                start = time.perf_counter_ns()
                self._a @ self._b
                self._dst.copy_(self._src)
                for _ in range(self._launches):
                    self._tiny.add_(1.0)
                self._sync()
                runs.append((time.perf_counter_ns() - start) / 1e6)
        return statistics.median(runs)

    def read(self) -> ProbeReading:
        """The probe now, against the quiet time. A reference taken during a slow spell of the host
        (seen on the shared VM: 12x the normal probe) would make every later round look quiet, so
        once the run has ``ROLLING_QUIET_READINGS`` readings the quiet time is lowered to their 10th
        percentile when that is lower: the machine has shown it can run the probe that fast."""
        ms = self.time_ms()
        self._readings.append(ms)
        if len(self._readings) >= ROLLING_QUIET_READINGS:
            ordered = sorted(self._readings)
            self.quiet_ms = min(self.quiet_ms, ordered[len(ordered) // 10])
        return ProbeReading(ms, ms / self.quiet_ms)

    def read_after_work(self) -> ProbeReading:
        """A reading taken right after some busy work, as the probe runs between rounds (a probe
        after an idle pause is favoured by the scheduler and would look quieter than it is).

        A reading over the limit is taken once more at once, and the lower one returned: on a VM whose
        vCPUs had idled (a load run's sleeps between arrivals, the two seconds ``wait_for_quiet`` waits)
        the first reading after the work was 1.5-1.6x the quiet time with nothing else running, the
        next ones 1.0-1.1x (2-vCPU Intel Xeon with AMX, 2026-12-08); each load run, the confirmation's
        check and every ``wait_for_quiet`` then found a quiet machine busy. A neighbour that is really
        there slows both readings."""
        self._work()
        first = self.read()
        if first.ratio <= self.limit:
            return first
        second = self.read()
        return second if second.ratio < first.ratio else first

    def wait_for_quiet(self, timeout_s: float, *, settled: int = 3, every_s: float = 2.0) -> bool:
        """Wait until ``settled`` readings in a row are within the limit; False when ``timeout_s`` ran out."""
        deadline, quiet = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            quiet = quiet + 1 if self.read_after_work().ratio <= self.limit else 0
            if quiet >= settled:
                return True
            time.sleep(every_s)
        return False

    def _work(self) -> None:
        """``_REFERENCE_WORK_S`` of busy matmuls, each waited for before the next. A CUDA launch returns at
        once: 20 ms of launches alone would queue hundreds of 2048x2048 matmuls, which would run on for
        up to a second after the time is up and leave the clocks unlike those between rounds."""
        with torch.inference_mode(), torch_threads(self.threads):
            until = time.perf_counter() + _REFERENCE_WORK_S
            while time.perf_counter() < until:
                self._a @ self._b
                self._sync()

    def _reference(self) -> float:
        """This run's reference: the median probe, each right after some busy work."""
        readings = []
        with torch.inference_mode():
            self.time_ms()  # first touch of the buffers and the thread pool
        for _ in range(_REFERENCE_PROBES):
            self._work()
            readings.append(self.time_ms())
        return statistics.median(readings)
