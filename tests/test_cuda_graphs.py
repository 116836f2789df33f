"""CUDA graphs on the CPU: the pools as built (a stand-in caching allocator behind ``torch.cuda``), the
backends ``cuda_graphs`` is offered on, and a throughput sweep of a compiled model past Dynamo's limit."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch import nn

from pareto import Task
from pareto.compress import Config, apply, get_technique
from pareto.compress import compile as compile_module
from pareto.compress import graphs as graphs_module
from pareto.compress.compile import Compile
from pareto.compress.graphs import CudaGraphed, CudaGraphs
from pareto.measure.memory import activation_bytes, memory_breakdown

MiB = 1 << 20
#: the handle the stand-in ``torch.cuda.graph_pool_handle`` returns
POOL = (0, 7)


class _Allocator:
    """The caching allocator's segments as ``torch.cuda.memory_snapshot`` lists them; ``cached`` ones are free."""

    def __init__(self) -> None:
        self.segments: list[dict[str, Any]] = [
            {"device": 0, "segment_pool_id": (0, 0), "total_size": 4 * MiB, "cached": False},
            {"device": 0, "segment_pool_id": (0, 0), "total_size": 6 * MiB, "cached": True},
            {"device": 0, "segment_pool_id": (0, 9), "total_size": 8 * MiB, "cached": False},  # another pool
        ]

    def reserved(self, device: object = None) -> int:
        return sum(s["total_size"] for s in self.segments)

    def empty_cache(self) -> None:
        self.segments = [s for s in self.segments if not s["cached"]]

    def allocate(self, pool: tuple[int, int], *sizes: int) -> None:
        self.segments += [{"device": 0, "segment_pool_id": pool, "total_size": n, "cached": False} for n in sizes]

    def snapshot(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self.segments]

    def pool_total(self, pool: tuple[int, int]) -> int:
        return sum(s["total_size"] for s in self.segments if s["segment_pool_id"] == pool)


class _Stream:
    def __init__(self, *args: object) -> None:
        pass

    def wait_stream(self, other: object) -> None:
        pass


class _CUDAGraph:
    def replay(self) -> None:
        pass


@pytest.fixture
def allocator(monkeypatch: pytest.MonkeyPatch) -> _Allocator:
    """``torch.cuda`` on the CPU: streams, graphs and the allocator's figures are stand-ins; a capture
    empties the cache on entry (as ``torch.cuda.graph`` does) and its allocations go into its pool."""
    state = _Allocator()

    class _Capture:
        def __init__(self, graph: object, pool: tuple[int, int] | None = None, **kwargs: object) -> None:
            self.pool = pool

        def __enter__(self) -> None:
            state.empty_cache()

        def __exit__(self, *exc: object) -> None:
            assert self.pool is not None
            state.allocate(self.pool, 2 * MiB, MiB // 2)

    for name, value in {
        "Stream": _Stream,
        "stream": lambda stream: contextlib.nullcontext(),
        "current_stream": lambda device=None: _Stream(),
        "synchronize": lambda device=None: None,
        "graph_pool_handle": lambda: POOL,
        "CUDAGraph": _CUDAGraph,
        "graph": _Capture,
        "memory_reserved": state.reserved,
        "memory_snapshot": state.snapshot,
        "current_device": lambda: 0,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return state


def _task(width: int = 16) -> Task:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4)).eval()
    x = torch.randn(8, width)
    return Task("mlp", model, lambda b: x[:b].clone(), lambda m: 1.0)


def _on_cuda(monkeypatch: pytest.MonkeyPatch, *modules: object) -> None:
    for module in modules:
        monkeypatch.setattr(module, "model_device", lambda model: torch.device("cuda:0"))


