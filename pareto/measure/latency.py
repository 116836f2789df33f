"""Per-call latency on the target device, timed in rounds with a contention guard between them.

The measurement rules: every call is timed on its own (CPU: ``perf_counter_ns``; CUDA: a start/end
event pair per call, synchronized); warm-up first; ``torch.inference_mode()``; a fixed thread count;
inputs made before timing; the garbage collector collected, frozen and disabled while timing. Calls
are grouped in rounds; several models measured together run in interleaved rounds in a random order
each round (randomized multiple interleaved trials, Abedi & Brecht, ICPE 2017), so that a slow
spell of the machine hits them alike.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from pareto.devices import InputCycle, as_args
from pareto.errors import UsageError
from pareto.locks import timing_lock
from pareto.measure.probe import ContentionProbe
from pareto.measure.stats import LatencySummary, percentile_bounds, summarize
from pareto.slo import (
    DEFAULT_CONFIDENCE,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    MIN_SAMPLES_P99,
    min_samples_for_upper_bound,
    slo_verdict,
)

#: Untimed calls before each block when models are interleaved or the contention probe runs between
#: rounds: another model or the probe leaves the caches to itself, and a served model is warm.
BLOCK_WARMUP = 3
#: What one timed call on a CUDA device includes, stored in every method there.
CUDA_TIMER_METHOD = (
    "cuda event pair per call, synchronized after each (the host's kernel launches included: serving latency; "
    "inputs made on the device before timing and outputs left there: no host-device copy timed)"
)
#: What the GPU's lock held off while a model was timed on it (``pareto.locks.timing_lock``).
GPU_LOCK_METHOD = (
    "the GPU's timing and work locks held: no other pareto timing on the host ran on it meanwhile, nor a "
    "search's, measure's, confirmation's or nightly's build, capture or evaluation (other programs are not held off)"
)
#: Adaptive sampling times at most this many times the planned rounds.
ADAPTIVE_ROUNDS_FACTOR = 10


@dataclass(frozen=True)
class Timed:
    """One model to time, with its inputs (a tensor or a tuple of arguments) and a label.

    ``ready`` is called before the model's warm-up, at the timed thread count
    (``pareto.compress.Served.ready``: ONNX Runtime opens its session there).
    """

    model: nn.Module
    inputs: Any
    label: str = ""
    ready: Callable[[], object] | None = None


@dataclass(frozen=True)
class RoundPlan:
    """How a latency measurement is made of rounds.

    Args:
        samples: Fewest timed calls in all (a "met" P99 needs ``MIN_SAMPLES_P99``).
        rounds: Rounds the calls are split into; each round has ``ceil(samples / rounds)`` calls.
        warmup: Untimed calls per model before the first round.
        confidence: One-sided confidence of every bound (overall, when adaptive).
        slo_ms: A P99 SLO: turns adaptive sampling on (more rounds until the verdict is decided).
        budget_s: Adaptive only: no further look starts after this many seconds.
        max_rounds: Adaptive only: most rounds per model; None means ``10 × rounds``.
        max_discards: Rounds discarded for contention before a model is given up as "machine busy";
            None means as many as ``rounds``.
        reject_above_ms: Early rejection: after the first round kept, a model whose P99 lower bound
            (order statistics of that round, at ``confidence``) is over this many ms stops there
            (``LatencyResult.rejected``). None: every round is timed.
    """

    samples: int = MIN_SAMPLES_P99
    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    confidence: float = DEFAULT_CONFIDENCE
    slo_ms: float | None = None
    budget_s: float | None = None
    max_rounds: int | None = None
    max_discards: int | None = None
    reject_above_ms: float | None = None

    def __post_init__(self) -> None:
        if 1 <= self.samples < self.rounds:  # fewer calls than rounds: one call per round
            object.__setattr__(self, "rounds", self.samples)

    @property
    def calls_per_round(self) -> int:
        return math.ceil(self.samples / self.rounds)

    def check(self) -> None:
        """Raises UsageError on a plan that cannot be measured."""
        if self.samples < 1:
            raise UsageError(f"Latency needs at least 1 timed sample, got {self.samples}.")
        if self.rounds < 1:
            raise UsageError(f"Latency needs at least 1 round, got {self.rounds}.")
        if self.warmup < 0:
            raise UsageError(f"Warm-up calls cannot be negative, got {self.warmup}.")
        if not 0.0 < self.confidence < 1.0:
            raise UsageError(f"Confidence must be between 0 and 1, got {self.confidence}.")
        if self.slo_ms is not None and not self.slo_ms > 0:
            raise UsageError(f"A latency SLO must be positive, got {self.slo_ms} ms.")
        if self.budget_s is not None and not self.budget_s >= 0:
            raise UsageError(f"A time budget cannot be negative, got {self.budget_s} s.")
        if self.max_rounds is not None and self.max_rounds < self.rounds:
            raise UsageError(f"max_rounds ({self.max_rounds}) must be at least rounds ({self.rounds}).")


@dataclass
class LatencyResult:
    """One model's latency measurement: its summary, its rounds and how it was taken.

    ``busy`` means the contention guard discarded more rounds than allowed: the summary covers the
    rounds kept and must not decide a verdict.
    """

    summary: LatencySummary
    warmup: int
    threads: int
    device: str
    method: str
    elapsed_s: float
    discarded_rounds: int = 0
    probe_ratio_max: float | None = None
    load_average: float | None = None
    busy: bool = False
    #: Why adaptive sampling, early rejection or the guard stopped; None when none did.
    stop_reason: str | None = None
    #: Stopped after the first round: the P99 is over ``RoundPlan.reject_above_ms`` with confidence.
    rejected: bool = False
    #: Every kept call's time in ms, rounds in order (what a queue simulation resamples); None when none was kept.
    samples_ms: np.ndarray | None = None


@dataclass
class _State:
    item: Timed
    args: tuple[Any, ...] | _Cycle
    kept: list[np.ndarray] = field(default_factory=list)
    discarded: int = 0
    ratios: list[float] = field(default_factory=list)
    busy: bool = False
    done: bool = False
    rejected: bool = False
    stop_reason: str | None = None


def measure_latency(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[Any],
    *,
    device: str,
    plan: RoundPlan | None = None,
    threads: int | None = None,
    probe: ContentionProbe | None = None,
    ready: Callable[[], object] | None = None,
    **plan_fields: Any,
) -> LatencyResult:
    """Time one model in rounds (see ``measure_interleaved``); ``plan_fields`` build a ``RoundPlan``.

    ``ready`` is called before the warm-up (``Timed.ready``). Example:
    ``measure_latency(model, x, device="cpu", samples=662, rounds=20)``.
    """
    plan = plan or RoundPlan(**plan_fields)
    timed = Timed(model, inputs, ready=ready)
    return measure_interleaved([timed], device=device, plan=plan, threads=threads, probe=probe)[0]


def measure_interleaved(
    items: Sequence[Timed],
    *,
    device: str,
    plan: RoundPlan,
    threads: int | None = None,
    probe: ContentionProbe | None = None,
    seed: int | None = None,
) -> list[LatencyResult]:
    """Time every item in rounds, interleaved in a random order each round.

    Every model is put in eval mode and warmed up; each model and its inputs must already sit on
    ``device`` (the bench puts them there: ``pareto.compress.apply(..., device=...)`` and the task's
    view, ``pareto.devices.on_device``), so no host-device copy is ever timed. Each round times
    ``plan.calls_per_round`` calls of every model still measuring, in a fresh random order, with
    ``BLOCK_WARMUP`` untimed calls first whenever another model or the contention probe ran since
    this model's last call. With a ``probe``, the
    probe is timed after every block: a block whose probe before or after is over the probe's limit
    is discarded and timed again, up to ``plan.max_discards`` times per model; past that the model
    is given up as "machine busy" (``busy``). With ``plan.slo_ms`` each model's P99 verdict is
    checked at planned looks (the planned rounds, then doubling up to ``max_rounds``); a model stops
    at the first look where it is decided. Looking repeatedly inflates the error rate, so every look
    and the stored bounds use the Bonferroni-corrected confidence ``1 - (1 - confidence) / looks``;
    the first look has enough samples for that confidence to bound the P99 at all.

    Timing waits for the device's timing lock (``pareto.locks.timing_lock``): no two pareto
    processes on this host time on one device at once; on a GPU it also waits until other pareto
    processes' GPU work (``pareto.locks.gpu_work``: builds, captures, evaluations) has ended, and
    holds new work off until it is done.

    Raises:
        UsageError: a bad plan or thread count, or a model or input that is not on ``device``.
    """
    plan.check()
    if threads is not None and threads < 1:
        raise UsageError(f"Thread count must be at least 1, got {threads}.")
    for item in items:
        _check_placement(item, device)
    with timing_lock(device):
        return _measure_held(items, device, plan, threads, probe, seed)


def _check_placement(item: Timed, device: str) -> None:
    """Raises UsageError when ``item``'s model or inputs are not on ``device`` (a copy would be timed, or fail)."""
    from pareto.devices import first_device, model_device, same_device

    for what, where in (("model", model_device(item.model)), ("inputs", first_device(item.inputs))):
        if where is not None and not same_device(where, device) and (what == "inputs" or _has_tensors(item.model)):
            raise UsageError(
                f"The {what} to time are on {where}, not on {device}: build models with "
                "pareto.compress.apply(..., device=...) and take inputs from the bench's task view "
                "(pareto.devices.on_device)."
            )


