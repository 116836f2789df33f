from __future__ import annotations

import dataclasses
import gc
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

# CPU tests pin one thread: on small VMs intra-op thread wake-ups can cost milliseconds per call
from pareto.devices import resolve_device
from pareto.errors import UsageError
from pareto.measure.latency import (
    RoundPlan,
    Timed,
    _looks,
    _run_looks,
    _State,
    measure_interleaved,
    measure_latency,
)
from pareto.measure.probe import ContentionProbe
from pareto.slo import MIN_SAMPLES_P99


def _mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


class _Pair(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def test_summary_has_rounds_of_calls_and_ordered_percentiles() -> None:
    result = measure_latency(_mlp(32), torch.randn(4, 32), device="cpu", samples=200, rounds=10, warmup=5, threads=1)
    s = result.summary
    assert s.samples == 200 and s.rounds == 10
    assert 0 < s.p50_ms <= s.p90_ms <= s.p99_ms <= s.p999_ms
    for name in ("p50", "p90", "p99", "p999"):
        value = getattr(s, f"{name}_ms")
        assert getattr(s, f"{name}_lower_ms") <= value <= getattr(s, f"{name}_upper_ms")
    assert result.device == "cpu" and result.warmup == 5
    assert "perf_counter_ns per call" in result.method and "10 rounds x 20 calls (200 samples)" in result.method
    assert "no contention probe" in result.method
    assert result.elapsed_s > 0


def test_samples_round_up_to_whole_rounds() -> None:
    result = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", samples=662, rounds=20, warmup=1, threads=1)
    assert result.summary.samples == 680 and result.summary.rounds == 20  # 20 rounds of ceil(662 / 20) = 34


def test_early_rejection_stops_after_the_first_round_only_when_the_p99_is_surely_over() -> None:
    model, x = _mlp(8), torch.randn(1, 8)
    over = measure_latency(model, x, device="cpu", samples=662, rounds=20, warmup=1, threads=1, reject_above_ms=1e-6)
    assert over.rejected and over.summary.rounds == 1 and over.summary.samples == 34
    assert over.stop_reason.startswith("rejected early: after the first round (34 calls)")
    assert over.summary.p99_lower_ms > 1e-6  # the bound that decided it, kept in the summary
    under = measure_latency(model, x, device="cpu", samples=662, rounds=20, warmup=1, threads=1, reject_above_ms=1e3)
    assert not under.rejected and under.summary.rounds == 20
    # without a limit nothing is rejected
    plain = measure_latency(model, x, device="cpu", samples=68, rounds=2, warmup=1, threads=1)
    assert not plain.rejected and plain.summary.rounds == 2


def test_tuple_inputs_are_unpacked() -> None:
    inputs = (torch.randn(8, 8), torch.randn(8, 8))
    result = measure_latency(_Pair(), inputs, device="cpu", samples=20, threads=1)
    assert result.summary.samples == 20


@pytest.mark.parametrize("frozen", [False, True], ids=["heap not frozen", "heap frozen by the caller"])
def test_restores_threads_and_gc_state(frozen: bool) -> None:
    # the suite's conftest froze the heap; a caller who did not is the other case
    model, x = _mlp(16), torch.randn(1, 16)
    if not frozen:
        gc.unfreeze()
    try:
        threads_before = torch.get_num_threads()
        gc_enabled_before, freeze_before = gc.isenabled(), gc.get_freeze_count()
        result = measure_latency(model, x, device="cpu", samples=10, warmup=1, threads=1)
        assert result.threads == 1 and "1 threads" in result.method
        assert torch.get_num_threads() == threads_before
        assert gc.isenabled() == gc_enabled_before
        # an unfrozen heap thawed again; a frozen one left frozen (objects in it may die meanwhile) and
        # nothing more frozen
        assert gc.get_freeze_count() == 0 if not frozen else 0 < gc.get_freeze_count() <= freeze_before
    finally:
        gc.freeze()


def test_restores_state_when_the_model_fails() -> None:
    class Broken(nn.Module):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Broken.calls += 1
            if Broken.calls > 2:  # fail inside the timed loop, after warm-up
                raise RuntimeError("boom")
            return x

    threads_before, freeze_before = torch.get_num_threads(), gc.get_freeze_count()
    with pytest.raises(RuntimeError, match="boom"):
        measure_latency(Broken(), torch.randn(2), device="cpu", samples=5, rounds=1, warmup=2, threads=1)
    assert torch.get_num_threads() == threads_before
    assert gc.isenabled()
    assert 0 < gc.get_freeze_count() <= freeze_before  # the suite's frozen heap left frozen, nothing more


def test_more_work_takes_longer() -> None:
    small = measure_latency(_mlp(16), torch.randn(1, 16), device="cpu", samples=100, warmup=10, threads=1)
    large = measure_latency(_mlp(512), torch.randn(64, 512), device="cpu", samples=100, warmup=10, threads=1)
    # ~10 000x the FLOPs; a generous factor keeps this stable on noisy machines
    assert large.summary.p50_ms > 2 * small.summary.p50_ms


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"samples": 0}, "at least 1"), ({"warmup": -1}, "negative"), ({"threads": 0}, "Thread count")],
)
def test_bad_arguments_raise_usage_error(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        measure_latency(_mlp(4), torch.randn(1, 4), device="cpu", **{"threads": 1, **kwargs})


def test_resolve_device_cpu_and_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"


def test_resolve_device_cuda_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda:0"
    assert resolve_device("cuda") == "cuda:0"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(UsageError, match="sees only 2 CUDA device"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cuda:-1", "mps", ""])
def test_resolve_device_unknown(spec: str) -> None:
    with pytest.raises(UsageError, match="Unknown device"):
        resolve_device(spec)


def test_resolve_device_cuda_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="torch sees no CUDA device; use --device cpu"):
        resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA event timing is untested")
def test_cuda_event_timing() -> None:
    model, x = _mlp(256).to("cuda:0"), torch.randn(8, 256, device="cuda:0")
    result = measure_latency(model, x, device="cuda:0", samples=200, warmup=10)
    assert result.device == "cuda:0"
    assert "cuda event pair per call" in result.method and "no host-device copy timed" in result.method
    assert result.summary.samples == 200
    assert 0 < result.summary.p50_ms <= result.summary.p99_ms


def test_interleaved_models_get_the_same_rounds() -> None:
    small, large = _mlp(8), _mlp(256)
    results = measure_interleaved(
        [Timed(small, torch.randn(1, 8)), Timed(large, torch.randn(32, 256))],
        device="cpu",
        plan=RoundPlan(samples=100, rounds=10, warmup=2),
        threads=1,
        seed=0,
    )
    assert [r.summary.rounds for r in results] == [10, 10]
    assert [r.summary.samples for r in results] == [100, 100]
    assert "interleaved with other models in random order" in results[0].method
    assert results[1].summary.p50_ms > results[0].summary.p50_ms


@dataclass
class _Reading:
    ms: float
    ratio: float


class _ScriptedProbe:
    """A probe whose readings follow a script: ratios to its quiet time, one per read."""

    def __init__(self, ratios: list[float], limit: float = 1.5) -> None:
        self.ratios, self.limit, self.quiet_ms = list(ratios), limit, 1.0
        self.description = "scripted probe"

    def read(self) -> _Reading:
        ratio = self.ratios.pop(0) if self.ratios else 1.0
        return _Reading(ratio, ratio)


def test_a_slow_probe_discards_the_rounds_around_it_and_they_are_timed_again() -> None:
    # reads: before round 1, then after each block; the 3rd read is slow: blocks 2 and 3 touch it
    probe = _ScriptedProbe([1.0, 1.0, 3.0, 1.0] + [1.0] * 20)
    result = measure_latency(
        _mlp(8), torch.randn(1, 8), device="cpu", samples=50, rounds=5, warmup=1, threads=1, probe=probe
    )  # type: ignore[arg-type]
    assert result.summary.rounds == 5 and result.summary.samples == 50
    assert result.discarded_rounds == 2
    assert result.probe_ratio_max == 3.0
    assert not result.busy


def test_a_machine_that_stays_busy_gives_no_verdict() -> None:
    probe = _ScriptedProbe([2.0] * 100)
    result = measure_latency(
        _mlp(8), torch.randn(1, 8), device="cpu", samples=40, rounds=4, warmup=1, threads=1, slo_ms=1000.0, probe=probe
    )  # type: ignore[arg-type]
    assert result.busy
    assert result.discarded_rounds == 5  # the limit (as many as the rounds) plus the one that tipped it
    assert result.stop_reason is not None and result.stop_reason.startswith("machine busy: 5 rounds discarded")


def test_a_spec_that_allows_more_discards_waits_out_a_load_the_default_gives_up_on() -> None:
    """``measure.max_discards`` (the nightly config's 4x the rounds) reaches the plan the guard reads."""
    from pareto.measure.latency import measure_interleaved
    from pareto.spec import Measure
    from pareto.study.assess import round_plan

    load = [1.0] + [2.0, 1.0, 1.0] * 20  # every third read slow: its block and the next are discarded
    for spec, busy in ((Measure(samples=40, rounds=4), True), (Measure(samples=40, rounds=4, max_discards=16), False)):
        plan = dataclasses.replace(round_plan(spec, None), warmup=1)
        assert plan.max_discards == spec.max_discards
        [result] = measure_interleaved(
            [Timed(_mlp(8), torch.randn(1, 8))], device="cpu", plan=plan, threads=1, probe=_ScriptedProbe(list(load))
        )  # type: ignore[arg-type]
        assert result.busy is busy
        assert busy or (result.summary.rounds == 4 and result.discarded_rounds > 4)


def test_the_real_probe_times_its_workload_against_a_quiet_reference() -> None:
    probe = ContentionProbe("cpu", threads=1)
    assert probe.run_reference_ms is not None and probe.quiet_ms <= probe.run_reference_ms
    assert probe.read().ms > 0
    now = min(probe.read().ms for _ in range(3))  # on many cores the first reference can run at low clocks
    remembered = ContentionProbe("cpu", threads=1, stored_quiet_ms=now / 20)
    assert remembered.quiet_ms == pytest.approx(now / 20)  # the lower, stored quiet time wins
    assert remembered.read().ratio > 2  # against it, today's probe looks busy
    with pytest.raises(ValueError, match="above 1"):
        ContentionProbe("cpu", threads=1, limit=1.0)


def test_the_probe_reads_at_its_own_thread_count_whatever_the_process_runs_at(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = ContentionProbe("cpu", threads=1)
    seen: list[int] = []
    matmul = torch.Tensor.__matmul__

    def counted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return matmul(a, b)

    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # between trials the process may run at another count than the rounds
    try:
        monkeypatch.setattr(torch.Tensor, "__matmul__", counted)
        probe.read_after_work()
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2  # given back afterwards
    finally:
        torch.set_num_threads(previous)


def test_a_reading_after_work_over_the_limit_is_taken_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vCPU waking from idle reads slow once (1.6x here), a neighbour slows every reading."""
    probe = ContentionProbe("cpu", threads=1, limit=1.5)
    monkeypatch.setattr(probe, "_work", lambda: None)
    for times, busy in (([1.6, 1.05], False), ([1.6, 1.7], True), ([1.2, 9.0], False)):
        given = iter(t * probe.quiet_ms for t in times)
        taken = len(probe._readings)
        monkeypatch.setattr(probe, "time_ms", given.__next__)
        reading = probe.read_after_work()
        assert (reading.ratio > probe.limit) is busy, times
        assert len(probe._readings) - taken == (1 if times[0] <= 1.5 else 2)  # a quiet first reading is enough


def test_adaptive_stops_at_once_on_a_clearly_met_slo() -> None:
    result = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", samples=662, warmup=5, threads=1,
                             slo_ms=1000.0, max_rounds=200)  # fmt: skip
    assert result.summary.samples == 680  # decided at the first look: no further round
    assert result.stop_reason == "P99 verdict met at SLO 1000 ms"
    # 20 → 200 rounds in doublings: 5 looks; 99 % overall is 1 - 0.01 / 5 per look; the overall is stored
    assert result.summary.confidence == 0.99
    assert "adaptive at up to 5 looks (Bonferroni: bounds at 0.998 each, 0.99 overall)" in result.method


def test_adaptive_stops_at_once_on_a_clearly_missed_slo() -> None:
    result = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", samples=662, warmup=5, threads=1,
                             slo_ms=1e-6)  # fmt: skip
    assert result.summary.samples == 680
    assert result.stop_reason is not None and result.stop_reason.startswith("P99 verdict missed")


def test_adaptive_first_look_has_enough_samples_for_a_bound() -> None:
    # 50 samples can never claim "met": the first look is at the 662 a P99 claim needs
    result = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", samples=50, rounds=5, warmup=5, threads=1,
                             slo_ms=1000.0)  # fmt: skip
    assert result.summary.samples >= MIN_SAMPLES_P99
    assert result.summary.p99_upper_ms < math.inf
    assert result.stop_reason == "P99 verdict met at SLO 1000 ms"


def test_adaptive_stops_at_max_rounds_or_budget() -> None:
    plan = RoundPlan(samples=100, rounds=10, warmup=5, slo_ms=1000.0, max_rounds=10)
    capped = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", plan=plan, threads=1)
    assert capped.summary.rounds == 10
    assert capped.stop_reason is not None and capped.stop_reason.startswith("10 rounds reached")
    spent = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", samples=662, warmup=5, threads=1,
                            slo_ms=1e3, budget_s=0.0)  # fmt: skip
    assert spent.stop_reason is not None
    assert spent.stop_reason.startswith(("time budget 0 s spent", "P99 verdict"))


def test_without_slo_sampling_is_fixed() -> None:
    result = measure_latency(_mlp(8), torch.randn(1, 8), device="cpu", samples=30, rounds=3, warmup=1, threads=1,
                             budget_s=0.0, max_rounds=40)  # fmt: skip
    assert result.summary.samples == 30 and result.stop_reason is None
    assert "adaptive" not in result.method


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"slo_ms": 0.0}, "SLO must be positive"), ({"slo_ms": 1.0, "budget_s": -1.0}, "budget"),
     ({"slo_ms": 1.0, "samples": 100, "rounds": 10, "max_rounds": 5}, "max_rounds"),
     ({"rounds": 0}, "at least 1 round"), ({"confidence": 1.0}, "Confidence")],
)  # fmt: skip
def test_bad_adaptive_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        measure_latency(_mlp(4), torch.randn(1, 4), device="cpu", threads=1, **kwargs)


def test_look_schedule() -> None:
    looks, per_look = _looks(RoundPlan(samples=680, rounds=20, slo_ms=1.0))
    assert looks == [20, 40, 80, 160, 200] and per_look == pytest.approx(1 - 0.01 / 5)
    # 5 rounds of 10: the first look waits for the samples a P99 claim needs
    looks, _ = _looks(RoundPlan(samples=50, rounds=5, slo_ms=1.0))
    assert looks[0] * 10 >= MIN_SAMPLES_P99
    assert _looks(RoundPlan(samples=100, rounds=10)) == ([10], 0.99)


def test_adaptive_stopping_keeps_its_error_rate() -> None:
    # true P99 exactly at the SLO: every "met" is false. Checking at every look at the corrected
    # confidence must keep false "met" within the 1 % one look at 99 % would allow.
    rng = np.random.default_rng(7)
    slo_ms = -math.log(0.01)  # P99 of an exponential with mean 1 ms
    plan = RoundPlan(samples=680, rounds=20, slo_ms=slo_ms, max_rounds=80)
    looks, confidence = _looks(plan)
    trials, false_met = 300, 0

    def timer(model: object, args: object, count: int, untimed: bool = False) -> np.ndarray:
        return np.empty(0) if untimed else rng.exponential(1e6, count)  # nanoseconds

    for _ in range(trials):
        state = _State(Timed(nn.Identity(), None), ())
        _run_looks([state], looks, plan, confidence, timer, None, rng, 0.0)
        false_met += (state.stop_reason or "").startswith("P99 verdict met")
    # seeded, so deterministic; without the correction (99 % at each of 3 looks) it is about 2 %
    assert false_met / trials <= 0.015


def test_ready_is_called_once_before_the_warm_up_at_the_timed_thread_count() -> None:
    calls: list[int] = []
    model = _mlp(4)
    measure_latency(
        model,
        torch.randn(1, 4),
        device="cpu",
        samples=4,
        rounds=1,
        warmup=1,
        threads=1,
        ready=lambda: calls.append(torch.get_num_threads()),  # ONNX Runtime opens its session here
    )
    assert calls == [1]
