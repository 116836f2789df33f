"""A user's own model as an ONNX file (``--model FOLDER/model.onnx``): read as its folder is, served by ONNX
Runtime as given, searched with ONNX Runtime's own passes, its FLOPs and activations counted on its graph, and
what it cannot be refused in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pareto._cli.cli import main
from pareto.errors import TaskError, UsageError
from pareto.spec import ONNX_SPACE, load_spec
from pareto.tasks.source import ModelSource
from tests.test_model_folder import FAST, _rows, folder, image_folder  # noqa: F401  (the fixtures)

pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _export(model_dir: Path, name: str, *, batch: bool = True, token_types: bool = True) -> Path:
    """The folder's classifier exported to ONNX as a user would (``torch.onnx.export``), written beside its config."""
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    ids = torch.randint(5, 20, (2, 16))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if token_types:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", max=64)} if batch else {}
    path = model_dir / name
    torch.onnx.export(
        model,
        (),
        str(path),
        kwargs=inputs,
        dynamo=True,
        dynamic_shapes={k: dims for k in inputs} if dims else None,
        input_names=list(inputs),
        output_names=["logits"],
    )
    return path


@pytest.fixture(scope="module")
def graph_file(folder: Path) -> Path:  # noqa: F811
    return _export(folder, "model.onnx")


def test_an_onnx_file_is_scored_and_timed_as_its_folder_is(folder: Path, graph_file: Path, tmp_path: Path) -> None:  # noqa: F811
    from pareto.compress.onnxrt import OrtModule
    from pareto.measure.compute import compute_cost
    from pareto.task import load_task

    data = _rows(tmp_path / "d.jsonl")
    eager = load_task(ModelSource.open(folder, data).ref())
    graph = load_task(ModelSource.open(graph_file, data).ref())
    assert graph.name == "my-classifier-model" and isinstance(graph.model, OrtModule)
    assert graph.evaluate(graph.model) == pytest.approx(eager.evaluate(eager.model), abs=0.01)
    args = eager.example_input(3)  # input_ids and attention_mask; the graph's token_type_ids are fed as zeros
    with torch.inference_mode():
        assert torch.allclose(graph.model(*args), eager.model(*args), atol=1e-4)
    assert graph.timing_inputs is not None
    assert len({ids.shape[1] for ids, _ in graph.timing_inputs(1)}) > 10  # each request at its own length
    cost = compute_cost(graph.model, args)
    torch_cost = compute_cost(eager.model, args)
    # counted on the graph: every product torch counts, and the attention's two products torch's count leaves out
    assert torch_cost.flops <= cost.flops <= 1.3 * torch_cost.flops
    assert "ONNX graph's MatMul/Gemm/Conv" in cost.method


def _tiny_graph() -> onnx.ModelProto:
    """A hand-built graph of input ``x``: MatMul [B, 8] x [8, 16], Relu, Gemm [B, 16] x [4, 16]^T."""
    from onnx import TensorProto, helper, numpy_helper

    weights = [
        numpy_helper.from_array(torch.randn(8, 16).numpy(), "w1"),
        numpy_helper.from_array(torch.randn(4, 16).numpy(), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_file_graph_is_fed_by_name_whatever_its_inputs_order() -> None:
    """Graphs of two inputs: (attention_mask, input_ids) in that order, and (input_ids, token_type_ids) with no
    mask; the task passes (input_ids, attention_mask) either way."""
    from onnx import TensorProto, helper

    from pareto.compress.onnxrt import OrtModule

    def graph(first: str, second: str) -> onnx.ModelProto:
        """``logits = input_ids - <the other input>``, the inputs declared in this order."""
        values = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "length"]) for n in (first, second)]
        other = second if first == "input_ids" else first
        nodes = [helper.make_node("Sub", ["input_ids", other], ["logits"])]
        out = helper.make_tensor_value_info("logits", TensorProto.INT64, ["batch", "length"])
        body = helper.make_graph(nodes, "g", values, [out])
        return helper.make_model(body, opset_imports=[helper.make_opsetid("", 17)])

    ids, mask = torch.tensor([[7, 8, 9]]), torch.tensor([[1, 1, 0]])
    swapped = OrtModule(graph("attention_mask", "input_ids"), None, given=("input_ids", "attention_mask"))
    assert torch.equal(swapped(ids, mask), ids - mask)
    no_mask = OrtModule(graph("input_ids", "token_type_ids"), None, given=("input_ids",))  # as load_onnx keeps it
    assert torch.equal(no_mask(ids, mask), ids)  # token_type_ids fed as zeros, the mask not taken for them
    assert [tuple(t.shape) for t in no_mask.graph_args((ids, mask))] == [(1, 3), (1, 3)]


def test_the_graph_is_counted_from_its_nodes() -> None:
    from pareto.measure.graph_cost import graph_cost

    cost = graph_cost(_tiny_graph().SerializeToString(), {"x": (3, 8)})  # at batch 3
    assert cost.flops == 2 * 3 * 8 * 16 + 2 * 3 * 16 * 4 and cost.uncounted == 0
    # h and r are alive together (Relu reads h, writes r); then r and y: the peak is 3 x 16 x 4 B x 2
    assert cost.activation_bytes == 2 * 3 * 16 * 4