def _has_tensors(model: nn.Module) -> bool:
    return next(iter(model.parameters()), None) is not None or next(iter(model.buffers()), None) is not None


def _measure_held(
    items: Sequence[Timed],
    device: str,
    plan: RoundPlan,
    threads: int | None,
    probe: ContentionProbe | None,
    seed: int | None,
) -> list[LatencyResult]:
    """``measure_interleaved`` once this process holds the device's timing lock."""
    looks, confidence = _looks(plan)
    started_s = time.perf_counter()
    load = _load_average()
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used_threads = torch.get_num_threads()
        states = [_State(item, _arguments(item.inputs)) for item in items]
        for state in states:
            state.item.model.eval()
            if state.item.ready is not None:  # a runtime that binds its threads when it opens (ONNX Runtime)
                state.item.ready()
        timer = _timer(device)
        rng = np.random.default_rng(seed)
        with torch.inference_mode(), _gc_paused():
            for state in states:
                timer(state.item.model, state.args, plan.warmup, untimed=True)
            _run_looks(states, looks, plan, confidence, timer, probe, rng, started_s)
    finally:
        if threads is not None:
            torch.set_num_threads(previous_threads)
    elapsed = time.perf_counter() - started_s
    return [
        _result(s, plan, confidence, len(looks), used_threads, device, probe, elapsed, load, len(states) > 1)
        for s in states
    ]


