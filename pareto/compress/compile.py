"""Compile family: ``torch.compile`` (TorchInductor) with its modes; compile time kept apart from latency."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sysconfig
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import torch
from torch import nn

from pareto.compress.base import Backend, Family, Technique, register
from pareto.compress.cpu import INDUCTOR_VECTORS, CpuRule
from pareto.compress.served import GraphPool, Step
from pareto.devices import as_args, model_device, recompile_settings
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
        return _triton_build_reason()
    # Inductor writes C++ for the CPU and builds it with the system compiler
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in candidates):
        return "torch.compile on the CPU needs a C++ compiler (g++ or clang++ on PATH, or $CXX); none was found."
    return None


def _triton_build_reason() -> str | None:
    """Why Triton cannot build its launcher here: it compiles a small C module against Python's headers
    with the system's C compiler (``$CC``, else cc, gcc or clang) the first time a kernel runs. A bare
    image without them fails every compile, so it is said before any trial pays for one."""
    if not any(c and shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang")):
        return (
            "torch.compile on CUDA builds Triton's launcher with a C compiler (cc, gcc or clang on PATH, or $CC); "
            "none was found."
        )
    headers = sysconfig.get_paths().get("include")
    if not headers or not os.path.exists(os.path.join(headers, "Python.h")):
        return (
            f"torch.compile on CUDA builds Triton's launcher against Python's headers, and {headers}/Python.h "
            "is missing (install python3-dev, or the python3.x-dev of this Python)."
        )
    return None


@register
class Compile(Technique):
    """Wrap the model in ``torch.compile(mode=...)`` and compile it on the task's example input.

    ``build`` runs ``task.example_input(task.batch_size)`` once (twice in a mode that records CUDA
    graphs) under ``torch.inference_mode`` so that compilation happens there, not during timing, and
    returns the seconds it took with the module (``Served.compile_s`` once applied): compile time is
    reported on its own and never counted as latency. Each apply starts from a reset compiler cache,
    so one trial's graphs and recompile limits never carry into the next.

    Args:
        mode: ``"default"``; ``"reduce-overhead"`` (CUDA graphs on GPUs); ``"max-autotune"``
            (benchmarks kernel choices, CUDA graphs on GPUs); ``"max-autotune-no-cudagraphs"``.
    """

    name: ClassVar[str] = "compile"
    artifact_note: ClassVar[str | None] = (
        "not in the graph: the artifact holds the eager module; the load line calls torch.compile with the mode"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {"mode": ["default", "reduce-overhead"]}
    cuda_default_order: ClassVar[int] = 20
    cpu_native: ClassVar[CpuRule | None] = INDUCTOR_VECTORS
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
        """Return the compiled model, already compiled for ``task.example_input(task.batch_size)`` (see ``build``)."""
        return self.build(model, task).module

    def build(self, model: nn.Module, task: Task, *, freezing: bool = False) -> Step:
        """The compiled model, compiled on ``task.example_input(task.batch_size)``, and the seconds that took.

        In a mode that records CUDA graphs on a GPU (``StepMarked``), the example runs twice: Inductor's
        cudagraph trees run a graph's first call as a warm-up and record it on the next. The pool they
        recorded into is read right after (``cudagraph_trees_pool``) and returned as the step's
        ``graph_pool``, counted in memory.

        Args:
            model: The module to compile.
            task: The task view whose example input the compile runs on.
            freezing: Compile with Inductor's freezing and static shapes (``FrozenCompiled``): how a
                PT2E-quantized graph (``int8_static``) is served.

        Raises:
            TechniqueError: ``torch.compile`` cannot run on the model's device.
        """
        device = model_device(model)
        reason = self.available(str(device))
        if reason is not None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        args = as_args(task.example_input(task.batch_size))  # the bench's view: on the model's device already
        reset_compiler()
        if freezing:
            compiled: nn.Module = FrozenCompiled(model.eval(), self.mode)
        elif device.type == "cuda" and self.mode in CUDAGRAPH_MODES:
            compiled = StepMarked(model.eval(), self.mode)
        else:
            compiled = cast("nn.Module", torch.compile(model.eval(), mode=self.mode))
        with torch.inference_mode():
            start = time.perf_counter()
            compiled(*args)
            if isinstance(compiled, StepMarked):
                compiled(*args)  # the cudagraph trees warm a graph up on its first call and record it on the next
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
        if isinstance(compiled, StepMarked):
            pool, notes = cudagraph_trees_pool(device)
            return Step(compiled, seconds=elapsed, graph_pool=pool, notes=notes)
        return Step(compiled, seconds=elapsed)


#: torch.compile's modes that record CUDA graphs on a GPU (cudagraph trees).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


class _Compiled(nn.Module):
    """``torch.compile`` of ``model`` held beside it: the weights stay ``_orig_mod``'s (memory and FLOPs are
    read on it, as on ``torch.compile``'s own wrapper)."""

    def __init__(self, model: nn.Module, mode: CompileMode) -> None:
        super().__init__()
        self._orig_mod = model
        compiled = torch.compile(model, mode=mode, dynamic=False)
        self._compiled: Callable[..., Any]
        object.__setattr__(self, "_compiled", compiled)  # not a submodule: the weights are _orig_mod's


