"""Recovery fine-tuning: a bounded number of training steps after pruning or low-rank factorization.

Also holds the training loop pieces distillation shares: batches cycled from ``train_data`` and a
seeded RNG scope that leaves the caller's random state untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from pareto.compress.base import Family, Technique, register
from pareto.compress.sparse import semi_structured_linears, to_dense_weights, to_semi_structured_weights
from pareto.devices import as_args, model_device
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Seed of every training run a technique makes: the same configuration trains the same model.
TRAIN_SEED = 0
#: The most steps a technique may train for: a search trial must stay bounded.
MAX_STEPS = 100_000


def no_train_data_reason(technique_name: str) -> str:
    return f"{technique_name} needs the task's train_data (an iterable of (inputs, targets)); this task has none."


@contextlib.contextmanager
def seeded(device: torch.device) -> Iterator[None]:
    """Seed torch's RNGs (CPU and ``device``) for the block, restoring the caller's state after it."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(TRAIN_SEED)
        yield


def train_batches(train_data: Iterable[Any], steps: int, technique: Technique) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Yield ``steps`` ``(args, targets)`` pairs, passing over ``train_data`` again as often as needed.

    Inputs may be a tensor or a tuple/list of them (the model is called as ``model(*args)``); they sit
    on the model's device already (the bench's task view). A one-shot iterator ends the run after its
    single pass.

    Raises:
        TechniqueError: ``train_data`` yields nothing, or an item is not an ``(inputs, targets)`` pair.
    """
    done = 0
    while done < steps:
        before = done
        for item in train_data:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise TechniqueError(
                    f"{technique.describe()}: train_data items must be (inputs, targets) pairs, "
                    f"got {type(item).__name__}."
                )
            inputs, targets = item
            yield as_args(inputs), targets
            done += 1
            if done >= steps:
                return
        if done == before:
            if done == 0:
                raise TechniqueError(f"{technique.describe()}: the task's train_data yielded no batch.")
            return  # an iterator that is spent after one pass


def _teacher_outputs(teacher: nn.Module, args: tuple[Any, ...]) -> torch.Tensor:
    """The uncompressed model's outputs on ``args`` (the bench's reference model, on the same device)."""
    was_training = teacher.training
    teacher.eval()
    try:
        return teacher(*args)
    finally:
        teacher.train(was_training)


def check_trainable(technique: Technique) -> None:
    """Raise TechniqueError when autograd is off for the caller (training needs it)."""
    if torch.is_inference_mode_enabled():
        raise TechniqueError(f"{technique.describe()}: cannot train inside torch.inference_mode().")


@register
class FineTune(Technique):
    """Train the compressed model for ``steps`` batches of the task's ``train_data`` (Adam).

    Recovers accuracy lost to pruning or low-rank factorization; runs before quantization. An
    ``(inputs, labels)`` item trains on cross-entropy with the labels; an ``(inputs, None)`` item, for
    a task without labels (a sentence encoder, say), trains by distillation: mean squared error to
    the uncompressed model's outputs on the same inputs (``task.model``, the teacher, left unchanged).
    Weights that are exactly zero when it starts (unstructured, 2:4 pruning) are held at zero after
    every step, so sparsity is not undone. Deterministic (seeded; the caller's RNG state is restored).

    Args:
        steps: Optimizer steps (batches); ``train_data`` is passed over again as needed.
        lr: Adam's learning rate.
    """

    name: ClassVar[str] = "finetune"
    artifact_note: ClassVar[str | None] = "the fine-tuned weights in the same layers"
    family: ClassVar[Family] = "finetune"
    summary: ClassVar[str] = (
        "bounded recovery training on train_data: labels, or the uncompressed model's outputs; zeros stay zero"
    )

    steps: int = Field(default=100, ge=1, le=MAX_STEPS)
    lr: float = Field(default=1e-4, gt=0, le=1)

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is not None and task.train_data is None:
            return no_train_data_reason(self.name)
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` after ``steps`` Adam steps on ``task.train_data``, in eval mode.

        Raises:
            TechniqueError: no train_data, nothing trainable, or inside ``torch.inference_mode``.
        """
        if task.train_data is None:
            raise TechniqueError(f"{self.describe()}: {no_train_data_reason(self.name)}")
        check_trainable(self)
        packed = semi_structured_linears(model)
        to_dense_weights(packed)  # trained dense with their 2:4 zeros held, packed again after
        params = [p for p in model.parameters() if p.is_floating_point()]
        if not params:
            raise TechniqueError(f"{self.describe()}: the model has no floating-point parameter to train.")
        trainable = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad_(True)
        # the zeros a pruning step left in weight matrices; biases and vectors are never masks
        masks = [(p, p != 0) for p in params if p.dim() >= 2 and bool((p == 0).any())]
        device = model_device(model)
        teacher = task.model
        optimizer = torch.optim.Adam(params, lr=self.lr)
        with seeded(device), torch.enable_grad():
            model.train()
            for args, targets in train_batches(task.train_data, self.steps, self):
                optimizer.zero_grad(set_to_none=True)
                outputs = model(*args)
                if targets is None:  # no labels: match the uncompressed model
                    with torch.no_grad():
                        wanted = _teacher_outputs(teacher, args)
                    loss = nn.functional.mse_loss(outputs.float(), wanted.float())
                else:
                    loss = nn.functional.cross_entropy(outputs, targets)
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    for p, mask in masks:
                        p.mul_(mask)
        model.eval()
        for p, flag in zip(params, trainable, strict=True):
            p.requires_grad_(flag)
        to_semi_structured_weights(packed)
        return model