def _looks(plan: RoundPlan) -> tuple[list[int], float]:
    """Round counts at which the verdict is checked, and the confidence each look uses.

    The first look has at least ``MIN_SAMPLES_P99`` samples and enough for the per-look confidence
    to bound the P99 at all; then the rounds double up to ``max_rounds`` (default 10x the first).
    """
    if plan.slo_ms is None:
        return [plan.rounds], plan.confidence
    k = plan.calls_per_round
    first = max(plan.rounds, math.ceil(MIN_SAMPLES_P99 / k))
    limit = plan.max_rounds or ADAPTIVE_ROUNDS_FACTOR * first
    first = min(first, limit)
    while True:
        looks = [first]
        while looks[-1] < limit:
            looks.append(min(2 * looks[-1], limit))
        per_look = 1.0 - (1.0 - plan.confidence) / len(looks)
        needed = math.ceil(min_samples_for_upper_bound(0.99, per_look) / k)
        if first >= needed or first >= limit:
            return looks, per_look
        first = min(needed, limit)


def _run_looks(
    states: list[_State],
    looks: list[int],
    plan: RoundPlan,
    confidence: float,
    timer: Callable[..., np.ndarray],
    probe: ContentionProbe | None,
    rng: np.random.Generator,
    started_s: float,
) -> None:
    max_discards = plan.max_discards if plan.max_discards is not None else plan.rounds
    # another model, or the probe, ran since this model's last call: its caches and clocks are not the model's
    block_warmup = BLOCK_WARMUP if len(states) > 1 or probe is not None else 0
    last = probe.read().ratio if probe is not None else 1.0
    for index, target in enumerate(looks):
        while True:
            pending = [s for s in states if not s.done and len(s.kept) < target]
            if not pending:
                break
            for state in (pending[i] for i in rng.permutation(len(pending))):
                if block_warmup:
                    timer(state.item.model, state.args, block_warmup, untimed=True)
                block = timer(state.item.model, state.args, plan.calls_per_round)
                now = probe.read().ratio if probe is not None else 1.0
                ratio, last = max(last, now), now
                state.ratios.append(ratio)
                if probe is not None and ratio > probe.limit:
                    state.discarded += 1
                    if state.discarded > max_discards:
                        state.busy = state.done = True
                        state.stop_reason = (
                            f"machine busy: {state.discarded} rounds discarded, the probe up to "
                            f"{max(state.ratios):.2g}x its quiet time"
                        )
                else:
                    state.kept.append(block)
                    if plan.reject_above_ms is not None and len(state.kept) == 1:
                        _reject_early(state, plan.reject_above_ms, plan.confidence)
        if plan.slo_ms is None:
            return
        _judge(states, plan.slo_ms, confidence, final=index == len(looks) - 1)
        if plan.budget_s is not None and time.perf_counter() - started_s >= plan.budget_s:
            for state in states:
                if not state.done:
                    state.done = True
                    state.stop_reason = (
                        f"time budget {plan.budget_s:g} s spent, P99 verdict uncertain at SLO {plan.slo_ms:g} ms"
                    )
            return


