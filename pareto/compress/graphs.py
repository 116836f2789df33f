"""CUDA graphs: the whole forward pass recorded once per input shape and replayed as one launch.

On a GPU a small model is launch-bound: each of its dozens of kernels costs the host a few
microseconds to launch, more than the kernel takes to run, and no compression of the math helps.
A CUDA graph records the kernels once (the capture) and replays them with one launch. Capture time
is kept apart from latency like compile time, and the graph's private memory pool, as built, is
counted in memory. Precision casts (``bf16``, ``fp16``) and quantized kernels applied before are
recorded inside the graph. The eager backend only: Inductor's kernels in CUDA graphs are
``torch.compile``'s reduce-overhead mode.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from pareto.compress.base import Backend, Family, Technique, register
from pareto.compress.compile import StepMarked
from pareto.compress.served import GraphPool, Step
from pareto.devices import as_args, model_device
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Eager calls on a side stream before a capture (as PyTorch's CUDA-graph notes ask: lazy
#: initializations such as cuBLAS workspaces must not happen inside the capture).
CAPTURE_WARMUP = 3


class CudaGraphed(nn.Module):
    """Serve ``module`` by replaying a CUDA graph recorded for each input signature it is called with.

    Each call copies its tensor arguments into the graph's static inputs (device-to-device), replays
    the graph, and returns a clone of the static outputs (the next replay overwrites them): all of it
    part of the timed call. A new shape, dtype or device records a new graph, into the same private
    memory pool. Calls run under ``torch.inference_mode`` (a recorded graph cannot train).

    Attributes:
        _orig_mod: The module recorded (read for memory, FLOPs and export, as on ``torch.compile``'s wrapper).
        pool_id: The private memory pool's handle (``torch.cuda.graph_pool_handle``); None before the first capture.
        graph_pool: The pool as built (``CudaGraphs.build`` reads it after the first capture; ``Served.graph_pool``:
            counted in memory). Graphs recorded later for other shapes grow the pool, not this record.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._orig_mod = module
        self._graphs: dict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]] = {}
        self.pool_id: Any = None
        self.graph_pool = GraphPool()

    def forward(self, *args: Any) -> Any:
        with torch.inference_mode():
            key = _signature(args)
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._graphs[key] = self._capture(args)
            graph, static_inputs, static_output = entry
            for static, given in zip(static_inputs, _tensors(args), strict=True):
                static.copy_(given)
            graph.replay()
            return _clone(static_output)

    def _capture(self, args: tuple[Any, ...]) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]:
        device = model_device(self._orig_mod)
        static_args = _clone(args)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP):
                self._orig_mod(*static_args)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        if self.pool_id is None:
            self.pool_id = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool_id):
            static_output = self._orig_mod(*static_args)
        torch.cuda.synchronize(device)
        return graph, _tensors(static_args), static_output


def _tensors(obj: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree

    return [leaf for leaf in _pytree.tree_leaves(obj) if isinstance(leaf, torch.Tensor)]


def _clone(obj: Any) -> Any:
    from torch.utils import _pytree

    return _pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, obj)


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a recorded graph is specific to: each tensor's shape, dtype and device; other values as they are."""
    from torch.utils import _pytree

    leaves, structure = _pytree.tree_flatten(args)
    parts: list[Any] = [str(structure)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append((tuple(leaf.shape), leaf.dtype, str(leaf.device)))
        else:
            parts.append(repr(leaf))
    return tuple(parts)


def _graphed_already(model: nn.Module) -> bool:
    """True when ``model`` replays CUDA graphs already (this technique, or torch.compile's cudagraph modes)."""
    return isinstance(model, (CudaGraphed, StepMarked))


@register
class CudaGraphs(Technique):
    """Record the model's forward pass as a CUDA graph per batch shape and replay it: one launch per call.

    Applied after every other technique (precision casts, quantized kernels), so what they launch is
    recorded too. CUDA and the eager backend only. The capture (with its warm-up calls) happens in
    ``apply`` on the task's example input, timed apart from latency as compile time.

    Not on the compile backend: serving compiles the module a configuration's techniques built, so
    ``torch.compile`` would wrap the graph replayer, whose FLOPs count as a replay's (about none) and
    which ``torch.export`` refuses. Inductor's kernels in CUDA graphs are ``compile``'s reduce-overhead mode.
    """

    name: ClassVar[str] = "cuda_graphs"
    artifact_note: ClassVar[str | None] = (
        "not in the graph: the artifact holds the eager module; CUDA graphs are recorded where the model is served "
        "(torch.cuda.graph per batch shape, replayed per call, as measured)"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {}
    cuda_default_order: ClassVar[int] = 10
    #: torch.compile's reduce-overhead mode is Inductor's kernels in CUDA graphs: this is the eager ones'
    excludes: ClassVar[frozenset[str]] = frozenset({"compile"})
    family: ClassVar[Family] = "compile"
    summary: ClassVar[str] = "the forward recorded as a CUDA graph per input shape and replayed: one launch (CUDA)"
    #: last of the compile family (``compile`` itself is excluded from its configurations)
    order_in_family: ClassVar[int] = 1
    #: eager only: on the compile backend torch.compile would wrap the replayer
    backends: ClassVar[tuple[Backend, ...]] = ("eager",)

    def available(self, device: str, task: Task | None = None) -> str | None:
        if not device.startswith("cuda"):
            return f"CUDA graphs record GPU kernels; this device is {device}."
        if not torch.cuda.is_available():
            return f"torch sees no CUDA device {device!r}."
        return None

    def backend(self, device: str) -> str | None:
        return "torch.cuda.CUDAGraph" if self.available(device) is None else None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return the model wrapped in ``CudaGraphed``, its first graph recorded (see ``build``)."""
        return self.build(model, task).module

    def build(self, model: nn.Module, task: Task) -> Step:
        """``CudaGraphed(model)`` with its first graph recorded, the capture's seconds, and its memory pool.

        The pool is read right after that capture (``GraphPool.read``: its segments in the caching
        allocator's snapshot) and kept as the configuration's; graphs recorded later for other batch
        shapes (during evaluation, a batch sweep) grow the pool but not the stored number.

        Raises:
            TechniqueError: not on CUDA, graphs recorded already, or the forward cannot be recorded
                (it synchronizes with the host, or changes shape from call to call).
        """
        device = str(model_device(model))
        reason = self.available(device)
        if reason is not None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        if _graphed_already(model):
            raise TechniqueError(
                f"{self.describe()}: the model replays CUDA graphs already (torch.compile's reduce-overhead "
                "or max-autotune mode); use one of the two."
            )
        graphed = CudaGraphed(model.eval())
        start = time.perf_counter()
        try:
            graphed(*as_args(task.example_input(task.batch_size)))
        except Exception as exc:  # a forward that syncs with the host or allocates per call cannot be recorded
            raise TechniqueError(f"{self.describe()}: the forward could not be recorded: {exc}") from exc
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start  # the capture's: kept apart from latency, as compile time
        graphed.graph_pool = GraphPool.read(graphed.pool_id, device)
        return Step(graphed, seconds=seconds, graph_pool=graphed.graph_pool)
