"""Where tensors live: the bench's device, its task view, and the device bugs a CPU-only machine can catch.

PyTorch's ``meta`` device exists on every machine and holds shapes, no data: a model there fed a CPU
tensor fails, as a model on a GPU does. Running assess, measure and the roofline with the model on
``meta`` and a shape-only ``evaluate`` catches any tensor pareto leaves behind.
"""

from __future__ import annotations

from collections import namedtuple
from typing import ClassVar

import pytest
import torch
from torch import nn

from pareto import Task
from pareto.compress import Config, Technique, apply, get_technique
from pareto.compress.base import Family
from pareto.devices import Fed, as_args, device_identity, first_device, model_device, on_device, to_device
from pareto.errors import BaselineFailed, UsageError
from pareto.measure.latency import measure_latency
from pareto.measure.memory import theoretical_bytes
from pareto.spec import Measure
from pareto.study.assess import assess, preflight

Pair = namedtuple("Pair", ["a", "b"])


def shape_task(train_data: object = None) -> Task:
    """A task written for the CPU: data on the CPU, an evaluate that reads only its outputs' shapes."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).eval()

    def evaluate(candidate: nn.Module) -> float:
        out = candidate(x)  # CPU rows in: pareto moves them to the model's device
        assert tuple(out.shape) == (64, 4)
        return 0.75

    return Task(
        name="shape",
        model=model,
        example_input=lambda batch_size: x[:batch_size].clone(),
        evaluate=evaluate,
        train_data=train_data,
        batch_size=8,
    )


MEASURE = Measure(device="cpu", threads=1, samples=40, rounds=4, warmup=2, contention_limit=None)


def test_to_device_moves_nested_structures_and_keeps_their_types() -> None:
    value = {"ids": (torch.zeros(2), [torch.ones(3), 5]), "pair": Pair(torch.ones(1), "text")}
    moved = to_device(value, "meta")
    assert moved["ids"][0].is_meta and moved["ids"][1][0].is_meta and moved["ids"][1][1] == 5
    assert isinstance(moved["pair"], Pair) and moved["pair"].a.is_meta and moved["pair"].b == "text"
    assert isinstance(moved["ids"][1], list)
    x = torch.ones(2)
    assert to_device(x, "cpu") is x  # already there: no copy
    assert first_device(moved) == torch.device("meta") and first_device((1, "a")) is None
    assert as_args(x) == (x,) and as_args([x, 1]) == (x, 1)


def test_fed_moves_the_tasks_inputs_in_and_leaves_a_meta_output_where_it_is() -> None:
    model = nn.Linear(4, 2).to("meta")
    fed = Fed(model, "meta")
    out = fed(torch.randn(3, 4))
    assert out.is_meta and tuple(out.shape) == (3, 2)
    with pytest.raises(RuntimeError):
        model(torch.randn(3, 4))  # what the task's evaluate would have hit without pareto
    assert fed.in_features == 4 and fed.eval() is fed  # the model's attributes read through


def test_fed_brings_outputs_back_to_where_the_inputs_were() -> None:
    calls = []

    class Spy(nn.Module):
        def forward(self, a: torch.Tensor, *, b: torch.Tensor) -> dict[str, torch.Tensor]:
            calls.append((a.device, b.device))
            return {"sum": a + b}

    out = Fed(Spy(), "cpu")(torch.ones(2), b=torch.ones(2))
    assert calls == [(torch.device("cpu"), torch.device("cpu"))] and out["sum"].device.type == "cpu"


def test_the_view_moves_data_and_never_the_users_model() -> None:
    batches = [(torch.randn(8, 16), torch.zeros(8, dtype=torch.long))] * 2
    task = shape_task(train_data=batches)
    view = on_device(task, "meta")
    assert model_device(task.model).type == "cpu"  # the user's model stays where it was
    assert model_device(view.model).type == "meta" and view.device == "meta"
    assert view.example_input(4).is_meta and all(x.is_meta and y.is_meta for x, y in view.train_data)
    assert on_device(view, "meta") is view
    assert on_device(task, "cpu").model is task.model  # already there: shared, not copied
    lazy = on_device(shape_task(train_data=iter(batches)), "meta")
    assert all(x.is_meta for x, _ in lazy.train_data)  # an iterator is moved as it is read


@pytest.mark.parametrize(
    "techniques",
    [
        (),
        (("lowrank", {"rank_ratio": 0.3, "keep_head": False}),),
    ],
)
def test_assess_runs_everything_on_the_models_device(techniques: tuple[tuple[str, dict], ...]) -> None:
    task = shape_task(train_data=[(torch.randn(8, 16), torch.zeros(8, dtype=torch.long))] * 2)
    view = on_device(task, "meta")
    config = Config(techniques=tuple(get_technique(n, p) for n, p in techniques), batch_size=8)
    result = assess(
        view,
        config,
        device="meta",
        threads=1,
        measure=MEASURE,
        baseline_theoretical_bytes=theoretical_bytes(view.model),
    )
    assert result.metrics.accuracy == 0.75 and result.metrics.flops > 0 and result.metrics.samples == 40


def test_a_model_and_its_inputs_must_sit_on_the_timed_device() -> None:
    model = nn.Linear(4, 2)
    with pytest.raises(UsageError, match="model to time are on cpu, not on meta"):
        measure_latency(model, torch.randn(2, 4, device="meta"), device="meta", samples=4, threads=1)
    with pytest.raises(UsageError, match="inputs to time are on cpu, not on meta"):
        measure_latency(model.to("meta"), torch.randn(2, 4), device="meta", samples=4, threads=1)


class _Reads(Technique):
    """A technique that runs the model on the task's example input and training batches, as compile,
    structured pruning, low-rank's head search and recovery training do."""

    name: ClassVar[str] = "test_reads_task_data"
    family: ClassVar[Family] = "finetune"

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        model(*as_args(task.example_input(task.batch_size)))
        for inputs, _ in task.train_data or ():
            model(*as_args(inputs))
        return model


