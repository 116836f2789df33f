"""Compression techniques: one module per family, registered by name."""

from __future__ import annotations

from pareto.compress import (  # noqa: F401  (register the techniques)
    compile,
    distill,
    finetune,
    lowrank,
    prune,
    quantize,
)
from pareto.compress.base import (
    CANONICAL_ORDER,
    Technique,
    describe_techniques,
    get_technique,
    register,
    registry,
)
from pareto.compress.pipeline import Config, apply

__all__ = [
    "CANONICAL_ORDER",
    "Config",
    "Technique",
    "apply",
    "describe_techniques",
    "get_technique",
    "register",
    "registry",
]
