"""Compute of a forward pass: FLOPs, bytes moved and arithmetic intensity, for the model and per layer.

FLOPs are what ``torch.utils.flop_counter.FlopCounterMode`` counts: matrix multiplications,
convolutions and attention kernels, 2 FLOPs per multiply-accumulate. Elementwise work (bias adds,
activations, normalization, softmax) is not counted, so a ReLU layer shows 0 FLOPs. Dynamically
quantized ``Linear`` layers (``torch.ao.nn.quantized.dynamic.Linear``, and ``nn.Linear`` layers whose
weight is a torchao tensor subclass) run ops the counter has no formula for; they are counted here by
forward hooks as 2 × in × out × rows, the same matmul FLOPs as the float layer they replace (bias
not counted, like the counter's ``addmm``). Two more gaps are closed: ``nn.MultiheadAttention``'s
fused inference fast path is switched off while counting (the math path runs the same products,
visibly), and CPU ``scaled_dot_product_attention`` gets the counter's own GPU attention formula. A
``torch.compile``d model is counted through the eager module it wraps: compilation fuses kernels but
runs the same matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils.flop_counter import FlopCounterMode

from pareto.devices import as_args
from pareto.measure.graph_cost import counted_graph
from pareto.measure.memory import eager_module, params_bytes, stored_bytes_by_module, tensor_bytes

#: How ``count_flops`` and ``layer_costs`` count; stored with the numbers.
FLOPS_METHOD = (
    "torch.utils.flop_counter.FlopCounterMode over one forward under inference_mode (matmul, conv and "
    "attention FLOPs, 2 per multiply-accumulate, bias and elementwise ops not counted; MHA fast path "
    "off; CPU SDPA by the GPU SDPA formula); dynamic-quantized Linear (torch.ao, or a torchao weight) by forward "
    "hook as 2 x in x out x rows"
)
#: How ``bytes_moved`` counts; stored with the number.
BYTES_METHOD = (
    "weights read once (parameter and buffer bytes as stored) + model inputs read + model outputs "
    "written; intermediate activations assumed to stay on chip (a lower bound on memory traffic)"
)


@dataclass(frozen=True)
class ComputeCost:
    """FLOPs, bytes moved and arithmetic intensity of one forward pass on one batch."""

    flops: int
    bytes_moved: int
    arithmetic_intensity: float
    method: str


@dataclass(frozen=True)
class LayerCost:
    """What one module does itself in a forward pass (its called submodules are separate entries).

    ``flops`` are the FLOPs run while this module was the innermost module executing, so the
    entries of ``layer_costs`` sum to ``count_flops``. ``weight_bytes`` are the parameters and
    buffers it holds that no called submodule claims (read once however often it is called);
    ``input_bytes`` and ``output_bytes`` are the tensors passed to and returned by its calls,
    summed over calls. ``bytes_moved`` is their sum, as if every activation went through memory.
    """

    name: str
    type: str
    calls: int
    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    bytes_moved: int
    arithmetic_intensity: float

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain values."""
        return asdict(self)


def count_flops(model: nn.Module, inputs: torch.Tensor | Sequence[Any]) -> int:
    """FLOPs of one forward pass of ``model`` on ``inputs`` (one batch), as the module docstring counts.

    For ``nn.Linear(i, o)`` on a ``(B, i)`` input that is ``2·B·i·o``. The model is put in eval mode;
    inputs and model must already be on the same device.

    Args:
        model: The module; called as ``model(*inputs)``.
        inputs: A tensor, or a tuple/list of tensors (non-tensor items are passed as they are).

    Returns:
        FLOPs per batch.
    """
    return _trace(model, inputs).flops


def bytes_moved(model: nn.Module, inputs: torch.Tensor | Sequence[Any], outputs: Any = None) -> int:
    """Bytes a forward pass must move at least: weights once, inputs read, outputs written.

    ``params_bytes(model)`` (int8 weights one byte each) plus the bytes of every input tensor and of
    every output tensor. Intermediate activations are assumed to stay in cache, so this is a lower
    bound on memory traffic (``layer_costs`` gives the per-layer view where each activation counts).

    Args:
        model: The module.
        inputs: A tensor, or a tuple/list of tensors.
        outputs: ``model(*inputs)`` when the caller has it; None runs one forward to get it.

    Returns:
        Bytes per batch.
    """
    args = as_args(inputs)
    if outputs is None:
        with torch.inference_mode():
            outputs = model.eval()(*args)
    return params_bytes(model) + tensor_bytes(args) + tensor_bytes(outputs)


