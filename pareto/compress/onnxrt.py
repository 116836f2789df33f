"""ONNX Runtime as a serving backend: export, an ORT session that runs like a module, ORT's int8 quantization.

A configuration on the ``onnxruntime`` backend is measured where it would be served: the compressed
PyTorch model is exported to ONNX (``torch.onnx.export`` with the dynamo exporter, every input axis
left dynamic where the graph allows it) and run by an ``onnxruntime.InferenceSession`` on the CPU
execution provider. ``OrtModule`` wraps that session as an ``nn.Module`` so that latency, accuracy and
the throughput sweep call it like any model. What the session holds is counted from the ONNX graph:
its initializers are the module's parameters and buffers (weights of two or more dimensions are
parameters, the rest buffers), so memory and compression ratio are those of the served graph. What
ORT does inside a run is not visible from Python, so FLOPs and peak activations are those of the
exported PyTorch module (``Served.source``), the same graph before ORT's fusions. A model read from a
user's ONNX file (``pareto.tasks.onnx_graph.load_onnx``) is served as given, only ONNX Runtime's passes
run on it (``graph_file_reason``), and its FLOPs and activations are counted on the file's own graph
(``pareto.measure.graph_cost``).

``ort_int8_dynamic`` quantizes the exported graph with ``onnxruntime.quantization.quantize_dynamic``:
the tool a user would reach for without pareto. ``ort_fuse`` runs ONNX Runtime's own optimizer for
transformer encoders on the graph first (``onnxruntime.transformers.optimizer``: attention, skip
LayerNorm, GELU and bias fusions), so that the quantizer sees the fused operators.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from pareto.compress.base import Backend, Family, Technique, register
from pareto.compress.cpu import INT8_DOT_PRODUCTS, CpuRule
from pareto.compress.served import Step
from pareto.compress.tracing import calibration_inputs, first_line, quiet, trace_first
from pareto.devices import as_args
from pareto.errors import NoEffect, TechniqueError
from pareto.measure.environment import onnxruntime_version
from pareto.tasks.onnx_graph import OrtModule

if TYPE_CHECKING:
    import onnx

    from pareto.task import Task

ONNX_HINT = "install it with: pip install 'pareto-slo[onnx]' (onnx, onnxruntime, onnxscript)"


@functools.cache
def onnxruntime_reason() -> str | None:
    """Why the ``onnxruntime`` backend cannot run in this environment, or None."""
    for module in ("onnxruntime", "onnx", "onnxscript"):
        if importlib.util.find_spec(module) is None:
            return f"the onnxruntime backend needs {module}, which is not installed; {ONNX_HINT}."
    if not hasattr(torch.export.Dim, "AUTO"):  # dynamic axes the exporter may fix: torch 2.6 and newer
        return f"the onnxruntime backend needs torch 2.6 or newer for its ONNX export; this is {torch.__version__}."
    return None


def device_reason(device: str) -> str | None:
    """Why a model cannot be served by ONNX Runtime on ``device``, or None."""
    reason = onnxruntime_reason()
    if reason is not None:
        return reason
    if not device.startswith("cpu"):
        return f"the onnxruntime backend measures on ORT's CPU execution provider; the device is {device}."
    return None


def export_onnx(model: nn.Module, task: Task) -> onnx.ModelProto:
    """Export ``model`` to ONNX on the task's example input, every input axis dynamic where it can be.

    Uses the dynamo exporter (``torch.export`` underneath) with ``Dim.AUTO`` on each axis: an axis
    the graph fixes stays fixed, the others follow the input. torch.export fixes an axis of size 1,
    so a batch of 1 is traced on ``example_input(2)`` (then on ``example_input(1)`` if that fails):
    the served graph then takes other batch sizes too (evaluation, the throughput sweep). Nothing is
    printed.

    Raises:
        TechniqueError: the model cannot be exported (the exporter's reason is kept).
    """

    def export(args: tuple[Any, ...], dims: tuple[Any, ...]) -> onnx.ModelProto:
        program = torch.onnx.export(model.eval(), args, dynamo=True, dynamic_shapes=dims, verbose=False)
        assert program is not None  # the dynamo exporter returns its program
        return program.model_proto

    try:
        return trace_first(task, export)
    except Exception as exc:  # any exporter failure fails the trial, with the exporter's own words
        raise TechniqueError(f"the model cannot be exported to ONNX: {type(exc).__name__}: {first_line(exc)}") from exc


#: ONNX Runtime ops that compute in int8: a graph with any of them computes in int8.
INTEGER_OPS = frozenset(
    {
        "MatMulInteger",
        "ConvInteger",
        "QLinearMatMul",
        "QLinearConv",
        "DynamicQuantizeMatMul",
        "DequantizeLinear",  # a QDQ graph: ORT fuses the pairs into int8 kernels
    }
)


def graph_compute_dtype(proto: onnx.ModelProto) -> str:
    """The dtype an ONNX graph computes in: "int8" with integer matrix products or QDQ pairs, else "fp32"."""
    return "int8" if {node.op_type for node in proto.graph.node} & INTEGER_OPS else "fp32"


def serving_note(module: OrtModule | None = None) -> str:
    """How an ``OrtModule`` is served, for the measurement's method (a file's graph: so said)."""
    served = (
        f"served by ONNX Runtime {onnxruntime_version()} (CPUExecutionProvider, intra-op threads = torch's, "
        "inter-op 1, no idle spinning)"
    )
    if module is not None and module.counted is not None:
        return f"{served} from the ONNX file as given; FLOPs and activations counted on the file's graph"
    return (
        f"{served} from a torch.onnx dynamo export; FLOPs and activations counted on the exported PyTorch "
        "module, parameters on the graph's initializers"
    )


def _served(module: OrtModule, proto: onnx.ModelProto, seconds: float) -> Step:
    """The step that opened ``module``: its build seconds, the graph's compute dtype, the serving note, the
    exported module (FLOPs and activations), and the session opened before a latency measurement's warm-up."""
    return Step(
        module,
        seconds=seconds,
        compute_dtype=graph_compute_dtype(proto),
        notes=(serving_note(module),),
        source=module.source,
        ready=module.session,
    )


