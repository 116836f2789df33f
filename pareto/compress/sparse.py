"""2:4 semi-structured sparse weights packed and unpacked: what pruning, fine-tuning and a cast share
(a cast or a training step goes through dense weights holding the same zeros, then packs them again)."""

from __future__ import annotations

import torch
from torch import nn


def semi_structured_linears(model: nn.Module) -> list[nn.Linear]:
    """``nn.Linear`` layers of ``model`` whose weight is packed 2:4 sparse."""
    sparse_type = getattr(torch.sparse, "SparseSemiStructuredTensor", None)
    if sparse_type is None:
        return []
    return [m for m in model.modules() if isinstance(m, nn.Linear) and isinstance(m.weight, sparse_type)]


def to_dense_weights(linears: list[nn.Linear]) -> None:
    """Unpack 2:4 sparse weights to dense ones holding the same zeros (to cast or train them)."""
    for linear in linears:
        linear.weight = nn.Parameter(linear.weight.detach().to_dense(), requires_grad=False)


def to_semi_structured_weights(linears: list[nn.Linear]) -> None:
    """Pack 2:4-patterned dense weights for Sparse Tensor Cores (cuSPARSELt, else CUTLASS)."""
    for linear in linears:
        dense = linear.weight.detach().contiguous()
        lt = getattr(torch.sparse, "SparseSemiStructuredTensorCUSPARSELT", None)
        cutlass = getattr(torch.sparse, "SparseSemiStructuredTensorCUTLASS", None)
        half = dense.dtype in (torch.float16, torch.bfloat16)
        if lt is not None and half and torch.backends.cusparselt.is_available():
            packed = lt.from_dense(dense)
        elif cutlass is not None:
            packed = cutlass.from_dense(dense)  # the one backend that also takes float32
        else:
            packed = torch.sparse.to_sparse_semi_structured(dense)
        linear.weight = nn.Parameter(packed, requires_grad=False)
