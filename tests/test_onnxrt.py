"""The onnxruntime backend: export, ORT's int8 quantization, accounting, search, CLI and export artifact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy import select
from torch import nn

from pareto._cli.cli import cli
from pareto.compress import Config, apply, backend_reason, describe_techniques, get_technique
from pareto.compress.onnxrt import OrtModule, device_reason
from pareto.errors import TechniqueError
from pareto.measure.compute import compute_cost, compute_dtype, count_flops
from pareto.measure.memory import activation_bytes, params_bytes
from pareto.spec import SearchSpec
from pareto.store.engine import open_engine, session_scope
from pareto.store.models import Trial
from pareto.study.samplers import grid, space_size
from pareto.study.search import Quiet, run_search
from pareto.task import Task
from tests.test_cli import one_sentence, pareto
from tests.tiny_task import make_conv_task, make_task

pytest.importorskip("onnxruntime", reason="the onnxruntime backend needs pip install 'pareto-slo[onnx]'")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

TINY = "tests.tiny_task:make_task"
ORT = Config(batch_size=8, backend="onnxruntime")
ORT_INT8 = Config(techniques=(get_technique("ort_int8_dynamic"),), batch_size=8, backend="onnxruntime")


@pytest.fixture(scope="module")
def task() -> Task:
    return make_task()


def test_the_served_graph_computes_the_model_at_any_batch(task: Task) -> None:
    served = apply(task.model, ORT, task)
    module, source = served.module, served.source
    assert isinstance(module, OrtModule) and served.compile_s is not None and served.compile_s > 0
    assert source is served.eager and served.ready is not None and served.notes[0].startswith("served by ONNX Runtime")
    for batch in (1, 8, 13):  # exported at 8: the batch axis is dynamic
        x = task.example_input(batch)
        with torch.inference_mode():
            torch.testing.assert_close(module(x), task.model(x), rtol=1e-4, atol=1e-5)
    # the session holds the graph's initializers: the same bytes as the model's fp32 weights and biases
    assert params_bytes(module) == params_bytes(task.model)
    assert compute_dtype(module, served.compute_dtype) == "fp32"
    x = task.example_input(8)
    assert compute_cost(module, x, source=source).flops == count_flops(task.model, x) > 0  # on the exported module
    assert activation_bytes(module, x, "cpu", source=source) == activation_bytes(task.model, x, "cpu")


def test_ort_int8_dynamic_stores_int8_weights_and_keeps_the_output(task: Task) -> None:
    served = apply(task.model, ORT_INT8, task)
    x = task.example_input(8)
    with torch.inference_mode():
        out, ref = served.module(x), task.model(x)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert (out.argmax(1) == ref.argmax(1)).float().mean() >= 0.75  # int8: close, not equal
    assert params_bytes(served.module) < params_bytes(task.model) / 2.5  # 4x on weights, biases and scales in fp32
    assert compute_dtype(served.module, served.compute_dtype) == "int8"
    assert len(served.notes) == 1 and served.source is served.eager  # the quantized graph, from the same export
    assert served.compile_s is not None and served.compile_s > 0  # the export and both sessions
    channels = Config(
        techniques=(get_technique("ort_int8_dynamic", {"per_channel": True}),), batch_size=8, backend="onnxruntime"
    )
    per_channel = apply(task.model, channels, task).module
    assert params_bytes(per_channel) > params_bytes(served.module)  # one scale per output channel


def test_ort_int8_static_calibrates_convs_on_the_training_inputs() -> None:
    conv = make_conv_task()
    config = Config(techniques=(get_technique("ort_int8_static"),), batch_size=8, backend="onnxruntime")
    served = apply(conv.model, config, conv)
    x = conv.example_input(8)
    with torch.inference_mode():
        out, ref = served.module(x), conv.model(x)
    assert out.shape == ref.shape
    assert nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.98  # int8 ranges calibrated
    assert params_bytes(served.module) < params_bytes(conv.model) / 2.5
    assert compute_dtype(served.module, served.compute_dtype) == "int8"
    assert "ort_int8_static" in {t["name"] for t in describe_techniques("cpu") if t["backends"] == ["onnxruntime"]}


def test_a_backend_is_part_of_the_configuration() -> None:
    eager = Config(batch_size=8)
    assert "backend" not in eager.to_dict() and eager.is_baseline  # keys of stored eager trials are unchanged
    assert ORT.to_dict()["backend"] == "onnxruntime" and not ORT.is_baseline and ORT.key() != eager.key()
    assert ORT.describe() == "uncompressed on onnxruntime @ batch 8"
    assert ORT_INT8.describe().endswith(" on onnxruntime @ batch 8")
    assert Config.from_dict(ORT_INT8.to_dict()) == ORT_INT8
    with pytest.raises(ValidationError, match="ort_int8_dynamic runs on the onnxruntime backend, not on eager"):
        Config(techniques=(get_technique("ort_int8_dynamic"),), batch_size=8)
    with pytest.raises(ValidationError, match="compile runs on the eager backend"):
        Config(techniques=(get_technique("compile"),), batch_size=8, backend="onnxruntime")
    with pytest.raises(ValidationError, match="int8_dynamic runs on the eager or compile backend"):
        Config(techniques=(get_technique("int8_dynamic"),), batch_size=8, backend="onnxruntime")


def test_where_the_backend_cannot_serve_it_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend_reason("onnxruntime", "cpu") is None and backend_reason("eager", "cuda:0") is None
    assert "CPU execution provider; the device is cuda:0" in str(device_reason("cuda:0"))
    import pareto.compress.onnxrt as module

    module.onnxruntime_reason.cache_clear()
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    try:
        assert "needs onnxruntime, which is not installed; install it with: pip install" in str(device_reason("cpu"))
    finally:
        module.onnxruntime_reason.cache_clear()


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # Python control flow on a value: torch.export cannot trace it
            return self.linear(x)
        return -self.linear(x)


def test_a_model_that_cannot_be_exported_fails_with_the_reason(task: Task) -> None:
    import dataclasses

    broken = dataclasses.replace(task, model=_DataDependent().eval())
    with pytest.raises(TechniqueError, match="cannot be exported to ONNX"):
        apply(broken.model, ORT, broken)


def test_ort_int8_dynamic_on_a_torch_module_is_refused(task: Task) -> None:
    with pytest.raises(TechniqueError, match="runs on the onnxruntime backend only"):
        get_technique("ort_int8_dynamic").apply(task.model, task)


def test_the_space_draws_only_techniques_that_run_on_the_backend() -> None:
    techniques = {"int8_dynamic": {}, "ort_int8_dynamic": {"per_channel": [False, True]}}
    assert space_size([8], techniques) == 2  # eager: int8 on or off
    assert space_size([8], techniques, ["onnxruntime"]) == 3  # ORT: int8 off, per tensor, per channel
    assert space_size([8], techniques, ["eager", "onnxruntime"]) == 5
    points = grid([8], techniques, 5, ["eager", "onnxruntime"])
    assert {p["backend"] for p in points} == {"eager", "onnxruntime"}
    assert not any("ort_int8_dynamic" in p for p in points if p["backend"] == "eager")


def _spec(**changes: object) -> SearchSpec:
    data = {
        "task": TINY,
        "study": "tiny-ort",
        "slo": {"p99": "1s"},
        "search": {"n_trials": 4, "seed": 1, "confirm_top": 1},
        "measure": {"device": "cpu", "threads": 1, "warmup": 5, "contention_limit": 50},
        "space": {
            "backend": ["onnxruntime"],
            "techniques": {"int8_dynamic": {}, "prune_structured": {"ratio": [0.5]}, "ort_int8_dynamic": {}},
        },
    }
    data.update(changes)
    # int8 on the tiny MLP is slower than float32 (the lever probe would leave it out): kept
    data["search"] = {"keep": ["int8_dynamic", "ort_int8_dynamic"], **data["search"]}  # type: ignore[dict-item]
    return SearchSpec.model_validate(data)


def test_a_search_serves_every_configuration_on_onnxruntime_beside_the_eager_baseline(db_url: str) -> None:
    notices: list[str] = []

    class Reporter(Quiet):
        def notice(self, message: str) -> None:
            notices.append(message)

    result = run_search(_spec(), db_url=db_url, reporter=Reporter())
    assert any("Skipping technique int8_dynamic: it runs on the eager or compile backend" in n for n in notices)
    with session_scope(open_engine(db_url)) as session:
        trials = session.scalars(select(Trial).where(Trial.state == "COMPLETE").order_by(Trial.id)).all()
        assert trials[0].is_baseline and "backend" not in trials[0].config  # the model as the user has it
        served = [t for t in trials if not t.is_baseline]
        assert served and all(t.config["backend"] == "onnxruntime" for t in served)
        assert all(t.description.endswith(" on onnxruntime @ batch 8") for t in served)
        assert all(t.compile_s is not None and t.compile_s > 0 for t in served)  # export + session, not latency
        assert all(t.config["techniques"] == [] or t.config["techniques"][0]["name"] != "int8_dynamic" for t in served)
    assert result.best is not None and result.best.config.get("backend") == "onnxruntime"
    assert math.isfinite(result.best.metrics["speedup_p99"])  # over the eager baseline of the same run


def test_cli_measure_and_search_name_a_bad_backend_in_one_sentence(tmp_path: Path) -> None:
    bad = pareto("measure", "--task", TINY, "--backend", "onnxruntime", "--technique", "int8_dynamic", cwd=tmp_path)
    assert bad.returncode == 2
    assert one_sentence(bad) == "Error: int8_dynamic runs on the eager or compile backend, not on onnxruntime."
    unknown = pareto("search", "--task", TINY, "--backend", "tensorrt", cwd=tmp_path)
    assert unknown.returncode == 2 and "'tensorrt' is not one of 'eager', 'compile', 'onnxruntime'" in unknown.stderr


def test_export_writes_the_measured_onnx_graph(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/p.db"
    run_search(_spec(search={"n_trials": 3, "seed": 1, "confirm_top": 0}), db_url=db)
    with session_scope(open_engine(db)) as session:
        number = session.scalars(
            select(Trial.optuna_number).where(Trial.state == "COMPLETE", Trial.is_baseline.is_(False))
        ).first()
    assert number is not None
    out = tmp_path / "artifact"
    result = CliRunner().invoke(
        cli, ["export", "--study", "tiny-ort", "--trial", str(number), "-o", str(out), "--db", db]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["artifact"]["format"] == "onnx" and (out / "model.onnx").is_file()
    assert manifest["artifact"]["load"].startswith("import onnxruntime; options = onnxruntime.SessionOptions()")
    assert 'allow_spinning", "0")' in manifest["artifact"]["load"]
    assert manifest["serve"]["backend"] == "onnxruntime" and manifest["reload_check"]["passed"]
    assert manifest["reload_check"]["pareto_imported"] == []  # loaded in a fresh process without pareto


def test_an_onnxruntime_only_space_is_tried_to_its_end(db_url: str) -> None:
    # 3 configurations on onnxruntime and the eager baseline, which is stored beside them: 4 in all
    space = {"backend": ["onnxruntime"], "techniques": {"ort_int8_dynamic": {"per_channel": [False, True]}}}
    result = run_search(_spec(space=space, search={"n_trials": 10, "seed": 1, "confirm_top": 0}), db_url=db_url)
    assert result.exhausted == "all 4 configurations of the search space were tried in this environment"
    with session_scope(open_engine(db_url)) as session:
        keys = set(session.scalars(select(Trial.config_key).where(Trial.state == "COMPLETE")).all())
    assert len(keys) == 4


def test_backends_keep_one_order_whatever_the_command_line_says(tmp_path: Path) -> None:
    from pareto.study.search import prepare

    space = {"backend": ["onnxruntime", "eager"], "techniques": {"int8_dynamic": {}}}
    setup = prepare(_spec(space=space), f"sqlite:///{tmp_path}/p.db", Quiet())
    assert setup.backends == ("eager", "onnxruntime")  # Optuna's categorical must not change order in a study


def test_what_onnx_runtime_cannot_hold_fails_the_trial_with_a_reason(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Branchy(nn.Module):  # control flow on the data: torch.export cannot trace it
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(TechniqueError, match="cannot be exported to ONNX: TorchExportError: Failed") as caught:
        apply(Branchy(), ORT, task)
    assert "\x1b[" not in str(caught.value)  # the exporter's terminal colours are not kept

    def unloadable(*args: object, **kwargs: object) -> None:
        raise TypeError("can't convert np.ndarray of type bfloat16")

    monkeypatch.setattr(OrtModule, "__init__", unloadable)
    with pytest.raises(TechniqueError, match="exported graph cannot be loaded: TypeError: can't convert"):
        apply(task.model, ORT, task)


def test_the_session_is_opened_at_the_timed_thread_count_before_the_first_call(task: Task) -> None:
    from pareto.measure.latency import RoundPlan, measure_latency

    served = apply(task.model, ORT, task)
    module = served.module
    assert isinstance(module, OrtModule)
    threads = torch.get_num_threads()
    opened: list[int] = []

    def ready() -> None:
        assert served.ready is not None
        served.ready()
        opened.append(module._threads)

    plan = RoundPlan(samples=4, rounds=1, warmup=0)
    measure_latency(module, task.example_input(8), device="cpu", plan=plan, threads=1, ready=ready)
    assert opened == [1] and module._threads == 1 and torch.get_num_threads() == threads


def test_an_export_compares_onnx_runtime_versions_only_for_a_graph_it_serves() -> None:
    from pareto.export.bundle import environment_differences

    here = {"device": "cpu", "cpu_model": "x", "torch_version": "2", "threads": 2, "onnxruntime_version": "1.32.0"}
    before = {**here, "onnxruntime_version": None}
    assert environment_differences(before, here) == []  # an eager trial: ORT's version changes nothing
    diff = environment_differences(before, here, onnxruntime=True)
    assert diff == [{"field": "onnxruntime_version", "measured": None, "here": "1.32.0"}]


def test_a_batch_of_one_is_exported_with_a_dynamic_batch(task: Task) -> None:
    import dataclasses

    single = dataclasses.replace(task, batch_size=1)
    served = apply(single.model, Config(batch_size=1, backend="onnxruntime"), single).module
    for batch in (1, 5):  # traced on two rows: torch.export would have fixed an axis of size 1
        with torch.inference_mode():
            x = task.example_input(batch)
            torch.testing.assert_close(served(x), task.model(x), rtol=1e-4, atol=1e-5)


def test_the_compile_backend_compiles_after_every_technique(task: Task) -> None:
    pytest.importorskip("torch._dynamo")
    if backend_reason("compile", "cpu") is not None:
        pytest.skip(str(backend_reason("compile", "cpu")))
    config = Config(techniques=(get_technique("prune_structured", {"ratio": 0.5}),), batch_size=8, backend="compile")
    built = apply(task.model, config, task)
    served = built.module
    assert built.compile_s is not None and built.compile_s > 0  # torch.compile's first call, warmed up
    assert served._orig_mod is built.eager  # torch.compile's wrapper around the pruned model
    with torch.inference_mode():
        x = task.example_input(8)
        torch.testing.assert_close(served(x), served._orig_mod(x), rtol=1e-4, atol=1e-5)  # kernels may reorder sums
    assert "compile" not in {t.name for t in config.techniques} and config.describe().endswith(" on compile @ batch 8")


class _FeedForward(nn.Module):
    """A transformer's feed-forward block: what ONNX Runtime's optimizer fuses (MatMul + bias + GELU)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(32, 128), nn.Linear(128, 32), nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(nn.functional.gelu(self.up(x))))