def test_an_onnx_file_takes_onnx_runtimes_passes_only(graph_file: Path, tmp_path: Path) -> None:
    from pareto.api import techniques

    data = _rows(tmp_path / "d.jsonl")
    listing = {t["name"]: t for t in techniques(device="cpu", task=ModelSource.open(graph_file, data).ref())}
    for name in ("int8_dynamic", "bf16", "prune_structured", "compile"):
        assert not listing[name]["available"] and "a model read from an ONNX file" in listing[name]["reason"]
    assert listing["ort_int8_dynamic"]["available"] and listing["ort_fuse"]["available"]
    spec = load_spec(None, {"model": str(graph_file), "data": str(data)})
    assert spec.space.backend == ONNX_SPACE["backend"] and set(spec.space.techniques) == set(ONNX_SPACE["techniques"])
    assert spec.inputs.padding == "request"  # its own graph serves every length it was exported with
    with pytest.raises(UsageError, match="an ONNX file is served by ONNX Runtime, which the compile backend"):
        load_spec(None, {"model": str(graph_file), "data": str(data), "space.backend": ["compile"]})


def test_what_an_onnx_file_cannot_be_is_one_sentence(folder: Path, tmp_path: Path) -> None:  # noqa: F811
    from pareto.task import load_task

    data = _rows(tmp_path / "d.jsonl")
    static = _export(folder, "static.onnx", batch=False)
    broken = folder / "broken.onnx"
    broken.write_bytes(b"not a graph")
    other = folder / "other.onnx"
    onnx.save(_tiny_graph(), str(other))
    try:
        with pytest.raises(TaskError, match="other.onnx takes x; for this folder pareto gives it input_ids"):
            load_task(ModelSource.open(other, data).ref())
        with pytest.raises(TaskError, match="exported at a fixed batch of 2; a server batches requests"):
            load_task(ModelSource.open(static, data).ref())
        with pytest.raises(TaskError, match="broken.onnx cannot be read as an ONNX model"):
            load_task(ModelSource.open(broken, data).ref())
    finally:
        for leftover in (static, broken, other):
            leftover.unlink()


def test_search_an_onnx_file_end_to_end_and_export_its_pick(
    graph_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _rows(tmp_path / "d.jsonl")
    db = f"sqlite:///{tmp_path}/o.db"
    args = ["search", "--model", str(graph_file), "--data", str(data), "--slo-p99", "1s", "--db", db, *FAST]
    code = main([*args, "--n-trials", "2", "--confirm-top", "0", "--seed", "3", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["study"] == "my-classifier-model"
    baseline = next(c for c in result["frontier"] if c["trial"] == 0)
    assert "from the ONNX file as given" in baseline["metrics"]["method"] and baseline["metrics"]["flops"] > 0
    out = tmp_path / "artifact"
    code = main(["export", "--db", db, "--study", "my-classifier-model", "--trial", "0", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reload_check"]["passed"] and len(manifest["inputs"]) == 3  # the graph's own three inputs
    assert onnx.load(str(out / "model.onnx")).graph == onnx.load(str(graph_file)).graph  # the file's graph as measured


def test_an_onnx_file_on_onnx_runtime_with_no_technique_is_its_own_baseline(graph_file: Path, tmp_path: Path) -> None:
    from pareto.study.search import run_search

    data = _rows(tmp_path / "d.jsonl")
    fast = {"threads": 1, "device": "cpu", "samples": 60, "warmup": 2, "rounds": 3, "contention_limit": None}
    given = {"model": str(graph_file), "data": str(data), "space.techniques": {}, "search.n_trials": 3}
    spec = load_spec(None, {**given, "slo.p99": "1s", "search.confirm_top": 0, "measure": fast})
    result = run_search(spec, db_url=f"sqlite:///{tmp_path}/b.db")
    assert result.measured == 1 and result.repeats >= 1  # the bare onnxruntime configuration: a repeat of trial 0
    assert [c.trial for c in result.frontier] == [0]


def test_an_image_classifier_onnx_file_is_read_with_its_folders_processor(
    image_folder: tuple[Path, Path],  # noqa: F811
) -> None:
    import transformers

    from pareto.compress.onnxrt import OrtModule
    from pareto.task import load_task

    model_dir, images = image_folder
    model = transformers.AutoModelForImageClassification.from_pretrained(model_dir).eval()
    path = model_dir / "m.onnx"
    torch.onnx.export(
        model,
        (),
        str(path),
        kwargs={"pixel_values": torch.randn(2, 3, 32, 32)},
        dynamo=True,
        dynamic_shapes={"pixel_values": {0: torch.export.Dim("batch")}},
        input_names=["input"],  # a graph of one input is given the images whatever its input's name
        output_names=["logits"],
    )
    try:
        eager = load_task(ModelSource.open(model_dir, images).ref())
        graph = load_task(ModelSource.open(path, images).ref())
        assert isinstance(graph.model, OrtModule)
        assert graph.evaluate(graph.model) == pytest.approx(eager.evaluate(eager.model), abs=0.02)
        batch = eager.example_input(3)
        with torch.inference_mode():
            assert torch.allclose(graph.model(batch), eager.model(batch), atol=1e-4)
    finally:
        path.unlink()
