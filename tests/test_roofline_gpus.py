"""Which datasheet profile a GPU's name gets: the H100's three parts each have their own ceilings."""

from __future__ import annotations

import json

import pytest

import cli
from pareto.measure.roofline import gpu_profile_name, load_profile, resolve_profile

TINY = "tests.tiny_task:make_task"


@pytest.mark.parametrize(
    ("device_name", "profile"),
    [
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H100-PCIE-80GB", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_each_gpu_name_gets_its_own_profile(device_name: str, profile: str | None) -> None:
    assert gpu_profile_name(device_name) == profile
    fingerprint = {"device": "cuda:0", "device_name": device_name}
    resolved, note = resolve_profile("auto", fingerprint=fingerprint, calibration=None)
    assert (resolved.name if resolved is not None else None) == profile
    assert (note is None) == (profile is not None)


def test_an_h100_pcie_is_not_given_the_sxm_ceilings() -> None:
    pcie, sxm, nvl = (load_profile(name) for name in ("h100-pcie", "h100-sxm", "h100-nvl"))
    # dense peaks (the datasheet's tensor figures are with 2:4 sparsity, twice these), as every profile
    assert pcie.peak_flops == pytest.approx(
        {"fp32": 51e12, "tf32": 378e12, "fp16": 756.5e12, "bf16": 756.5e12, "fp8": 1513e12, "int8": 1513e12}
    )
    assert pcie.memory_bandwidth_bytes_per_s == 2.0e12 and sxm.memory_bandwidth_bytes_per_s == 3.35e12
    assert nvl.peak("bf16") == 835.5e12 and nvl.memory_bandwidth_bytes_per_s == 3.9e12
    assert pcie.peak("bf16") < nvl.peak("bf16") < sxm.peak("bf16")
    assert pcie.ridge_flop_per_byte("bf16") == pytest.approx(378, abs=1)  # SXM's is 295: PCIe's HBM2e is slower


def test_the_new_profiles_are_hardware_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hardware", "--json"]) == 0
    names = {p["name"] for p in json.loads(capsys.readouterr().out)}
    assert {"h100-pcie", "h100-nvl", "h100-sxm"} <= names
    code = cli.main(["roofline", "--task", TINY, "--hardware", "H100-PCIe", "--device", "cpu", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["hardware"]["name"] == "h100-pcie"
