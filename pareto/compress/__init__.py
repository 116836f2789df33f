"""Compression techniques: one module per family, registered by name."""

from __future__ import annotations

from pareto.compress import (  # noqa: F401  (register the techniques)
    availability,
    compile,
    distill,
    finetune,
    graphs,
    lowrank,
    onnxrt,
    prune,
    pt2e,
    quantize,
)
from pareto.compress.availability import backend_reason, describe_techniques, why_not_here
from pareto.compress.base import (
    BACKENDS,
    CANONICAL_ORDER,
    Backend,
    Technique,
    get_technique,
    register,
    registry,
)
from pareto.compress.pipeline import Config, apply
from pareto.compress.served import GraphPool, Served, Step

__all__ = [
    "BACKENDS",
    "CANONICAL_ORDER",
    "Backend",
    "Config",
    "GraphPool",
    "Served",
    "Step",
    "Technique",
    "apply",
    "backend_reason",
    "describe_techniques",
    "get_technique",
    "register",
    "registry",
    "why_not_here",
]
