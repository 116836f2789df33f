"""A configuration (techniques + batch size) and the one verb that applies it."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pareto.compress.base import Technique, canonical_key, get_technique
from pareto.errors import TechniqueError
from pareto.naming import describe_config

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
        return tuple(sorted(value, key=canonical_key))

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
        return describe_config(self.to_dict())


def apply(model: nn.Module, config: Config, task: Task, *, device: str | None = None) -> nn.Module:
    """Return a compressed copy of ``model``; the original is never modified.

    Techniques see ``task`` with ``batch_size`` set to the configuration's (``compile`` warms up on it).

    Args:
        model: The uncompressed model.
        config: The techniques, applied in canonical order, and the batch size.
        task: The task the model belongs to (``train_data`` for distillation and fine-tuning).
        device: Where to put the copy before the first technique ("cpu", "cuda:0"); None leaves it
            where ``model`` is. CUDA-only techniques (``prune_2_4``, ``int4_weight_only``) need it.

    Raises:
        TechniqueError: a technique broke on this model (the reason is kept).
    """
    compressed = copy.deepcopy(model).eval()
    if device is not None:
        compressed = compressed.to(device)
    served = dataclasses.replace(task, batch_size=config.batch_size)
    for technique in config.techniques:
        try:
            compressed = technique.apply(compressed, served)
        except TechniqueError:
            raise
        except Exception as exc:  # a model that breaks under a technique fails the trial, reason kept
            raise TechniqueError(f"{technique.describe()} failed on this model: {type(exc).__name__}: {exc}") from exc
        _route_around_fused_encoder_kernel(compressed)  # before the next technique (compile) sees it
    return compressed.eval()


def _route_around_fused_encoder_kernel(model: nn.Module) -> None:
    """Send ``nn.TransformerEncoderLayer`` through its modules once a technique has replaced its linears.

    In eval mode the layer's fused fast path passes ``linear1.weight``, ``linear2.weight`` and the
    attention's ``out_proj.weight`` straight to one kernel: a factor pair, a quantized module or a
    packed weight there breaks it. Its regular path calls the modules and computes the same function.
    """
    from torch import nn
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    def plain(module: object) -> bool:
        weight = getattr(module, "weight", None)
        return isinstance(weight, nn.Parameter) and not is_traceable_wrapper_subclass(weight)

    for layer in model.modules():
        if isinstance(layer, nn.TransformerEncoderLayer) and not all(
            plain(m) for m in (layer.linear1, layer.linear2, getattr(layer.self_attn, "out_proj", None))
        ):
            layer.activation_relu_or_gelu = 0  # the fast path's gate: the layer runs module by module
