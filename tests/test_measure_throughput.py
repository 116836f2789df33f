from __future__ import annotations

import pytest
import torch
from torch import nn

from pareto.errors import UsageError
from pareto.measure.throughput import SATURATION_FRACTION, default_batch_sweep, throughput_curve


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def _inputs(batch: int) -> torch.Tensor:
    return torch.randn(batch, 16)


def test_default_batch_sweep() -> None:
    assert default_batch_sweep(1) == [1]
    assert default_batch_sweep(8) == [1, 2, 4, 8]
    assert default_batch_sweep(100) == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(UsageError, match="at least 1"):
        default_batch_sweep(0)


def test_curve_points_fields_and_rules() -> None:
    curve = throughput_curve(_mlp(), _inputs, [4, 1, 2, 2], device="cpu", samples=662, warmup=5,
                             threads=1, slo_ms=1000.0)  # fmt: skip
    assert [p.batch for p in curve.points] == [1, 2, 4]  # sorted, deduplicated
    for point in curve.points:
        assert 0 < point.p50_ms <= point.p99_ms <= point.p99_upper_ms
        assert point.throughput_per_s == pytest.approx(point.batch / (point.mean_ms / 1e3))
        assert point.samples == 680 and point.verdict == "met"
    best = max(p.throughput_per_s for p in curve.points)
    expected = min(p.batch for p in curve.points if p.throughput_per_s >= SATURATION_FRACTION * best)
    assert curve.saturation_batch == expected
    assert curve.max_batch_within_slo == 4
    assert curve.stopped_reason is None
    assert "throughput = batch / mean latency" in curve.method and "perf_counter_ns" in curve.method
    data = curve.to_dict()
    assert data["points"][0]["batch"] == 1 and data["slo_ms"] == 1000.0


def test_no_batch_within_an_impossible_slo_and_none_without_slo() -> None:
    tight = throughput_curve(_mlp(), _inputs, [1, 2], device="cpu", samples=50, warmup=2, threads=1,
                             slo_ms=1e-6)  # fmt: skip
    assert tight.max_batch_within_slo is None
    assert all(p.verdict == "missed" for p in tight.points)
    free = throughput_curve(_mlp(), _inputs, [1], device="cpu", samples=20, warmup=1, threads=1)
    assert free.max_batch_within_slo is None and free.points[0].verdict is None
    assert free.saturation_batch == 1


def test_throughput_rises_with_batch_when_fixed_costs_dominate() -> None:
    # a small layer costs about the same per call at batch 1 and 64 (call overhead and reading the
    # weights, the C_w of L = C_w + B·c): T(B) = B / L(B) grows almost 64-fold; 4x leaves room for noise
    curve = throughput_curve(nn.Linear(16, 16), lambda b: torch.randn(b, 16), [1, 64], device="cpu",
                             samples=200, warmup=20, threads=1)  # fmt: skip
    assert curve.points[1].throughput_per_s > 4 * curve.points[0].throughput_per_s
    assert curve.saturation_batch == 64


def test_sweep_stops_at_out_of_memory() -> None:
    class Limited(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > 2:
                raise torch.OutOfMemoryError("simulated: no room for this batch")
            return x * 2

    curve = throughput_curve(Limited(), _inputs, [1, 2, 4, 8], device="cpu", samples=10, warmup=1, threads=1)
    assert [p.batch for p in curve.points] == [1, 2]
    assert curve.stopped_reason == "batch 4 ran out of device memory; larger batches not measured"


def test_bad_batches() -> None:
    with pytest.raises(UsageError, match="at least one batch"):
        throughput_curve(_mlp(), _inputs, [], device="cpu", samples=5, warmup=0, threads=1)
    with pytest.raises(UsageError, match="at least 1"):
        throughput_curve(_mlp(), _inputs, [0, 1], device="cpu", samples=5, warmup=0, threads=1)
