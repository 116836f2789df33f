"""The transformer-large task: trained once on a CUDA device, refused in one sentence where there is none.

Its full shape (about 150 M parameters) is trained on a GPU; here the same recipe and the same
factory run at a small width on the CPU, standing in for the device.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from pareto.errors import TaskError
from pareto.task import AttentionShape, load_task
from pareto.tasks import transformer_large as large
from pareto.tasks.transformer import sentences


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The recipe at width 64, two layers, 1 024 training sentences; a cache of its own."""
    monkeypatch.setenv("PARETO_CACHE_DIR", str(tmp_path))
    for name, value in {"WIDTH": 64, "HEADS": 4, "LAYERS": 2, "TRAIN_SIZE": 1024, "TEST_SIZE": 512}.items():
        monkeypatch.setattr(large, name, value)
    return tmp_path


def test_without_weights_or_a_gpu_the_task_refuses_in_one_sentence(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(large, "_training_device", lambda: None)
    with pytest.raises(TaskError, match=r"trained once on a CUDA GPU .* copy that machine's transformer-large-"):
        load_task("transformer-large")
    assert not list(small.iterdir()), "nothing is cached by a refusal"


def test_trained_on_the_device_cached_then_loaded(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained: list[torch.device] = []

    def train(*args: object, device: torch.device) -> dict[str, torch.Tensor]:
        trained.append(device)
        return large_train(*args, device=device)

    large_train = large.train
    monkeypatch.setattr(large, "_training_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(large, "train", train)
    task = load_task("transformer-large")
    assert trained == [torch.device("cpu")]
    assert (task.name, task.batch_size) == ("transformer-large", 32)
    assert task.attention == AttentionShape(layers=2, width=64, sequence=128, heads=4)
    assert task.example_input(task.batch_size).shape == (32, 128)
    # 64 steps of the recipe learn the topic counts well above chance (0.25), scored in slices
    assert task.evaluate(task.model) > 0.4
    (cached,) = small.glob("transformer-large-*.pt")
    monkeypatch.setattr(large, "_training_device", lambda: None)  # a second load never trains
    again = load_task("transformer-large")
    assert [p.name for p in small.glob("*.pt")] == [cached.name]
    assert trained == [torch.device("cpu")]
    assert again.evaluate(again.model) == task.evaluate(task.model)


def test_longer_sentences_keep_the_topic_density_and_the_short_ones_are_unchanged() -> None:
    short, labels = sentences(64, seed=5)
    assert short.shape == (64, 32)
    # the transformer task's data as it was before sentences took a length (its cached weights stay valid)
    digest = hashlib.sha256(short.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()[:16]
    assert digest == "25bcb215761fe548"
    long, long_labels = sentences(400, seed=5, length=128)
    assert long.shape == (400, 128)
    topic_words = (long < 32).sum(dim=1)
    assert int(topic_words.min()) >= 16 and int(topic_words.max()) <= 40
    assert torch.bincount(long_labels).tolist() == [100] * 4


def test_sliced_scoring_equals_scoring_in_one_forward() -> None:
    from pareto.tasks._cache import classification_task

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 32, 4)).eval()
    x, y = sentences(300, seed=1)
    whole = classification_task("t", model, x, y, batch_size=1)
    sliced = classification_task("t", model, x, y, batch_size=1, eval_batch=64)
    assert whole.evaluate(model) == sliced.evaluate(model)
    assert 0.0 < whole.evaluate(model) < 1.0
