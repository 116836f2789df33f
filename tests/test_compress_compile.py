"""torch.compile as a technique: compiled on the example input, compile time kept apart."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pareto.compress import Config, apply
from pareto.compress.compile import Compile
from pareto.task import Task


def test_compile_modes_are_torchs_own() -> None:
    from typing import get_args

    from torch._inductor import list_mode_options

    from pareto.compress.compile import CompileMode

    assert set(get_args(CompileMode)) <= set(list_mode_options())


@pytest.mark.skipif(Compile().available("cpu") is not None, reason=str(Compile().available("cpu")))
def test_compile_compiles_on_the_example_input_and_records_the_time() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    seen: list[int] = []

    def example_input(batch_size: int) -> torch.Tensor:
        seen.append(batch_size)
        return torch.randn(batch_size, 8)

    task = Task(name="tiny", model=model, example_input=example_input, evaluate=lambda m: 0.0, batch_size=2)
    served = apply(model, Config(techniques=(Compile(),), batch_size=3), task)
    compiled = served.module
    assert seen == [3]  # the configuration's batch size, not the task's
    assert isinstance(served.compile_s, float) and served.compile_s > 0
    assert compiled._orig_mod is served.eager  # torch.compile's wrapper around the model it compiled
    x = torch.randn(3, 8)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x))


def test_the_serving_form_is_built_at_the_thread_count_it_is_timed_at(monkeypatch: pytest.MonkeyPatch) -> None:
    import pareto.compress.pipeline as pipeline

    model = nn.Sequential(nn.Linear(8, 4)).eval()
    task = Task(name="tiny", model=model, example_input=lambda n: torch.randn(n, 8), evaluate=lambda m: 0.0)
    built_at: list[int] = []
    serve = pipeline._serve

    def counted(*args: object) -> object:
        built_at.append(torch.get_num_threads())
        return serve(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "_serve", counted)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # the process's count while trials are built
    try:
        apply(model, Config(batch_size=1), task, threads=1)
        apply(model, Config(batch_size=1), task)
        # Inductor's code and oneDNN's packed weights are made for the count they were built at
        assert built_at == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_compile_on_cuda_says_when_triton_cannot_build_its_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    # a bare image has triton but no C compiler or no Python.h: every compile probe would fail, and be cached
    import sysconfig

    from pareto.compress import compile as compile_module

    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CC", raising=False)
    assert "C compiler" in (compile_module._triton_build_reason() or "")
    monkeypatch.setattr(compile_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": "/nowhere/include"})
    assert "/nowhere/include/Python.h is missing" in (compile_module._triton_build_reason() or "")
