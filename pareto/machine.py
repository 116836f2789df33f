"""The machine a measurement was taken on, as records: which measurements compare (the environment key),
the CPU's kernel features in words, and a device's hardware ceilings.

Pure Python (no torch, no database): the store imports these without the measuring code
(``pareto.measure.environment`` takes a fingerprint, ``pareto.measure.roofline`` loads and uses profiles).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pareto.errors import UsageError

#: Fields that must match for two measurements to be comparable in one frontier. ``hostname`` holds the
#: host's identity (``host_id``): ``PARETO_HOST_ID`` where set, else the hostname.
KEY_FIELDS = ("device_name", "driver", "torch_version", "cpu_model", "threads", "hostname")
#: Part of the key only where set, so that environments recorded before them (or without the library)
#: keep their keys: installing or upgrading ONNX Runtime or torchao (whose kernels int8_dynamic prefers
#: and int8_static needs) makes a new environment, as a torch upgrade does. ``cuda_math`` (CUDA only)
#: holds the float32 math settings: TF32 on or off changes an fp32 model's time on a GPU 5-10x.
#: ``cpu_features``, ``cpu_id`` and ``cpu_capability`` say which CPU kernels can run: cloud VMs report
#: every Intel generation as "Intel(R) Xeon(R) Processor", and one with AMX runs bf16 and int8
#: matmuls on other kernels than one without.
OPTIONAL_KEY_FIELDS = (
    "onnxruntime_version",
    "torchao_version",
    "cuda_math",
    "cpu_features",
    "cpu_id",
    "cpu_capability",
    "cpu_isa_limits",
)


def environment_key(fp: dict[str, Any]) -> str:
    """Return a short stable hash of the fingerprint fields in ``KEY_FIELDS`` (and ``OPTIONAL_KEY_FIELDS`` set).

    Raises:
        KeyError: ``fp`` lacks one of the ``KEY_FIELDS``.
    """
    fields = {name: fp[name] for name in KEY_FIELDS}
    fields.update({name: fp[name] for name in OPTIONAL_KEY_FIELDS if fp.get(name) is not None})
    payload = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def describe_cpu_features(features: str | None) -> str:
    """The CPU's kernel features in words: "AVX2, AVX-512 (VNNI, bf16, fp16), AVX-VNNI, AMX (int8, bf16)"."""
    have = set((features or "").split())
    parts = []
    if "avx2" in have:
        parts.append("AVX2")
    groups = (
        ("AVX-512", "avx512f", (("avx512_vnni", "VNNI"), ("avx512_bf16", "bf16"), ("avx512_fp16", "fp16"))),
        ("AVX-VNNI", "avx_vnni", ()),
        ("AMX", "amx_tile", (("amx_int8", "int8"), ("amx_bf16", "bf16"), ("amx_fp16", "fp16"))),
        ("NEON", "asimd", (("asimddp", "dot product"), ("asimdhp", "fp16"), ("bf16", "bf16"), ("i8mm", "int8 matmul"))),
        ("SVE", "sve", (("sve2", "SVE2"),)),
    )
    for name, flag, extras in groups:
        if flag in have:
            inner = [word for extra, word in extras if extra in have]
            parts.append(f"{name} ({', '.join(inner)})" if inner else name)
    return ", ".join(parts) or "no vector extensions listed"


@dataclass(frozen=True)
class HardwareProfile:
    """Peak compute per dtype and memory bandwidth of one device, with where each number comes from.

    Args:
        name: Short name (``a100-40gb``, ``host-cpu``).
        description: The device in words.
        peak_flops: Dense peak FLOP/s per dtype ("fp32", "tf32", "fp16", "bf16", "int8" in op/s, ...),
            without 2:4 structured sparsity.
        memory_bandwidth_bytes_per_s: Peak (datasheet) or measured memory bandwidth.
        memory_bytes: Device memory capacity; None when unknown.
        sources: For each number (``peak_flops.fp16``, ``memory_bandwidth_bytes_per_s``,
            ``memory_bytes``), the public document it is taken from or how it was measured.
        method: How a calibrated profile was measured; None for datasheet profiles.
        measured_at: ISO-8601 UTC time of a calibration; None for datasheet profiles.
    """

    name: str
    description: str
    peak_flops: dict[str, float]
    memory_bandwidth_bytes_per_s: float
    memory_bytes: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    method: str | None = None
    measured_at: str | None = None
    #: the stored calibration this profile comes from (``pareto calibrate``); None for datasheets
    calibration_id: int | None = None

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``.

        Raises:
            UsageError: the profile has no figure for ``dtype``.
        """
        value = self.peak_flops.get(dtype)
        if value is None:
            known = ", ".join(sorted(self.peak_flops)) or "none"
            raise UsageError(f"Hardware profile {self.name!r} has no peak for {dtype!r}; it has: {known}.")
        return value

    def ridge_flop_per_byte(self, dtype: str) -> float:
        """The ridge point: arithmetic intensity where the memory and compute roofs meet (peak / bandwidth)."""
        return self.peak(dtype) / self.memory_bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        """Plain values, with ``ridge_flop_per_byte`` per dtype added."""
        return {
            "name": self.name,
            "description": self.description,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "memory_bytes": self.memory_bytes,
            "ridge_flop_per_byte": {dtype: self.ridge_flop_per_byte(dtype) for dtype in self.peak_flops},
            "sources": dict(self.sources),
            "method": self.method,
            "measured_at": self.measured_at,
        }
