"""Static int8 through PyTorch 2 export quantization (PT2E), lowered by TorchInductor to oneDNN's int8 kernels.

The flow of PyTorch's "PyTorch 2 Export Quantization with X86 Backend through Inductor" tutorial:
``torch.export`` the model (batch axis dynamic), ``prepare_pt2e`` with the ``X86InductorQuantizer``
(int8 weights per output channel, uint8 activations per tensor, for convolutions, linears and the
ops between them), run calibration data through the observers, ``convert_pt2e``, then compile with
Inductor's freezing on (``pareto.compress.compile.FrozenCompiled``), which folds each
quantize/dequantize pair around a convolution or matrix product into one int8 kernel. Without that
compile the converted graph runs the reference quantize/dequantize ops in float and is slower than
the model it came from, so ``int8_static`` is served on the ``compile`` backend only.

The quantizer lives in torchao (``torchao.quantization.pt2e``, a dependency of pareto); PyTorch
releases before it moved there have it in ``torch.ao`` and are used when torchao does not import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import platform
import types
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from pareto.compress.base import Backend, Family, Technique, register
from pareto.compress.compile import _compile_reason
from pareto.compress.cpu import INT8_DOT_PRODUCTS, CpuRule
from pareto.compress.quantize import TORCHAO_HINT, _has_ao_quantized, _is_wrapper_tensor
from pareto.compress.served import Step
from pareto.compress.tracing import calibration_inputs, first_line, quiet, trace_first
from pareto.devices import model_device
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Where the PT2E entry points and the X86 Inductor quantizer are, newest home first.
_HOMES = (
    ("torchao.quantization.pt2e", "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer"),
    ("torch.ao.quantization", "torch.ao.quantization.quantizer.x86_inductor_quantizer"),
)


@functools.cache
def _pt2e() -> tuple[SimpleNamespace | None, str]:
    """``(prepare_pt2e, convert_pt2e, X86InductorQuantizer and its default config; the library)``, or
    ``(None, why not)``."""
    broken: str | None = None
    for flow, quantizer in _HOMES:
        try:
            with quiet():
                quantize_pt2e = importlib.import_module(f"{flow}.quantize_pt2e")
                quantizer_module = importlib.import_module(quantizer)
        except Exception as exc:  # absent, or built for another torch: try the next home
            if flow.startswith("torchao") and importlib.util.find_spec("torchao") is not None:
                broken = (
                    f"torchao is installed but its PT2E quantizer does not import ({type(exc).__name__}: "
                    f"{first_line(exc)}); upgrade it (pip install -U torchao)."
                )
            continue
        return SimpleNamespace(
            prepare=quantize_pt2e.prepare_pt2e,
            convert=quantize_pt2e.convert_pt2e,
            quantizer=quantizer_module.X86InductorQuantizer,
            config=quantizer_module.get_default_x86_inductor_quantization_config,
        ), flow.split(".")[0]
    return None, broken or TORCHAO_HINT


def pt2e_reason(device: str) -> str | None:
    """Why PT2E static int8 with the X86 Inductor quantizer cannot run on ``device`` here, or None."""
    if not device.startswith("cpu"):
        return f"it lowers to oneDNN's int8 kernels for x86 CPUs; the device is {device}."
    if platform.machine().lower() not in {"x86_64", "amd64", "i686", "x86"}:
        return f"the X86 Inductor quantizer targets x86 CPUs; this machine is {platform.machine()}."
    if not hasattr(torch.export.Dim, "AUTO"):
        return f"needs torch 2.6 or newer (torch.export with Dim.AUTO); this is {torch.__version__}."
    flow, why = _pt2e()
    if flow is None:
        return why
    return _compile_reason("cpu")


def _drop_unused_attributes(graph: torch.fx.GraphModule) -> None:
    """Delete the parameters and buffers the converted graph no longer reads.

    ``convert_pt2e`` folds each weight's quantization into an int8 constant and leaves the float
    weight behind, unused: deleting it makes memory and the compression ratio those of what runs.
    """
    used = {str(node.target) for node in graph.graph.nodes if node.op == "get_attr"}
    for name, _ in [*graph.named_parameters(), *graph.named_buffers()]:
        if name not in used:
            owner, _, attribute = name.rpartition(".")
            delattr(graph.get_submodule(owner) if owner else graph, attribute)
    graph.delete_all_unused_submodules()


def _eval_only(graph: nn.Module) -> None:
    """Make ``train()`` and ``eval()`` return the graph unchanged.

    An exported graph refuses both (its mode was fixed when it was traced: here, eval), and the
    library's permissive switch returns None, which breaks ``model.eval()(x)``.
    """

    def unchanged(self: nn.Module, mode: bool = True) -> nn.Module:
        return self

    graph.train = types.MethodType(unchanged, graph)  # type: ignore[method-assign]
    graph.eval = types.MethodType(unchanged, graph)  # type: ignore[method-assign]


@register
class Int8Static(Technique):
    """Static int8 of convolutions and linears by PT2E quantization, calibrated on the task's data.

    Weights become int8 (one scale per output channel) and activations uint8 with ranges fixed
    beforehand from calibration: up to 32 batches of ``task.train_data``'s inputs (labels unused),
    or the example input when the task has none. Batch norms are folded into the convolutions. The
    result runs on the ``compile`` backend, where Inductor (with freezing) turns it into oneDNN int8
    kernels; x86 CPUs only (the X86 Inductor quantizer). The model must be float32 and exportable
    with ``torch.export``; one integer quantization per configuration.
    """

    name: ClassVar[str] = "int8_static"
    artifact_note: ClassVar[str | None] = (
        "the PT2E graph: int8 weights with quantize/dequantize operators (loading imports the library that "
        "registers them: torchao, or torch.ao.quantization on older torch); the load line compiles it with "
        "Inductor's freezing, which makes them oneDNN int8 kernels"
    )
    cpu_native: ClassVar[CpuRule | None] = INT8_DOT_PRODUCTS
    excludes: ClassVar[frozenset[str]] = frozenset(
        {"bf16", "fp16", "fp8", "int4_weight_only", "int8_dynamic", "int8_weight_only"}
    )
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = (
        "PT2E static int8 (X86 Inductor quantizer): int8 convs and linears, activation ranges calibrated on "
        "train_data, lowered to oneDNN by torch.compile (compile backend, x86 CPU)"
    )
    #: the float graph goes to torch.export: after any other quantization, so that it can say why it cannot
    order_in_family: ClassVar[int] = 5
    backends: ClassVar[tuple[Backend, ...]] = ("compile",)
    #: its weights are int8 constants the graph dequantizes: the dtypes torch sees are float
    compute_dtype: ClassVar[str | None] = "int8"
    #: served compiled with Inductor's freezing (``pareto.compress.compile.FrozenCompiled``)
    inductor_freezing: ClassVar[bool] = True

    def backend(self, device: str) -> str | None:
        flow, where = _pt2e()
        return f"{where} pt2e + inductor" if flow is not None else None

    def requires(self) -> tuple[str, ...]:
        """The library that registers the graph's quantize/dequantize operators: loading an export imports it."""
        flow, library = _pt2e()
        if flow is None:
            return ()
        return ("torchao" if library == "torchao" else "torch.ao.quantization",)

    def available(self, device: str, task: Task | None = None) -> str | None:
        return pt2e_reason(device)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        return self.build(model, task).module

    def build(self, model: nn.Module, task: Task) -> Step:
        """The converted graph module (the pipeline compiles it with freezing: ``inductor_freezing``), with a
        note when the quantizer's linear + activation fusion had to be left out.

        Raises:
            TechniqueError: the quantizer cannot run here, the model is not float32, is quantized
                already, or cannot be exported.
        """
        reason = self.available(str(model_device(model)))
        if reason is not None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        tensors = [*model.parameters(), *model.buffers()]
        if _has_ao_quantized(model) or any(_is_wrapper_tensor(t) for t in tensors):
            raise TechniqueError(
                f"{self.describe()}: the model is quantized or 2:4 sparse already; "
                "use one integer quantization per configuration."
            )
        if any(t.is_floating_point() and t.dtype != torch.float32 for t in tensors):
            raise TechniqueError(
                f"{self.describe()} quantizes a float32 model; drop fp16/bf16 from this configuration."
            )
        graph = _export(self, model.eval(), task)
        converted, note = _quantize(self, graph, task)
        _drop_unused_attributes(converted)
        _eval_only(converted)
        converted.requires_grad_(False)
        return Step(converted, notes=(note,) if note else ())


