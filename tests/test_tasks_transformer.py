"""The built-in transformer task: a real trained encoder classifier, cached once and reused."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from pareto.task import AttentionShape, Task, load_task
from pareto.tasks import transformer

#: Training rows for these tests: 64 steps instead of the recipe's 160, to keep this file fast.
SHORT_TRAIN_SIZE = 2048


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # conftest's session cache, set here as well: module fixtures run before its autouse fixture
    path = tmp_path_factory.getbasetemp() / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARETO_CACHE_DIR", str(path))
        # a shorter recipe is a different recipe: its own cache file, never the full model's
        mp.setattr(transformer, "TRAIN_SIZE", SHORT_TRAIN_SIZE)
        yield path


@pytest.fixture(scope="module")
def task(cache_dir: Path) -> Task:
    return transformer.make_task()


def _cache_file(cache_dir: Path) -> Path:
    (path,) = cache_dir.glob("transformer-*.pt")
    return path


def _never_train(*args: object) -> dict[str, torch.Tensor]:
    raise AssertionError("the transformer was retrained instead of loaded from the cache")


def _int8(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def test_transformer_task_contract(task: Task) -> None:
    assert task.name == "transformer"
    assert task.batch_size == transformer.BATCH_SIZE == 32
    assert task.attention == AttentionShape(
        layers=transformer.LAYERS,
        width=transformer.WIDTH,
        sequence=transformer.SEQUENCE_LENGTH,
        heads=transformer.HEADS,
    )
    layers = [m for m in task.model.modules() if isinstance(m, nn.TransformerEncoderLayer)]
    assert len(layers) == transformer.LAYERS
    for layer in layers:
        assert layer.self_attn.batch_first and layer.self_attn.num_heads == transformer.HEADS
        assert type(layer.linear1) is nn.Linear and type(layer.linear2) is nn.Linear
        assert (layer.linear1.in_features, layer.linear1.out_features) == (transformer.WIDTH, transformer.FFN_WIDTH)


def test_transformer_is_accurate(task: Task) -> None:
    assert task.evaluate(task.model) > 0.75  # four balanced classes: chance is 0.25 (0.88 here, 0.97 in full)


def test_evaluate_scores_a_constant_model_at_chance(task: Task) -> None:
    class Constant(nn.Module):
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.zeros(len(tokens), transformer.CLASSES)

    assert task.evaluate(Constant()) == pytest.approx(0.25)  # the test split is exactly balanced


def test_labels_follow_the_majority_topic_and_are_deterministic() -> None:
    tokens, labels = transformer.sentences(200, seed=5)
    again_tokens, again_labels = transformer.sentences(200, seed=5)
    assert torch.equal(tokens, again_tokens) and torch.equal(labels, again_labels)
    counts = torch.stack(
        [torch.isin(tokens, torch.tensor(words)).sum(dim=1) for words in transformer.TOPIC_WORDS], dim=1
    )
    assert torch.equal(counts.argmax(dim=1), labels)
    top2 = counts.topk(2, dim=1).values
    assert (top2[:, 0] > top2[:, 1]).all()  # no ties for first
    assert torch.bincount(labels, minlength=transformer.CLASSES).tolist() == [50] * transformer.CLASSES


def test_example_input_is_real_token_sequences(task: Task) -> None:
    small = task.example_input(7)
    assert small.shape == (7, transformer.SEQUENCE_LENGTH) and small.dtype == torch.long
    assert int(small.min()) >= 0 and int(small.max()) < transformer.VOCAB_SIZE
    big = task.example_input(transformer.TEST_SIZE + 3)
    assert torch.equal(big[:7], small) and torch.equal(big[transformer.TEST_SIZE], big[0])
    with torch.inference_mode():
        logits = task.model(small)
    assert logits.shape == (7, transformer.CLASSES)


def test_train_data_is_minibatches_of_the_training_split(task: Task) -> None:
    batches = list(task.train_data or [])
    assert sum(len(targets) for _, targets in batches) == SHORT_TRAIN_SIZE
    for inputs, targets in batches:
        assert inputs.shape[1] == transformer.SEQUENCE_LENGTH and inputs.dtype == torch.long
        assert targets.dtype == torch.long and len(inputs) == len(targets)


def test_int8_dynamic_quantization_runs_and_keeps_accuracy(task: Task) -> None:
    quantized = _int8(task.model)
    layer = next(m for m in quantized.modules() if isinstance(m, nn.TransformerEncoderLayer))
    # the encoder's own Linears are swapped, not just the head's
    assert type(layer.linear1).__module__.startswith("torch.ao.nn.quantized.dynamic")
    with torch.inference_mode():
        assert quantized(task.example_input(4)).shape == (4, transformer.CLASSES)
    assert task.evaluate(quantized) >= task.evaluate(task.model) - 0.05


def test_the_cache_is_written_once_and_reused(task: Task, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARETO_CACHE_DIR", str(cache_dir))
    path = _cache_file(cache_dir)
    written = path.stat().st_mtime_ns
    monkeypatch.setattr(transformer, "_train", _never_train)
    again = load_task("transformer")
    assert path.stat().st_mtime_ns == written
    assert not list(cache_dir.glob("*.tmp"))
    for key, value in task.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[key], value), key


def test_a_corrupt_cache_file_is_replaced(
    task: Task, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARETO_CACHE_DIR", str(tmp_path))
    good = _cache_file(cache_dir)
    path = tmp_path / good.name
    path.write_bytes(good.read_bytes()[:1000])  # a half-written file left by some other tool
    monkeypatch.setattr(transformer, "_train", lambda x, y: task.model.state_dict())
    transformer.make_task()
    monkeypatch.setattr(transformer, "_train", _never_train)
    rebuilt = transformer.make_task()
    assert rebuilt.evaluate(rebuilt.model) == task.evaluate(task.model)  # the rewritten file loads