def _reject_early(state: _State, limit_ms: float, confidence: float) -> None:
    """Stop ``state`` when its first round alone puts the P99 over ``limit_ms`` with ``confidence``.

    The lower bound is an order statistic of that round (with 34 calls at 99 %: the third largest);
    the round was kept, so the contention probe around it was quiet. A P99 within the limit is
    rejected with probability at most ``1 - confidence``.
    """
    first_ms = state.kept[0] / 1e6
    lower = percentile_bounds([first_ms], 0.99, confidence).lower
    if lower > limit_ms:
        state.done = state.rejected = True
        state.stop_reason = (
            f"rejected early: after the first round ({first_ms.size} calls) the P99 is at least "
            f"{lower:.3g} ms ({confidence:.3g} one-sided), over the SLO {limit_ms:g} ms"
        )


def _judge(states: list[_State], slo_ms: float, confidence: float, *, final: bool) -> None:
    for state in states:
        if state.done:
            continue
        rounds_ms = [r / 1e6 for r in state.kept]
        p99 = percentile_bounds(rounds_ms, 0.99, confidence)
        verdict = slo_verdict(p99.lower, p99.upper, slo_ms, sum(r.size for r in rounds_ms))
        if verdict != "uncertain":
            state.done, state.stop_reason = True, f"P99 verdict {verdict} at SLO {slo_ms:g} ms"
        elif final:
            state.done = True
            state.stop_reason = f"{len(state.kept)} rounds reached, P99 verdict uncertain at SLO {slo_ms:g} ms"


def _result(
    state: _State,
    plan: RoundPlan,
    confidence: float,
    looks: int,
    threads: int,
    device: str,
    probe: ContentionProbe | None,
    elapsed: float,
    load: float | None,
    interleaved: bool,
) -> LatencyResult:
    summary = summarize(state.kept, confidence) if state.kept else _empty_summary(confidence)
    # the bounds are at the per-look level; what the verdict holds at overall is the plan's confidence
    summary = dataclasses.replace(summary, confidence=plan.confidence)
    timer = f"{CUDA_TIMER_METHOD}; {GPU_LOCK_METHOD}" if device.startswith("cuda") else "perf_counter_ns per call"
    taken = f"{summary.rounds} rounds x {plan.calls_per_round} calls ({summary.samples} samples)"
    if plan.slo_ms is not None:
        taken += (
            f", adaptive at up to {looks} looks (Bonferroni: bounds at {confidence:.4g} each, "
            f"{plan.confidence:.4g} overall)"
        )
    if isinstance(state.args, _Cycle):
        taken += f", each call on the next of {len(state.args.args)} inputs in turn (the task's own requests)"
    if interleaved:
        taken += ", interleaved with other models in random order"
    if interleaved or probe is not None:
        taken += f", {BLOCK_WARMUP} untimed calls per block"
    guard = "no contention probe"
    if probe is not None:
        guard = f"{probe.description}; {state.discarded} rounds discarded"
    method = (
        f"{timer}, {plan.warmup} warm-up, {taken}, inference_mode, gc frozen, {threads} threads; {guard}; "
        f"P99 bound: {summary.p99_bound}, {plan.confidence:.4g} one-sided"
    )
    return LatencyResult(
        summary=summary,
        warmup=plan.warmup,
        threads=threads,
        device=device,
        method=method,
        elapsed_s=elapsed,
        discarded_rounds=state.discarded,
        probe_ratio_max=max(state.ratios) if probe is not None and state.ratios else None,
        load_average=load,
        busy=state.busy,
        stop_reason=state.stop_reason,
        rejected=state.rejected,
        samples_ms=np.concatenate(state.kept) / 1e6 if state.kept else None,
    )