def _quantize(technique: Technique, graph: torch.fx.GraphModule, task: Task) -> tuple[torch.fx.GraphModule, str | None]:
    """Prepare, calibrate and convert ``graph``; the note says what was left in float.

    The X86 Inductor quantizer annotates each linear followed by an activation as one fused pattern;
    on some graphs (BERT's linear + GELU, torchao 0.18) that annotation raises. The linears are then
    annotated one by one without the fusion (each stays int8, its activation runs in float between
    them), and the note says so; a graph that fails that way too fails the trial with the first reason.
    """
    import copy

    flow, library = _pt2e()
    assert flow is not None  # available() said so
    pristine = copy.deepcopy(graph)
    try:
        return _calibrated(flow, graph, task, fuse=True), None
    except Exception as exc:  # the quantizer's own limits (some graphs' fusion patterns)
        first = exc
    try:
        converted = _calibrated(flow, pristine, task, fuse=False)
    except Exception:
        raise TechniqueError(
            f"{technique.describe()}: {library}'s X86 Inductor quantizer failed on this model's graph: "
            f"{type(first).__name__}: {first_line(first)}"
        ) from first
    return converted, (
        f"int8_static: linears quantized one by one, their activations left in float: the quantizer's "
        f"linear + activation fusion failed on this graph ({type(first).__name__}: {first_line(first)})"
    )


def _calibrated(flow: SimpleNamespace, graph: torch.fx.GraphModule, task: Task, *, fuse: bool) -> torch.fx.GraphModule:
    quantizer = flow.quantizer().set_global(flow.config())
    if not fuse:
        # the linear + unary fusion is one pass of the quantizer's annotation; without it the plain
        # linear pass annotates every linear
        quantizer._annotate_linear_unary = lambda *args, **kwargs: None
    with quiet():
        prepared = flow.prepare(graph, quantizer)
        with torch.no_grad():
            for args in calibration_inputs(task):
                prepared(*args)
        return flow.convert(prepared)


def _export(technique: Technique, model: nn.Module, task: Task) -> torch.fx.GraphModule:
    """``torch.export`` of ``model`` (non-strict), batch axis dynamic, as a graph module.

    Raises:
        TechniqueError: torch.export failed on every trace input (its first line is kept).
    """

    def export(args: tuple[Any, ...], dims: tuple[Any, ...]) -> torch.fx.GraphModule:
        return torch.export.export(model, args, dynamic_shapes=dims, strict=False).module()

    try:
        return trace_first(task, export)
    except Exception as exc:  # torch.export's reason fails the trial
        raise TechniqueError(
            f"{technique.describe()}: the model cannot be exported with torch.export: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
