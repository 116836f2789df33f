"""Techniques that train: distillation into a smaller student and recovery fine-tuning."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from pareto.compress import Config, apply, get_technique
from pareto.compress.distill import Distill
from pareto.compress.finetune import FineTune
from pareto.compress.prune import UnstructuredPrune
from pareto.errors import TechniqueError
from pareto.task import Task


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, linearly separable with a margin: real signal, learnt in a few steps."""
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, 16, generator=g)
    return x, (x @ directions).argmax(dim=1)


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.inference_mode():
        return float((model.eval()(x).argmax(dim=1) == y).float().mean())


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    # tiny tensors: thread wake-ups would cost more than the math
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task(_one_thread: None) -> Task:
    x, y = _data(512, seed=1)
    x_test, y_test = _data(256, seed=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        teacher = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4)
        )
        optimizer = torch.optim.Adam(teacher.parameters(), lr=1e-2)
        for _ in range(80):
            optimizer.zero_grad()
            nn.functional.cross_entropy(teacher(x), y).backward()
            optimizer.step()
    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 512, 64)]
    return Task(
        name="separable",
        model=teacher.eval(),
        example_input=lambda b: x_test[:b],
        evaluate=lambda m: _accuracy(m, x_test, y_test),
        train_data=batches,
        batch_size=8,
    )


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- distillation ---------------------------------------------------------------------------------


def test_distill_trains_a_smaller_student_that_beats_chance_clearly(task: Task) -> None:
    assert task.evaluate(task.model) > 0.85
    technique = Distill(width_ratio=0.25, depth=2, steps=150, lr=1e-2)
    threads = torch.get_num_threads()
    student = apply(task.model, Config(techniques=(technique,), batch_size=8), task).module
    assert torch.get_num_threads() == threads
    linears = [m for m in student if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(16, 16), (16, 4)]
    assert _n_params(student) < _n_params(task.model) / 10
    assert task.evaluate(student) > 0.75  # chance is 0.25


def test_distill_keeps_the_depth_and_copies_activations_by_default(task: Task) -> None:
    student = Distill(steps=5).apply(copy.deepcopy(task.model), task)
    assert [type(m) for m in student] == [type(m) for m in task.model]
    assert [m.out_features for m in student if isinstance(m, nn.Linear)] == [32, 32, 4]


def test_distill_is_deterministic_and_leaves_the_callers_rng_alone(task: Task) -> None:
    state = torch.get_rng_state()
    first = Distill(steps=20).apply(copy.deepcopy(task.model), task)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)  # the caller's seed does not matter
    second = Distill(steps=20).apply(copy.deepcopy(task.model), task)
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_distill_soft_targets_only(task: Task) -> None:
    student = Distill(alpha=1.0, width_ratio=0.5, steps=100, lr=1e-2).apply(copy.deepcopy(task.model), task)
    assert task.evaluate(student) > 0.75


def test_distill_is_unavailable_without_train_data(task: Task) -> None:
    bare = Task(name="no-data", model=task.model, example_input=task.example_input, evaluate=task.evaluate)
    reason = Distill().available("cpu", bare)
    assert reason == "distill needs the task's train_data (an iterable of (inputs, targets)); this task has none."
    with pytest.raises(TechniqueError, match="needs the task's train_data"):
        Distill().apply(copy.deepcopy(task.model), bare)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (nn.Sequential(nn.Linear(16, 8), nn.LayerNorm(8), nn.Linear(8, 4)), "holds a LayerNorm"),
        (nn.TransformerEncoderLayer(16, 4), "this model is a TransformerEncoderLayer"),
        (nn.Sequential(nn.ReLU()), "no nn.Linear layer"),
    ],
    ids=["layernorm", "transformer", "no-linear"],
)
def test_distill_names_what_it_cannot_shrink(task: Task, model: nn.Module, message: str) -> None:
    other = Task(name="x", model=model, example_input=task.example_input, evaluate=task.evaluate, train_data=[])
    reason = Distill().available("cpu", other)
    assert reason is not None and message in reason
    with pytest.raises(TechniqueError, match=message):
        Distill().apply(model, other)