def arithmetic_intensity(flops: float, bytes_: float) -> float:
    """FLOPs per byte moved; 0 when nothing is computed, ``inf`` when something is but nothing moves.

    Raises:
        ValueError: a negative count.
    """
    if flops < 0 or bytes_ < 0:
        raise ValueError(f"FLOPs and bytes cannot be negative, got {flops} and {bytes_}.")
    if flops == 0:
        return 0.0
    return flops / bytes_ if bytes_ > 0 else math.inf


def compute_cost(
    model: nn.Module, inputs: torch.Tensor | Sequence[Any], *, source: nn.Module | None = None
) -> ComputeCost:
    """FLOPs, bytes moved and arithmetic intensity from one forward pass (see ``count_flops``, ``bytes_moved``).

    An ONNX Runtime module's FLOPs are counted on ``source``, the module it was exported from
    (``pareto.compress.Served.source``: ORT's kernels are not visible to torch); its bytes moved use
    the served graph's weights. A graph read from an ONNX file counts its FLOPs on itself
    (``pareto.measure.graph_cost``).
    """
    graph = counted_graph(source if source is not None else model, as_args(inputs))
    if graph is not None:  # a graph read from an ONNX file counts its own (no PyTorch module behind it)
        moved = bytes_moved(model, inputs)
        return ComputeCost(
            flops=graph.flops,
            bytes_moved=moved,
            arithmetic_intensity=arithmetic_intensity(graph.flops, moved),
            method=f"FLOPs: {graph.flops_method}; bytes: {BYTES_METHOD}",
        )
    trace = _trace(source if source is not None else model, inputs)
    moved = bytes_moved(model, inputs, trace.outputs)
    return ComputeCost(
        flops=trace.flops,
        bytes_moved=moved,
        arithmetic_intensity=arithmetic_intensity(trace.flops, moved),
        method=f"FLOPs: {FLOPS_METHOD}; bytes: {BYTES_METHOD}",
    )


def layer_costs(model: nn.Module, inputs: torch.Tensor | Sequence[Any]) -> list[LayerCost]:
    """Per-layer FLOPs, bytes and arithmetic intensity of one forward pass, in first-call order.

    Lists every called module that calls no submodule (a leaf of the call tree: ``Linear``, ``ReLU``,
    a quantized ``Linear``) and every module that runs FLOPs in its own ``forward`` (e.g.
    ``MultiheadAttention``, whose projections run functionally). Containers that only call their
    children are left out. A module that does its work outside any submodule appears under its own
    name; the root is named ``"(model)"``.

    Args:
        model: The module; called as ``model(*inputs)``.
        inputs: A tensor, or a tuple/list of tensors, on the model's device.

    Returns:
        One ``LayerCost`` per listed module; see ``LayerCost`` for what each number is.
    """
    model = eager_module(model)
    trace = _trace(model, inputs)
    called = set(trace.records)
    names = {module: name or "(model)" for name, module in model.named_modules()}
    held = stored_bytes_by_module(model)
    owner = _owners(model, called)
    weight_bytes: dict[nn.Module, int] = {}
    for module, nbytes in held.items():
        holder = owner.get(module)
        if holder is not None:
            weight_bytes[holder] = weight_bytes.get(holder, 0) + nbytes
    result = []
    for module, record in trace.records.items():
        if record.called_children and record.flops == 0:
            continue
        weights = weight_bytes.get(module, 0)
        moved = weights + record.input_bytes + record.output_bytes
        result.append(
            LayerCost(
                name=names.get(module, type(module).__name__),
                type=type(module).__name__,
                calls=record.calls,
                flops=record.flops,
                weight_bytes=weights,
                input_bytes=record.input_bytes,
                output_bytes=record.output_bytes,
                bytes_moved=moved,
                arithmetic_intensity=arithmetic_intensity(record.flops, moved),
            )
        )
    return result


def compute_dtype(model: nn.Module, declared: str | None = None) -> str:
    """The roofline dtype of the model's heavy math: ``declared`` when given, else "int8" when a Linear is
    dynamically quantized to int8, else the floating dtype holding most parameter bytes ("fp32", "fp16", "bf16").

    ``declared`` is what torch's dispatch cannot tell (``pareto.compress.Served.compute_dtype``: torchao's
    int8 and float8 weights, a PT2E graph's int8 constants, the ops of an ONNX Runtime graph). fp32 on a
    GPU may run as TF32 when the user allows it (``torch.set_float32_matmul_precision``); this says
    "fp32" regardless.
    """
    if declared is not None:
        return declared
    quantized = _dynamic_quantized_linear()
    if quantized is not None:
        for module in model.modules():
            if isinstance(module, quantized) and getattr(module, "weight")().dtype == torch.qint8:  # noqa: B009
                return "int8"
    by_dtype: dict[torch.dtype, int] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            by_dtype[tensor.dtype] = by_dtype.get(tensor.dtype, 0) + tensor.numel() * tensor.element_size()
    if not by_dtype:
        return "fp32"
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
    return names.get(max(by_dtype, key=by_dtype.__getitem__), "fp32")


