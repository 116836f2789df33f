"""Pruning family: unstructured magnitude pruning, structured removal of units, channels and heads, 2:4 sparsity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, cast

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune as torch_prune
from torch.nn.utils import skip_init

from pareto.compress.base import Family, Technique, cuda_capability, register
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Modules that act on each feature independently, so a hidden unit can be removed straight through them.
ELEMENTWISE = (
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
)
#: Modules that act on each channel of a feature map on its own: a channel can be removed straight through them.
_CHANNELWISE = (*ELEMENTWISE, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Dropout2d)

TWO_FOUR_REASON = "2:4 sparse kernels need a CUDA GPU of compute capability 8.0 or newer (A100, H100…)"


@register
class UnstructuredPrune(Technique):
    """Zero the smallest-magnitude weights of all ``nn.Linear`` layers, ranked globally.

    The tensors stay dense: this shrinks the compressed size, not the latency on dense kernels.

    Args:
        sparsity: Fraction of all linear weights set to zero.
    """

    name: ClassVar[str] = "prune_unstructured"
    family: ClassVar[Family] = "prune"
    summary: ClassVar[str] = "zero the smallest Linear weights globally; tensors stay dense (size, not speed)"
    example: ClassVar[dict[str, float]] = {"sparsity": 0.5}

    sparsity: float = Field(gt=0, lt=1)

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is not None and not _dense_linears(task.model):
            return "the model has no nn.Linear layer to prune."
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with plain dense weights holding exact zeros (no masks or hooks left).

        Raises:
            TechniqueError: the model has no ``nn.Linear`` layer.
        """
        linears = _dense_linears(model)
        if not linears:
            raise TechniqueError(f"{self.describe()}: the model has no nn.Linear layer to prune.")
        targets = [(m, "weight") for m in linears]
        torch_prune.global_unstructured(targets, pruning_method=torch_prune.L1Unstructured, amount=self.sparsity)
        for module, param in targets:
            # fold weight_orig * mask into a plain parameter and drop the forward pre-hook
            torch_prune.remove(module, param)
        return model


@register
class StructuredPrune(Technique):
    """Physically remove a fraction of hidden units, channels, FFN units and attention heads.

    What it acts on (anything else is left alone):

    - ``Linear A -> (BatchNorm1d, elementwise modules) -> Linear B`` inside an ``nn.Sequential``:
      A loses output rows, the norm its features, B the matching input columns.
    - ``Conv2d A -> (BatchNorm2d, activations, pooling, Dropout2d) -> Conv2d B`` inside an
      ``nn.Sequential`` (``groups=1``): A loses output channels, B input channels; also
      ``Conv2d A -> ... -> Flatten -> Linear B``, where B loses each channel's block of columns.
    - The feed-forward width of ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
      (``linear1 -> activation -> linear2``).
    - Attention heads of any module with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``
      (``nn.Linear``, equal q/k/v widths) and an int ``num_heads`` that its forward reads, such as
      ``MultiHeadSelfAttention`` below. ``nn.MultiheadAttention`` is not supported: its fused
      ``in_proj`` and fixed ``embed_dim == num_heads * head_dim`` leave no head to remove.

    A unit's importance is ``||A row|| * ||B column||`` (L2), times ``|gamma| / sigma`` of a batch
    norm between them: a unit weak going in or coming out contributes little. A head's is
    ``||W_v rows|| * ||W_out columns||`` (its value path). A model's final outputs are never
    pruned: only units some later layer reads are candidates.

    Args:
        ratio: Fraction of each hidden layer's units (channels, heads) removed; at least one is kept.
    """

    name: ClassVar[str] = "prune_structured"
    family: ClassVar[Family] = "prune"
    summary: ClassVar[str] = (
        "remove hidden units, conv channels, FFN width and attention heads: smaller layers, not masks"
    )
    example: ClassVar[dict[str, float]] = {"ratio": 0.5}

    ratio: float = Field(gt=0, lt=1)

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is not None and not _prunable_sites(task.model):
            return _NO_SITE
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with smaller layers swapped in wherever a supported pattern occurs.

        Raises:
            TechniqueError: no supported pattern exists, or the ratio removes nothing.
        """
        sites = _prunable_sites(model)
        if not sites:
            raise TechniqueError(f"{self.describe()}: {_NO_SITE}")
        shrunk = sum(site.shrink(self.ratio) for site in sites)
        if shrunk == 0:
            raise TechniqueError(f"{self.describe()}: the ratio is too small to remove any hidden unit.")
        return model


_NO_SITE = (
    "the model has no Linear→activation→Linear pair to prune inside an nn.Sequential, no "
    "Conv2d→Conv2d channel pair, no transformer feed-forward layer and no q/k/v/out attention module."
)


class MultiHeadSelfAttention(nn.Module):
    """Self-attention with separate q/k/v/out projections; ``prune_structured`` can remove its heads.

    ``forward(x)`` takes ``(batch, sequence, embed_dim)`` and reads ``num_heads`` at call time, so
    a pruned copy (fewer heads, narrower projections) runs unchanged.

    Args:
        embed_dim: Model width (input and output).
        num_heads: Heads; ``embed_dim`` must be a multiple of it.
        bias: Whether the projections have biases.
        dropout: Attention-weight dropout in training mode.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        batch, tokens, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, tokens, self.num_heads, -1).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q_proj(x)),
            heads(self.k_proj(x)),
            heads(self.v_proj(x)),
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )
        return self.out_proj(y.transpose(1, 2).reshape(batch, tokens, -1))


