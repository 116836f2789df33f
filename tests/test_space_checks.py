"""The lever probe: each CPU lever timed beside float32 on a layer of the task's widths decides the space."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sqlalchemy import select
from torch import nn

from pareto.spec import SearchSpec
from pareto.store.engine import open_engine, session_scope
from pareto.store.models import TechniqueCheck, Trial
from pareto.study import search as search_module
from pareto.study import space_checks
from pareto.study.search import run_search
from pareto.task import Task

QUICK = {"device": "cpu", "threads": 1, "samples": 40, "rounds": 4, "warmup": 2, "contention_limit": 50}


def test_the_probe_layer_is_the_linear_that_carries_the_most_flops() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 4)).eval()
    x = torch.randn(32, 16)
    task = Task(name="t", model=model, example_input=lambda b: x[:b], evaluate=lambda m: 1.0)
    layer = space_checks.probe_layer(task, 8)
    assert layer is not None
    linear = layer.module
    assert isinstance(linear, nn.Linear) and (linear.in_features, linear.out_features) == (16, 256)
    assert linear is not model[0] and torch.equal(linear.weight, model[0].weight)  # a copy
    assert layer.inputs.shape == (8, 16) and layer.describe() == "16→256 linear at 8 rows"
    probe = layer.task()
    assert probe.example_input(20).shape == (20, 16)  # any batch, from the input it saw
    # a CNN: its convolutions carry the FLOPs, not its linear head
    cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    images = Task(name="c", model=cnn.eval(), example_input=lambda b: torch.randn(b, 3, 16, 16), evaluate=lambda m: 1.0)
    conv = space_checks.probe_layer(images, 2)
    assert conv is not None and isinstance(conv.module, nn.Conv2d)
    assert conv.describe() == "3→32 3×3 convolution on 2×16×16"
    flat = nn.Sequential(nn.ReLU()).eval()
    nothing = Task(name="r", model=flat, example_input=lambda b: torch.randn(b, 4), evaluate=lambda m: 1.0)
    assert space_checks.probe_layer(nothing, 2) is None


def test_each_lever_is_timed_beside_float32_on_the_same_backend() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(128, 256).eval().requires_grad_(False)
    layer = space_checks.ProbeLayer(linear, torch.randn(64, 128), "128→256 linear at 64 rows")
    speeds = space_checks.lever_speeds(layer, {"int8_dynamic": {}, "bf16": {}}, ("eager",), threads=1)
    for name in ("int8_dynamic", "bf16"):
        eager = speeds[name]["per_backend"]["eager"]
        assert eager["lever_p50_ms"] > 0 and eager["float_p50_ms"] > 0
        assert eager["speedup"] == pytest.approx(eager["float_p50_ms"] / eager["lever_p50_ms"])
        assert speeds[name]["best"] == eager["speedup"] and not speeds[name]["failed"]
        assert "interleaved" in speeds[name]["method"] and "128→256 linear at 64 rows" in speeds[name]["method"]
    # the same float32 timing for both: one interleaved run
    assert (
        speeds["bf16"]["per_backend"]["eager"]["float_p50_ms"]
        == speeds["int8_dynamic"]["per_backend"]["eager"]["float_p50_ms"]
    )


def _spec(**search: Any) -> SearchSpec:
    return SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_task",
            "study": "levers",
            "slo": {"p99": "1s"},
            "search": {"n_trials": 6, "seed": 0, "confirm_top": 0, "sampler": "random", **search},
            "measure": QUICK,
            "space": {"techniques": {"bf16": {}, "int8_dynamic": {}, "prune_structured": {"ratio": [0.25, 0.5]}}},
        }
    )


def _slow_bf16(layer: Any, levers: dict[str, Any], backends: Any, *, threads: Any, guard: Any = None) -> dict[str, Any]:
    calls.append(sorted(levers))
    speed = {"bf16": 0.2, "int8_dynamic": 1.5}
    return {
        name: {
            "per_backend": {"eager": {"lever_p50_ms": 1 / speed[name], "float_p50_ms": 1.0, "speedup": speed[name]}},
            "best": speed[name],
            "failed": {},
            "method": "stub",
        }
        for name in levers
    }


calls: list[list[str]] = []


def test_a_lever_slower_than_float32_leaves_the_space_unless_kept(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls.clear()
    monkeypatch.setattr(space_checks, "isolated_lever_speeds", _slow_bf16)
    monkeypatch.setattr(space_checks, "cpu_facts", lambda name: "not native (no AMX or AVX-512 BF16)")
    notices: list[str] = []

    class Collect(search_module.Quiet):
        def notice(self, message: str) -> None:
            notices.append(message)

    run_search(_spec(), db_url=db_url, reporter=Collect())
    [said] = [n for n in notices if n.startswith("Leaving out bf16")]
    assert "0.20× on eager the speed of float32" in said and "not native" in said and "search.keep" in said
    assert not any(n.startswith("Leaving out int8_dynamic") for n in notices)
    with session_scope(open_engine(db_url)) as session:
        descriptions = session.scalars(select(Trial.description)).all()
        stored = session.scalars(select(TechniqueCheck).where(TechniqueCheck.kind == "pays")).all()
    assert not any("bf16" in d for d in descriptions) and any("int8_dynamic" in d for d in descriptions)
    assert {c.technique: c.ok for c in stored} == {"bf16": False, "int8_dynamic": True}
    assert calls == [["bf16", "int8_dynamic"]]
    # the next run reads the probe from the database; a lever named in search.keep is not probed at all
    notices.clear()
    run_search(_spec(keep=["bf16"], n_trials=2), db_url=db_url, reporter=Collect())
    assert calls == [["bf16", "int8_dynamic"]]
    assert not any(n.startswith("Leaving out bf16") for n in notices)
    with session_scope(open_engine(db_url)) as session:
        assert any("bf16" in d for d in session.scalars(select(Trial.description)).all())


def test_keep_names_levers_only() -> None:
    from pareto.errors import UsageError
    from pareto.spec import load_spec

    with pytest.raises(UsageError, match="not one of the CPU levers"):
        load_spec(None, {"search.keep": ["lowrank"]})


def _abort(*_: object) -> None:
    import os

    os.abort()  # what a native crash (a double free in a compiled kernel) does to the process


def test_a_probe_that_crashes_its_process_ends_the_probe_not_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = space_checks.ProbeLayer(nn.Linear(8, 8).eval(), torch.randn(4, 8), "8→8 linear at 4 rows")
    said = space_checks._in_child(layer, {"bf16": {}}, ("eager",), 1, target=_abort)
    assert isinstance(said, str) and "ended with exit code" in said
    # the whole probe's process dies: each lever alone, and one that still cannot be timed is kept
    runs: list[list[str]] = []

    def child(layer: Any, levers: dict[str, Any], backends: Any, threads: Any, target: Any = None, **_: Any) -> Any:
        runs.append(sorted(levers))
        if len(levers) > 1 or "bf16" in levers:
            return "the probe's process ended with exit code -6"
        return {name: {"per_backend": {}, "best": 1.5, "failed": {}, "method": "m"} for name in levers}

    monkeypatch.setattr(space_checks, "_in_child", child)
    speeds = space_checks.isolated_lever_speeds(layer, {"bf16": {}, "int8_dynamic": {}}, ("eager",), threads=1)
    assert runs == [["bf16", "int8_dynamic"], ["bf16"], ["int8_dynamic"]]
    assert speeds["int8_dynamic"]["best"] == 1.5
    assert speeds["bf16"]["best"] is None and "exit code -6" in speeds["bf16"]["failed"]["probe"]


def test_a_busy_machine_keeps_a_lever_the_probe_could_not_judge(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lever probe is guarded as trials are: bf16's rounds all discarded for contention (a probe that
    always reads busy) leaves it unjudged, so it is searched (never dropped on a noisy reading), said in one
    line, and not stored (a later search probes it again)."""
    from pareto.measure.probe import ContentionProbe, ProbeReading

    guards: list[Any] = []

    def busy_speeds(layer: Any, levers: dict[str, Any], backends: Any, *, threads: Any, guard: Any = None) -> Any:
        guards.append(guard)
        probe = guard.probe(threads)
        # every round of the lever probe busy: nothing is judged; the trials after it read the machine
        with pytest.MonkeyPatch.context() as busy:
            busy.setattr(ContentionProbe, "read", lambda self: ProbeReading(1.0, 99.0))
            return space_checks.lever_speeds(layer, levers, backends, threads=threads, guard=_Fixed(probe))

    class _Fixed:
        def __init__(self, probe: ContentionProbe) -> None:
            self._probe = probe

        def probe(self, threads: Any) -> ContentionProbe:
            return self._probe

    monkeypatch.setattr(space_checks, "isolated_lever_speeds", busy_speeds)
    monkeypatch.setattr(space_checks, "PROBE_ROUNDS", 3)
    notices: list[str] = []

    class Collect(search_module.Quiet):
        def notice(self, message: str) -> None:
            notices.append(message)

    run_search(_spec(n_trials=2), db_url=db_url, reporter=Collect())
    assert guards and guards[0] is not None and guards[0].limit > 1
    assert not any(n.startswith("Leaving out bf16") for n in notices)
    assert any(n.startswith("Keeping bf16: the machine stayed busy") for n in notices)
    with session_scope(open_engine(db_url)) as session:
        stored = session.scalars(select(TechniqueCheck).where(TechniqueCheck.kind == "pays")).all()
    assert "bf16" not in {c.technique for c in stored}
