"""Parameter memory of a model: as stored now, and as ideal sparse/compressed storage would hold it."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


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
    return sum(dtype.itemsize * t.numel() + _qparams_bytes(t) for t, dtype, _ in _tensors(model))


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
        count = int(torch.count_nonzero(values)) if is_weight else tensor.numel()
        total += dtype.itemsize * count + _qparams_bytes(tensor)
    return total


def _tensors(model: nn.Module) -> Iterator[tuple[torch.Tensor, torch.dtype, bool]]:
    """Yield ``(tensor, stored dtype, is_weight)`` for every parameter, buffer and packed weight."""
    for name, param in model.named_parameters():
        yield param.detach(), param.dtype, name.rsplit(".", 1)[-1] != "bias"
    for buffer in model.buffers():
        yield buffer, buffer.dtype, False
    for module in model.modules():
        # torch.ao quantized modules expose packed weights through methods, not as parameters
        if callable(getattr(module, "weight", None)) and callable(getattr(module, "bias", None)):
            weight = module.weight()
            # fp16 dynamic quantization unpacks to fp32; the packed params know the stored dtype
            packed_dtype = getattr(getattr(module, "_packed_params", None), "dtype", weight.dtype)
            yield weight, packed_dtype, True
            bias = module.bias()
            if bias is not None:
                yield bias, bias.dtype, False


def _qparams_bytes(tensor: torch.Tensor) -> int:
    """Bytes of per-channel scales and zero points; per-tensor ones are two scalars, not counted."""
    per_channel = (torch.per_channel_affine, torch.per_channel_symmetric)
    if not tensor.is_quantized or tensor.qscheme() not in per_channel:
        return 0
    scales, zero_points = tensor.q_per_channel_scales(), tensor.q_per_channel_zero_points()
    return scales.numel() * scales.element_size() + zero_points.numel() * zero_points.element_size()
