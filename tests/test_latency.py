from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

# CPU tests pin one thread: on small VMs intra-op thread wake-ups can cost milliseconds per call

from pareto.errors import UsageError
from pareto.measure.latency import measure_latency, resolve_device


def _mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


class _Pair(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def test_summary_has_requested_samples_and_ordered_percentiles() -> None:
    result = measure_latency(_mlp(32), torch.randn(4, 32), device="cpu", samples=200, warmup=5, threads=1)
    s = result.summary
    assert s.samples == 200
    assert 0 < s.p50_ms <= s.p90_ms <= s.p99_ms <= s.p999_ms
    for name in ("p50", "p90", "p99", "p999"):
        value = getattr(s, f"{name}_ms")
        assert getattr(s, f"{name}_lower_ms") <= value <= getattr(s, f"{name}_upper_ms")
    assert result.device == "cpu" and result.warmup == 5
    assert "perf_counter_ns per call" in result.method and "200 samples" in result.method
    assert result.elapsed_s > 0


def test_tuple_inputs_are_unpacked() -> None:
    inputs = (torch.randn(8, 8), torch.randn(8, 8))
    result = measure_latency(_Pair(), inputs, device="cpu", samples=20, threads=1)
    assert result.summary.samples == 20


def test_restores_threads_and_gc_state() -> None:
    threads_before = torch.get_num_threads()
    gc_enabled_before, freeze_before = gc.isenabled(), gc.get_freeze_count()
    result = measure_latency(_mlp(16), torch.randn(1, 16), device="cpu", samples=10, warmup=1, threads=1)
    assert result.threads == 1 and "1 threads" in result.method
    assert torch.get_num_threads() == threads_before
    assert gc.isenabled() == gc_enabled_before
    assert gc.get_freeze_count() == freeze_before


def test_restores_state_when_the_model_fails() -> None:
    class Broken(nn.Module):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Broken.calls += 1
            if Broken.calls > 2:  # fail inside the timed loop, after warm-up
                raise RuntimeError("boom")
            return x

    threads_before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"):
        measure_latency(Broken(), torch.randn(2), device="cpu", samples=5, warmup=2, threads=1)
    assert torch.get_num_threads() == threads_before
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


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
    result = measure_latency(_mlp(256), torch.randn(8, 256), device="cuda", samples=200, warmup=10)
    assert result.device == "cuda:0"
    assert "cuda event pair per call" in result.method
    assert result.summary.samples == 200
    assert 0 < result.summary.p50_ms <= result.summary.p99_ms
