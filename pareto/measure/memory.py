"""Memory of a model at inference: parameters as stored, peak activations, KV cache, optimizer state.

M = M_params + M_activations + M_kv_cache + M_optimizer, the four terms of inference memory; at
inference M_optimizer = 0.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from pareto.devices import as_args
from pareto.errors import UsageError
from pareto.measure.graph_cost import GRAPH_ACTIVATION_METHOD, counted_graph

if TYPE_CHECKING:
    from pareto.task import AttentionShape

#: How ``activation_bytes`` measures on each kind of device; stored with the number.
ACTIVATION_METHOD_CUDA = (
    "CUDA caching allocator: max_memory_allocated during one forward minus memory_allocated before it "
    "(peak stats reset, one untimed forward first), inference_mode"
)
ACTIVATION_METHOD_CPU = (
    "peak bytes of tensor storages produced by operators during one forward and alive at once "
    "(TorchDispatchMode, freed when their last tensor dies; parameters, buffers and inputs excluded, "
    "output included, kernel-internal workspaces not seen), inference_mode"
)


def params_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers as the model actually stores them.

    Dense tensors count ``numel × element size`` whatever their zeros (a pruned-but-dense weight
    counts in full). Packed weights of quantized modules (``torch.ao.nn.quantized`` and its dynamic
    variant, e.g. from ``quantize_dynamic``) count at their packed dtype: int8 is one byte per element,
    fp16 two, plus per-channel scales and zero points.

    Args:
        model: Any module, nested or not, float or quantized.

    Returns:
        The total in bytes.
    """
    return sum(_stored_bytes(t, dtype) for t, dtype, _ in _tensors(model))


