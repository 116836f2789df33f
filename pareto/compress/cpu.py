"""What a CPU's own instructions do for each technique: the "on this CPU" of ``pareto techniques``.

Whether a cast or an int8 format pays on a CPU depends on the instructions it has, not on its model
name: bfloat16 matmuls run natively on AMX tiles (Sapphire Rapids and later) or with AVX-512 BF16
dot products (Cooper Lake, Zen 4) and are converted around every op elsewhere, often slower than
float32; int8 dot products run on AMX int8 tiles, AVX-512 VNNI or AVX-VNNI, and without VNNI through
16-bit multiply-adds that gain less. The libraries behind each technique have kernels for these:
oneDNN (PyTorch's bf16 and fp16 matmuls, PT2E int8 compiled by Inductor) for AMX, AVX-512 BF16/FP16
and VNNI; FBGEMM (PyTorch's dynamic int8) for AVX2 and AVX-512 VNNI; ONNX Runtime's MLAS for VNNI and
AMX int8. The features are read from the environment (``pareto.measure.environment``).
"""

from __future__ import annotations

#: The techniques whose speed on a CPU turns on its int8 instructions.
INT8 = ("int8_dynamic", "int8_static", "ort_int8_dynamic", "ort_int8_static")
#: The CPU's levers: what its instructions decide the speed of. Before a search on a CPU each one in the
#: space is timed beside float32 on a layer of the task's widths (``pareto.study.space_checks``).
LEVERS = ("bf16", "fp16", *INT8)


#: For each cast, the flags that make it native, best first, with what they mean; then what it is without.
_CASTS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "bf16": (
        (
            ("amx_bf16", "AMX bf16 tiles (oneDNN matmuls and convolutions); pays most on the compile backend"),
            ("avx512_bf16", "AVX-512 BF16 dot products (oneDNN); pays most on the compile backend"),
            ("bf16", "Arm BF16 matrix multiply (oneDNN/ACL)"),
        ),
        "not native (no AMX or AVX-512 BF16): converted around each op, often slower than float32",
    ),
    "fp16": (
        (
            ("amx_fp16", "AMX fp16 tiles (oneDNN)"),
            ("avx512_fp16", "AVX-512 FP16 arithmetic (oneDNN)"),
            ("asimdhp", "Arm half-precision SIMD"),
        ),
        "not native (F16C converts, it does not compute): usually slower than float32",
    ),
}


def kernel_library(name: str) -> str:
    """Whose kernels technique ``name`` runs on a CPU, as ``pareto.measure.environment.host_cpu`` names them:
    ONNX Runtime's MLAS, FBGEMM (PyTorch's dynamic int8) or oneDNN (casts, PT2E int8, Inductor)."""
    return "mlas" if name.startswith("ort_") else "fbgemm" if name == "int8_dynamic" else "onednn"


def on_this_cpu(name: str, features: str | None, capability: str | None = None) -> str | None:
    """What this CPU's instructions do for technique ``name`` (its ``KERNEL_FEATURES``, space-separated,
    and torch's dispatch level); None for a technique they do not decide."""
    have = set((features or "").split())
    if name in _CASTS:
        native, otherwise = _CASTS[name]
        return next((f"native: {words}" for flag, words in native if flag in have), otherwise)
    if name in INT8:
        return _int8(have)
    if name == "compile":
        level = capability or ("AVX-512" if "avx512f" in have else "AVX2" if "avx2" in have else "scalar")
        return f"Inductor's C++ kernels are vectorized for {level}; bf16 and int8 graphs lower to oneDNN"
    return None


def _int8(have: set[str]) -> str:
    found = [
        words
        for flag, words in (
            ("amx_int8", "AMX int8 tiles"),
            ("avx512_vnni", "AVX-512 VNNI"),
            ("avx_vnni", "AVX-VNNI"),
            ("asimddp", "Arm dot product"),
            ("i8mm", "Arm int8 matrix multiply"),
        )
        if flag in have
    ]
    if found:
        return f"int8 dot products: {', '.join(found)}"
    if "avx2" in have:
        return "no VNNI: int8 through AVX2 16-bit multiply-adds, smaller gains over float32"
    return "no int8 dot-product instructions listed: little to gain over float32"


def cpu_facts(name: str) -> str | None:
    """What this CPU's instructions, as the kernels technique ``name`` runs on may use them, do for it."""
    from pareto.measure.environment import host_cpu

    features, capability = host_cpu(kernel_library(name))
    return on_this_cpu(name, features, capability)
