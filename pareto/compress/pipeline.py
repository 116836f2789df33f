"""A configuration (techniques + batch size) and the one verb that applies it."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pareto.compress.base import CANONICAL_ORDER, Technique, get_technique
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from torch import nn

    from pareto.task import Task


class Config(BaseModel):
    """One point of the search space: which techniques, with which parameters, at which batch size."""

    model_config = ConfigDict(frozen=True)

    techniques: tuple[Technique, ...] = ()
    batch_size: int = Field(ge=1)

    @field_validator("techniques")
    @classmethod
    def _canonical(cls, value: tuple[Technique, ...]) -> tuple[Technique, ...]:
        names = [t.name for t in value]
        if len(set(names)) != len(names):
            raise ValueError(f"a technique appears twice in {names}")
        return tuple(sorted(value, key=lambda t: (CANONICAL_ORDER.index(t.family), t.name)))

    @property
    def is_baseline(self) -> bool:
        return not self.techniques

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "techniques": [{"name": t.name, "params": t.params()} for t in self.techniques],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        techniques = tuple(get_technique(t["name"], t.get("params")) for t in data.get("techniques", []))
        return cls(techniques=techniques, batch_size=data["batch_size"])

    def key(self) -> str:
        """Content hash of the configuration: equal configs share a key."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        body = " + ".join(t.describe() for t in self.techniques) or "baseline"
        return f"{body} @ batch {self.batch_size}"


def apply(model: nn.Module, config: Config, task: Task) -> nn.Module:
    """Return a compressed copy of ``model``; the original is never modified.

    Raises:
        TechniqueError: a technique broke on this model (the reason is kept).
    """
    compressed = copy.deepcopy(model).eval()
    for technique in config.techniques:
        try:
            compressed = technique.apply(compressed, task)
        except TechniqueError:
            raise
        except Exception as exc:  # a model that breaks under a technique fails the trial, reason kept
            raise TechniqueError(
                f"{technique.describe()} failed on this model: {type(exc).__name__}: {exc}"
            ) from exc
    return compressed.eval()
