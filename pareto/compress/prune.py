"""Pruning family: unstructured magnitude pruning, structured removal of units, channels and heads, 2:4 sparsity."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune as torch_prune

from pareto.compress.base import Backend, Family, Technique, cuda_capability, register, round_up, width_multiple
from pareto.compress.quantize import cast_for
from pareto.compress.sparse import to_semi_structured_weights
from pareto.devices import as_args, model_device
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

TWO_FOUR_REASON = "2:4 sparse kernels need a CUDA GPU of compute capability 8.0 or newer (A100, H100…)"


@register
class UnstructuredPrune(Technique):
    """Zero the smallest-magnitude weights of all ``nn.Linear`` layers, ranked globally.

    The tensors stay dense: this shrinks the compressed size, not the latency on dense kernels.

    Args:
        sparsity: Fraction of all linear weights set to zero.
    """

    name: ClassVar[str] = "prune_unstructured"
    artifact_note: ClassVar[str | None] = (
        "dense weights holding exact zeros; dense kernels run them at dense speed, as measured"
    )
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
    """Physically remove a fraction of conv channels, hidden units, feed-forward width and attention heads.

    Built on Torch-Pruning's dependency graph (DepGraph: Fang et al., "DepGraph: Towards Any Structural
    Pruning", CVPR 2023; the ``torch-pruning`` package). The model is traced once on
    ``task.example_input(1)`` and its coupled channels are found as groups: a conv's output
    channels with the batch norm after it and every layer that reads them, channels joined by a
    residual add, a Linear's units with the next layer's input columns. A group loses the same
    channels everywhere, so residual networks with batch norm, transformer blocks and plain MLPs
    come out consistent. Each group keeps ``1 - ratio`` of its channels, ranked by the L2 norm of
    their weights averaged over the group's layers (``GroupMagnitudeImportance``).

    Attention heads: a module with separate query/key/value projections and a head count
    (``q_proj``/``k_proj``/``v_proj`` with ``num_heads``, such as ``MultiHeadSelfAttention`` below, or
    Hugging Face BERT-family ``query``/``key``/``value`` with ``num_attention_heads``) loses whole
    heads at ``ratio``; its head count (and ``all_head_size``) is updated, which Torch-Pruning leaves
    to the caller. ``nn.MultiheadAttention`` keeps its heads: its fused ``in_proj`` has none to remove.

    What is kept: channels that reach the model's output (a classifier head's classes, a residual
    stream the model returns), and, unless ``width_ratio`` is given, the embedding width (every
    group holding an ``nn.Embedding``'s output: a transformer's residual stream).

    Args:
        ratio: Fraction of each group's channels (units, heads) removed; at least one is kept.
        width_ratio: Fraction of the embedding width removed as well; None keeps it.
    """

    name: ClassVar[str] = "prune_structured"
    artifact_note: ClassVar[str | None] = "smaller layers with the removed units, channels and heads gone; no masks"
    cuda_default: ClassVar[dict[str, Any] | None] = {"ratio": {"low": 0.2, "high": 0.8}}
    cuda_default_order: ClassVar[int] = 90
    family: ClassVar[Family] = "prune"
    summary: ClassVar[str] = (
        "remove channels, hidden units, FFN width and attention heads of any traced graph (DepGraph): smaller layers"
    )
    example: ClassVar[dict[str, float]] = {"ratio": 0.5}

    ratio: float = Field(gt=0, lt=1)
    width_ratio: float | None = Field(default=None, gt=0, lt=1)

    def available(self, device: str, task: Task | None = None) -> str | None:
        if importlib.util.find_spec("torch_pruning") is None:
            return "structured pruning needs the torch-pruning package (pip install torch-pruning)."
        if task is None:
            return None
        # a trial run on a copy: tracing can miss a coupling, and then only running the result tells
        try:
            self.apply(copy.deepcopy(task.model), task)
        except TechniqueError as exc:
            reason = str(exc).removeprefix(f"{self.describe()}: ")
            return None if reason == _TOO_SMALL else reason
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with narrower layers wherever a group of coupled channels can shrink.

        Raises:
            TechniqueError: the model cannot be traced, has no group it may shrink, or the ratio removes nothing.
        """
        import torch_pruning as tp

        plan = _plan(model, task, self)
        if not plan.prunable:
            raise TechniqueError(f"{self.describe()}: {_NO_GROUP}")
        num_heads = {proj: site.heads for site in plan.heads for proj in site.projections}
        # each group's exact count (Torch-Pruning floors the kept count and skips a group it would empty)
        multiple = width_multiple(model_device(model))  # tensor cores' tile on CUDA
        ratios = {root: _exact_ratio(self.ratio, channels, multiple=multiple) for root, channels in plan.roots}
        if self.width_ratio is not None:
            ratios.update({root: _exact_ratio(self.width_ratio, c, multiple=multiple) for root, c in plan.width_roots})
        head_ratios = {  # Torch-Pruning rounds the heads removed up, which may remove them all
            proj: _exact_ratio(self.ratio, site.heads, removed_rounds_up=True)
            for site in plan.heads
            for proj in site.projections
        }
        before = sum(p.numel() for p in model.parameters())
        ties = _ties(model)
        with _traceable(model, self):
            pruner = tp.pruner.BasePruner(
                model,
                plan.args,
                importance=tp.importance.GroupMagnitudeImportance(p=2),
                pruning_ratio=self.ratio,
                pruning_ratio_dict=ratios,
                ignored_layers=plan.kept_roots,
                num_heads=num_heads,
                prune_num_heads=bool(num_heads),
                prune_head_dims=False,
                head_pruning_ratio_dict=head_ratios,
                forward_fn=_Marked(),
            )
            try:
                pruner.step()
            except Exception as exc:  # a layer type Torch-Pruning traces but cannot cut (an LSTM's, say)
                raise TechniqueError(f"{self.describe()}: pruning failed: {type(exc).__name__}: {exc}") from exc
        for site in plan.heads:
            site.update(pruner.num_heads[site.projections[0]])
        if ties and _ties(model) != ties:
            raise TechniqueError(
                f"{self.describe()}: the model ties weights between layers ({_tie_text(ties)}); "
                "pruning one side would untie them."
            )
        if sum(p.numel() for p in model.parameters()) == before:
            raise TechniqueError(f"{self.describe()}: {_TOO_SMALL}")
        _check_runs(model, plan.args, self)
        return model