def test_distill_refuses_a_student_no_smaller_or_deeper(task: Task) -> None:
    with pytest.raises(TechniqueError, match="no smaller than the teacher"):
        Distill(width_ratio=1.0).apply(copy.deepcopy(task.model), task)
    with pytest.raises(TechniqueError, match="deeper than the teacher's 3 Linear layers"):
        Distill(depth=4).apply(copy.deepcopy(task.model), task)


def test_distill_reports_empty_or_malformed_train_data(task: Task) -> None:
    empty = Task(name="x", model=task.model, example_input=task.example_input, evaluate=task.evaluate, train_data=[])
    with pytest.raises(TechniqueError, match="yielded no batch"):
        Distill(steps=3).apply(copy.deepcopy(task.model), empty)
    bad = Task(
        name="x",
        model=task.model,
        example_input=task.example_input,
        evaluate=task.evaluate,
        train_data=[torch.randn(4, 16)],
    )
    with pytest.raises(TechniqueError, match=r"\(inputs, targets\) pairs"):
        Distill(steps=3).apply(copy.deepcopy(task.model), bad)


def test_a_one_shot_iterator_ends_training_after_its_pass(task: Task) -> None:
    batches = list(task.train_data or [])
    once = Task(
        name="x", model=task.model, example_input=task.example_input, evaluate=task.evaluate, train_data=iter(batches)
    )
    student = Distill(steps=1000).apply(copy.deepcopy(task.model), once)  # 8 batches, then it stops
    assert isinstance(student, nn.Sequential)


# --- recovery fine-tuning -------------------------------------------------------------------------


def test_finetune_keeps_pruned_zeros_zero_and_recovers_accuracy(task: Task) -> None:
    prune = UnstructuredPrune(sparsity=0.9)
    pruned = apply(task.model, Config(techniques=(prune,), batch_size=8), task).module
    tuned = apply(task.model, Config(techniques=(prune, FineTune(steps=60, lr=1e-2)), batch_size=8), task).module
    for before, after in zip(pruned.modules(), tuned.modules(), strict=True):
        if isinstance(before, nn.Linear):
            assert torch.equal(after.weight == 0, before.weight == 0)
    assert task.evaluate(tuned) > task.evaluate(pruned)
    assert task.evaluate(tuned) > 0.8
    assert all(p.requires_grad for p in tuned.parameters())  # flags as they were


def test_finetune_is_unavailable_without_train_data(task: Task) -> None:
    bare = Task(name="no-data", model=task.model, example_input=task.example_input, evaluate=task.evaluate)
    assert FineTune().available("cpu", bare) == (
        "finetune needs the task's train_data (an iterable of (inputs, targets)); this task has none."
    )
    assert FineTune().available("cpu") is None  # without a task only the device is judged
    with pytest.raises(TechniqueError, match="needs the task's train_data"):
        FineTune().apply(copy.deepcopy(task.model), bare)


def test_training_inside_inference_mode_is_refused(task: Task) -> None:
    with torch.inference_mode(), pytest.raises(TechniqueError, match="inference_mode"):
        get_technique("finetune", {"steps": 1}).apply(copy.deepcopy(task.model), task)


def test_finetune_without_labels_distils_from_the_uncompressed_model(task: Task) -> None:
    assert task.train_data is not None
    unlabelled = [(inputs, None) for inputs, _ in task.train_data]
    encoder = Task(
        name="no-labels",
        model=task.model,
        example_input=task.example_input,
        evaluate=task.evaluate,
        train_data=unlabelled,
    )
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    prune = get_technique("prune_structured", {"ratio": 0.75})
    pruned = apply(task.model, Config(techniques=(prune,), batch_size=8), encoder).module
    tuned = apply(task.model, Config(techniques=(prune, FineTune(steps=100, lr=1e-2)), batch_size=8), encoder).module
    x = torch.cat([inputs for inputs, _ in unlabelled])
    with torch.inference_mode():
        reference = task.model(x)
        gap_pruned = nn.functional.mse_loss(pruned(x), reference).item()
        gap_tuned = nn.functional.mse_loss(tuned(x), reference).item()
    assert gap_tuned < gap_pruned / 2  # closer to the teacher's outputs, without a label
    assert task.evaluate(tuned) > task.evaluate(pruned)
    for key, value in task.model.state_dict().items():  # the teacher is left as it was
        assert torch.equal(value, before[key]), key
