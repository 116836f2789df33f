"""Low-rank family: replace linear layers by two thin factors from a truncated SVD."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import Field, model_validator
from torch import nn
from torch.nn.utils import skip_init
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from pareto.compress.base import Family, Technique, register, round_up, width_multiple
from pareto.devices import as_args
from pareto.errors import NoEffect, TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task


@register
class LowRank(Technique):
    """Factor each ``nn.Linear(in, out)`` as ``Linear(in, r) -> Linear(r, out)``, ``W ≈ U_r S_r V_rᵀ``.

    The rank comes from exactly one of two rules: ``rank_ratio`` gives
    ``r = max(1, round(rank_ratio * min(in, out)))``; ``energy`` gives the smallest ``r`` whose top
    singular values hold that fraction of ``sum(s**2)`` (so each layer gets the rank its spectrum
    needs). A layer is left alone when the two factors would hold as many weights as the original
    (``r * (in + out) >= in * out``), when ``r`` would fall under ``min_rank``, and, unless
    ``keep_head`` is off, when it is the model's head: a layer whose output is the model's output
    (found by running ``task.example_input(1)`` once). A classifier head is narrow (10 classes, say),
    so a rank ratio leaves it a handful of directions and the accuracy goes with them, while it
    holds a small share of the compute.

    Args:
        rank_ratio: Kept rank as a fraction of each layer's full rank.
        energy: Kept fraction of each layer's squared singular values (its Frobenius norm squared).
        keep_head: Leave the layers whose output is the model's output unfactored.
        min_rank: Leave a layer unfactored when its rank would be under this.
    """

    name: ClassVar[str] = "lowrank"
    artifact_note: ClassVar[str | None] = "each factorized Linear as two thin Linears (W ≈ U·V)"
    family: ClassVar[Family] = "lowrank"
    summary: ClassVar[str] = "truncated-SVD factorization of each Linear but the head, where the factors are smaller"
    example: ClassVar[dict[str, float]] = {"rank_ratio": 0.25}

    rank_ratio: float | None = Field(default=None, gt=0, le=1)
    energy: float | None = Field(default=None, gt=0, le=1)
    keep_head: bool = True
    leaves_layers: ClassVar[bool] = True
    min_rank: int = Field(default=8, ge=1)

    @model_validator(mode="after")
    def _one_rule(self) -> LowRank:
        if (self.rank_ratio is None) == (self.energy is None):
            raise ValueError("give exactly one of rank_ratio and energy")
        return self

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is None:
            return None
        linears = [m for m in task.model.modules() if type(m) is nn.Linear]
        if not linears:
            return "the model has no nn.Linear layer to factorize."
        if self.keep_head:
            try:
                head = output_linears(task.model, task)
            except TechniqueError as exc:
                return str(exc)
            if all(m in head for m in linears):
                return "the model's only nn.Linear layers are its head, which is kept (keep_head=false factorizes it)."
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with its ``nn.Linear`` layers swapped for factor pairs where that is smaller.

        Raises:
            NoEffect: no layer would get smaller at this rank ratio (the configuration is the same without it).
        """
        head = output_linears(model, task) if self.keep_head else set()
        if type(model) is nn.Linear:
            factored = None if model in head else self._factorize(model)
            if factored is None:
                raise NoEffect(self.name, self._nothing_to_do())
            return factored
        factorized = 0
        for prefix, parent in list(model.named_modules()):
            for child_name, child in list(parent.named_children()):
                # exact type: subclasses such as MultiheadAttention's out_proj are read as plain weights;
                # packed weights (2:4 sparse) are not factorized; a layer the study learned to leave alone
                if type(child) is not nn.Linear or is_traceable_wrapper_subclass(child.weight) or child in head:
                    continue
                if self.leaves(f"{prefix}.{child_name}" if prefix else child_name):
                    continue
                factored = self._factorize(child)
                if factored is not None:
                    setattr(parent, child_name, factored)
                    factorized += 1
        if factorized == 0:
            raise NoEffect(self.name, self._nothing_to_do())
        return model

    @torch.no_grad()
    def _factorize(self, linear: nn.Linear) -> nn.Sequential | None:
        """The factor pair replacing ``linear``, or None when it would not be smaller."""
        n_in, n_out = linear.in_features, linear.out_features
        multiple = width_multiple(linear.weight.device)
        if self.rank_ratio is not None:
            rank = round_up(max(1, round(self.rank_ratio * min(n_in, n_out))), multiple)
            if rank < self.min_rank or _not_smaller(rank, n_in, n_out):
                return None  # decided before the SVD, which is the expensive part
        u, s, vh = torch.linalg.svd(linear.weight.float(), full_matrices=False)
        if self.energy is not None:
            rank = round_up(_rank_for_energy(s, self.energy), multiple)
        if rank < self.min_rank or _not_smaller(rank, n_in, n_out):
            return None
        # split the singular values evenly so both factors have the same scale
        root = s[:rank].sqrt()
        factory = {"device": linear.weight.device, "dtype": linear.weight.dtype}
        down = skip_init(nn.Linear, n_in, rank, bias=False, **factory)
        down.weight.copy_(root[:, None] * vh[:rank])
        up = skip_init(nn.Linear, rank, n_out, bias=linear.bias is not None, **factory)
        up.weight.copy_(u[:, :rank] * root)
        if linear.bias is not None:
            up.bias.copy_(linear.bias)
        return nn.Sequential(down, up)

    def _nothing_to_do(self) -> str:
        rule = "rank ratio" if self.rank_ratio is not None else "energy"
        kept = " and the head is kept" if self.keep_head else ""
        return (
            f"{self.describe()}: no nn.Linear layer gets smaller at this {rule} "
            f"(the two factors would hold as many weights as the layer, or the rank would be under "
            f"min_rank={self.min_rank}{kept})."
        )


def output_linears(model: nn.Module, task: Task) -> set[nn.Module]:
    """The ``nn.Linear`` layers whose output is (a view of) the model's output on ``task.example_input(1)``.

    Found by running the model once with forward hooks: a layer counts when its output tensor shares
    storage with a tensor the model returns (directly, in a tuple/list/dict, or in a Hugging Face
    ``ModelOutput``). A head followed by a softmax is not found; ``min_rank`` still guards it.
    """
    produced: dict[nn.Module, torch.Tensor] = {}

    def hook(module: nn.Module, args: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            produced[module] = output

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        return set()
    handles = [m.register_forward_hook(hook) for m in linears]
    args = as_args(task.example_input(1))
    training = model.training
    model.eval()  # a model in train mode would update its batch-norm statistics
    try:
        with torch.inference_mode():
            result = model(*args)
    except Exception as exc:  # the task's model or input is user code
        raise TechniqueError(f"finding the model's head: the model failed on example_input(1): {exc}") from exc
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    pointers = {t.untyped_storage().data_ptr() for t in _tensors(result)}
    return {m for m, out in produced.items() if out.untyped_storage().data_ptr() in pointers}


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # ModelOutput is a dict
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _not_smaller(rank: int, n_in: int, n_out: int) -> bool:
    return rank * (n_in + n_out) >= n_in * n_out


def _rank_for_energy(singular_values: torch.Tensor, energy: float) -> int:
    """Smallest rank whose leading singular values hold ``energy`` of ``sum(s**2)`` (at least 1)."""
    power = singular_values.double() ** 2
    total = power.sum()
    if total == 0:
        return 1
    kept = torch.cumsum(power, 0) / total
    # the tolerance keeps energy=1.0 from asking for more than the full rank through rounding
    return min(int((kept < energy - 1e-12).sum()) + 1, len(singular_values))