_TOO_SMALL = "the ratio is too small to remove any channel, unit or head."


def _ties(model: nn.Module) -> list[tuple[str, ...]]:
    """Names sharing one parameter (tied weights), as sorted tuples; [] for a model without ties."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return sorted(tuple(sorted(n)) for n in names.values() if len(n) > 1)


def _tie_text(ties: list[tuple[str, ...]]) -> str:
    return "; ".join(" = ".join(group) for group in ties)


def _check_runs(model: nn.Module, args: tuple[Any, ...], technique: Technique) -> None:
    """Run the pruned model once: a coupling the trace cannot see leaves shapes that do not fit.

    What the trace misses: a tensor without autograd history joined to the channels (a buffer such
    as a fixed positional encoding added to them), or an attention layout pareto does not know (a
    fused qkv projection, grouped-query attention), whose heads are then cut as plain channels.
    """
    training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            model(*args)
    except Exception as exc:  # the point is to catch whatever breaks
        raise TechniqueError(
            f"{technique.describe()}: the pruned model no longer runs on example_input(1) ({type(exc).__name__}: "
            f"{exc}); something the trace cannot see couples its channels (a buffer added to them, a fused "
            "or grouped-query attention layout)."
        ) from exc
    finally:
        model.train(training)


_NO_GROUP = (
    "the model has no group of channels, units or heads that may shrink: every one reaches the "
    "model's output or the embedding width."
)


@dataclass
class _HeadSite:
    """An attention module whose heads are removed whole: its q/k/v projections and its head-count attribute."""

    module: nn.Module
    projections: tuple[nn.Linear, nn.Linear, nn.Linear]
    attribute: str
    heads: int

    def update(self, heads: int) -> None:
        setattr(self.module, self.attribute, heads)
        head_size = getattr(self.module, "attention_head_size", None)
        if isinstance(head_size, int) and hasattr(self.module, "all_head_size"):
            setattr(self.module, "all_head_size", heads * head_size)  # noqa: B010 (mypy: a Module attribute)


@dataclass
class _Plan:
    """What a trace of the model found: the example call, groups to keep whole, width groups, heads."""

    args: tuple[Any, ...]
    kept_roots: list[nn.Module]
    roots: list[tuple[nn.Module, int]]  # groups pruned at ``ratio``: root layer, channels
    width_roots: list[tuple[nn.Module, int]]  # groups holding the embedding width
    heads: list[_HeadSite]

    @property
    def prunable(self) -> bool:
        return any(channels > 1 for _, channels in self.roots) or bool(self.heads)


#: Head-count conventions: (query, key, value attribute names, head-count attribute).
_HEAD_CONVENTIONS = (("q_proj", "k_proj", "v_proj", "num_heads"), ("query", "key", "value", "num_attention_heads"))


def _head_sites(model: nn.Module) -> list[_HeadSite]:
    sites = []
    for module in model.modules():
        for q_name, k_name, v_name, attribute in _HEAD_CONVENTIONS:
            projections = [getattr(module, name, None) for name in (q_name, k_name, v_name)]
            heads = getattr(module, attribute, None)
            if not isinstance(heads, int) or heads < 2 or not all(type(p) is nn.Linear for p in projections):
                continue
            q, k, v = cast("list[nn.Linear]", projections)
            if q.out_features == k.out_features == v.out_features and q.out_features % heads == 0:
                sites.append(_HeadSite(module, (q, k, v), attribute, heads))
                break
    return sites


def _plan(model: nn.Module, task: Task, technique: StructuredPrune) -> _Plan:
    """Trace ``model`` on ``task.example_input(1)`` and sort its groups into kept and prunable.

    A group is kept whole when it reaches a node nothing reads (the model's output: Torch-Pruning
    prunes a classifier's classes unless told not to), when it would take input channels from a
    layer that reads the model's input (a depthwise first layer, a residual stream that starts at the
    input), or, without ``width_ratio``, when it holds an ``nn.Embedding``'s output.

    Raises:
        TechniqueError: the model cannot be traced on its example input.
    """
    import torch_pruning as tp

    args = as_args(task.example_input(1))
    keep_width = technique.width_ratio is None
    marked = _Marked()
    try:
        # Torch-Pruning warns of parameters outside a layer (a ViT's cls_token); whether the pruned model still
        # runs is checked, and said, after pruning
        with _traceable(model, technique), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            graph = tp.DependencyGraph().build_dependency(model, example_inputs=args, forward_fn=marked)
    except TechniqueError:
        raise
    except Exception as exc:  # the model's forward is user code
        raise TechniqueError(
            f"{technique.describe()}: the model could not be traced on example_input(1): {type(exc).__name__}: {exc}"
        ) from exc
    layers = set(model.modules())
    # nodes nothing reads: the model's outputs (a layer's own, or an op Torch-Pruning marks as output)
    terminals = {n.module for n in graph.module2node.values() if not n.outputs and n.module in layers}
    outputs = {n.module for n in graph.module2node.values() if isinstance(n.module, tp.ops._OutputOp)}
    # layers reading the model's input (nothing upstream of them was traced), and the marks on it
    sources = {n.module for n in graph.module2node.values() if not n.inputs and n.module in layers}
    inputs_seen = {n.module for n in graph.module2node.values() if n.grad_fn in marked.grad_fns}
    embeddings = {m for m in graph.module2node if isinstance(m, nn.Embedding)}
    # layers sharing a weight (an output layer tied to the embedding): the trace sees two layers, and
    # cutting one side would untie them
    owners: dict[int, list[nn.Module]] = {}
    for module in layers:
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(module)
    tied = {m for group in owners.values() if len(group) > 1 for m in group}
    kept: list[nn.Module] = []
    roots: list[tuple[nn.Module, int]] = []
    width: list[tuple[nn.Module, int]] = []
    for group in graph.get_all_groups(root_module_types=_ROOTS):
        touched = {item.dep.target.module for item in group}
        narrows = False
        for item in group:
            target, out = item.dep.target.module, graph.is_out_channel_pruning_fn(item.dep.handler)
            # the model's output would lose channels, or a layer reading the model's input would lose
            # input channels (a residual stream that starts at the input; a grouped first layer,
            # whose output channels are its input channels)
            narrows = (
                narrows
                or target in inputs_seen
                or target in outputs
                or (target in terminals and out)
                or (target in sources and (not out or getattr(target, "groups", 1) > 1))
            )
        root = group[0].dep.target.module
        channels = int(graph.get_out_channels(root) or 0)
        if narrows or touched & tied or (touched & embeddings and keep_width):
            kept.append(root)
        elif touched & embeddings:
            width.append((root, channels))
        else:
            roots.append((root, channels))
    return _Plan(args, kept, roots, width, _head_sites(model))


_ROOTS = (nn.modules.conv._ConvNd, nn.Linear)


class _Marked:
    """Torch-Pruning's ``forward_fn``: the model called on its inputs, each floating-point one marked.

    The trace follows autograd history, and a raw input has none: channels that flow from the input
    straight into a residual add or a norm would look free to cut. Multiplying the input by one
    gives it a node every reader shares, so such channels join one group, which ``_plan`` keeps.
    (Torch-Pruning's own call also retries with the tuple as one argument when the first call
    raises, which hides the model's real error.)
    """

    def __init__(self) -> None:
        self.grad_fns: set[Any] = set()

    def __call__(self, model: nn.Module, args: tuple[Any, ...]) -> Any:
        marked = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a.detach().requires_grad_(True) * 1.0
                self.grad_fns.add(a.grad_fn)
            marked.append(a)
        return model(*marked)


def _exact_ratio(ratio: float, units: int, *, removed_rounds_up: bool = False, multiple: int = 1) -> float:
    """The ratio to hand Torch-Pruning so that ``max(1, round((1 - ratio) * units))`` units stay, rounded
    up to a multiple of ``multiple`` (a group no wider than ``multiple`` is left as it is).

    For channels it keeps ``int(units * (1 - r))``; for heads it removes ``ceil(r * units)``: aim
    half a unit inside the step so that float rounding cannot move it.
    """
    if units < 1:
        return 0.0
    keep = max(1, round((1 - ratio) * units))
    if multiple > 1:
        keep = min(units, round_up(keep, multiple))
    if removed_rounds_up:
        return max(0.0, (units - keep - 0.5) / units)
    return max(0.0, 1 - (keep + 0.5) / units)


@contextlib.contextmanager
def _traceable(model: nn.Module, technique: Technique) -> Iterator[None]:
    """Let autograd record the forward (Torch-Pruning reads the graph from ``grad_fn``); restore the flags after."""
    if torch.is_inference_mode_enabled():
        raise TechniqueError(f"{technique.describe()}: cannot trace the model inside torch.inference_mode().")
    # by name: pruning replaces the parameters, and the new ones would keep requires_grad=True
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    training = model.training
    try:
        for p in model.parameters():
            if p.is_floating_point():
                p.requires_grad_(True)
        with torch.enable_grad():
            yield
    finally:
        for name, p in model.named_parameters():
            if p.is_floating_point():
                p.requires_grad_(flags.get(name, False))
        model.train(training)


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
    On 9.x (Hopper) PyTorch's CUTLASS kernels do not run and cuSPARSELt takes half precision only:
    a float32 model is cast to bfloat16 (as ``bf16`` does; a ``bf16`` or ``fp16`` in the same
    configuration decides the precision instead). In a configuration it runs after the other
    pruning techniques.
    """

    name: ClassVar[str] = "prune_2_4"
    artifact_note: ClassVar[str | None] = (
        "2:4 semi-structured sparse weights, as torch.export (else torch.jit.trace) holds them; CUDA sm80+"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {}
    cuda_default_order: ClassVar[int] = 80
    #: semi-structured sparse tensors: the ONNX exporter has no mapping for them
    backends: ClassVar[tuple[Backend, ...]] = ("eager", "compile")
    family: ClassVar[Family] = "prune"
    summary: ClassVar[str] = "2 of every 4 Linear weights zeroed and packed for Sparse Tensor Cores (CUDA, sm80+)"
    # packed weights cannot be pruned further: after structured and unstructured pruning
    order_in_family: ClassVar[int] = 1

    def cuda_width_multiple(self) -> int:
        """The 2:4 kernels take rows a multiple of 32 and columns of 64: a shrunk width of 64 serves both."""
        return TWO_FOUR_COLUMNS

    def available(self, device: str, task: Task | None = None) -> str | None:
        if not hasattr(torch.sparse, "to_sparse_semi_structured"):
            return f"torch {torch.__version__} has no torch.sparse.to_sparse_semi_structured."
        capability = cuda_capability(device)
        if capability is None or capability < (8, 0):
            return f"{TWO_FOUR_REASON}; {device} is not one."
        if capability >= (9, 0) and not _cusparselt():
            return (
                f"on compute capability {capability[0]}.{capability[1]} the 2:4 kernels are cuSPARSELt's "
                "(PyTorch's CUTLASS ones run on 8.x only), and this torch build has no cuSPARSELt."
            )
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
        capability = cuda_capability(device)
        if capability is not None and capability >= (9, 0) and linears[0].weight.dtype == torch.float32:
            # cuSPARSELt, the one 2:4 backend on 9.x, takes half precision only: the model runs in bfloat16
            cast = cast_for(model, torch.bfloat16, self)
            to_semi_structured_weights(linears)  # the same modules, in bfloat16 now
            return cast
        to_semi_structured_weights(linears)
        return model


def _cusparselt() -> bool:
    backend = getattr(torch.backends, "cusparselt", None)
    return backend is not None and bool(backend.is_available())


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


#: The 2:4 kernels' strictest tile among backends and dtypes (CUTLASS fp16/bf16): rows and columns.
TWO_FOUR_ROWS, TWO_FOUR_COLUMNS = 32, 64


def _two_four_linears(model: nn.Module) -> list[nn.Linear]:
    """Dense ``nn.Linear`` layers (exact type: not attention's ``out_proj``) whose shape the 2:4 kernels take."""
    # the strictest tile among the backends and dtypes (CUTLASS fp16/bf16): rows % 32, columns % 64
    return [
        m
        for m in _dense_linears(model)
        if type(m) is nn.Linear and m.out_features % TWO_FOUR_ROWS == 0 and m.in_features % TWO_FOUR_COLUMNS == 0
    ]


def _dense_linears(model: nn.Module) -> list[nn.Linear]:
    """``nn.Linear`` layers whose weight is a plain dense floating-point tensor."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return [
        m
        for m in model.modules()
        if isinstance(m, nn.Linear) and m.weight.is_floating_point() and not is_traceable_wrapper_subclass(m.weight)
    ]
