"""int8_static: PT2E static int8 (X86 Inductor quantizer), served compiled with Inductor's freezing.

The first tests run everywhere (the capability check, the freezing wrapper); the rest need torchao,
which pareto installs (they skip where it does not import).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy import select
from torch import nn

import pareto.compress.compile as compile_module
import pareto.compress.pt2e as pt2e
from pareto._cli.cli import cli
from pareto.compress import Config, apply, describe_techniques, get_technique, why_not_here
from pareto.compress.compile import Compile, FrozenCompiled, reset_compiler
from pareto.compress.quantize import TORCHAO_HINT
from pareto.errors import TechniqueError
from pareto.measure.compute import compute_dtype, count_flops
from pareto.measure.memory import params_bytes
from pareto.spec import SearchSpec
from pareto.store.engine import open_engine, session_scope
from pareto.store.models import Trial
from pareto.study.search import run_search
from pareto.task import Task
from tests.tiny_task import make_conv_task

STATIC = Config(techniques=(get_technique("int8_static"),), batch_size=8, backend="compile")
HAS_PT2E = pt2e.pt2e_reason("cpu") is None
needs_pt2e = pytest.mark.skipif(not HAS_PT2E, reason=f"int8_static cannot run here: {pt2e.pt2e_reason('cpu')}")


def test_int8_static_is_served_compiled_and_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="int8_static runs on the compile backend, not on eager"):
        Config(techniques=(get_technique("int8_static"),), batch_size=8)
    assert "oneDNN's int8 kernels for x86 CPUs; the device is cuda:0" in str(pt2e.pt2e_reason("cuda:0"))
    if not hasattr(torch.export.Dim, "AUTO"):
        pytest.skip(f"torch {torch.__version__}: int8_static needs torch 2.6 or newer, checked before torchao")
    monkeypatch.setattr(pt2e.platform, "machine", lambda: "x86_64")  # the CPU is checked before torchao
    monkeypatch.setattr(pt2e, "_pt2e", lambda: (None, TORCHAO_HINT))
    assert pt2e.pt2e_reason("cpu") == TORCHAO_HINT
    if compile_module._compile_reason("cpu") is None:  # else the compile backend's own reason comes first
        assert why_not_here(STATIC, None, "cpu") == f"int8_static: {TORCHAO_HINT.rstrip('.')}"
    monkeypatch.setattr(pt2e.platform, "machine", lambda: "aarch64")
    assert pt2e.pt2e_reason("cpu") == "the X86 Inductor quantizer targets x86 CPUs; this machine is aarch64."
    row = next(t for t in describe_techniques("cpu") if t["name"] == "int8_static")
    assert row["backends"] == ["compile"] and row["family"] == "quantize"


def test_frozen_compiled_sets_freezing_only_while_a_new_signature_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as inductor_config

    seen: list[bool] = []

    def compiled(x: torch.Tensor, scale: int = 2) -> torch.Tensor:  # stands in for torch.compile's wrapper
        seen.append(bool(inductor_config.freezing))
        return x * scale

    model = nn.Identity()
    frozen = FrozenCompiled(model, "default")
    object.__setattr__(frozen, "_compiled", compiled)
    frozen(torch.ones(2, 3))  # a new shape: Dynamo and Inductor compile it, with freezing
    frozen(torch.ones(2, 3))  # seen: no setting touched
    frozen(torch.ones(5, 3))  # another batch: compiles again, with freezing
    with torch.inference_mode():
        frozen(torch.ones(5, 3))  # another grad mode is another graph for Dynamo
    frozen(torch.ones(3, 2).t())  # the same shape with other strides: Dynamo guards on strides too
    frozen(torch.ones(2, 3), 2)  # an int argument: Dynamo specializes on its value...
    frozen(torch.ones(2, 3), 3)  # ...so another value compiles again
    frozen(torch.ones(2, 3), 3)
    reset_compiler()  # every graph forgotten: the next call compiles again, so freezing is on again
    frozen(torch.ones(2, 3))
    assert seen == [True, False, True, True, True, True, True, False, True]
    assert inductor_config.freezing is False  # restored: other models compile as before
    assert frozen._orig_mod is model


def test_compile_freezes_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    if compile_module._compile_reason("cpu") is not None:
        pytest.skip(str(compile_module._compile_reason("cpu")))
    graph = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.randn(3, 4)
    task = Task(name="t", model=graph, example_input=lambda n: x[:n], evaluate=lambda m: 1.0, batch_size=3)
    step = Compile().build(graph, task, freezing=True)  # as the pipeline serves a technique's inductor_freezing
    served = step.module
    assert isinstance(served, FrozenCompiled) and step.seconds is not None and step.seconds > 0
    with torch.inference_mode():
        torch.testing.assert_close(served(x), graph(x), rtol=1e-4, atol=1e-5)
    plain = Compile().apply(nn.Sequential(nn.Linear(4, 4)).eval(), task)
    assert not isinstance(plain, FrozenCompiled)
    assert get_technique("int8_static").inductor_freezing and not get_technique("int8_dynamic").inductor_freezing


# --- with torchao ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conv() -> Task:
    return make_conv_task()


@needs_pt2e
def test_int8_static_stores_int8_weights_keeps_the_output_and_runs_at_any_batch(conv: Task) -> None:
    built = apply(conv.model, STATIC, conv)
    served = built.module
    assert isinstance(served, FrozenCompiled) and built.compile_s is not None and built.compile_s > 0
    graph = served._orig_mod
    assert graph is built.eager and built.inductor_freezing
    library = "torchao" if pt2e._pt2e()[1] == "torchao" else "torch.ao.quantization"
    assert built.requires == (library,)  # loading an export of the graph imports it
    weights = [t for t in (*graph.parameters(), *graph.buffers()) if t.dim() >= 2]
    assert weights and all(t.dtype == torch.int8 for t in weights)  # the float copies convert_pt2e leaves are gone
    assert params_bytes(served) < params_bytes(conv.model) / 3  # 4x on weights; scales and biases stay fp32
    assert built.compute_dtype == "int8" and compute_dtype(served, built.compute_dtype) == "int8"
    for batch in (8, 1, 13):  # traced with a dynamic batch; each new shape compiles (static shapes)
        x = conv.example_input(batch)
        with torch.inference_mode():
            out, ref = served(x), conv.model(x)
        assert out.shape == ref.shape == (batch, 10)
        assert nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.99  # calibrated ranges
    x = conv.example_input(8)
    assert count_flops(graph, x) == pytest.approx(count_flops(conv.model, x), rel=0.05)  # batch norms folded


@needs_pt2e
def test_the_served_graph_runs_onednn_int8_kernels_at_every_batch(conv: Task) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    served = apply(conv.model, STATIC, conv).module
    x = conv.example_input(13)  # a batch it was not built at: compiled now, with freezing
    with torch.inference_mode():
        _, code = run_and_get_code(served, x)
    kernels = "".join(code)
    assert (
        "onednn.qconv" in kernels and "onednn.qlinear" in kernels
    )  # without freezing: float convs on dequantized weights
    graphs = counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        served(x)  # the same signature: no new graph
    assert counters["stats"]["unique_graphs"] == graphs


@needs_pt2e
def test_int8_static_refuses_what_it_cannot_quantize(conv: Task) -> None:
    with pytest.raises(TechniqueError, match="int8_static quantizes a float32 model; drop fp16/bf16"):
        apply(conv.model, STATIC.model_copy(update={"techniques": (get_technique("bf16"), *STATIC.techniques)}), conv)
    with pytest.raises(ValueError, match="int8_dynamic and int8_static cannot share a configuration"):
        Config(
            techniques=(get_technique("int8_dynamic"), get_technique("int8_static")), batch_size=8, backend="compile"
        )
    dynamic = apply(conv.model, Config(techniques=(get_technique("int8_dynamic"),), batch_size=8), conv).module
    with pytest.raises(TechniqueError, match="use one integer quantization per configuration"):
        get_technique("int8_static").apply(dynamic, conv)  # applied one after the other anyway, it refuses

    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x) if x.sum() > 0 else -self.conv(x)  # a branch on a value: not exportable

    broken = dataclasses.replace(conv, model=DataDependent().eval())
    with pytest.raises(TechniqueError, match="int8_static: the model cannot be exported with torch.export"):
        apply(broken.model, STATIC, broken)


@needs_pt2e
def test_a_graph_the_quantizer_cannot_annotate_fails_the_trial_with_its_reason(
    conv: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(graph: object, quantizer: object) -> None:  # as torchao 0.18 does on MiniLM's linear + GELU
        raise IndexError("list index out of range")

    flow, library = pt2e._pt2e()
    monkeypatch.setattr(flow, "prepare", fails)
    with pytest.raises(TechniqueError) as caught:
        apply(conv.model, STATIC, conv)
    assert str(caught.value) == (
        f"int8_static: {library}'s X86 Inductor quantizer failed on this model's graph: "
        "IndexError: list index out of range"
    )


@needs_pt2e
def test_when_the_linear_activation_fusion_fails_the_linears_are_quantized_alone(
    conv: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow, _ = pt2e._pt2e()
    prepare = flow.prepare

    def fusion_fails(graph: object, quantizer: object) -> object:  # as torchao 0.18 does on MiniLM's linear + GELU
        if "_annotate_linear_unary" not in vars(quantizer):  # the fused pattern is still annotated
            raise IndexError("list index out of range")
        return prepare(graph, quantizer)

    monkeypatch.setattr(flow, "prepare", fusion_fails)
    served = apply(conv.model, STATIC, conv)
    (note,) = served.notes
    assert note.startswith("int8_static: linears quantized one by one") and "IndexError" in note
    x = conv.example_input(8)
    with torch.inference_mode():
        assert torch.allclose(served.module(x), conv.model(x), atol=0.1, rtol=0.1)
    assert any(t.dtype == torch.int8 for t in served.eager.buffers())  # the weights are int8 constants


def _spec(tmp_name: str) -> SearchSpec:
    return SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_conv_task",
            "study": tmp_name,
            "objectives": ["p99"],
            "slo": {"p99": "1s"},
            # on the tiny CNN's layers int8 is slower than float32 (the lever probe would leave it out): kept
            "search": {"n_trials": 3, "seed": 0, "sampler": "grid", "confirm_top": 1, "keep": ["int8_static"]},
            "measure": {"device": "cpu", "threads": 1, "warmup": 5, "contention_limit": 50},
            "space": {"backend": ["compile"], "techniques": {"int8_static": {}}},
        }
    )


@needs_pt2e
def test_a_search_measures_int8_static_and_exports_it_as_measured(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/p.db"
    result = run_search(_spec("pt2e"), db_url=db)
    with session_scope(open_engine(db)) as session:
        trials = session.scalars(select(Trial).where(Trial.state == "COMPLETE").order_by(Trial.id)).all()
        static = [t for t in trials if t.config.get("techniques")]
        assert len(static) == 1 and static[0].description == "int8_static on compile @ batch 8"
        number = static[0].optuna_number
        assert static[0].compile_s is not None and static[0].compile_s > 0  # kept apart from latency
    assert result.best is not None
    out = tmp_path / "artifact"
    command = ["export", "--study", "pt2e", "--trial", str(number), "-o", str(out), "--db", db]
    exported = CliRunner().invoke(cli, command)
    assert exported.exit_code == 0, exported.output
    manifest = json.loads((out / "manifest.json").read_text())
    load = manifest["artifact"]["load"]
    library = "torchao" if pt2e._pt2e()[1] == "torchao" else "torch.ao.quantization"
    assert load.startswith(f"import torch, torch._inductor.config, {library}; torch._inductor.config.freezing = True;")
    assert "dynamic=False" in load and any("recompile_limit" in note for note in manifest["serve"]["notes"])
    assert manifest["serve"]["torch_compile"]["inductor_config"] == {"freezing": True}
    check = manifest["reload_check"]
    assert check["passed"] and check["pareto_imported"] == [] and "compiled with Inductor's freezing" in check["method"]
    assert check["other_batch"]["matches"]  # compiled in the fresh process too: the same int8 kernels


def test_an_export_compares_torchao_versions_only_for_an_artifact_that_loads_it() -> None:
    from pareto.export.bundle import environment_differences

    here = {"device": "cpu", "cpu_model": "x", "torch_version": "2", "threads": 2, "torchao_version": "0.18.0"}
    before = {**here, "torchao_version": "0.17.0"}
    assert environment_differences(before, here) == []
    diff = environment_differences(before, here, torchao=True)
    assert diff == [{"field": "torchao_version", "measured": "0.17.0", "here": "0.18.0"}]