def to_onnxruntime(model: nn.Module, task: Task) -> Step:
    """Export ``model`` and open it in ONNX Runtime; the seconds it took are the step's (``Served.compile_s``).

    Raises:
        TechniqueError: ORT is missing, the model is not on the CPU, or it cannot be exported or loaded.
    """
    from pareto.devices import model_device

    reason = device_reason(str(model_device(model)))
    if reason is not None:
        raise TechniqueError(reason)
    if isinstance(model, OrtModule):  # a graph read from an ONNX file: served as it is
        return opened(model)
    start = time.perf_counter()
    proto = export_onnx(model, task)
    try:
        module = OrtModule(proto, model)
    except Exception as exc:  # e.g. initializers in a dtype torch cannot take from numpy (bfloat16)
        raise TechniqueError(f"the exported graph cannot be loaded: {type(exc).__name__}: {first_line(exc)}") from exc
    _first_call(module, task)
    return _served(module, proto, time.perf_counter() - start)


#: What runs on a graph read from an ONNX file: ONNX Runtime's own passes.
GRAPH_PASSES = ("ort_int8_dynamic", "ort_int8_static", "ort_fuse")


def is_graph_file(model: object) -> bool:
    """Whether ``model`` is a graph read from an ONNX file, which ONNX Runtime serves as it is: on the
    onnxruntime backend with no technique it is its own baseline (the search answers it as a repeat)."""
    return isinstance(model, OrtModule) and model.counted is not None


def graph_file_reason(name: str, on_graph: bool, model: object) -> str | None:
    """Why technique ``name`` (``on_graph``: it rewrites an ONNX graph) cannot run on ``model`` when that is
    a graph read from an ONNX file, or None."""
    if on_graph or not is_graph_file(model):
        return None
    return (
        f"{name} works on PyTorch modules, and a model read from an ONNX file is a graph ONNX Runtime runs; "
        f"on it run {', '.join(GRAPH_PASSES)} and the batch size"
    )


def opened(module: OrtModule) -> Step:
    """``module`` (a graph already in ONNX Runtime, read from a file) as its serving step: nothing built."""
    import onnx

    return dataclasses.replace(_served(module, onnx.load_from_string(module.onnx_bytes), 0.0), seconds=None)