class StepMarked(_Compiled):
    """``torch.compile`` in a mode that records CUDA graphs, served one request at a time.

    Every call starts a new step of the cudagraph trees (``torch.compiler.cudagraph_mark_step_begin``:
    the previous call's outputs may be overwritten now) and returns a clone of the outputs, which the
    next replay would overwrite: a caller may keep them, as a served model's caller does. Shapes are
    static: a new batch size records a new graph.

    """

    def forward(self, *args: Any) -> Any:
        from torch.utils import _pytree

        torch.compiler.cudagraph_mark_step_begin()
        output = self._compiled(*args)
        return _pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, output)


def cudagraph_trees_pool(device: torch.device) -> tuple[GraphPool | None, tuple[str, ...]]:
    """The private memory pool of ``torch.compile``'s CUDA graphs on ``device`` now, or a note that it is not counted.

    Inductor's cudagraph trees keep one tree manager per device (per thread, in
    ``torch._inductor.cudagraph_trees``), and every graph it records goes into that manager's one
    pool (``cuda_graphs_thread_pool``). ``Compile.build`` resets the compiler first, which drops the
    trees, so right after its warm-up and recording the pool holds this configuration's graphs alone.
    Its size is read as ``CudaGraphed``'s is (``GraphPool.read``). With no tree manager on the
    device (torch.compile recorded no CUDA graph: it skips graphs it cannot record), or on a torch
    that keeps the pool elsewhere, no pool is counted and the note says so.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
    except (ImportError, AttributeError, TypeError):
        manager = None
    pool_id = getattr(manager, "cuda_graphs_thread_pool", None)
    if pool_id is None:
        note = (
            f"memory: no pool of torch.compile's CUDA graphs is counted (no cudagraph tree on {device} after "
            "the build: none was recorded, or this torch keeps it where pareto does not read it)"
        )
        return None, (note,)
    return GraphPool.read(pool_id, device), ()


#: Input signatures (shapes, dtypes, grad mode) one ``FrozenCompiled`` may compile a graph for.
FROZEN_RECOMPILE_LIMIT = 64

_resets = 0


def reset_compiler() -> None:
    """``torch.compiler.reset()``, counted: a ``FrozenCompiled`` built before it compiles again on its next call."""
    global _resets
    torch.compiler.reset()
    _resets += 1


class FrozenCompiled(_Compiled):
    """``torch.compile`` with Inductor's freezing on and static shapes: how a PT2E-quantized graph is served.

    Freezing treats the weights as constants, which is what lets Inductor fold the quantized
    weights and replace quantize/dequantize pairs around convolutions and matrix products with
    oneDNN's int8 kernels (PyTorch's PT2E tutorial for X86 sets ``torch._inductor.config.freezing``).
    Dynamo reads that flag when it traces as well as Inductor when it compiles, so ``torch.compile``'s
    ``options`` cannot carry it: it is set while a call compiles, and restored after. Which calls
    compile is known here: one per new input signature (what Dynamo guards on with static shapes:
    each tensor's shape, strides, dtype, device and ``requires_grad``, other arguments' values, grad
    and inference mode), since shapes are static (Inductor's freezing with a dynamic batch axis failed a
    stride assertion on these graphs, torch 2.13). Calls with a signature seen before run the
    compiled graph directly, without touching any setting, unless the compiler was reset since
    (``reset_compiler``: each build of a compiled configuration does it, so that an interleaved
    measurement of several models recompiles this one on its next call, with freezing again).

    Attributes:
        _orig_mod: The module compiled (as on ``torch.compile``'s wrapper: memory and FLOPs are read on it).
    """

    def __init__(self, model: nn.Module, mode: CompileMode) -> None:
        super().__init__(model, mode)
        self._signatures: set[tuple[Any, ...]] = set()
        self._resets = _resets

    def forward(self, *args: Any) -> Any:
        signature = _signature(args)
        if self._resets != _resets:  # the compiler forgot every graph: each signature compiles again
            self._signatures.clear()
            self._resets = _resets
        if signature in self._signatures:
            return self._compiled(*args)
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config

        with (
            inductor_config.patch(freezing=True),
            dynamo_config.patch(recompile_settings(FROZEN_RECOMPILE_LIMIT)),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._inductor")  # its own advice
            output = self._compiled(*args)
        self._signatures.add(signature)
        return output


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a static-shape Dynamo graph is specialized on, for ``FrozenCompiled``'s arguments.

    Nested arguments are flattened (``torch.utils._pytree``); a hashable non-tensor leaf counts by
    value (Dynamo specializes on ints, floats, bools and strings), an unhashable one by identity.
    """
    from torch.utils import _pytree

    parts: list[Any] = [torch.is_grad_enabled(), torch.is_inference_mode_enabled()]
    for arg in args:
        if isinstance(arg, torch.Tensor):
            leaves: list[Any] = [arg]
        else:
            leaves, structure = _pytree.tree_flatten(arg)
            parts.append(str(structure))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                parts.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    parts.append((type(leaf), id(leaf)))
                else:
                    parts.append((type(leaf), leaf))
    return tuple(parts)
