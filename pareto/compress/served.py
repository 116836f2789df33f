"""A served model as data: what ``pareto.compress.apply`` returns, with the facts the measurers and export need.

A configuration's model is served by a module (the compressed PyTorch module, a ``torch.compile``
wrapper, a CUDA-graph replayer or an ONNX Runtime session), and some facts about it cannot be read
back from that module: how long its serving form took to build, which dtype its kernels compute in
when torch's dispatch cannot tell, which libraries loading it needs. Techniques declare the facts
that are theirs alone (``Technique.compute_dtype``, ``Technique.inductor_freezing``,
``Technique.requires``); the steps that build a serving form return the ones only they know in a
``Step``; ``apply`` gathers both into one ``Served``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class GraphPool:
    """The bytes a CUDA-graph private memory pool held when its configuration was built.

    Read from the caching allocator's snapshot right after the build's capture, so a graph recorded
    later for another input shape (during evaluation, or in a batch sweep) does not change it.
    """

    reserved_bytes: int = 0

    @classmethod
    def read(cls, pool_id: tuple[int, int], device: Any) -> GraphPool:
        """The pool ``pool_id`` on ``device`` now: the sizes of the segments ``torch.cuda.memory_snapshot()``
        lists with that ``segment_pool_id``.

        ``torch.cuda.memory_reserved`` cannot tell: ``torch.cuda.graph`` empties the allocator's cache
        on entry, so reserved bytes read before a capture and after it differ by the pool less the cache freed.
        """
        import torch

        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        wanted = tuple(pool_id)
        held = sum(
            int(segment["total_size"])
            for segment in torch.cuda.memory_snapshot()
            if tuple(segment["segment_pool_id"]) == wanted and segment.get("device", index) == index
        )
        return cls(reserved_bytes=held)


@dataclass(frozen=True)
class Step:
    """What one technique or serving step built, with the facts only it knows about it.

    Attributes:
        module: The module it returned.
        seconds: Seconds spent compiling, capturing or building a serving form (kept apart from
            latency, added up over the steps); None when it built none.
        compute_dtype: The dtype the module's kernels compute in, when it knows better than the
            module's parameters do (an ONNX Runtime graph's integer ops).
        notes: How the module is served or measured, for the method (ONNX Runtime's version and
            settings; a CUDA-graph pool that is not counted).
        source: The PyTorch module FLOPs and activations are counted on, when ``module`` runs
            outside PyTorch (the module exported to ONNX).
        ready: Called before the warm-up of a latency measurement (ONNX Runtime opens its session
            at the timed thread count).
        graph_pool: The CUDA graphs' private memory pool as built, counted in memory.
    """

    module: nn.Module
    seconds: float | None = None
    compute_dtype: str | None = None
    notes: tuple[str, ...] = ()
    source: nn.Module | None = None
    ready: Callable[[], object] | None = None
    graph_pool: GraphPool | None = None


@dataclass(frozen=True)
class Served:
    """A configuration applied to a model: the module that serves it and what is known about serving it.

    Attributes:
        module: What is called to serve the configuration (and timed).
        eager: The model after the techniques, before torch.compile, ONNX Runtime or CUDA graphs.
        compile_s: Seconds spent compiling, capturing CUDA graphs or exporting and opening ONNX
            Runtime (kept apart from latency); None when nothing was built.
        compute_dtype: The dtype the kernels compute in when torch's dispatch cannot tell ("int8",
            "fp8"); None leaves it to ``pareto.measure.compute.compute_dtype``.
        requires: Modules beside torch that loading the served model imports (the library that
            registers a PT2E graph's quantize/dequantize operators).
        notes: How the model is served or measured (ONNX Runtime's note; a CUDA-graph pool that is
            not counted), for the method.
        inductor_freezing: Compiled with Inductor's freezing and static shapes (a PT2E graph).
        source: The PyTorch module FLOPs and activations are counted on when ``module`` runs outside
            PyTorch (ONNX Runtime); None otherwise.
        ready: Called before a latency measurement's warm-up; None when nothing needs it.
        graph_pool: The CUDA graphs' private memory pool as built (counted in memory); None without graphs.
        changed: The layers of ``eager`` a technique that replaces layers one by one changed, as (layer
            name, technique name): where a failure can be traced to (``pareto.study.layers``).
    """

    module: nn.Module
    eager: nn.Module
    compile_s: float | None = None
    compute_dtype: str | None = None
    requires: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    inductor_freezing: bool = False
    source: nn.Module | None = None
    ready: Callable[[], object] | None = None
    graph_pool: GraphPool | None = None
    changed: tuple[tuple[str, str], ...] = ()

    @property
    def graph_pool_bytes(self) -> int:
        """Bytes the CUDA graphs' private memory pool held when built (0 without graphs)."""
        return self.graph_pool.reserved_bytes if self.graph_pool is not None else 0

    def then(self, step: Step) -> Served:
        """This record after ``step``: its module served, its seconds added, the facts it knows replacing these."""
        seconds = self.compile_s if step.seconds is None else (self.compile_s or 0.0) + step.seconds
        return Served(
            module=step.module,
            eager=self.eager,
            compile_s=seconds,
            compute_dtype=step.compute_dtype or self.compute_dtype,
            requires=self.requires,
            notes=tuple(dict.fromkeys([*self.notes, *step.notes])),
            inductor_freezing=self.inductor_freezing,
            source=step.source or self.source,
            ready=step.ready or self.ready,
            graph_pool=step.graph_pool or self.graph_pool,
            changed=self.changed,
        )
