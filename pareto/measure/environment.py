"""The environment a measurement was taken in, and a key that says which measurements compare."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
from pathlib import Path
from typing import Any

#: Fields that must match for two measurements to be comparable in one frontier.
KEY_FIELDS = ("device_name", "driver", "torch_version", "cpu_model", "threads", "hostname")
#: Part of the key only where set, so that environments recorded before them (or without the library)
#: keep their keys: installing or upgrading ONNX Runtime or torchao (whose kernels int8_dynamic prefers
#: and int8_static needs) makes a new environment, as a torch upgrade does. ``cuda_math`` (CUDA only)
#: holds the float32 math settings: TF32 on or off changes an fp32 model's time on a GPU 5-10x.
OPTIONAL_KEY_FIELDS = ("onnxruntime_version", "torchao_version", "cuda_math")


def fingerprint(device: str, threads: int) -> dict[str, Any]:
    """Describe the hardware and software a measurement on ``device`` runs on.

    Args:
        device: A resolved device, "cpu" or "cuda:N".
        threads: The torch thread count used while timing.

    Returns:
        device, device_name, driver (None on CPU), torch_version, python_version, platform,
        cpu_model, cpu_count, threads, hostname, onnxruntime_version and torchao_version (None when
        that library is not installed; then it is not part of the key), and on CUDA ``cuda_math``
        (``cuda_math_settings``; None on the CPU).
    """
    import torch  # lazily: query commands import this package without torch

    from pareto.compress.onnxrt import onnxruntime_version

    cpu_model = _cpu_model()
    on_cuda = device.startswith("cuda")
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if on_cuda else cpu_model,
        "driver": cuda_driver() if on_cuda else None,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "hostname": socket.gethostname(),
        "onnxruntime_version": onnxruntime_version(),
        "torchao_version": distribution_version("torchao"),
        "cuda_math": cuda_math_settings() if on_cuda else None,
    }


def cuda_math_settings() -> str:
    """How float32 math runs on CUDA in this process: TF32 for matmuls (``float32_matmul_precision``:
    "highest" is full fp32, torch's default) and for cuDNN convolutions, and cuDNN's autotuner.

    pareto leaves these as the process has them (the user's serving code decides them): they are
    recorded, and part of the environment key, so that measurements under other settings never mix.
    """
    import torch

    return (
        f"float32_matmul_precision={torch.get_float32_matmul_precision()}, "
        f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, cudnn.benchmark={torch.backends.cudnn.benchmark}"
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


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (read from its metadata, not imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux: fall back to what platform knows
        pass
    return platform.processor() or platform.machine()


def cuda_driver() -> str:
    """The CUDA (or HIP) runtime torch was built with, and the NVIDIA kernel driver when readable."""
    import torch

    runtime = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"HIP {torch.version.hip}"
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:  # no NVIDIA kernel module info (ROCm, containers without /proc/driver)
        return runtime
    match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return f"{runtime}, driver {match.group(1)}" if match else runtime