def theoretical_bytes(model: nn.Module) -> int:
    """Bytes an ideal sparse/compressed storage would need for the model's parameters.

    Each weight counts its non-zero elements × bytes per element of its stored dtype (int8 1, fp16 2,
    fp32 4, ...); biases and buffers count in full. The index overhead of a real sparse format (CSR
    indices, bitmasks) is ignored, so this is a lower bound used for the compression-ratio column.

    Args:
        model: Any module, nested or not, float or quantized.

    Returns:
        The total in bytes.
    """
    total = 0
    for tensor, dtype, is_weight in _tensors(model):
        values = tensor.dequantize() if tensor.is_quantized else tensor
        # a meta tensor holds no values: every element counts
        count = int(torch.count_nonzero(values)) if is_weight and not values.is_meta else tensor.numel()
        total += dtype.itemsize * count + _qparams_bytes(tensor)
    return total


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (a tensor, or tuples, lists and dict values of them).

    Each tensor counts ``numel × element size`` (its logical size, not its storage's); other
    objects count 0.
    """
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(item) for item in obj)
    return 0


def activation_bytes(
    model: nn.Module, inputs: torch.Tensor | Sequence[Any], device: str, *, source: nn.Module | None = None
) -> int:
    """Peak activation bytes of one forward pass on one batch.

    On CUDA: the caching allocator's peak. One untimed forward runs first (so that lazily created
    workspaces such as cuBLAS's are not counted), then peak statistics are reset and the result is
    ``torch.cuda.max_memory_allocated`` during one forward minus ``memory_allocated`` before it:
    every tensor the forward allocated, kernel workspaces included, output included.

    On CPU (no allocator statistics): the peak of *live tensor bytes*, tracked at the operator level
    with a ``TorchDispatchMode``: every storage an operator returns during the forward is counted
    when it first appears and uncounted when the last tensor viewing it is freed; the result is the
    largest sum alive at once. Parameters, buffers and the inputs are excluded (they exist before the
    forward); the output is included. Scratch memory inside a kernel (oneDNN/FBGEMM workspaces) never
    reaches Python and is not seen, so this is a lower bound on the allocator's true peak. A
    ``torch.compile``d model is measured through the eager module it wraps (fused kernels may keep
    fewer intermediates alive), an ONNX Runtime one through the module it was exported from (``source``:
    ORT's arena is not visible from Python). For a
    ``Sequential(Linear(a, h), ReLU(), Linear(h, b))`` at batch B it is ``4·B·(h + h)`` bytes (the
    first Linear's output and the ReLU's are alive together).

    The model is put in eval mode; it and its inputs are on ``device`` already (the bench's rule).

    Args:
        model: The module; called as ``model(*inputs)``.
        inputs: A tensor, or a tuple/list of tensors (non-tensor items are passed as they are).
        device: Where the model and inputs are: "cpu", "cuda:N" (or "meta": no data, shapes only).
        source: The PyTorch module measured instead on the CPU, when ``model`` runs outside PyTorch
            (``pareto.compress.Served.source``: the module exported to ONNX Runtime).

    Returns:
        Peak activation bytes (``ACTIVATION_METHOD_CPU`` / ``ACTIVATION_METHOD_CUDA`` name the method).

    """
    model = model.eval()
    args = as_args(inputs)
    graph = counted_graph(source if source is not None else model, args)
    if graph is not None:  # a graph read from an ONNX file: counted on its nodes (pareto.measure.graph_cost)
        return graph.activation_bytes
    with torch.inference_mode():
        if device.startswith("cuda"):
            return _cuda_peak_bytes(model, args, device)
        model = eager_module(model, source)  # a dispatch mode sees the eager ops, not a compiled graph's
        held = [p for t in (*model.parameters(), *model.buffers()) for p in _plain_tensors(t)]
        known = {_storage_key(t) for t in held if _has_storage(t)}
        known |= {_storage_key(t) for t in args if isinstance(t, torch.Tensor) and _has_storage(t)}
        with _LiveTensorBytes(known) as tracker:
            output = model(*args)
        del output
        return tracker.peak_bytes


def eager_module(model: nn.Module, source: nn.Module | None = None) -> nn.Module:
    """The eager module behind ``model``: ``source`` when given (the module an ONNX Runtime one was exported
    from, ``pareto.compress.Served.source``), else a ``torch.compile``d one's ``_orig_mod``, else ``model``."""
    if source is not None:
        return source
    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, nn.Module) else model


def activation_method(device: str) -> str:
    """The method string ``activation_bytes`` follows on ``device`` ("cpu" or "cuda:N")."""
    return ACTIVATION_METHOD_CUDA if device.startswith("cuda") else ACTIVATION_METHOD_CPU


def kv_cache_bytes(attention: AttentionShape | None, batch_size: int, bytes_per_element: int) -> int:
    """Bytes of the key/value cache: 2 (K and V) × layers × sequence × width × bytes × batch.

    LLaMA-7B (32 layers, width 4096) at sequence 4096 in FP16, batch 1: 2·32·4096·4096·2 =
    2,147,483,648 bytes (2 GiB), on top of its ~13.5 GB of FP16 weights.

    Args:
        attention: The task's attention shape; None (not a transformer) gives 0.
        batch_size: Sequences held at once.
        bytes_per_element: Bytes per cached element (FP16 2, FP32 4, INT8 1).

    Returns:
        The KV-cache bytes.

    Raises:
        UsageError: ``batch_size < 1`` or ``bytes_per_element < 1``.
    """
    if batch_size < 1:
        raise UsageError(f"Batch size must be at least 1, got {batch_size}.")
    if bytes_per_element < 1:
        raise UsageError(f"Bytes per KV-cache element must be at least 1, got {bytes_per_element}.")
    if attention is None:
        return 0
    return 2 * attention.layers * attention.sequence * attention.width * bytes_per_element * batch_size


@dataclass(frozen=True)
class MemoryBreakdown:
    """Inference memory split into its terms, in bytes, with how each was obtained.

    ``optimizer_bytes`` is 0 by definition at inference: no gradients and no optimizer state
    (Adam would hold two more copies of the parameters) are kept. ``total_bytes`` is the sum.
    """

    params_bytes: int
    activation_bytes: int
    kv_cache_bytes: int
    optimizer_bytes: int = 0
    method: str = ""
    total_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        total = self.params_bytes + self.activation_bytes + self.kv_cache_bytes + self.optimizer_bytes
        object.__setattr__(self, "total_bytes", total)

    def to_dict(self) -> dict[str, int | str]:
        """All fields as plain values."""
        return asdict(self)


def memory_breakdown(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[Any],
    *,
    device: str,
    batch_size: int,
    attention: AttentionShape | None = None,
    kv_bytes_per_element: int | None = None,
    source: nn.Module | None = None,
    graph_pool_bytes: int = 0,
) -> MemoryBreakdown:
    """Measure every memory term of ``model`` at inference on one batch.

    Args:
        model: The module (put in eval mode), on ``device``.
        inputs: One batch, as ``measure_latency`` takes it, on ``device``.
        device: Where the model is: "cpu", "cuda:N" (or "meta").
        batch_size: The batch ``inputs`` holds (sequences in the KV cache).
        attention: The task's attention shape, None when it has no KV cache.
        kv_bytes_per_element: Bytes per cached element; None takes the element size of the model's
            floating-point parameters (its activations' dtype: dynamic int8 quantization keeps fp32
            activations), 4 when it has none.
        source: The PyTorch module whose activations are measured when ``model`` runs outside
            PyTorch (``pareto.compress.Served.source``); None measures ``model``.
        graph_pool_bytes: Bytes the CUDA graphs' private memory pool held when the configuration was
            built (``pareto.compress.Served.graph_pool_bytes``: a ``CudaGraphed`` replayer's, or the
            cudagraph trees' of ``torch.compile``'s reduce-overhead mode), counted with the activations.

    Returns:
        The breakdown; ``method`` says how each term was obtained.
    """
    element = kv_bytes_per_element if kv_bytes_per_element is not None else _float_element_size(model)
    kv = kv_cache_bytes(attention, batch_size, element)
    graph = counted_graph(source if source is not None else model, as_args(inputs))
    activations = GRAPH_ACTIVATION_METHOD if graph is not None else activation_method(device)
    method = (
        f"params: bytes as stored; activations: {activations}; "
        + (
            f"KV cache: 2 x {attention.layers} layers x {attention.sequence} tokens x "
            f"{attention.width} width x {element} B x batch {batch_size}; "
            if attention is not None
            else "KV cache: none (no attention shape); "
        )
        + "optimizer: 0 at inference"
    )
    # a CUDA graph's private pool was reserved at capture and is held while it is served; a replay
    # allocates (almost) nothing, so the pool is what its activations take
    pool = graph_pool_bytes
    if pool:
        counted = (
            f" + the CUDA graphs' private memory pool as built ({pool} B: its segments in the caching allocator's "
            "snapshot after the build's capture; graphs recorded later for other batch shapes not counted)"
        )
        method = method.replace("; KV cache:", f"{counted}; KV cache:", 1)
    return MemoryBreakdown(
        params_bytes=params_bytes(model),
        activation_bytes=activation_bytes(model, inputs, device, source=source) + pool,
        kv_cache_bytes=kv,
        method=method,
    )


def _float_element_size(model: nn.Module) -> int:
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            return tensor.element_size()
    return 4


def _cuda_peak_bytes(model: nn.Module, args: tuple[Any, ...], device: str) -> int:
    output = model(*args)  # lazily created workspaces (cuBLAS handles) are not activations
    del output
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    output = model(*args)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - baseline
    del output
    return max(int(peak), 0)


def _has_storage(tensor: torch.Tensor) -> bool:
    return tensor.layout == torch.strided and tensor.device.type != "meta" and not is_traceable_wrapper_subclass(tensor)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


class _LiveTensorBytes(TorchDispatchMode):
    """Track bytes of operator-produced storages that are alive at once; keep the peak."""

    def __init__(self, known: set[tuple[str, int]]) -> None:
        super().__init__()
        self._known = known
        self._live: dict[tuple[str, int], list[int]] = {}  # key -> [bytes, tensors alive]
        self._finalizers: list[weakref.finalize] = []
        self._current = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in _leaves(out):
            if not _has_storage(tensor):
                continue
            key = _storage_key(tensor)
            if key in self._known:
                continue
            entry = self._live.get(key)
            if entry is None:
                entry = self._live[key] = [tensor.untyped_storage().nbytes(), 0]
                self._current += entry[0]
            entry[1] += 1
            self._finalizers.append(weakref.finalize(tensor, self._release, key))
        self.peak_bytes = max(self.peak_bytes, self._current)
        return out

    def _release(self, key: tuple[str, int]) -> None:
        entry = self._live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self._current -= entry[0]
            del self._live[key]

    def __exit__(self, *exc: Any) -> None:
        for finalizer in self._finalizers:  # tensors that outlive the forward need no tracking
            finalizer.detach()
        self._finalizers.clear()
        super().__exit__(*exc)


def _leaves(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield from _plain_tensors(obj)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)


def _stored_bytes(tensor: torch.Tensor, dtype: torch.dtype) -> int:
    return dtype.itemsize * tensor.numel() + _qparams_bytes(tensor)


def _own_tensors(module: nn.Module) -> Iterator[tuple[object, torch.Tensor, torch.dtype, bool]]:
    """Yield ``(identity, tensor, stored dtype, is_weight)`` for what ``module`` itself holds.

    A tensor subclass that wraps others (torchao's quantized weights, 2:4 sparse weights) has no
    storage of its own: the plain tensors inside it are yielded instead, each at its own dtype (int8
    values, fp32 scales); the one holding as many elements as the weight is the weight.
    """
    for identity, tensor, dtype, is_weight in _module_tensors(module):
        if not is_traceable_wrapper_subclass(tensor):
            yield identity, tensor, dtype, is_weight
            continue
        for inner in _plain_tensors(tensor):
            yield inner, inner, inner.dtype, is_weight and inner.numel() == tensor.numel()


def _plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a wrapper tensor subclass holds (``__tensor_flatten__``, recursively); ``[tensor]`` else."""
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inner = [getattr(tensor, name) for name in names]
    return [plain for t in inner if isinstance(t, torch.Tensor) for plain in _plain_tensors(t)]  # optional: None


def _module_tensors(module: nn.Module) -> Iterator[tuple[object, torch.Tensor, torch.dtype, bool]]:
    for name, param in module.named_parameters(recurse=False):
        yield param, param.detach(), param.dtype, name != "bias"
    for buffer in module.buffers(recurse=False):
        yield buffer, buffer, buffer.dtype, False
    # torch.ao quantized modules expose packed weights through methods, not as parameters
    weight_of, bias_of = getattr(module, "weight", None), getattr(module, "bias", None)
    if callable(weight_of) and callable(bias_of):
        weight = weight_of()
        # fp16 dynamic quantization unpacks to fp32; the packed params know the stored dtype
        packed_dtype = getattr(getattr(module, "_packed_params", None), "dtype", weight.dtype)
        yield weight, weight, packed_dtype, True
        bias = bias_of()
        if bias is not None:
            yield bias, bias, bias.dtype, False


def _tensors(model: nn.Module) -> Iterator[tuple[torch.Tensor, torch.dtype, bool]]:
    """Yield ``(tensor, stored dtype, is_weight)`` for every parameter, buffer and packed weight once."""
    for _, tensor, dtype, is_weight in _owned_tensors(model):
        yield tensor, dtype, is_weight


def _owned_tensors(model: nn.Module) -> Iterator[tuple[nn.Module, torch.Tensor, torch.dtype, bool]]:
    """Like ``_tensors``, with the module that holds each tensor (a shared one counts at its first)."""
    seen: dict[int, object] = {}  # holds each object: a freed one's id could be reused by the next
    for module in model.modules():
        for identity, tensor, dtype, is_weight in _own_tensors(module):
            if id(identity) in seen:
                continue
            seen[id(identity)] = identity
            yield module, tensor, dtype, is_weight


def stored_bytes_by_module(model: nn.Module) -> dict[nn.Module, int]:
    """Bytes (as ``params_bytes`` counts them) held directly by each module of ``model``.

    A tensor shared by several modules counts once, at the first in ``model.modules()`` order, so
    the values sum to ``params_bytes(model)``.
    """
    result: dict[nn.Module, int] = {}
    for module, tensor, dtype, _ in _owned_tensors(model):
        result[module] = result.get(module, 0) + _stored_bytes(tensor, dtype)
    return result


def _qparams_bytes(tensor: torch.Tensor) -> int:
    """Bytes of per-channel scales and zero points; per-tensor ones are two scalars, not counted."""
    per_channel = (torch.per_channel_affine, torch.per_channel_symmetric)
    if not tensor.is_quantized or tensor.qscheme() not in per_channel:
        return 0
    scales, zero_points = tensor.q_per_channel_scales(), tensor.q_per_channel_zero_points()
    return scales.numel() * scales.element_size() + zero_points.numel() * zero_points.element_size()
