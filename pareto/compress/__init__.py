"""Compression techniques: one module per family, registered by name."""

from __future__ import annotations

from pareto.compress import lowrank, prune, quantize  # noqa: F401  (register the techniques)
from pareto.compress.base import CANONICAL_ORDER, Technique, get_technique, register, registry
from pareto.compress.pipeline import Config, apply

__all__ = ["CANONICAL_ORDER", "Config", "Technique", "apply", "get_technique", "register", "registry"]
