"""FLOPs and peak activation bytes of an ONNX graph at one input's shapes, counted from the graph itself.

A model read from an ONNX file has no PyTorch module behind it, so torch's FLOP counter and its
live-tensor tracker see nothing of what ONNX Runtime runs. Here every tensor's shape is inferred at
the timed input's shapes with ONNX Runtime's symbolic shape inference
(``onnxruntime.tools.symbolic_shape_infer``, which folds the shape arithmetic transformer graphs
carry; ONNX's own ``infer_shapes`` with data propagation when it fails), then:

- **FLOPs**: 2 per multiply-add of every matrix product and convolution (``MatMul``, ``Gemm``,
  ``Conv`` and their integer and fused forms), as torch's FLOP counter counts them; elementwise ops,
  softmax and normalizations are not counted, as torch's counter does not count them either. A
  product whose shapes could not be inferred is not counted and the method says how many there were.
- **activations**: the peak of live intermediate tensor bytes with the nodes run in the graph's
  order, each tensor alive from the node that makes it to the last node that reads it (the graph's
  outputs to the end). Initializers and inputs are left out, as the PyTorch method leaves out
  parameters and inputs. ONNX Runtime's memory planner may share or fuse buffers, so this is what the
  graph asks for, not what ORT's arena holds.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GRAPH_ACTIVATION_METHOD", "GRAPH_FLOPS_METHOD", "GraphCost", "counted_graph", "graph_cost"]

GRAPH_FLOPS_METHOD = (
    "2 per multiply-add of the ONNX graph's MatMul/Gemm/Conv (and integer, fused forms) at the timed input's "
    "shapes (ONNX Runtime's symbolic shape inference)"
)
GRAPH_ACTIVATION_METHOD = (
    "peak of live intermediate tensor bytes over the ONNX graph's nodes in order, shapes inferred at the timed "
    "input (initializers and inputs excluded; ONNX Runtime's arena may share buffers)"
)

#: Matrix products: the op, and the index of its left operand (whose last axis is the reduced one).
_MATMULS = {
    "MatMul": 0,
    "MatMulInteger": 0,
    "FusedMatMul": 0,
    "DynamicQuantizeMatMul": 0,
    "MatMulIntegerToFloat": 0,
    "QLinearMatMul": 0,
}
#: Convolutions: the op, and the index of its weight (``[out, in / groups, *kernel]``).
_CONVS = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}


_COUNTED: weakref.WeakKeyDictionary[Any, dict[tuple[tuple[str, tuple[int, ...]], ...], GraphCost]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class GraphCost:
    """One input's counts over an ONNX graph (see the module's docstring for the method)."""

    flops: int
    activation_bytes: int
    #: matrix products and convolutions whose shapes could not be inferred (not counted)
    uncounted: int = 0

    @property
    def flops_method(self) -> str:
        unknown = f"; {self.uncounted} product(s) of unknown shape not counted" if self.uncounted else ""
        return GRAPH_FLOPS_METHOD + unknown


def counted_graph(model: Any, inputs: Sequence[Any]) -> GraphCost | None:
    """The counts of the graph ``model`` is counted on (an ONNX file's module: its ``counted`` graph, at
    ``model.input_shapes(inputs)``), else None (a PyTorch module, counted by torch). Kept per module and shapes."""
    graph = getattr(model, "counted", None)
    if not isinstance(graph, bytes):
        return None
    shapes = tuple(sorted(model.input_shapes(tuple(inputs)).items()))
    known = _COUNTED.setdefault(model, {})
    if shapes not in known:
        known[shapes] = graph_cost(graph, dict(shapes))
    return known[shapes]


def graph_cost(graph: bytes, shapes: Mapping[str, Sequence[int]]) -> GraphCost:
    """The FLOPs and peak activation bytes of the serialized ONNX ``graph`` with its inputs at ``shapes``
    (by input name; an input not named keeps its declared shape)."""
    import onnx

    model = onnx.load_from_string(graph)
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name], strict=False):
                dim.Clear()
                dim.dim_value = int(size)
    inferred = _inferred(model)
    known = _shapes(inferred)
    flops, uncounted = _flops(inferred.graph, known)
    return GraphCost(flops=flops, activation_bytes=_peak_bytes(inferred.graph, known), uncounted=uncounted)


def _inferred(model: Any) -> Any:
    """``model`` with every shape that can be inferred written in (ORT's symbolic inference, else ONNX's)."""
    import onnx

    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=False)
    except Exception:  # an op ORT's inference does not know: ONNX's own, which may leave some shapes out
        return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _shapes(model: Any) -> dict[str, tuple[tuple[int, ...] | None, int]]:
    """Each named tensor's shape (None when not fully known) and its element size in bytes."""
    from onnx import helper

    def size(elem_type: int) -> int:
        try:
            return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
        except (KeyError, TypeError):
            return 4

    graph = model.graph
    out: dict[str, tuple[tuple[int, ...] | None, int]] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        kind = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim)
        out[value.name] = (None if -1 in dims or not kind.HasField("shape") else dims, size(kind.elem_type))
    for init in graph.initializer:
        out[init.name] = (tuple(int(d) for d in init.dims), size(init.data_type))
    return out


def _flops(graph: Any, known: Mapping[str, tuple[tuple[int, ...] | None, int]]) -> tuple[int, int]:
    """FLOPs of the graph's matrix products and convolutions, and how many could not be counted."""
    flops = unknown = 0
    for node in graph.node:
        if node.op_type not in _MATMULS and node.op_type not in _CONVS and node.op_type != "Gemm":
            continue
        out = known.get(node.output[0], (None, 0))[0]
        if node.op_type in _CONVS:
            weight = known.get(node.input[_CONVS[node.op_type]], (None, 0))[0]
            reduced = math.prod(weight[1:]) if weight is not None else None
        else:
            left = known.get(node.input[0], (None, 0))[0]
            transposed = node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute)
            reduced = (left[0] if transposed else left[-1]) if left else None
        if out is None or reduced is None:
            unknown += 1
            continue
        flops += 2 * math.prod(out) * int(reduced)
    return flops, unknown


def _peak_bytes(graph: Any, known: Mapping[str, tuple[tuple[int, ...] | None, int]]) -> int:
    """The most bytes of intermediate tensors alive at once, the nodes run in the graph's order."""
    outside = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    last_use: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            last_use[name] = index
    end = len(graph.node)
    for value in graph.output:
        last_use[value.name] = end
    live = peak = 0
    freed_at: dict[int, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if not name or name in outside:
                continue
            shape, element = known.get(name, (None, 0))
            nbytes = math.prod(shape) * element if shape is not None else 0
            live += nbytes
            last = last_use.get(name, index)  # read by nothing: freed once its node is done
            freed_at[last] = freed_at.get(last, 0) + nbytes
        peak = max(peak, live)
        live -= freed_at.pop(index, 0)
    return peak