def _first_call(module: OrtModule, task: Task) -> None:
    """Open the session and run it once on the task's input, so that a graph ORT cannot run fails here."""
    args = as_args(task.example_input(task.batch_size))
    try:
        with torch.inference_mode():
            module(*args)
    except Exception as exc:  # a graph ORT rejects fails the trial with ORT's reason
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        raise TechniqueError(f"ONNX Runtime cannot run the exported model: {reason}") from exc


class _OrtGraphPass(Technique):
    """What ORT's graph passes (its quantizers and its optimizer) share: they run on the onnxruntime
    backend, on the exported graph, and write a rewritten copy of it (``_quantize``) that becomes a new
    ``OrtModule``."""

    family: ClassVar[Family] = "quantize"
    backends: ClassVar[tuple[Backend, ...]] = ("onnxruntime",)
    on_graph: ClassVar[bool] = True
    #: ONNX Runtime runs MLAS's kernels on a CPU
    cpu_kernels: ClassVar[str] = "mlas"

    def backend(self, device: str) -> str | None:
        return "onnxruntime"

    def available(self, device: str, task: Task | None = None) -> str | None:
        return device_reason(device)

    def _quantize(self, model: OrtModule, task: Task, source: Path, target: Path) -> None:
        raise NotImplementedError

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return a new ``OrtModule`` with the quantized graph (see ``build``)."""
        return self.build(model, task).module

    def build(self, model: nn.Module, task: Task) -> Step:
        """A new ``OrtModule`` with the quantized graph, opened; the seconds opening it took.

        Raises:
            TechniqueError: ``model`` is not an ONNX Runtime module, or ORT's quantizer failed.
        """
        if not isinstance(model, OrtModule):
            raise TechniqueError(f"{self.describe()} quantizes an ONNX graph: it runs on the onnxruntime backend only.")
        import onnx

        with tempfile.TemporaryDirectory(prefix="pareto-ort-") as folder:
            source, target = Path(folder) / "model.onnx", Path(folder) / "model.int8.onnx"
            source.write_bytes(model.onnx_bytes)
            try:
                with quiet():
                    self._quantize(model, task, source, target)
            except TechniqueError:
                raise
            except Exception as exc:  # ORT's quantizer refuses some graphs: the trial fails with its reason
                raise TechniqueError(f"{self.describe()} failed: {type(exc).__name__}: {first_line(exc)}") from exc
            proto = onnx.load(str(target))
        quantized = model.rebuilt(proto)
        opened = time.perf_counter()
        _first_call(quantized, task)
        # the export and the sessions count as build time (the pipeline adds them up, apart from latency);
        # quantizing is compression
        return _served(quantized, proto, time.perf_counter() - opened)


@register
class OrtInt8Dynamic(_OrtGraphPass):
    """ONNX Runtime's dynamic int8 quantization of the exported graph (``quantize_dynamic``).

    Weights of MatMul and Gemm nodes (and, with ``op_types="all"``, of every op ORT can quantize,
    embeddings' Gather and attention included) are stored as int8; activations are quantized per
    call (uint8). Runs on the ``onnxruntime`` backend only, after the export.

    Args:
        per_channel: One scale per output channel instead of one per tensor (usually more accurate).
        op_types: ``"matmul"`` (MatMul, Gemm) or ``"all"`` (ORT's default list).
    """

    name: ClassVar[str] = "ort_int8_dynamic"
    artifact_note: ClassVar[str | None] = (
        "the ONNX graph with int8 weights (DynamicQuantizeLinear, MatMulInteger), as ORT ran it"
    )
    cpu_native: ClassVar[CpuRule | None] = INT8_DOT_PRODUCTS
    summary: ClassVar[str] = "ONNX Runtime quantize_dynamic: int8 weights of the exported graph (onnxruntime backend)"
    order_in_family: ClassVar[int] = 10

    per_channel: bool = False
    op_types: Literal["matmul", "all"] = "matmul"

    def _quantize(self, model: OrtModule, task: Task, source: Path, target: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            source,
            target,
            weight_type=QuantType.QInt8,
            per_channel=self.per_channel,
            op_types_to_quantize=["MatMul", "Gemm"] if self.op_types == "matmul" else None,
        )


@register
class OrtFuse(_OrtGraphPass):
    """ONNX Runtime's transformer optimizer on the exported graph (``optimize_model``, ``model_type``).

    It fuses what an encoder repeats (attention, an Add and LayerNorm into SkipLayerNormalization, GELU
    with its bias, embeddings with their LayerNorm) into ONNX Runtime's contrib operators, offline and
    with patterns beyond those ORT's session applies when it loads a graph. Applied before ORT's int8
    quantizers in the same configuration, which then quantize the fused operators. The heads and the
    width are read from the graph. A graph in which nothing is fused is not this technique's: the
    configuration is the same without it (``NoEffect``).

    Args:
        model_type: ORT's name for the architecture's patterns: ``"bert"`` (BERT, MiniLM, RoBERTa
            encoders), ``"gpt2"`` or ``"vit"``.
    """

    name: ClassVar[str] = "ort_fuse"
    artifact_note: ClassVar[str | None] = (
        "the ONNX graph with ONNX Runtime's fused contrib operators (com.microsoft domain), as ORT ran it"
    )
    family: ClassVar[Family] = "compile"
    summary: ClassVar[str] = (
        "ONNX Runtime's transformer optimizer: attention, SkipLayerNorm and GELU fusions of the exported graph, "
        "before ORT's int8 (onnxruntime backend)"
    )

    model_type: Literal["bert", "gpt2", "vit"] = "bert"

    def _quantize(self, model: OrtModule, task: Task, source: Path, target: Path) -> None:
        import onnx
        from onnxruntime.transformers.optimizer import optimize_model

        # opt_level 0: ORT's own session optimizations run when the graph is loaded, as for any model
        optimized = optimize_model(str(source), model_type=self.model_type, opt_level=0, use_gpu=False)
        # what it fused: ONNX Runtime's own operators it put in (its statistics also count the plain
        # LayerNormalization the exporter writes as fused)
        before = _contrib_nodes(onnx.load(str(source)).graph)
        if _contrib_nodes(optimized.model.graph) <= before:
            raise NoEffect(self.name, f"{self.describe()}: ONNX Runtime's optimizer found nothing to fuse here.")
        optimized.save_model_to_file(str(target))


def _contrib_nodes(graph: onnx.GraphProto) -> int:
    """The nodes of ONNX Runtime's own operators (domain ``com.microsoft``) in ``graph``."""
    return sum(node.domain == "com.microsoft" for node in graph.node)


@register
class OrtInt8Static(_OrtGraphPass):
    """ONNX Runtime's static int8 quantization of the exported graph, calibrated on the task's data.

    Convolutions and matrix products get int8 weights (per output channel by default) and int8
    activations whose ranges were fixed beforehand (``quantize_static``, QDQ format, MinMax
    calibration), so no range is computed per call: the int8 path for CNNs, where dynamic
    quantization only reaches the Linear head. Calibration runs the exported float graph on up to
    ``tracing.CALIBRATION_BATCHES`` (32) inputs of ``task.train_data`` (the inputs only; labels are not used), or
    on ``task.example_input`` when the task has no training data. Runs on the ``onnxruntime`` backend.

    Args:
        per_channel: One weight scale per output channel (default) or one per tensor.
    """

    name: ClassVar[str] = "ort_int8_static"
    artifact_note: ClassVar[str | None] = (
        "the ONNX graph with QuantizeLinear/DequantizeLinear pairs and calibrated scales, as ORT ran it"
    )
    cpu_native: ClassVar[CpuRule | None] = INT8_DOT_PRODUCTS
    summary: ClassVar[str] = (
        "ONNX Runtime quantize_static: int8 weights and activations of convs and matmuls, ranges calibrated on "
        "train_data (onnxruntime backend)"
    )
    order_in_family: ClassVar[int] = 11
    #: two int8 quantizers of one graph: the second finds the products the first quantized
    excludes: ClassVar[frozenset[str]] = frozenset({"ort_int8_dynamic"})

    per_channel: bool = True

    def _quantize(self, model: OrtModule, task: Task, source: Path, target: Path) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        batches = iter(calibration_inputs(task))
        model.session()  # the input names

        class Reader(CalibrationDataReader):
            def get_next(self) -> dict[str, Any] | None:
                args = next(batches, None)
                return None if args is None else model.feed(args)

        quantize_static(
            source,
            target,
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=self.per_channel,
            op_types_to_quantize=["Conv", "MatMul", "Gemm"],
        )