def test_a_cuda_graph_pool_is_its_snapshot_segments_as_built(
    monkeypatch: pytest.MonkeyPatch, allocator: _Allocator
) -> None:
    _on_cuda(monkeypatch, graphs_module)
    monkeypatch.setattr(CudaGraphs, "available", lambda self, device, task=None: None)
    task = _task()
    served = apply(task.model, Config(techniques=(get_technique("cuda_graphs"),), batch_size=4), task)
    # memory_reserved after the capture is below the reading before it (the capture emptied 6 MiB of
    # cache): their difference counts no pool; the pool's own segments hold 2.5 MiB
    assert served.graph_pool_bytes == allocator.pool_total(POOL) == 2 * MiB + MiB // 2
    assert isinstance(served.module, CudaGraphed)
    # a new batch shape during evaluation records a second graph into the pool: the stored number stays
    served.module(torch.randn(3, 16))
    assert len(served.module._graphs) == 2 and allocator.pool_total(POOL) == 5 * MiB
    assert served.graph_pool_bytes == 2 * MiB + MiB // 2
    x = task.example_input(4)
    breakdown = memory_breakdown(served.module, x, device="cpu", batch_size=4, graph_pool_bytes=served.graph_pool_bytes)
    assert breakdown.activation_bytes == activation_bytes(served.eager, x, "cpu") + served.graph_pool_bytes
    assert "private memory pool as built (2621440 B" in breakdown.method


def _reduce_overhead(monkeypatch: pytest.MonkeyPatch, allocator: _Allocator, manager: object) -> list[int]:
    """Compile's reduce-overhead path on the CPU: ``torch.compile`` a stand-in whose first call warms up
    (1 MiB into the trees' pool) and whose next calls record (3 MiB each); returns the batch of each call."""
    from torch._inductor import cudagraph_trees

    calls: list[int] = []

    def compiled(model: nn.Module, **kwargs: object) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            calls.append(x.shape[0])
            allocator.allocate((0, 5), MiB if len(calls) == 1 else 3 * MiB)
            return model(x)

        return run

    _on_cuda(monkeypatch, compile_module)
    monkeypatch.setattr(Compile, "available", lambda self, device, task=None: None)
    monkeypatch.setattr(torch, "compile", compiled)
    monkeypatch.setattr(cudagraph_trees, "get_manager", lambda index, create_if_none_exists=True: manager)
    return calls


def test_reduce_overhead_counts_the_cudagraph_trees_pool_after_the_recording(
    monkeypatch: pytest.MonkeyPatch, allocator: _Allocator
) -> None:
    calls = _reduce_overhead(monkeypatch, allocator, SimpleNamespace(cuda_graphs_thread_pool=(0, 5)))
    task = _task()
    technique = get_technique("compile", {"mode": "reduce-overhead"})
    served = apply(task.model, Config(techniques=(technique,), batch_size=4), task)
    assert isinstance(served.module, compile_module.StepMarked)
    assert calls == [4, 4]  # a warm-up, then the recording: both in the build
    assert served.graph_pool_bytes == 4 * MiB  # the trees' pool alone, not the other pools' segments
    served.module(torch.randn(2, 16))  # a new batch shape records another graph
    assert allocator.pool_total((0, 5)) == 7 * MiB and served.graph_pool_bytes == 4 * MiB
    assert not any("pool" in note for note in served.notes)


def test_reduce_overhead_without_a_tree_says_no_pool_is_counted(
    monkeypatch: pytest.MonkeyPatch, allocator: _Allocator
) -> None:
    _reduce_overhead(monkeypatch, allocator, None)
    task = _task()
    technique = get_technique("compile", {"mode": "reduce-overhead"})
    served = apply(task.model, Config(techniques=(technique,), batch_size=4), task)
    assert served.graph_pool is None and served.graph_pool_bytes == 0
    assert any("no pool of torch.compile's CUDA graphs is counted" in note for note in served.notes)


