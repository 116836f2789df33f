"""A user's own model as a ``torch.export`` program (``--model FOLDER/model.pt2``): read as its folder is, searched
with what runs on a graph, its shapes respected, and what it cannot be refused in one sentence."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from pareto._cli.cli import main
from pareto.compress.onnxrt import onnxruntime_reason
from pareto.errors import TaskError
from pareto.spec import PROGRAM_SPACE, load_spec
from pareto.tasks.program import Program
from pareto.tasks.source import ModelSource
from tests.test_model_folder import FAST, _rows, folder, image_folder  # noqa: F401  (the fixtures)

pytest.importorskip("transformers")


def _export(model_dir: Path, name: str, *, batch: bool = True, length: bool = True, kwargs: bool = True) -> Path:
    """The folder's model exported as a user would, each axis dynamic or not, written beside its config."""
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    ids = torch.randint(5, 20, (2, 16))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    dims = {0: torch.export.Dim("batch", max=1024)} if batch else {}
    if length:
        dims[1] = torch.export.Dim("length", max=64)
    shapes = {k: dims for k in inputs} if dims else None
    if kwargs:
        program = torch.export.export(model, (), inputs, dynamic_shapes=shapes)
    else:
        program = torch.export.export(
            model, tuple(inputs.values()), dynamic_shapes=tuple(shapes.values()) if shapes else None
        )
    path = model_dir / name
    torch.export.save(program, str(path))
    return path


@pytest.fixture(scope="module")
def program(folder: Path) -> Path:  # noqa: F811
    return _export(folder, "model.pt2")


def test_a_program_is_scored_and_timed_as_its_folder_is(folder: Path, program: Path, tmp_path: Path) -> None:  # noqa: F811
    from pareto.task import load_task

    data = _rows(tmp_path / "d.jsonl")
    eager = load_task(ModelSource.open(folder, data).ref())
    graph = load_task(ModelSource.open(program, data).ref())
    assert graph.name == "my-classifier-model" and graph.evaluation_rows == eager.evaluation_rows
    assert isinstance(graph.model, Program) and not isinstance(eager.model, Program)
    assert graph.evaluate(graph.model) == eager.evaluate(eager.model)
    args = eager.example_input(3)
    with torch.inference_mode():
        assert torch.allclose(graph.model(*args), eager.model(*args), atol=1e-5)
    assert graph.timing_inputs is not None
    assert len({ids.shape[1] for ids, _ in graph.timing_inputs(1)}) > 10  # its dynamic length: each request's own
    positional = _export(folder, "positional.pt2", kwargs=False)
    called = load_task(ModelSource.open(positional, data).ref())
    assert called.evaluate(called.model) == eager.evaluate(eager.model)


def test_a_program_exported_at_one_length_pads_every_request_to_it(folder: Path, tmp_path: Path) -> None:  # noqa: F811
    from pareto.task import load_task

    data = _rows(tmp_path / "d.jsonl")
    fixed = _export(folder, "fixed.pt2", length=False)
    task = load_task(ModelSource.open(fixed, data).ref())
    assert task.timing_inputs is not None
    assert {ids.shape[1] for ids, _ in task.timing_inputs(2)} == {16}
    assert "fixed.pt2 was exported at 16 tokens only" in (task.inputs_note or "")
    assert 0.0 <= task.evaluate(task.model) <= 1.0


def test_what_a_program_cannot_be_is_one_sentence(folder: Path, tmp_path: Path) -> None:  # noqa: F811
    from pareto.task import load_task

    data = _rows(tmp_path / "d.jsonl")
    static = _export(folder, "static.pt2", batch=False, length=False)
    with pytest.raises(TaskError, match="exported at a fixed batch of 2; a server batches requests"):
        load_task(ModelSource.open(static, data).ref())
    broken = folder / "broken.pt2"
    broken.write_bytes(b"not a program")
    with pytest.raises(TaskError, match="broken.pt2 cannot be read as a torch.export program"):
        load_task(ModelSource.open(broken, data).ref())
    for leftover in (static, broken):
        leftover.unlink()


def test_a_program_takes_the_techniques_that_run_on_a_graph(folder: Path, program: Path, tmp_path: Path) -> None:  # noqa: F811
    from pareto.api import techniques

    data = _rows(tmp_path / "d.jsonl")
    listing = {t["name"]: t for t in techniques(device="cpu", task=ModelSource.open(program, data).ref())}
    assert not listing["int8_dynamic"]["available"] and "no nn.Linear" in listing["int8_dynamic"]["reason"]
    assert not listing["lowrank"]["available"]
    assert listing["compile"]["available"] and listing["bf16"]["available"]
    spec = load_spec(None, {"model": str(program), "data": str(data)})
    assert spec.inputs.padding == "max"  # the graph backends serve one shape
    served = [b for b in PROGRAM_SPACE["backend"] if b != "onnxruntime" or onnxruntime_reason() is None]
    assert spec.space.backend == served  # ONNX Runtime where installed
    assert set(spec.space.techniques) == set(PROGRAM_SPACE["techniques"])
    said = load_spec(
        None, {"model": str(program), "data": str(data), "inputs.padding": "request", "space.backend": ["eager"]}
    )
    assert said.inputs.padding == "request" and said.space.backend == ["eager"]


def test_search_a_program_end_to_end(program: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    data = _rows(tmp_path / "d.jsonl")
    db = f"sqlite:///{tmp_path}/p.db"
    args = ["search", "--model", str(program), "--data", str(data), "--slo-p99", "1s", "--db", db, *FAST]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # every warning the search lets through, as a terminal would show it
        code = main(
            [*args, "--backend", "onnxruntime", "--n-trials", "2", "--confirm-top", "0", "--seed", "3", "--json"]
        )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert not [w for w in seen if "treespec" in str(w.message)], [str(w.message) for w in seen]
    result = json.loads(captured.out)
    assert result["study"] == "my-classifier-model"
    served = [c for c in result["frontier"] if c["config"]["backend"] == "onnxruntime"]
    assert served, result["frontier"]
    assert "every request padded to 64 tokens" in served[0]["metrics"]["method"]


def test_an_image_classifier_program_is_read_with_its_folders_processor(
    image_folder: tuple[Path, Path],  # noqa: F811
) -> None:
    import transformers

    from pareto.task import load_task

    model_dir, images = image_folder
    model = transformers.AutoModelForImageClassification.from_pretrained(model_dir).eval()

    class Images(torch.nn.Module):  # a user's wrapper: one input, named x, a tensor out
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=x).logits

    dims = {"x": {0: torch.export.Dim("batch", max=256)}}
    program = torch.export.export(Images().eval(), (torch.randn(2, 3, 32, 32),), dynamic_shapes=dims)
    torch.export.save(program, model_dir / "m.pt2")
    try:
        eager = load_task(ModelSource.open(model_dir, images).ref())
        graph = load_task(ModelSource.open(model_dir / "m.pt2", images).ref())
        assert isinstance(graph.model, Program)  # the program, not the folder's own weights
        assert graph.evaluate(graph.model) == eager.evaluate(eager.model)
        batch = eager.example_input(3)
        with torch.inference_mode():
            assert torch.allclose(graph.model(batch), eager.model(batch), atol=1e-5)
    finally:
        (model_dir / "m.pt2").unlink()
