"""Compile family: ``torch.compile`` (TorchInductor) with its modes; compile time kept apart from latency."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import time
from typing import TYPE_CHECKING, ClassVar, Literal, cast

import torch
from torch import nn

from pareto.compress.base import Backend, Family, Technique, model_device, register
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: ``torch.compile`` modes (``torch._inductor.list_mode_options()``) a search may choose from.
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


@functools.cache
def _compile_reason(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot run on a device of ``device_type`` here, or None (checked once per process)."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile."
    import torch._dynamo as dynamo

    if not dynamo.is_dynamo_supported():
        return f"torch {torch.__version__} does not support torch.compile on this Python."
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs triton (pip install triton); it is not installed."
        return None
    # Inductor writes C++ for the CPU and builds it with the system compiler
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in candidates):
        return "torch.compile on the CPU needs a C++ compiler (g++ or clang++ on PATH, or $CXX); none was found."
    return None


@register
class Compile(Technique):
    """Wrap the model in ``torch.compile(mode=...)`` and compile it on the task's example input.

    ``apply`` runs ``task.example_input(task.batch_size)`` once under ``torch.inference_mode`` so
    that compilation happens there, not during timing, and stores the seconds it took as
    ``pareto_compile_s`` on the returned module: compile time is reported on its own and never
    counted as latency. Each apply starts from a reset compiler cache, so one trial's graphs and
    recompile limits never carry into the next.

    Args:
        mode: ``"default"``; ``"reduce-overhead"`` (CUDA graphs on GPUs); ``"max-autotune"``
            (benchmarks kernel choices, CUDA graphs on GPUs); ``"max-autotune-no-cudagraphs"``.
    """

    name: ClassVar[str] = "compile"
    #: on the compile backend every configuration is compiled already; an ONNX graph is not a torch module
    backends: ClassVar[tuple[Backend, ...]] = ("eager",)
    family: ClassVar[Family] = "compile"
    summary: ClassVar[str] = "torch.compile (TorchInductor) in a given mode; compile time kept apart from latency"

    mode: CompileMode = "default"

    def backend(self, device: str) -> str | None:
        return "inductor"

    def available(self, device: str, task: Task | None = None) -> str | None:
        return _compile_reason(torch.device(device).type)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return the compiled model, already compiled for ``task.example_input(task.batch_size)``.

        Raises:
            TechniqueError: ``torch.compile`` cannot run on the model's device.
        """
        device = model_device(model)
        reason = self.available(str(device))
        if reason is not None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        inputs = task.example_input(task.batch_size)
        items = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        args = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in items)
        torch.compiler.reset()
        compiled = torch.compile(model.eval(), mode=self.mode)
        with torch.inference_mode():
            start = time.perf_counter()
            compiled(*args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
        setattr(compiled, "pareto_compile_s", elapsed)  # noqa: B010  (read back by pareto.assess.build)
        return cast("nn.Module", compiled)