def test_ort_fuse_fuses_before_the_quantizer_and_says_when_there_is_nothing_to_fuse(task: Task) -> None:
    import onnx

    from pareto.errors import NoEffect

    torch.manual_seed(0)
    x = torch.randn(16, 10, 32)
    block = Task(name="ffn", model=_FeedForward().eval(), example_input=lambda b: x[:b], evaluate=lambda m: 1.0)
    fuse = get_technique("ort_fuse")
    fused = apply(block.model, Config(techniques=(fuse,), batch_size=4, backend="onnxruntime"), block)
    ops = {n.op_type for n in onnx.load_from_string(fused.module.onnx_bytes).graph.node}
    assert "BiasGelu" in ops  # ONNX Runtime's contrib operator
    with torch.inference_mode():
        assert torch.allclose(fused.module(x[:4]), block.model(x[:4]), atol=1e-4)
    # listed after the quantizer in the configuration, applied before it: the int8 graph holds the fusion
    both = Config(techniques=(get_technique("ort_int8_dynamic"), fuse), batch_size=4, backend="onnxruntime")
    assert [t.name for t in both.techniques] == ["ort_int8_dynamic", "ort_fuse"]
    quantized = apply(block.model, both, block)
    ops = {n.op_type for n in onnx.load_from_string(quantized.module.onnx_bytes).graph.node}
    assert "BiasGelu" in ops and "MatMulInteger" in ops
    with pytest.raises(NoEffect, match="found nothing to fuse"):  # the MLP has no GELU, no attention
        apply(task.model, Config(techniques=(fuse,), batch_size=8, backend="onnxruntime"), task)