@dataclass
class _Record:
    calls: int = 0
    flops: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    called_children: bool = False


@dataclass
class _Trace:
    flops: int
    outputs: Any
    records: dict[nn.Module, _Record]


def _trace(model: nn.Module, inputs: torch.Tensor | Sequence[Any]) -> _Trace:
    """Run one forward with the flop counter and hooks on every module; attribute FLOPs exclusively."""
    args = as_args(inputs)
    model = eager_module(model).eval()
    counter = FlopCounterMode(display=False, custom_mapping=_extra_formulas())
    quantized = _dynamic_quantized_linear()
    hook_flops = 0  # FLOPs the counter cannot see, added by the quantized-Linear hook
    records: dict[nn.Module, _Record] = {}
    stack: list[list[Any]] = []  # [module, FLOPs at entry, FLOPs of its called children]

    def now() -> int:
        return int(counter.get_total_flops()) + hook_flops

    def pre_hook(module: nn.Module, args_: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if stack:
            records[stack[-1][0]].called_children = True
        record = records.setdefault(module, _Record())
        record.calls += 1
        record.input_bytes += tensor_bytes(args_) + tensor_bytes(kwargs)
        stack.append([module, now(), 0])

    def post_hook(module: nn.Module, args_: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        nonlocal hook_flops
        _, entry, children = stack.pop()
        total = now() - entry
        if total == 0 and args_ and _counted_by_hook(module, quantized):
            x = args_[0]
            rows = x.numel() // module.in_features
            hook_flops += 2 * rows * module.in_features * module.out_features
            total = now() - entry
        record = records[module]
        record.flops += total - children
        record.output_bytes += tensor_bytes(output)
        if stack:
            stack[-1][2] += total

    handles = []
    try:
        for module in model.modules():
            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            handles.append(module.register_forward_hook(post_hook, with_kwargs=True))
        with _mha_fastpath_off(), torch.inference_mode(), counter:
            outputs = model(*args)
    finally:
        for handle in handles:
            handle.remove()
    return _Trace(flops=now(), outputs=outputs, records=records)


def _owners(model: nn.Module, called: set[nn.Module]) -> dict[nn.Module, nn.Module | None]:
    """Map each module to its nearest called ancestor-or-self (None above the first called one)."""
    owner: dict[nn.Module, nn.Module | None] = {}

    def walk(module: nn.Module, current: nn.Module | None) -> None:
        if module in owner:
            return
        current = module if module in called else current
        owner[module] = current
        for child in module.children():
            walk(child, current)

    walk(model, None)
    return owner


@contextmanager
def _mha_fastpath_off() -> Iterator[None]:
    """nn.MultiheadAttention's inference fast path is one fused op the flop counter cannot see."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        yield
        return
    was_enabled = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(was_enabled)


def _extra_formulas() -> dict[Any, Any]:
    """FLOP formulas torch's counter lacks: CPU scaled-dot-product attention (the formula it uses on GPU)."""
    from torch.utils import flop_counter

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    count = getattr(flop_counter, "sdpa_flop_count", None)
    if op is None or count is None:
        return {}

    def cpu_sdpa_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
        return int(count(query_shape, key_shape, value_shape))

    return {op: cpu_sdpa_flops}


def _counted_by_hook(module: nn.Module, quantized: type[nn.Module] | None) -> bool:
    """A linear layer whose matmul the counter cannot see: torch.ao's dynamic-quantized Linear, or an
    ``nn.Linear`` whose weight is a wrapper tensor subclass (torchao's int8/int4 weights run their own ops)."""
    if quantized is not None and isinstance(module, quantized):
        return True
    return isinstance(module, nn.Linear) and is_traceable_wrapper_subclass(module.weight)


def _dynamic_quantized_linear() -> type[nn.Module] | None:
    """``torch.ao.nn.quantized.dynamic.Linear``, or None in a torch without it."""
    try:
        from torch.ao.nn.quantized.dynamic import Linear
    except ImportError:  # torch.ao quantization is deprecated and may be gone
        return None
    return Linear