@register
class TwoFourPrune(Technique):
    """2:4 semi-structured sparsity: in every 4 consecutive input weights of a Linear, keep the 2 largest.

    Weights are packed with ``torch.sparse.to_sparse_semi_structured`` (cuSPARSELt for fp16/bf16,
    CUTLASS for float32), so Sparse Tensor Cores run the matmul at up to 2x: the one sparsity
    pattern GPUs accelerate. CUDA only, compute capability 8.0 or newer; layers whose shape the
    kernels cannot tile (output rows not a multiple of 32, inputs not a multiple of 64) stay dense.
    In a configuration it runs after the other pruning techniques.
    """

    name: ClassVar[str] = "prune_2_4"
    family: ClassVar[Family] = "prune"
    summary: ClassVar[str] = "2 of every 4 Linear weights zeroed and packed for Sparse Tensor Cores (CUDA, sm80+)"
    # packed weights cannot be pruned further: after structured and unstructured pruning
    order_in_family: ClassVar[int] = 1

    def available(self, device: str, task: Task | None = None) -> str | None:
        if not hasattr(torch.sparse, "to_sparse_semi_structured"):
            return f"torch {torch.__version__} has no torch.sparse.to_sparse_semi_structured."
        capability = cuda_capability(device)
        if capability is None or capability < (8, 0):
            return f"{TWO_FOUR_REASON}; {device} is not one."
        if task is not None and not _two_four_linears(task.model):
            return "the model has no nn.Linear whose shape the 2:4 kernels take (rows a multiple of 32, columns of 64)."
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with eligible ``nn.Linear`` weights 2:4-pruned and packed as semi-structured tensors.

        Raises:
            TechniqueError: not on a capable CUDA device, or no layer the kernels take.
        """
        linears = _two_four_linears(model)
        if not linears:
            raise TechniqueError(
                f"{self.describe()}: the model has no nn.Linear whose shape the 2:4 kernels take "
                "(rows a multiple of 32, columns of 64)."
            )
        device = str(linears[0].weight.device)
        reason = self.available(device)
        if reason is not None:
            raise TechniqueError(
                f"{self.describe()}: {reason} (the pipeline moves the model to the device given to apply)"
            )
        with torch.no_grad():
            for linear in linears:
                linear.weight.mul_(two_four_mask(linear.weight))
        to_semi_structured_weights(linears)
        return model


def two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    """Boolean mask keeping the 2 largest-magnitude weights of every 4 consecutive ones along the input dimension.

    Args:
        weight: A ``(out_features, in_features)`` matrix with ``in_features`` a multiple of 4.

    Returns:
        A mask of the same shape with exactly two True values in every group of four.

    Raises:
        ValueError: not a matrix, or ``in_features`` not a multiple of 4.
    """
    if weight.dim() != 2 or weight.shape[1] % 4:
        raise ValueError(f"2:4 sparsity needs a matrix whose columns are a multiple of 4, got {tuple(weight.shape)}")
    rows, cols = weight.shape
    groups = weight.detach().abs().reshape(rows, cols // 4, 4)
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros(groups.shape, dtype=torch.bool, device=weight.device).scatter_(-1, keep, True)
    return mask.reshape(rows, cols)


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


def _two_four_linears(model: nn.Module) -> list[nn.Linear]:
    """Dense ``nn.Linear`` layers (exact type: not attention's ``out_proj``) whose shape the 2:4 kernels take."""
    # the strictest tile among the backends and dtypes (CUTLASS fp16/bf16): rows % 32, columns % 64
    return [
        m
        for m in _dense_linears(model)
        if type(m) is nn.Linear and m.out_features % 32 == 0 and m.in_features % 64 == 0
    ]


def _dense_linears(model: nn.Module) -> list[nn.Linear]:
    """``nn.Linear`` layers whose weight is a plain dense floating-point tensor."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return [
        m
        for m in model.modules()
        if isinstance(m, nn.Linear) and m.weight.is_floating_point() and not is_traceable_wrapper_subclass(m.weight)
    ]


# --- structured pruning sites -----------------------------------------------------------------------


def _keep(units: int, ratio: float) -> int:
    return max(1, round((1 - ratio) * units))


def _top_units(score: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the ``keep`` highest scores, in their original order."""
    return score.topk(keep).indices.sort().values


@dataclass
class _SequentialPair:
    """``seq[i]`` (Linear or Conv2d) feeds ``seq[j]`` through channel-wise modules, maybe a batch norm at ``seq[norm]``.

    ``block`` is how many input columns of ``seq[j]`` each unit of ``seq[i]`` feeds (H×W after a Flatten).
    """

    seq: nn.Sequential
    i: int
    j: int
    norm: int | None
    block: int

    @torch.no_grad()
    def shrink(self, ratio: float) -> bool:
        a, b = self.seq[self.i], self.seq[self.j]  # re-read: in a chain the previous pair replaced a
        units = a.weight.shape[0]
        keep = _keep(units, ratio)
        if keep >= units:
            return False
        score = a.weight.float().flatten(1).norm(dim=1) * _input_norms(b, units, self.block)
        norm = cast("nn.BatchNorm1d | nn.BatchNorm2d | None", self.seq[self.norm] if self.norm is not None else None)
        if norm is not None:
            score = score * _norm_gain(norm)
        index = _top_units(score, keep)
        self.seq[self.i] = _take_outputs(a, index)
        if norm is not None and self.norm is not None:
            self.seq[self.norm] = _take_norm(norm, index)
        self.seq[self.j] = _take_inputs(b, index, self.block)
        return True


@dataclass
class _FeedForward:
    """``linear1 -> activation -> linear2`` of a transformer layer."""

    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer

    @torch.no_grad()
    def shrink(self, ratio: float) -> bool:
        a, b = self.layer.linear1, self.layer.linear2
        keep = _keep(a.out_features, ratio)
        if keep >= a.out_features:
            return False
        index = _top_units(a.weight.float().norm(dim=1) * b.weight.float().norm(dim=0), keep)
        self.layer.linear1 = _take_outputs(a, index)
        self.layer.linear2 = _take_inputs(b, index, 1)
        return True


@dataclass
class _AttentionHeads:
    """A module with ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` and ``num_heads``."""

    module: nn.Module

    @torch.no_grad()
    def shrink(self, ratio: float) -> bool:
        m = self.module
        heads: int = m.num_heads
        keep = _keep(heads, ratio)
        if keep >= heads:
            return False
        v_rows = m.v_proj.weight.float().reshape(heads, -1)
        out_cols = m.out_proj.weight.float().t().reshape(heads, -1)
        kept = _top_units(v_rows.norm(dim=1) * out_cols.norm(dim=1), keep)
        width = m.q_proj.out_features // heads
        rows = (kept[:, None] * width + torch.arange(width, device=kept.device)).flatten()
        m.q_proj = _take_outputs(m.q_proj, rows)
        m.k_proj = _take_outputs(m.k_proj, rows)
        m.v_proj = _take_outputs(m.v_proj, rows)
        m.out_proj = _take_inputs(m.out_proj, rows, 1)
        m.num_heads = keep
        return True


def _prunable_sites(model: nn.Module) -> list[_SequentialPair | _FeedForward | _AttentionHeads]:
    sites: list[_SequentialPair | _FeedForward | _AttentionHeads] = []
    for module in model.modules():
        if isinstance(module, nn.Sequential):
            sites.extend(_sequential_pairs(module))
        elif isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            a, b = module.linear1, module.linear2
            if type(a) is nn.Linear and type(b) is nn.Linear and a.out_features == b.in_features:
                sites.append(_FeedForward(module))
        elif _is_head_prunable(module):
            sites.append(_AttentionHeads(module))
    return sites


def _is_head_prunable(module: nn.Module) -> bool:
    projections = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj", "out_proj")]
    heads = getattr(module, "num_heads", None)
    if not isinstance(heads, int) or heads < 2 or not all(type(p) is nn.Linear for p in projections):
        return False
    q, k, v, out = cast("list[nn.Linear]", projections)
    return q.out_features == k.out_features == v.out_features == out.in_features and q.out_features % heads == 0


def _sequential_pairs(seq: nn.Sequential) -> list[_SequentialPair]:
    """Producer→consumer pairs among ``seq``'s children (see ``StructuredPrune``)."""
    children = list(seq)
    pairs = []
    for i, first in enumerate(children):
        if type(first) is nn.Linear:
            units, norm_type, passthrough = first.out_features, nn.BatchNorm1d, ELEMENTWISE
        elif type(first) is nn.Conv2d and first.groups == 1:
            units, norm_type, passthrough = first.out_channels, nn.BatchNorm2d, _CHANNELWISE
        else:
            continue
        j, norm = i + 1, None
        while j < len(children):
            child = children[j]
            if type(child) is norm_type and norm is None and child.num_features == units:
                norm = j
            elif not isinstance(child, passthrough):
                break
            j += 1
        flatten = (
            type(first) is nn.Conv2d
            and j < len(children)
            and type(children[j]) is nn.Flatten
            and children[j].start_dim == 1
            and children[j].end_dim == -1
        )
        if flatten:
            j += 1
        second = children[j] if j < len(children) else None
        block = 0
        if type(first) is nn.Linear and type(second) is nn.Linear and second.in_features == units:
            block = 1
        elif flatten and type(second) is nn.Linear and second.in_features % units == 0:
            block = second.in_features // units
        elif not flatten and type(second) is nn.Conv2d and second.groups == 1 and second.in_channels == units:
            block = 1
        if block:
            pairs.append(_SequentialPair(seq, i, j, norm, block))
    return pairs


def _input_norms(layer: nn.Module, units: int, block: int) -> torch.Tensor:
    """L2 norm of the weights that read each of ``units`` inputs of ``layer`` (Linear or Conv2d)."""
    weight = layer.weight.float()
    if isinstance(layer, nn.Conv2d):
        return weight.transpose(0, 1).flatten(1).norm(dim=1)
    return weight.reshape(weight.shape[0], units, block).transpose(0, 1).flatten(1).norm(dim=1)


def _norm_gain(norm: nn.BatchNorm1d | nn.BatchNorm2d) -> torch.Tensor:
    """Per-feature multiplier a batch norm applies at inference: ``|gamma| / sqrt(var + eps)``."""
    gain = torch.ones(norm.num_features, device=_device_of(norm))
    if norm.affine:
        gain = gain * norm.weight.float().abs()
    if norm.running_var is not None:
        gain = gain / (norm.running_var.float() + norm.eps).sqrt()
    return gain


def _float_state(norm: nn.Module) -> torch.Tensor | None:
    return next((t for t in norm.state_dict().values() if t.is_floating_point()), None)


def _device_of(norm: nn.Module) -> torch.device:
    state = _float_state(norm)
    return state.device if state is not None else torch.device("cpu")


def _take_outputs(layer: nn.Module, index: torch.Tensor) -> nn.Module:
    """A copy of ``layer`` (Linear or Conv2d) with only the output units/channels ``index``."""
    if isinstance(layer, nn.Conv2d):
        new = _conv_like(layer, layer.in_channels, len(index))
    else:
        new = _linear_like(layer, layer.in_features, len(index))
    new.weight.copy_(layer.weight[index])
    if layer.bias is not None:
        new.bias.copy_(layer.bias[index])
    return new


def _take_inputs(layer: nn.Module, index: torch.Tensor, block: int) -> nn.Module:
    """A copy of ``layer`` reading only the input units/channels ``index`` (``block`` columns each)."""
    if isinstance(layer, nn.Conv2d):
        new = _conv_like(layer, len(index), layer.out_channels)
        new.weight.copy_(layer.weight[:, index])
    else:
        columns = (index[:, None] * block + torch.arange(block, device=index.device)).flatten()
        new = _linear_like(layer, len(columns), layer.out_features)
        new.weight.copy_(layer.weight[:, columns])
    if layer.bias is not None:
        new.bias.copy_(layer.bias)
    return new


# skip_init: the weights are overwritten at once, so spare the init work and the global RNG
def _linear_like(linear: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    return skip_init(
        nn.Linear,
        in_features,
        out_features,
        bias=linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )


def _conv_like(conv: nn.Conv2d, in_channels: int, out_channels: int) -> nn.Conv2d:
    return skip_init(
        nn.Conv2d,
        in_channels,
        out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=1,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        device=conv.weight.device,
        dtype=conv.weight.dtype,
    )


def _take_norm(norm: nn.BatchNorm1d | nn.BatchNorm2d, index: torch.Tensor) -> nn.Module:
    new = type(norm)(
        len(index),
        eps=norm.eps,
        momentum=norm.momentum,
        affine=norm.affine,
        track_running_stats=norm.track_running_stats,
        device=_device_of(norm),
        dtype=state.dtype if (state := _float_state(norm)) is not None else None,
    )
    if norm.affine:
        new.weight.copy_(norm.weight[index])
        new.bias.copy_(norm.bias[index])
    if norm.running_mean is not None and norm.running_var is not None:
        new.running_mean.copy_(norm.running_mean[index])
        new.running_var.copy_(norm.running_var[index])
        new.num_batches_tracked.copy_(norm.num_batches_tracked)
    return new.train(norm.training)
