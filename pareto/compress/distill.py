"""Distillation family: a narrower or shallower student trained to match the teacher's outputs."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, ClassVar, cast

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from pareto.compress.base import Family, Technique, register
from pareto.compress.finetune import (
    MAX_STEPS,
    check_trainable,
    no_train_data_reason,
    seeded,
    train_batches,
)
from pareto.devices import model_device
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Modules a student copies as they are: they act on each feature alone and hold no width of their own.
_PASSTHROUGH = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.Softplus,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.Dropout,
    nn.AlphaDropout,
    nn.Identity,
    nn.Flatten,
)


@register
class Distill(Technique):
    """Train a smaller student of the same ``nn.Sequential``-of-``nn.Linear`` shape on the teacher's logits.

    The student keeps the teacher's input and output widths, scales every hidden width by
    ``width_ratio`` (at least 1 unit) and keeps the first ``depth - 1`` hidden layers plus the output
    layer; activations, dropout and flatten modules are copied. It starts from a fresh (seeded)
    initialization and trains for ``steps`` batches of ``task.train_data`` with Adam on
    ``alpha * T² * KL(teacher_T || student_T) + (1 - alpha) * CE(student, targets)``, where ``_T``
    is a softmax at temperature ``T``. Deterministic; the caller's RNG state is restored.

    Only models that are an ``nn.Sequential`` (nested ones included) of ``nn.Linear`` layers and
    elementwise modules can be shrunk this way; anything else raises ``TechniqueError``.

    Args:
        width_ratio: Student hidden widths as a fraction of the teacher's.
        depth: ``nn.Linear`` layers the student keeps (the output layer included); None: as many as the teacher.
        temperature: Softmax temperature of the soft targets (higher: softer).
        alpha: Weight of the soft-target loss; ``1 - alpha`` weighs cross-entropy on the hard labels.
        steps: Optimizer steps (batches); ``train_data`` is passed over again as needed.
        lr: Adam's learning rate.
    """

    name: ClassVar[str] = "distill"
    artifact_note: ClassVar[str | None] = (
        "the trained student (a plain nn.Sequential); the teacher is not in the artifact"
    )
    family: ClassVar[Family] = "distill"
    summary: ClassVar[str] = "train a narrower/shallower MLP student on the teacher's logits (train_data)"

    width_ratio: float = Field(default=0.5, gt=0, le=1)
    depth: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=4.0, gt=0, le=100)
    alpha: float = Field(default=0.9, ge=0, le=1)
    steps: int = Field(default=200, ge=1, le=MAX_STEPS)
    lr: float = Field(default=1e-3, gt=0, le=1)

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is None:
            return None
        if task.train_data is None:
            return no_train_data_reason(self.name)
        layers = _mlp_layers(task.model)
        return layers if isinstance(layers, str) else None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return a trained student in eval mode; ``model`` is the teacher and is left unchanged.

        Raises:
            TechniqueError: no train_data, a model it cannot shrink, a student no smaller than the
                teacher, or a depth beyond the teacher's.
        """
        if task.train_data is None:
            raise TechniqueError(f"{self.describe()}: {no_train_data_reason(self.name)}")
        check_trainable(self)
        device = model_device(model)
        with seeded(device), device:  # the student is made where the teacher is
            student = self._student(model)
            self._train(model.eval(), student, task)
        return student.eval()

    def _student(self, teacher: nn.Module) -> nn.Sequential:
        layers = _mlp_layers(teacher)
        if isinstance(layers, str):
            raise TechniqueError(f"{self.describe()}: {layers}")
        linear_at = [i for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
        depth = self.depth or len(linear_at)
        if depth > len(linear_at):
            raise TechniqueError(
                f"{self.describe()}: depth {depth} is deeper than the teacher's {len(linear_at)} Linear layers."
            )
        # keep what precedes the first Linear, the first depth-1 hidden blocks, and the output block
        kept = layers[: linear_at[0]]
        for block in range(depth - 1):
            end = linear_at[block + 1]
            kept += layers[linear_at[block] : end]
        kept += layers[linear_at[-1] :]
        student: list[nn.Module] = []
        width = cast(nn.Linear, layers[linear_at[0]]).in_features
        last = sum(isinstance(m, nn.Linear) for m in kept) - 1
        seen = 0
        for module in kept:
            if not isinstance(module, nn.Linear):
                student.append(copy.deepcopy(module))
                continue
            out = module.out_features if seen == last else max(1, round(self.width_ratio * module.out_features))
            student.append(nn.Linear(width, out, bias=module.bias is not None, dtype=module.weight.dtype))
            width, seen = out, seen + 1
        result = nn.Sequential(*student)
        if _n_params(result) >= _n_params(teacher):
            raise TechniqueError(
                f"{self.describe()}: the student would be no smaller than the teacher; lower width_ratio or depth."
            )
        return result

    def _train(self, teacher: nn.Module, student: nn.Sequential, task: Task) -> None:
        assert task.train_data is not None
        device = model_device(student)
        optimizer = torch.optim.Adam(student.parameters(), lr=self.lr)
        t = self.temperature
        student.train()
        with torch.enable_grad():
            for args, targets in train_batches(task.train_data, self.steps, self):
                with torch.no_grad():
                    soft = teacher(*args)
                logits = student(*args)
                loss = torch.zeros((), device=device)
                if self.alpha > 0:
                    kl = F.kl_div(
                        F.log_softmax(logits / t, dim=-1),
                        F.log_softmax(soft / t, dim=-1),
                        reduction="batchmean",
                        log_target=True,
                    )
                    loss = loss + self.alpha * t * t * kl  # T² keeps the gradient scale independent of T
                if self.alpha < 1 and targets is not None:  # an unlabelled item teaches by soft targets alone
                    loss = loss + (1 - self.alpha) * F.cross_entropy(logits, targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()


def _mlp_layers(model: nn.Module) -> list[nn.Module] | str:
    """The leaf modules of an ``nn.Sequential`` MLP in order, or why ``model`` is not one."""
    if not isinstance(model, nn.Sequential):
        return (
            "distill builds students for nn.Sequential models of nn.Linear layers and elementwise "
            f"activations; this model is a {type(model).__name__}."
        )
    layers: list[nn.Module] = []
    stack: list[nn.Module] = list(reversed(list(model)))
    while stack:
        module = stack.pop()
        if isinstance(module, nn.Sequential):
            stack.extend(reversed(list(module)))
        else:
            layers.append(module)
    width = None
    for module in layers:
        if type(module) is nn.Linear:
            if width is not None and module.in_features != width:
                return f"distill: a Linear expects {module.in_features} inputs after {width} outputs."
            width = module.out_features
        elif isinstance(module, nn.Flatten) and width is not None:
            return "distill: an nn.Flatten after the first Linear layer is not supported."
        elif not isinstance(module, _PASSTHROUGH):
            return (
                "distill builds students for nn.Sequential models of nn.Linear layers and elementwise "
                f"activations; this model holds a {type(module).__name__}."
            )
    if width is None:
        return "distill: the model has no nn.Linear layer to shrink."
    return layers


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
