"""A technique declares its own facts: what it becomes in an exported artifact (``artifact_note``),
whether and how a CUDA search offers it by default (``cuda_default``, ``cuda_default_order``), and what
a CPU's instructions do for it (``cpu_native``, ``cpu_kernels``). Adding one is its module and its test:
the toy techniques here get every fact from their own class, and nothing else names them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from torch import nn

import pareto.measure.environment as environment
from pareto.compress import base, describe_techniques
from pareto.compress.availability import cpu_facts, kernel_library, on_this_cpu
from pareto.compress.base import Family, Technique, register, registry
from pareto.compress.cpu import INT8_DOT_PRODUCTS, Cast, CpuRule
from pareto.export.manifest import TECHNIQUE_NOTES, UNNOTED, technique_entry
from pareto.spec import default_cuda_space

#: ``pareto.spec.DEFAULT_CUDA_SPACE`` as it was written out before each technique declared its part.
WRITTEN_OUT: dict[str, Any] = {
    "batch_size": None,
    "techniques": {
        "cuda_graphs": {},
        "compile": {"mode": ["default", "reduce-overhead"]},
        "bf16": {},
        "fp16": {},
        "fp8": {},
        "int4_weight_only": {"group_size": [64, 128]},
        "int8_weight_only": {},
        "prune_2_4": {},
        "prune_structured": {"ratio": {"low": 0.2, "high": 0.8}},
    },
}


class ToyCast(Technique):
    """A cast to a made-up format that declares every fact."""

    name: ClassVar[str] = "toy_cast"
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "a toy cast"
    artifact_note: ClassVar[str | None] = "weights in the toy format"
    cuda_default: ClassVar[dict[str, Any] | None] = {"bits": [4, 8]}
    #: between fp16 (40) and fp8 (50)
    cuda_default_order: ClassVar[int] = 45
    cpu_native: ClassVar[CpuRule | None] = Cast(native=(("toy_tiles", "toy tiles"),), otherwise="not native: slow")
    cpu_kernels: ClassVar[str] = "mlas"

    bits: int = 8

    def apply(self, model: nn.Module, task: Any) -> nn.Module:
        return model


class ToyInt8(Technique):
    """An int8 format: the shared int8 rule, the other facts left at their defaults."""

    name: ClassVar[str] = "toy_int8"
    family: ClassVar[Family] = "quantize"
    cpu_native: ClassVar[CpuRule | None] = INT8_DOT_PRODUCTS

    def apply(self, model: nn.Module, task: Any) -> nn.Module:
        return model


class ToyPlain(Technique):
    """A technique that declares no fact: every default."""

    name: ClassVar[str] = "toy_plain"
    family: ClassVar[Family] = "prune"

    def apply(self, model: nn.Module, task: Any) -> nn.Module:
        return model


@pytest.fixture
def toys() -> Iterator[None]:
    registry()  # the built-in techniques first
    added = [register(cls) for cls in (ToyCast, ToyInt8, ToyPlain)]
    try:
        yield
    finally:
        for cls in added:
            base._REGISTRY.pop(cls.name, None)


def test_the_default_cuda_space_is_the_one_written_out_before() -> None:
    from pareto.spec import DEFAULT_CUDA_SPACE

    assert json.dumps(DEFAULT_CUDA_SPACE) == json.dumps(WRITTEN_OUT)  # the same values in the same order
    space = default_cuda_space()
    space["techniques"]["compile"]["mode"].append("max-autotune")
    assert default_cuda_space() == WRITTEN_OUT  # each call builds its own; the classes' facts are untouched


def test_every_built_in_technique_says_what_it_becomes_in_the_artifact() -> None:
    assert set(TECHNIQUE_NOTES) == set(registry())
    assert all(TECHNIQUE_NOTES[name] == cls.artifact_note for name, cls in registry().items())


def test_a_new_technique_gets_its_manifest_note_from_its_class(toys: None) -> None:
    assert technique_entry(ToyCast(bits=4), "cpu") == {
        "name": "toy_cast",
        "family": "quantize",
        "params": {"bits": 4},
        "backend": None,
        "in_the_artifact": "weights in the toy format",
    }
    assert TECHNIQUE_NOTES["toy_cast"] == "weights in the toy format"
    assert technique_entry(ToyPlain(), "cpu")["in_the_artifact"] == UNNOTED
    assert "toy_plain" not in TECHNIQUE_NOTES


def test_a_new_technique_gets_its_cuda_default_from_its_class(toys: None) -> None:
    from pareto.spec import DEFAULT_CUDA_SPACE

    techniques = DEFAULT_CUDA_SPACE["techniques"]
    assert list(techniques) == [*list(WRITTEN_OUT["techniques"])[:4], "toy_cast", *list(WRITTEN_OUT["techniques"])[4:]]
    assert techniques["toy_cast"] == {"bits": [4, 8]}
    assert "toy_int8" not in techniques and "toy_plain" not in techniques


def test_a_new_technique_gets_its_cpu_rule_from_its_class(toys: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.compress.availability import int8, levers

    INT8, LEVERS = int8(), levers()

    assert on_this_cpu("toy_cast", "avx2 toy_tiles") == "native: toy tiles"
    assert on_this_cpu("toy_cast", "avx2") == "not native: slow"
    assert on_this_cpu("toy_int8", "avx512f avx512_vnni") == "int8 dot products: AVX-512 VNNI"
    assert on_this_cpu("toy_plain", "avx512f avx512_vnni toy_tiles") is None
    assert "toy_cast" in LEVERS and "toy_int8" in LEVERS and "toy_plain" not in LEVERS
    assert "toy_int8" in INT8 and "toy_cast" not in INT8
    assert [kernel_library(name) for name in ("toy_cast", "toy_int8", "toy_plain")] == ["mlas", "onednn", "onednn"]

    asked = []

    def host_cpu(library: str = "onednn") -> tuple[str | None, str | None]:
        asked.append(library)
        return "toy_tiles" if library == "mlas" else "avx2", "AVX2"

    monkeypatch.setattr(environment, "host_cpu", host_cpu)
    assert cpu_facts("toy_cast") == "native: toy tiles" and asked == ["mlas"]
    assert cpu_facts("toy_int8") == "no VNNI: int8 through AVX2 16-bit multiply-adds, smaller gains over float32"
    listing = {t["name"]: t for t in describe_techniques("cpu")}
    assert listing["toy_cast"]["on_this_cpu"] == "native: toy tiles"
    assert listing["toy_plain"]["on_this_cpu"] is None


def test_the_toys_leave_no_trace() -> None:
    from pareto.compress.availability import levers

    LEVERS = levers()
    from pareto.spec import DEFAULT_CUDA_SPACE

    assert not {"toy_cast", "toy_int8", "toy_plain"} & (set(registry()) | set(LEVERS) | set(TECHNIQUE_NOTES))
    assert DEFAULT_CUDA_SPACE == WRITTEN_OUT