def test_apply_builds_on_the_device_from_a_task_written_for_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.compress import base

    monkeypatch.setitem(base._REGISTRY, _Reads.name, _Reads)
    task = shape_task(train_data=[(torch.randn(8, 16), torch.zeros(8, dtype=torch.long))] * 2)
    model = apply(task.model, Config(techniques=(_Reads(),), batch_size=8), task, device="meta").module
    assert model_device(model).type == "meta" and model_device(task.model).type == "cpu"


def test_preflight_builds_runs_evaluates_and_counts_on_the_device() -> None:
    preflight(shape_task(), [1, 8], "meta")
    broken = shape_task()
    broken.example_input = lambda batch_size: torch.randn(batch_size, 3)
    with pytest.raises(BaselineFailed, match=r"failed when running it on example_input\(1\) on meta"):
        preflight(broken, [1], "meta")


def test_measure_and_roofline_run_on_the_resolved_device(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import pareto.devices
    from pareto import api

    monkeypatch.setattr(pareto.devices, "resolve_device", lambda spec: "meta")
    result = api.measure(
        "tests.test_devices:shape_task",
        techniques=["lowrank:rank_ratio=0.3,keep_head=false"],
        device="meta",
        samples=40,
        rounds=4,
        warmup=2,
        threads=1,
        contention_limit=None,
        hardware="h200",
        db=f"sqlite:///{tmp_path}/none.db",
    )
    assert result["metrics"]["accuracy"] == 0.75 and result["environment"]["device"] == "meta"
    import pareto.measure.compute as compute

    seen, real = [], compute.layer_costs
    monkeypatch.setattr(
        compute, "layer_costs", lambda model, x: seen.append((model_device(model), x.device)) or real(model, x)
    )
    rows = api.roofline("tests.test_devices:shape_task", hardware="h200", device="meta")
    assert rows["layers"] and all(row["flops"] >= 0 for row in rows["layers"])
    assert seen == [(torch.device("meta"), torch.device("meta"))]  # counted where it would be measured


def test_the_device_lock_names_a_gpu_by_its_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_identity("cpu") == "cpu"

    class Props:
        uuid = "GPU-1234"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    assert device_identity("cuda:0") == "gpu-GPU-1234"


def test_each_worker_gets_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.study.workers import worker_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert worker_devices("cuda", 3) == [("cuda:0", "0"), ("cuda:0", "1"), ("cuda:0", "0")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert worker_devices("cuda", 2) == [("cuda:0", "3"), ("cuda:0", "5")]
    assert worker_devices("cuda:1", 2) == [("cuda:1", None)] * 2 and worker_devices("cpu", 1) == [("cpu", None)]


def test_running_out_of_device_memory_is_one_sentence() -> None:
    from pareto.errors import TechniqueError
    from pareto.study.assess import device_memory

    config = Config(batch_size=8)
    expected = r"ran out of memory on cpu at batch 8 \(OutOfMemoryError: CUDA out"
    with pytest.raises(TechniqueError, match=expected), device_memory(config, "cpu"):
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.cuda.OutOfMemoryError as exc:
            raise RuntimeError("wrapped by a technique") from exc
    with pytest.raises(ValueError), device_memory(config, "cpu"):
        raise ValueError("not memory")
