"""What a CPU's own instructions do for each technique: the "on this CPU" of ``pareto techniques``.

Whether a cast or an int8 format pays on a CPU depends on the instructions it has, not on its model
name: bfloat16 matmuls run natively on AMX tiles (Sapphire Rapids and later) or with AVX-512 BF16
dot products (Cooper Lake, Zen 4) and are converted around every op elsewhere, often slower than
float32; int8 dot products run on AMX int8 tiles, AVX-512 VNNI or AVX-VNNI, and without VNNI through
16-bit multiply-adds that gain less. The libraries behind each technique have kernels for these:
oneDNN (PyTorch's bf16 and fp16 matmuls, PT2E int8 compiled by Inductor) for AMX, AVX-512 BF16/FP16
and VNNI; FBGEMM (PyTorch's dynamic int8) for AVX2 and AVX-512 VNNI; ONNX Runtime's MLAS for VNNI and
AMX int8. The features are read from the environment (``pareto.measure.environment``).

Each technique declares its own rule (``Technique.cpu_native``: a ``Cast`` with its flags, the shared
``INT8_DOT_PRODUCTS`` or ``INDUCTOR_VECTORS``) and whose kernels it runs (``Technique.cpu_kernels``);
this module holds the rules; ``pareto.compress.availability`` answers by technique name.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class CpuRule:
    """What a CPU's instructions do for a technique: a technique's ``cpu_native``."""

    #: The instructions decide whether it pays: one of the CPU's levers (``pareto.compress.availability.levers``).
    lever: ClassVar[bool] = False

    def judge(self, have: Set[str], capability: str | None) -> str:
        """The sentence for a CPU with the ``KERNEL_FEATURES`` ``have`` and torch's dispatch level ``capability``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Cast(CpuRule):
    """A cast: native where one of the flags is present (best first, each with what it means), else ``otherwise``."""

    native: tuple[tuple[str, str], ...]
    otherwise: str
    lever: ClassVar[bool] = True

    def judge(self, have: Set[str], capability: str | None) -> str:
        return next((f"native: {words}" for flag, words in self.native if flag in have), self.otherwise)


#: The instructions that compute int8 dot products, with what they are called.
INT8_FLAGS = (
    ("amx_int8", "AMX int8 tiles"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("asimddp", "Arm dot product"),
    ("i8mm", "Arm int8 matrix multiply"),
)


@dataclass(frozen=True)
class Int8DotProducts(CpuRule):
    """An int8 format: its speed turns on the CPU's int8 dot-product instructions (``INT8_FLAGS``)."""

    lever: ClassVar[bool] = True

    def judge(self, have: Set[str], capability: str | None) -> str:
        found = [words for flag, words in INT8_FLAGS if flag in have]
        if found:
            return f"int8 dot products: {', '.join(found)}"
        if "avx2" in have:
            return "no VNNI: int8 through AVX2 16-bit multiply-adds, smaller gains over float32"
        return "no int8 dot-product instructions listed: little to gain over float32"


@dataclass(frozen=True)
class InductorVectors(CpuRule):
    """Inductor's generated C++ kernels: vectorized for the dispatch level (not a lever)."""

    def judge(self, have: Set[str], capability: str | None) -> str:
        level = capability or ("AVX-512" if "avx512f" in have else "AVX2" if "avx2" in have else "scalar")
        return f"Inductor's C++ kernels are vectorized for {level}; bf16 and int8 graphs lower to oneDNN"


INT8_DOT_PRODUCTS = Int8DotProducts()
INDUCTOR_VECTORS = InductorVectors()
