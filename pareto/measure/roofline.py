"""Hardware ceilings and the roofline: attainable FLOP/s <= min(peak, bandwidth × arithmetic intensity).

Profiles of public accelerators live in ``configs/hardware/*.yaml`` (package ``pareto._hardware``),
each number with its public source; a host's own profile comes from ``pareto.measure.calibrate``.
No torch here: ``pareto hardware`` lists profiles without importing it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pareto.errors import UsageError
from pareto.machine import HardwareProfile

Regime = Literal["memory-bound", "compute-bound"]

_PACKAGE = "pareto._hardware"


def list_profiles() -> list[str]:
    """Names of the shipped hardware profiles, sorted."""
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in resources.files(_PACKAGE).iterdir()
        if entry.name.endswith(".yaml")
    )


def load_profile(name: str) -> HardwareProfile:
    """Load a shipped profile by name (case-insensitive), or a profile YAML file by its path.

    Raises:
        UsageError: an unknown name (the message lists the known ones) or a malformed file.
    """
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return _parse(path.read_text(encoding="utf-8"), str(path))
    key = name.strip().lower()
    entry = resources.files(_PACKAGE) / f"{key}.yaml"
    if not key or "/" in key or not entry.is_file():
        known = ", ".join(list_profiles())
        raise UsageError(f"Unknown hardware profile {name!r}; known profiles: {known}.")
    return _parse(entry.read_text(encoding="utf-8"), f"{key}.yaml")


#: GPU names (as ``torch.cuda.get_device_name`` reports them) to datasheet profiles, most specific
#: first: "NVIDIA H100 PCIe" and "NVIDIA H100 NVL" have their own ceilings; any other H100 ("NVIDIA
#: H100 80GB HBM3", the SXM part) takes the SXM profile.
_GPU_PROFILES = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100 NVL", "h100-nvl"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100 80GB", "a100-80gb"),
    ("A100", "a100-40gb"),
    ("V100", "v100"),
)


def gpu_profile_name(device_name: str) -> str | None:
    """The shipped datasheet profile for a GPU of this name (``torch.cuda.get_device_name``), or None.
    Case, spaces, hyphens and underscores do not matter ("H100-PCIE" is "H100 PCIe")."""
    name = _words(device_name)
    return next((profile for marker, profile in _GPU_PROFILES if _words(marker) in name), None)


def _words(text: str) -> str:
    return " ".join(re.split(r"[\s_-]+", text.lower())).strip()


def resolve_profile(
    name: str | None, *, fingerprint: dict[str, Any], calibration: HardwareProfile | None
) -> tuple[HardwareProfile | None, str | None]:
    """The roofline profile a measurement uses, and a note when there is none.

    ``auto``: a CUDA device's datasheet profile by its name, else this host's latest calibration.
    ``host``: the latest calibration of this environment. Any other name: a shipped profile or a file.

    Args:
        name: The profile asked for; None means no roofline.
        fingerprint: The environment measured in (``device``, ``device_name``).
        calibration: This host's latest calibration as a profile, None when it has none.

    Raises:
        UsageError: an unknown profile name, or ``host`` without a calibration.
    """
    if name is None:
        return None, None
    if name == "host":
        if calibration is None:
            raise UsageError(
                "No calibration of this machine is stored; run 'pareto calibrate' first, "
                "or name a profile with --hardware (see 'pareto hardware')."
            )
        return calibration, None
    if name != "auto":
        return load_profile(name), None
    shipped = gpu_profile_name(fingerprint["device_name"]) if fingerprint["device"].startswith("cuda") else None
    if shipped is not None:
        return load_profile(shipped), None
    if calibration is not None:
        return calibration, None
    return None, "No roofline: run 'pareto calibrate' once to measure this machine's ceilings, or pass --hardware."


def roofline_bound_ms(flops: float, bytes_: float, profile: HardwareProfile, dtype: str) -> float:
    """The roofline lower bound on latency: max(FLOPs / peak, bytes / bandwidth), in milliseconds."""
    compute_s = flops / profile.peak(dtype)
    memory_s = bytes_ / profile.memory_bandwidth_bytes_per_s
    return max(compute_s, memory_s) * 1e3


def regime(intensity: float, profile: HardwareProfile, dtype: str) -> Regime:
    """ "memory-bound" below the ridge point, "compute-bound" at or above it."""
    return "compute-bound" if intensity >= profile.ridge_flop_per_byte(dtype) else "memory-bound"


def achieved_fraction(bound_ms: float, measured_p50_ms: float) -> float:
    """How close a measurement comes to its roofline bound: bound / measured p50 (1.0 is the roof).

    Above 1 the model ran faster than the ceilings allow: the profile is wrong, not the model
    (``ceiling_suspect``).

    Raises:
        ValueError: a non-positive measurement or a negative bound.
    """
    if not measured_p50_ms > 0:
        raise ValueError(f"A measured latency must be positive, got {measured_p50_ms} ms.")
    if bound_ms < 0:
        raise ValueError(f"A roofline bound cannot be negative, got {bound_ms} ms.")
    return bound_ms / measured_p50_ms


def ceiling_suspect(fraction: float, profile: HardwareProfile) -> str | None:
    """Why a roofline bound cannot be right, or None: a measurement ran faster than the bound."""
    if fraction <= 1.0:
        return None
    return (
        f"a measured p50 was {fraction:.2f}x faster than the roofline bound of profile {profile.name!r}, "
        "so its ceilings are too low; run 'pareto calibrate' again"
        if profile.calibration_id is not None
        else f"a measured p50 was {fraction:.2f}x faster than the roofline bound of profile {profile.name!r}: "
        "its ceilings do not fit this device"
    )


#: What can make a layer faster, by its regime: below the ridge only fewer bytes help.
PAYS_OFF: dict[Regime, str] = {
    "memory-bound": "fewer bytes: quantization, smaller layers",
    "compute-bound": "fewer FLOPs: structured pruning, low-rank, distillation",
}


def layer_types(layers: Iterable[Any], profile: HardwareProfile, dtype: str) -> list[dict[str, Any]]:
    """Per-layer costs (``pareto.measure.compute.LayerCost``) grouped by layer type, most FLOPs first,
    each placed on the roofline with its regime and what can pay off there."""
    by_type: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if layer.flops == 0 and layer.weight_bytes == 0:
            continue  # containers and free elementwise ops: nothing to place on the roofline
        row = by_type.setdefault(layer.type, {"layers": 0, "flops": 0, "bytes_moved": 0})
        row["layers"] += 1
        row["flops"] += layer.flops
        row["bytes_moved"] += layer.bytes_moved
    rows = []
    for layer_type, row in sorted(by_type.items(), key=lambda kv: -kv[1]["flops"]):
        intensity = row["flops"] / row["bytes_moved"] if row["bytes_moved"] else math.inf
        kind = regime(intensity, profile, dtype)
        rows.append(
            {"type": layer_type, **row, "arithmetic_intensity": intensity, "regime": kind, "pays_off": PAYS_OFF[kind]}
        )
    return rows


def _parse(text: str, origin: str) -> HardwareProfile:
    import yaml  # lazily: only loading a profile needs it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"Hardware profile {origin} is not valid YAML: {exc}.") from exc
    if not isinstance(data, dict):
        raise UsageError(f"Hardware profile {origin} must be a mapping of fields.")
    missing = [key for key in ("name", "peak_flops", "memory_bandwidth_bytes_per_s", "sources") if key not in data]
    if missing:
        raise UsageError(f"Hardware profile {origin} lacks {', '.join(missing)}.")
    try:
        peaks = {str(dtype): _positive(value) for dtype, value in dict(data["peak_flops"]).items()}
        bandwidth = _positive(data["memory_bandwidth_bytes_per_s"])
        memory = data.get("memory_bytes")
        memory_bytes = int(_positive(memory)) if memory is not None else None
        sources = {str(key): str(value) for key, value in dict(data["sources"]).items()}
    except (TypeError, ValueError) as exc:
        raise UsageError(f"Hardware profile {origin} has a bad value: {exc}.") from exc
    if not peaks:
        raise UsageError(f"Hardware profile {origin} lists no peak FLOP/s.")
    return HardwareProfile(
        name=str(data["name"]),
        description=str(data.get("description", data["name"])),
        peak_flops=peaks,
        memory_bandwidth_bytes_per_s=bandwidth,
        memory_bytes=memory_bytes,
        sources=sources,
    )


def _positive(value: Any) -> float:
    number = float(value)  # YAML 1.1 reads "1.5e12" (no exponent sign) as a string; float() accepts it
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{value!r} is not a positive finite number")
    return number
