from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pareto.errors import UsageError
from pareto.measure.roofline import (
    HardwareProfile,
    achieved_fraction,
    list_profiles,
    load_profile,
    regime,
    roofline_bound_ms,
)

REQUIRED = {"v100", "a100-40gb", "a100-80gb", "h100-sxm", "h200"}


def _toy() -> HardwareProfile:
    return HardwareProfile(name="toy", description="toy", peak_flops={"fp32": 1e12}, memory_bandwidth_bytes_per_s=1e10)


@pytest.mark.parametrize(
    ("name", "dtype", "ridge"),
    [("v100", "fp16", 139), ("a100-40gb", "fp16", 201), ("a100-40gb", "bf16", 201), ("h100-sxm", "bf16", 295)],
)
def test_ridge_points(name: str, dtype: str, ridge: float) -> None:
    assert load_profile(name).ridge_flop_per_byte(dtype) == pytest.approx(ridge, abs=2)


def test_ridge_rises_with_each_generation() -> None:
    ridges = [load_profile(name).ridge_flop_per_byte("fp16") for name in ("v100", "a100-40gb", "h100-sxm")]
    assert ridges == sorted(ridges)


def test_shipped_profiles_are_complete_and_sourced() -> None:
    assert set(list_profiles()) >= REQUIRED
    for name in list_profiles():
        profile = load_profile(name)
        assert profile.name == name and profile.description
        assert {"fp32", "fp16"} <= set(profile.peak_flops)
        assert profile.memory_bandwidth_bytes_per_s > 0 and profile.memory_bytes and profile.memory_bytes > 0
        numbers = {f"peak_flops.{dtype}" for dtype in profile.peak_flops}
        numbers |= {"memory_bandwidth_bytes_per_s", "memory_bytes"}
        assert numbers <= set(profile.sources), f"{name} lacks a source for {numbers - set(profile.sources)}"
        assert all("NVIDIA" in profile.sources[key] for key in numbers)
        assert profile.method is None and profile.measured_at is None  # datasheet, not measured
    for name in REQUIRED - {"v100"}:  # V100 has no BF16/TF32 tensor cores
        assert {"fp32", "tf32", "fp16", "bf16", "int8"} <= set(load_profile(name).peak_flops)


def test_load_profile_is_case_insensitive_and_to_dict_has_ridges() -> None:
    profile = load_profile("A100-40GB")
    data = profile.to_dict()
    assert data["ridge_flop_per_byte"]["fp16"] == pytest.approx(312e12 / 1555e9)
    assert data["peak_flops"]["int8"] == 624e12


def test_unknown_profile_lists_known_names() -> None:
    with pytest.raises(UsageError, match="Unknown hardware profile 'tpu-v9'") as info:
        load_profile("tpu-v9")
    for name in REQUIRED:
        assert name in str(info.value)
    with pytest.raises(UsageError, match="Unknown hardware profile"):
        load_profile("../demo")


def test_profile_from_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\npeak_flops: {fp32: 2.0e+12}\nmemory_bandwidth_bytes_per_s: 1.0e+11\n"
                    "sources: {peak_flops.fp32: measured}\n")  # fmt: skip
    assert load_profile(str(path)).ridge_flop_per_byte("fp32") == 20.0
    path.write_text("name: bad\npeak_flops: {fp32: -1}\nmemory_bandwidth_bytes_per_s: 1\nsources: {}\n")
    with pytest.raises(UsageError, match="bad value"):
        load_profile(str(path))
    path.write_text("name: bad\n")
    with pytest.raises(UsageError, match="lacks peak_flops"):
        load_profile(str(path))


def test_unknown_dtype_names_the_known_ones() -> None:
    with pytest.raises(UsageError, match="has no peak for 'bf16'; it has: fp16, fp32"):
        load_profile("v100").ridge_flop_per_byte("bf16")


def test_roofline_bound_picks_the_larger_term() -> None:
    toy = _toy()  # ridge 100 FLOP/byte
    # compute term 1e9 / 1e12 = 1 ms; memory term 1e6 / 1e10 = 0.1 ms
    assert roofline_bound_ms(1e9, 1e6, toy, "fp32") == pytest.approx(1.0)
    # compute 1e6 / 1e12 = 1 us; memory 1e8 / 1e10 = 10 ms
    assert roofline_bound_ms(1e6, 1e8, toy, "fp32") == pytest.approx(10.0)


def test_regime_switches_at_the_ridge() -> None:
    toy = _toy()
    assert regime(99.9, toy, "fp32") == "memory-bound"
    assert regime(100.0, toy, "fp32") == "compute-bound"
    assert regime(1e4, toy, "fp32") == "compute-bound"
    a100 = load_profile("a100-40gb")
    assert regime(128, a100, "fp16") == "memory-bound"  # standard attention, AI ~ head dimension
    assert regime(128, load_profile("v100"), "fp32") == "compute-bound"  # FP32 CUDA-core ridge is ~17


def test_achieved_fraction() -> None:
    assert achieved_fraction(0.5, 2.0) == 0.25
    with pytest.raises(ValueError):
        achieved_fraction(0.5, 0.0)


def test_roofline_does_not_import_torch() -> None:
    code = "import sys, pareto.measure.roofline as r; r.load_profile('h200'); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
