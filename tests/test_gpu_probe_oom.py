"""CUDA paths checked on the CPU with stubs: the contention probe's busy work waits for its kernels,
running out of device memory while timing beside the baseline is one sentence, and ``pareto
techniques`` judges structured pruning on the device it is asked about."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import cli
from pareto.compress import Config, get_technique
from pareto.errors import TechniqueError, Transient

TINY = "tests.tiny_task:make_task"
FAST = ["--threads", "1", "--device", "cpu", "--samples", "100", "--warmup", "3", "--contention-limit", "50"]
OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 3.56 MiB is "
    "free. Including non-PyTorch memory, this process has 79.10 GiB memory in use. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


class _Gpu:
    """A host clock and a GPU's queue: a launch takes the host 10 µs and queues 0.5 ms of work; a
    synchronize waits until the queue is empty."""

    def __init__(self) -> None:
        self.now = self.drained_at = 0.0
        self.launches = self.syncs = 0

    def perf_counter(self) -> float:
        return self.now

    def matmul(self, a: torch.Tensor, _b: torch.Tensor) -> torch.Tensor:
        self.now += 10e-6
        self.drained_at = max(self.drained_at, self.now) + 0.5e-3
        self.launches += 1
        return a

    def synchronize(self) -> None:
        self.syncs += 1
        self.now = max(self.now, self.drained_at)


def test_the_probe_busy_work_waits_for_each_matmul_and_lasts_what_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.measure import probe as probe_module

    probe = probe_module.ContentionProbe("cpu", threads=1)
    assert f"reference {probe.reference_s:.2g} s" in probe.description  # what the reference cost is said
    gpu = _Gpu()
    monkeypatch.setattr(probe_module, "time", SimpleNamespace(perf_counter=gpu.perf_counter))
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: gpu.matmul(a, b))
    probe._sync = gpu.synchronize
    probe._work()
    assert gpu.launches > 1 and gpu.syncs == gpu.launches  # each matmul waited for before the next launch
    # the busy work ends with its 20 ms, not with a queue of kernels launched during them
    assert gpu.now <= probe_module._REFERENCE_WORK_S + 1e-3


def _stub_bench(device: str) -> Any:
    from pareto.devices import on_device
    from pareto.spec import Measure
    from pareto.study.bench import Bench
    from tests.tiny_task import make_task

    task = on_device(make_task(), "cpu")
    return Bench(None, task, device, 1, {}, None, Measure(device="cpu", threads=1, contention_limit=None))


def _stub_builds(monkeypatch: pytest.MonkeyPatch, alive: list[weakref.ref[nn.Module]], fail_on: str | None) -> None:
    from pareto.compress.served import Served
    from pareto.study import bench as _runs

    def build(bench: Any, config: Config) -> Any:
        if config.describe() == fail_on:
            raise RuntimeError("the technique failed") from torch.OutOfMemoryError(OOM)
        model = nn.Linear(16, 4)
        alive.append(weakref.ref(model))
        return _runs.Built(config, Served(model, model), 0.0)

    monkeypatch.setattr(_runs, "build", build)


def test_out_of_memory_while_timing_together_is_one_sentence_with_the_memory_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pareto.measure import latency
    from pareto.study import bench as _runs
    from pareto.study.assess import round_plan

    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    alive: list[weakref.ref[nn.Module]] = []
    _stub_builds(monkeypatch, alive, fail_on=None)

    def timed(items: Any, **_: Any) -> Any:
        raise torch.OutOfMemoryError(OOM)  # the warm-up of one of them

    monkeypatch.setattr(latency, "measure_interleaved", timed)
    bench = _stub_bench("cuda:0")
    int8 = Config(techniques=(get_technique("int8_dynamic"),), batch_size=8)
    with pytest.raises(Transient) as info:
        _runs.time_together(bench, [int8, Config(batch_size=8)], plan=round_plan(bench.measure, None), probe=None)
    message = str(info.value)
    assert message.startswith("int8_dynamic @ batch 8 and baseline @ batch 8, timed together, ran out of memory on ")
    assert "on cuda:0 at batch 8 (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 " in message
    assert message.endswith("of which 3.56 MiB is free); their memory was freed") and "\n" not in message
    assert emptied and len(alive) == 2
    gc.collect()
    assert all(ref() is None for ref in alive)  # the models built for the timing went before the cache was emptied


def test_out_of_memory_while_building_names_that_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.study import bench as _runs
    from pareto.study.assess import round_plan

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    alive: list[weakref.ref[nn.Module]] = []
    _stub_builds(monkeypatch, alive, fail_on="int8_dynamic @ batch 4")
    bench = _stub_bench("cuda:0")
    int8 = Config(techniques=(get_technique("int8_dynamic"),), batch_size=4)
    with pytest.raises(TechniqueError) as info:
        _runs.time_together(bench, [Config(batch_size=4), int8], plan=round_plan(bench.measure, None), probe=None)
    assert str(info.value).startswith("int8_dynamic @ batch 4 ran out of memory on cuda:0 at batch 4 (OutOfMemoryError")
    gc.collect()
    assert len(alive) == 1 and alive[0]() is None  # the baseline built before it is let go of, the error still held


def test_pareto_measure_out_of_memory_while_timing_is_one_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pareto.measure import latency

    def timed(items: Any, **_: Any) -> Any:
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(latency, "measure_interleaved", timed)
    code = cli.main(["measure", "--task", TINY, "--technique", "int8_dynamic", *FAST])
    line = _one_line(capsys.readouterr().err)
    assert code == 1
    assert line.startswith("Error: int8_dynamic @ batch 8 and baseline @ batch 8, timed together, ran out of memory")
    assert "on cpu at batch 8 (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in line


def test_measure_out_of_memory_while_evaluating_names_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.api import measure
    from pareto.study import assess

    def other_axes(*args: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(assess, "_other_axes", other_axes)
    with pytest.raises(Transient, match=r"^int8_dynamic @ batch 8 ran out of memory on cpu at batch 8 \(Out"):
        measure(TINY, techniques=["int8_dynamic"], device="cpu", threads=1, samples=100, warmup=3,
                       contention_limit=None, hardware=None)  # fmt: skip


def test_pareto_confirm_out_of_memory_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pareto.measure import latency
    from pareto.spec import SearchSpec
    from pareto.study.search import run_search

    db = f"sqlite:///{tmp_path}/pareto.db"
    spec = SearchSpec.model_validate(
        {
            "task": TINY,
            "study": "tiny",
            "slo": {"p99": "1s"},
            "search": {"n_trials": 2, "seed": 1, "confirm_top": 0},
            "measure": {"device": "cpu", "threads": 1, "warmup": 3, "contention_limit": None},
            "space": {"techniques": {"int8_dynamic": {}}},
        }
    )
    run_search(spec, db_url=db)

    def timed(items: Any, **_: Any) -> Any:
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(latency, "measure_interleaved", timed)
    code = cli.main(["confirm", "--study", "tiny", "--top", "1", "--db", db])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and line.startswith("Error: ") and "ran out of memory on cpu at batch 8" in line
    assert "(OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in line


def test_structured_pruning_is_judged_on_the_device_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The meta device stands in for a GPU: the trial run of ``prune_structured`` runs there, with
    the task's inputs there, as a bench on it would build it (before: on a CPU copy, by CPU rules)."""
    from pareto.compress import describe_techniques, prune
    from pareto.devices import model_device
    from tests.tiny_task import make_task

    seen: list[tuple[str, str]] = []

    def trial(self: Any, model: nn.Module, task: Any) -> nn.Module:
        seen.append((str(model_device(model)), str(task.example_input(1).device)))
        return model  # Torch-Pruning ranks channels by their values, which a meta tensor has not got

    monkeypatch.setattr(prune.StructuredPrune, "apply", trial)
    task = make_task()
    listing = {t["name"]: t for t in describe_techniques("meta", task)}
    assert seen == [("meta", "meta")]  # on the device asked, whose widths rule then applies (8 on CUDA)
    assert listing["prune_structured"]["available"] is True
    assert model_device(task.model).type == "cpu"  # the user's model stays where it was


@pytest.mark.parametrize(("device", "locked"), [("cuda:0", True), ("cpu", False)])
def test_the_probe_reference_is_timed_under_the_timing_lock_on_a_gpu_only(
    monkeypatch: pytest.MonkeyPatch, device: str, locked: bool
) -> None:
    from contextlib import contextmanager

    from pareto.measure import probe as probe_module
    from pareto.study import bench as _runs

    held: list[str] = []
    seen: list[bool] = []

    @contextmanager
    def timing_lock(name: str, **_: Any) -> Any:
        held.append(name)
        yield
        held.remove(name)

    class Probe:
        def __init__(self, device: str, **_: Any) -> None:
            seen.append(device in held)

    monkeypatch.setattr(_runs, "timing_lock", timing_lock)  # the bench's name for pareto.locks.timing_lock
    monkeypatch.setattr(probe_module, "ContentionProbe", Probe)
    bench = SimpleNamespace(device=device, threads=1, quiet_ms=None, measure=SimpleNamespace(contention_limit=1.5))
    assert isinstance(_runs.Bench.probe(bench), Probe)  # type: ignore[arg-type]
    assert seen == [locked] and held == []
