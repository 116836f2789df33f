from __future__ import annotations

import math
import time

import pytest
import torch

from pareto.errors import UsageError
from pareto.measure.calibrate import calibrate


def test_cpu_calibration_is_positive_finite_and_within_budget() -> None:
    budget = 1.5
    started = time.perf_counter()
    profile = calibrate("cpu", seconds_budget=budget, threads=1)
    elapsed = time.perf_counter() - started
    assert elapsed < 5 * budget
    assert profile.name == "host-cpu"
    assert "fp32" in profile.peak_flops
    for dtype, flops in profile.peak_flops.items():
        assert math.isfinite(flops) and flops > 0
        assert profile.sources[f"peak_flops.{dtype}"].startswith("measured:")
        assert profile.ridge_flop_per_byte(dtype) > 0
    assert math.isfinite(profile.memory_bandwidth_bytes_per_s) and profile.memory_bandwidth_bytes_per_s > 0
    assert "read + write" in profile.sources["memory_bandwidth_bytes_per_s"]
    assert profile.memory_bytes is None or profile.memory_bytes > 0
    assert profile.method and "best of per-call timings" in profile.method and "1 threads" in profile.method
    assert profile.measured_at and profile.measured_at.endswith("+00:00")
    # sanity, not a benchmark: any CPU of the last decade does > 0.1 GFLOP/s and copies > 0.1 GB/s
    assert profile.peak_flops["fp32"] > 1e8 and profile.memory_bandwidth_bytes_per_s > 1e8


def test_calibration_restores_threads_and_matmul_precision() -> None:
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    calibrate("cpu", seconds_budget=0.3, threads=1)
    assert torch.get_num_threads() == threads
    assert torch.get_float32_matmul_precision() == precision


def test_bad_calibration_arguments() -> None:
    with pytest.raises(UsageError, match="budget must be positive"):
        calibrate("cpu", seconds_budget=0)
    with pytest.raises(UsageError, match="Thread count"):
        calibrate("cpu", threads=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU calibration is untested")
def test_cuda_calibration() -> None:
    profile = calibrate("cuda", seconds_budget=5)
    assert profile.name == "host-cuda-0"
    assert profile.peak_flops["fp32"] > 1e11 and profile.memory_bandwidth_bytes_per_s > 1e10
    assert "cuda event pair per call" in (profile.method or "")
