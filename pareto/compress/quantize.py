"""Quantization family: int8 dynamic quantization of linear layers (CPU)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from pareto.compress.base import Family, Technique, register
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Quantized engines that ship int8 dynamic linear kernels.
_INT8_ENGINES = ("x86", "fbgemm", "qnnpack")


def _quantize_dynamic() -> Callable[..., Any] | None:
    """Return torch's ``quantize_dynamic``, or None when this torch no longer has it."""
    # torch.ao.quantization warns on import (deprecated in favour of torchao); the warning is not ours to show
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError:
            return None
    return quantize_dynamic


@register
class Int8Dynamic(Technique):
    """Weights stored as int8, activations quantized on the fly per batch; every ``nn.Linear``.

    Cuts weight bytes by 4x, not FLOPs: it pays off where the linear layers are memory-bound.
    """

    name: ClassVar[str] = "int8_dynamic"
    family: ClassVar[Family] = "quantize"

    def available(self, device: str) -> str | None:
        if not device.startswith("cpu"):
            return "int8 dynamic quantization runs on the CPU only."
        if _quantize_dynamic() is None:
            return f"torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic."
        engines = [e for e in _INT8_ENGINES if e in torch.backends.quantized.supported_engines]
        if not engines:
            return "this torch build has no quantized CPU engine (x86, fbgemm or qnnpack)."
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with every ``nn.Linear`` swapped for a dynamic int8 linear.

        Raises:
            TechniqueError: the model has no ``nn.Linear`` or the quantized kernels are missing.
        """
        if not any(isinstance(m, nn.Linear) for m in model.modules()):
            raise TechniqueError(f"{self.describe()}: the model has no nn.Linear layer to quantize.")
        reason = self.available("cpu")
        quantize_dynamic = _quantize_dynamic()
        if reason is not None or quantize_dynamic is None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=False)
