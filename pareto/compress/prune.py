"""Pruning family: unstructured magnitude pruning and structured removal of hidden units."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import torch
from pydantic import Field
from torch import nn
from torch.nn.utils import prune as torch_prune
from torch.nn.utils import skip_init

from pareto.compress.base import Family, Technique, register
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Modules that act on each feature independently, so a hidden unit can be removed straight through them.
_ELEMENTWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU,
    nn.CELU, nn.Softplus, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Dropout, nn.AlphaDropout,
    nn.Identity,
)


@register
class UnstructuredPrune(Technique):
    """Zero the smallest-magnitude weights of all ``nn.Linear`` layers, ranked globally.

    The tensors stay dense: this shrinks the compressed size, not the latency on dense kernels.

    Args:
        sparsity: Fraction of all linear weights set to zero.
    """

    name: ClassVar[str] = "prune_unstructured"
    family: ClassVar[Family] = "prune"

    sparsity: float = Field(gt=0, lt=1)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with plain dense weights holding exact zeros (no masks or hooks left).

        Raises:
            TechniqueError: the model has no ``nn.Linear`` layer.
        """
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise TechniqueError(f"{self.describe()}: the model has no nn.Linear layer to prune.")
        targets = [(m, "weight") for m in linears]
        torch_prune.global_unstructured(
            targets, pruning_method=torch_prune.L1Unstructured, amount=self.sparsity
        )
        for module, param in targets:
            # fold weight_orig * mask into a plain parameter and drop the forward pre-hook
            torch_prune.remove(module, param)
        return model


@register
class StructuredPrune(Technique):
    """Physically remove a fraction of the hidden units between pairs of linear layers.

    For each ``Linear A -> (elementwise modules) -> Linear B`` inside an ``nn.Sequential``,
    A loses output rows and B the matching input columns, so the dense matmuls really shrink.
    A unit's importance is ``||A row|| * ||B column||`` (L2): a unit that is weak going in or
    coming out contributes little. A model's final outputs are never pruned: only units some
    later Linear reads are candidates.

    Args:
        ratio: Fraction of each hidden layer's units removed (at least one unit is kept).
    """

    name: ClassVar[str] = "prune_structured"
    family: ClassVar[Family] = "prune"

    ratio: float = Field(gt=0, lt=1)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with smaller ``nn.Linear`` layers swapped into its ``nn.Sequential`` containers.

        Raises:
            TechniqueError: no Linear→activation→Linear pair exists, or the ratio removes no unit.
        """
        pairs = 0
        shrunk = 0
        for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
            for i, j in _linear_pairs(seq):
                pairs += 1
                a, b = cast(nn.Linear, seq[i]), cast(nn.Linear, seq[j])  # re-read: a chain shrinks B first
                keep = max(1, round((1 - self.ratio) * a.out_features))
                if keep >= a.out_features:
                    continue
                seq[i], seq[j] = _shrink_pair(a, b, keep)
                shrunk += 1
        if pairs == 0:
            raise TechniqueError(
                f"{self.describe()}: the model has no Linear→activation→Linear pair to prune "
                "inside an nn.Sequential."
            )
        if shrunk == 0:
            raise TechniqueError(f"{self.describe()}: the ratio is too small to remove any hidden unit.")
        return model


def _linear_pairs(seq: nn.Sequential) -> list[tuple[int, int]]:
    """Indices ``(i, j)`` of ``Linear -> elementwise* -> Linear`` runs among ``seq``'s children."""
    children = list(seq)
    pairs = []
    for i, first in enumerate(children):
        if type(first) is not nn.Linear:
            continue
        j = i + 1
        while j < len(children) and isinstance(children[j], _ELEMENTWISE):
            j += 1
        second = children[j] if j < len(children) else None
        if type(second) is nn.Linear and second.in_features == first.out_features:
            pairs.append((i, j))
    return pairs


@torch.no_grad()
def _shrink_pair(a: nn.Linear, b: nn.Linear, keep: int) -> tuple[nn.Linear, nn.Linear]:
    """New ``(A, B)`` keeping the ``keep`` hidden units with the largest importance, in their order."""
    score = a.weight.float().norm(dim=1) * b.weight.float().norm(dim=0)
    index = score.topk(keep).indices.sort().values
    # skip_init: the weights are overwritten at once, so spare the init work and the global RNG
    new_a = skip_init(nn.Linear, a.in_features, keep, bias=a.bias is not None,
                      device=a.weight.device, dtype=a.weight.dtype)
    new_a.weight.copy_(a.weight[index])
    if a.bias is not None:
        new_a.bias.copy_(a.bias[index])
    new_b = skip_init(nn.Linear, keep, b.out_features, bias=b.bias is not None,
                      device=b.weight.device, dtype=b.weight.dtype)
    new_b.weight.copy_(b.weight[:, index])
    if b.bias is not None:
        new_b.bias.copy_(b.bias)
    return new_a, new_b
