"""The environment a measurement was taken in, and a key that says which measurements compare."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import re
import socket
from pathlib import Path
from typing import Any

from pareto.errors import UsageError

#: Names one machine across the processes that run on it when their hostnames differ (a Kubernetes
#: pod's is its own, new for every pod): pods on one node that set it alike share an environment.
HOST_ID_ENV = "PARETO_HOST_ID"
#: The longest host identity the database stores (``pareto_environments.hostname``).
HOST_ID_MAX = 256
#: Environment variables that hold the CPU kernels below what the CPU has: oneDNN's (bf16, fp16 and int8
#: matmuls, PT2E int8 compiled by Inductor), FBGEMM's (PyTorch's dynamic int8) and ATen's own dispatch.
#: Set, they are part of the environment, and ``cpu_features`` keeps only what oneDNN may use.
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
#: FBGEMM's ``FBGEMM_ENABLE_INSTRUCTIONS`` values and the x86 flags each lets it use.
_FBGEMM_LEVELS = {
    "AVX2": ("avx2", "fma", "f16c"),
    "AVX512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"),
    "AVX512_256": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"),
    "AVX512_E1": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
    "AVX512_E1_256": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
}
#: oneDNN's ``ONEDNN_MAX_CPU_ISA`` levels, lowest first, with the x86 flags each one adds.
_ONEDNN_LEVELS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("SSE41", "AVX"), ()),
    (("AVX2",), ("avx2", "fma", "f16c")),
    (("AVX2_VNNI", "AVX2_VNNI_2"), ("avx_vnni",)),
    (("AVX512_CORE",), ("avx512f", "avx512bw", "avx512vl")),
    (("AVX512_CORE_VNNI",), ("avx512_vnni",)),
    (("AVX512_CORE_BF16",), ("avx512_bf16",)),
    (("AVX512_CORE_FP16", "AVX10_1_512"), ("avx512_fp16",)),
    (("AVX512_CORE_AMX", "AVX10_1_512_AMX"), ("amx_tile", "amx_int8", "amx_bf16")),
    (("AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16"), ("amx_fp16",)),
)
#: The CPU flags that decide which kernels oneDNN, FBGEMM, MLAS and Inductor choose, as Linux names them
#: in /proc/cpuinfo: x86 vector widths and their int8 (VNNI), bf16 and fp16 instructions and AMX
#: tiles; Arm's SIMD dot products, SVE, bf16 and int8 matrix multiply.
KERNEL_FEATURES = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
    "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm",
)  # fmt: skip


def fingerprint(device: str, threads: int) -> dict[str, Any]:
    """Describe the hardware and software a measurement on ``device`` runs on.

    Args:
        device: A resolved device, "cpu" or "cuda:N".
        threads: The torch thread count used while timing.

    Returns:
        device, device_name, driver (None on CPU), torch_version, python_version, platform,
        cpu_model, cpu_count, threads, hostname (``host_id()``: ``PARETO_HOST_ID`` where set, else the
        hostname), onnxruntime_version and torchao_version (None when
        that library is not installed; then it is not part of the key), on CUDA ``cuda_math``
        (``cuda_math_settings``; None on the CPU), and the CPU's ``cpu_features`` (``KERNEL_FEATURES``
        it has), ``cpu_id`` (family, model and stepping; Arm's implementer and part) and
        ``cpu_capability`` (the vector code torch's own kernels dispatch to), None where unreadable.
    """
    import torch  # lazily: query commands import this package without torch

    cpu_model = _cpu_model()
    cpuinfo = _cpuinfo()
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
        "hostname": host_id(),
        "onnxruntime_version": onnxruntime_version(),
        "torchao_version": distribution_version("torchao"),
        "cuda_math": cuda_math_settings() if on_cuda else None,
        "cpu_features": cpu_features(cpuinfo),
        "cpu_id": cpu_id(cpuinfo),
        "cpu_capability": _cpu_capability(),
        "cpu_isa_limits": isa_limits(),
    }


def host_id() -> str:
    """The host's identity in the environment key: ``PARETO_HOST_ID`` where set (to one name for every
    pod of a node, say), else the hostname, as before it existed. The hardware facts stay in the key
    beside it, so two different machines never share an environment under one identity.

    Raises:
        UsageError: ``PARETO_HOST_ID`` is longer than the database stores.
    """
    configured = (os.environ.get(HOST_ID_ENV) or "").strip()
    if len(configured) > HOST_ID_MAX:
        raise UsageError(f"{HOST_ID_ENV} is {len(configured)} characters long; at most {HOST_ID_MAX} are stored.")
    return configured or socket.gethostname()


def host_cpu(library: str = "onednn") -> tuple[str | None, str | None]:
    """This CPU's ``KERNEL_FEATURES`` (space-separated) that ``library``'s kernels may use, and torch's
    dispatch level. "onednn" (what ``fingerprint`` records): under ``ONEDNN_MAX_CPU_ISA``; "fbgemm"
    (PyTorch's dynamic int8): under ``FBGEMM_ENABLE_INSTRUCTIONS``; "mlas" (ONNX Runtime): everything,
    since it has no such setting."""
    cpuinfo = _cpuinfo()
    if library == "onednn":
        return cpu_features(cpuinfo), _cpu_capability()
    flags = set((cpuinfo.get("flags") or cpuinfo.get("Features") or "").split())
    allowed = (
        _FBGEMM_LEVELS.get((os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS") or "").upper())
        if library == "fbgemm"
        else None
    )
    present = [name for name in KERNEL_FEATURES if name in flags and (allowed is None or name in allowed)]
    return " ".join(present) or None, _cpu_capability()


def isa_limits() -> str | None:
    """The ``ISA_LIMITS`` set in this process ("ONEDNN_MAX_CPU_ISA=AVX2, ..."), None when none is."""
    said = [f"{name}={os.environ[name]}" for name in ISA_LIMITS if os.environ.get(name)]
    return ", ".join(said) or None


def separate_compiled_code() -> str | None:
    """Give Inductor a cache folder of its own for this process's ``ISA_LIMITS`` (unless the user set
    ``TORCHINDUCTOR_CACHE_DIR``); the folder, or None when nothing was changed.

    Inductor's on-disk cache does not key its entries by these limits: a PT2E graph compiled with
    freezing under ``ONEDNN_MAX_CPU_ISA=AVX2`` and loaded from the shared cache by a process that may
    use AMX aborted it ("double free or corruption", torch 2.13 on a Xeon with AMX). Measurements under
    other limits are another environment; their compiled code is kept apart the same way.
    """
    limits = isa_limits()
    if limits is None or os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    import tempfile

    user = os.getuid() if hasattr(os, "getuid") else 0
    suffix = hashlib.sha256(limits.encode()).hexdigest()[:12]
    folder = str(Path(tempfile.gettempdir()) / f"torchinductor_{user}_{suffix}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def _onednn_allows(flag: str) -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` (unset or unknown: everything) lets oneDNN use x86 ``flag``."""
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    levels = [names for names, _ in _ONEDNN_LEVELS]
    reached = next((k for k, names in enumerate(levels) if limit in names), None)
    if reached is None:
        return True
    if flag == "avx_vnni":  # a branch of its own: AVX2_VNNI, or oneDNN's levels that have VNNI anyway
        return limit.startswith("AVX2_VNNI") or reached >= levels.index(("AVX512_CORE_VNNI",))
    for k, (_, flags) in enumerate(_ONEDNN_LEVELS):
        if flag in flags:
            return k <= reached
    return True  # not an x86 level flag (Arm's)


def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (empty where there is none)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's fields of a /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() and fields:
            break
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_features(cpuinfo: dict[str, str]) -> str | None:
    """The ``KERNEL_FEATURES`` the CPU has and oneDNN may use (``ONEDNN_MAX_CPU_ISA``), space-separated in
    that order; None when none are listed."""
    flags = set((cpuinfo.get("flags") or cpuinfo.get("Features") or "").split())
    present = [name for name in KERNEL_FEATURES if name in flags and _onednn_allows(name)]
    return " ".join(present) or None


def cpu_id(cpuinfo: dict[str, str]) -> str | None:
    """ "family 6 model 143 stepping 8" (x86) or "implementer 0x41 part 0xd40" (Arm); None when unknown."""
    if "cpu family" in cpuinfo:
        return (
            f"family {cpuinfo['cpu family']} model {cpuinfo.get('model', '?')} stepping {cpuinfo.get('stepping', '?')}"
        )
    if "CPU implementer" in cpuinfo:
        return f"implementer {cpuinfo['CPU implementer']} part {cpuinfo.get('CPU part', '?')}"
    return None


def _cpu_capability() -> str | None:
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # torch builds before 2.1 have no such query
        return None


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


def onnxruntime_version() -> str | None:
    """The installed ONNX Runtime's version, or None (recorded with every environment)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime")
    except PackageNotFoundError:  # an onnxruntime-gpu or nightly build under another distribution name
        import onnxruntime

        return str(onnxruntime.__version__)


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