def _empty_summary(confidence: float) -> LatencySummary:
    nan = math.nan
    return LatencySummary(
        nan,
        nan,
        -math.inf,
        math.inf,
        nan,
        -math.inf,
        math.inf,
        nan,
        -math.inf,
        math.inf,
        nan,
        -math.inf,
        math.inf,
        nan,
        0,
        0,
        None,
        "none: every round discarded",
        confidence,
    )


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not available on this platform
        return None


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Collect, freeze and disable the garbage collector for a whole measurement; restore it afterwards.

    A heap the caller froze already stays as the caller left it (``gc.unfreeze`` would thaw all of it,
    and freezing more would change the caller's count): then it is only collected and disabled.
    """
    was_enabled = gc.isenabled()
    was_frozen = gc.get_freeze_count() > 0
    gc.collect()
    if not was_frozen:
        gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if not was_frozen:
            gc.unfreeze()
        if was_enabled:
            gc.enable()


class _Cycle:
    """Argument tuples handed out one per call, in turn and then from the first again (``InputCycle``)."""

    def __init__(self, inputs: InputCycle) -> None:
        self.args = [as_args(x) for x in inputs]
        self.position = 0

    def next(self) -> tuple[Any, ...]:
        args = self.args[self.position]
        self.position = (self.position + 1) % len(self.args)
        return args


def _arguments(inputs: Any) -> tuple[Any, ...] | _Cycle:
    """What a timed call is given: one fixed tuple, or a ``_Cycle`` over a task's real inputs."""
    if isinstance(inputs, InputCycle):
        if not inputs:
            raise UsageError("a task's timing_inputs gave no inputs; give at least one per batch size.")
        return _Cycle(inputs)
    return as_args(inputs)


def _timer(device: str) -> Callable[..., np.ndarray]:
    """``timer(model, args, count, untimed=False)``: per-call nanoseconds on ``device``."""
    if device.startswith("cuda"):
        return lambda model, args, count, untimed=False: _time_cuda(model, args, count, device, untimed)
    return lambda model, args, count, untimed=False: _time_cpu(model, args, count, untimed)


def _time_cpu(model: nn.Module, args: tuple[Any, ...] | _Cycle, count: int, untimed: bool = False) -> np.ndarray:
    samples_ns = np.empty(0 if untimed else count, dtype=np.int64)
    cycle = args if isinstance(args, _Cycle) else None
    for i in range(count):
        call = cycle.next() if cycle is not None else args
        assert isinstance(call, tuple)
        start_ns = time.perf_counter_ns()
        output = model(*call)
        if not untimed:
            samples_ns[i] = time.perf_counter_ns() - start_ns
        del output  # freeing the output is not part of the next call's time
    return samples_ns


def _time_cuda(
    model: nn.Module, args: tuple[Any, ...] | _Cycle, count: int, device: str, untimed: bool = False
) -> np.ndarray:
    cycle = args if isinstance(args, _Cycle) else None
    with torch.cuda.device(device):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for start, end in zip(starts, ends, strict=True):
            call = cycle.next() if cycle is not None else args
            assert isinstance(call, tuple)
            start.record()
            output = model(*call)
            end.record()
            end.synchronize()  # one query at a time: the next call must not overlap this one
            del output
    if untimed:
        return np.empty(0, dtype=np.int64)
    return np.array([start.elapsed_time(end) * 1e6 for start, end in zip(starts, ends, strict=True)])