def test_cuda_graphs_is_not_offered_on_the_compile_backend() -> None:
    import optuna

    from pareto.study.samplers import grid, suggest

    graphs = get_technique("cuda_graphs")
    with pytest.raises(ValueError, match="cuda_graphs runs on the eager backend, not on compile"):
        Config(techniques=(graphs,), batch_size=1, backend="compile")
    assert Config(techniques=(graphs,), batch_size=1).backend == "eager"
    space: dict[str, dict[str, Any]] = {"cuda_graphs": {}, "bf16": {}}
    points = grid([1], space, backends=("eager", "compile"))
    assert any(p["backend"] == "eager" and p.get("cuda_graphs") for p in points)
    assert not any(p["backend"] == "compile" and "cuda_graphs" in p for p in points)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = set()
    for _ in range(40):
        trial = study.ask()
        config = suggest(trial, [1], space, backends=("eager", "compile"))
        study.tell(trial, 0.0)
        drawn.add((config.backend, "cuda_graphs" in {t.name for t in config.techniques}))
    assert ("eager", True) in drawn and ("compile", False) in drawn and ("compile", True) not in drawn


def _counting_backend(graphs: list[set[tuple[int, ...]]]) -> Any:
    """A Dynamo backend that runs the graph as traced and keeps each graph's input shapes."""

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        graphs.append({tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)})
        return gm.forward

    return backend


def test_a_throughput_sweep_compiles_every_batch_size_past_the_default_limit() -> None:
    import torch._dynamo.config as dynamo_config

    from pareto.measure.throughput import throughput_curve

    graphs: list[set[tuple[int, ...]]] = []
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    model = cast("nn.Module", torch.compile(mlp, backend=_counting_backend(graphs), dynamic=False))
    with dynamo_config.patch(recompile_limit=2):  # the default (8) shrunk, for speed
        curve = throughput_curve(model, lambda b: torch.randn(b, 8), [1, 2, 3, 4, 5], device="cpu",
                                 samples=20, warmup=1, threads=1)  # fmt: skip
        assert dynamo_config.recompile_limit == 2  # restored after the sweep
    assert [p.batch for p in curve.points] == [1, 2, 3, 4, 5] and curve.stopped_reason is None
    # each batch timed its own graph, none eagerly
    assert len(graphs) == 5 and all((b, 8) in shapes for b, shapes in zip([1, 2, 3, 4, 5], graphs, strict=True))
    assert "recompile limit raised to 11 for the sweep" in curve.method


class _RecompilesFromBatch3(nn.Module):
    """From batch 3 on, each call changes an int attribute Dynamo specializes on: a new graph per call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= 3:
            self.calls += 1
        return x * (self.calls + 1)


def test_a_sweep_that_still_hits_the_limit_stops_there_with_a_sentence() -> None:
    import torch._dynamo.config as dynamo_config

    from pareto.measure.throughput import throughput_curve

    graphs: list[set[tuple[int, ...]]] = []
    model = cast("nn.Module", torch.compile(_RecompilesFromBatch3(), backend=_counting_backend(graphs), dynamic=False))
    with dynamo_config.patch(recompile_limit=2):
        curve = throughput_curve(model, lambda b: torch.randn(b, 8), [1, 2, 3, 4], device="cpu",
                                 samples=20, warmup=1, threads=1)  # fmt: skip
    assert [p.batch for p in curve.points] == [1, 2]
    assert curve.stopped_reason == (
        "batch 3 would compile past torch.compile's recompile limit (10 graphs per function) and run eagerly; "
        "larger batches not measured"
    )


def test_a_stored_cuda_graphs_configuration_on_the_compile_backend_is_one_sentence() -> None:
    from pareto.compress import Config
    from pareto.errors import UsageError

    stored = {"batch_size": 8, "techniques": [{"name": "cuda_graphs", "params": {}}], "backend": "compile"}
    with pytest.raises(UsageError) as info:
        Config.from_dict(stored)
    message = str(info.value)
    assert "\n" not in message and "cuda_graphs runs on the eager backend, not on compile" in message
