"""Low-rank family: replace linear layers by two thin factors from a truncated SVD."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import Field
from torch import nn
from torch.nn.utils import skip_init

from pareto.compress.base import Family, Technique, register
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task


@register
class LowRank(Technique):
    """Factor each ``nn.Linear(in, out)`` as ``Linear(in, r) -> Linear(r, out)``, ``W ≈ U_r S_r V_rᵀ``.

    ``r = max(1, round(rank_ratio * min(in, out)))``; a layer is left alone when the two factors
    would hold as many weights as the original (``r * (in + out) >= in * out``).

    Args:
        rank_ratio: Kept rank as a fraction of each layer's full rank.
    """

    name: ClassVar[str] = "lowrank"
    family: ClassVar[Family] = "lowrank"

    rank_ratio: float = Field(gt=0, le=1)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with its ``nn.Linear`` layers swapped for factor pairs where that is smaller.

        Raises:
            TechniqueError: no layer would get smaller at this rank ratio.
        """
        if type(model) is nn.Linear:
            factored = self._factorize(model)
            if factored is None:
                raise TechniqueError(self._nothing_to_do())
            return factored
        factorized = 0
        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                # exact type: subclasses such as MultiheadAttention's out_proj are read as plain weights
                if type(child) is not nn.Linear:
                    continue
                factored = self._factorize(child)
                if factored is not None:
                    setattr(parent, child_name, factored)
                    factorized += 1
        if factorized == 0:
            raise TechniqueError(self._nothing_to_do())
        return model

    @torch.no_grad()
    def _factorize(self, linear: nn.Linear) -> nn.Sequential | None:
        """The factor pair replacing ``linear``, or None when it would not be smaller."""
        n_in, n_out = linear.in_features, linear.out_features
        rank = max(1, round(self.rank_ratio * min(n_in, n_out)))
        if rank * (n_in + n_out) >= n_in * n_out:
            return None
        u, s, vh = torch.linalg.svd(linear.weight.float(), full_matrices=False)
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
        return (
            f"{self.describe()}: no nn.Linear layer gets smaller at this rank ratio "
            "(the two factors would hold as many weights as the layer)."
        )
