"""Quantization family: int8 dynamic, int8 and int4 weight-only, fp16 and bf16.

Integer quantization goes through torchao's ``quantize_`` (a dependency of pareto); where it does not
import (a torchao built for another torch), int8 dynamic falls back to PyTorch's deprecated eager
``torch.ao.quantization.quantize_dynamic`` (CPU only) and the weight-only variants are unavailable.
Within the family, names sort casts (bf16, fp16) before integer quantization, which is also the
order that works: torchao's weight-only kernels run on bfloat16 models.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from pareto.compress import kernels as kernel_probes
from pareto.compress.base import Backend, Family, Technique, cuda_capability, get_technique, register
from pareto.compress.cpu import INT8_DOT_PRODUCTS, Cast, CpuRule
from pareto.compress.sparse import semi_structured_linears, to_dense_weights, to_semi_structured_weights
from pareto.compress.tracing import quiet
from pareto.errors import TechniqueError

if TYPE_CHECKING:
    from pareto.task import Task

#: Quantized engines that ship int8 dynamic linear kernels.
_INT8_ENGINES = ("x86", "fbgemm", "qnnpack")

TORCHAO_HINT = "needs torchao, which pareto installs (pip install torchao)"


def _quantize_dynamic() -> Callable[..., Any] | None:
    """Return torch's ``quantize_dynamic``, or None when this torch no longer has it."""
    # torch.ao.quantization warns on import (deprecated in favour of torchao); the warning is not ours to show
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError:
            return None
    return quantize_dynamic


@functools.cache
def _torchao() -> tuple[ModuleType | None, str | None]:
    """``(torchao.quantization, None)``, or ``(None, why not)`` when torchao is absent or broken."""
    if importlib.util.find_spec("torchao") is None:
        return None, TORCHAO_HINT
    try:
        with quiet():  # torchao logs a line for each optional kernel library this machine cannot load
            module = importlib.import_module("torchao.quantization")
    except Exception as exc:  # a torchao built for another torch fails in many ways; keep its reason
        return None, f"torchao is installed but does not import: {type(exc).__name__}: {exc}"
    return module, None


def _torchao_config(name: str, **kwargs: Any) -> Any:
    """Build torchao's config class ``name``, or None when this torchao lacks it."""
    ao, _ = _torchao()
    cls = getattr(ao, name, None) if ao is not None else None
    if cls is None:
        return None
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if "set_inductor_config" in fields:
        # it would change torch._inductor's global config for every later trial of the process
        kwargs["set_inductor_config"] = False
    return cls(**{k: v for k, v in kwargs.items() if k in fields or not fields})


def _torchao_reason(config_name: str) -> str | None:
    """Why torchao's ``config_name`` cannot be used here, or None."""
    ao, reason = _torchao()
    if ao is None:
        return reason
    if getattr(ao, config_name, None) is None:
        return f"the installed torchao has no {config_name}; upgrade it (pip install -U torchao)."
    return None


def _is_wrapper_tensor(tensor: torch.Tensor) -> bool:
    """True for torchao's quantized weights and 2:4 sparse weights (tensor subclasses that wrap others)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(tensor)


def _float_linears(model: nn.Module) -> list[nn.Linear]:
    """``nn.Linear`` layers whose weight is still a plain floating-point tensor."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.Linear)
        and m.weight.is_floating_point()
        and not _is_wrapper_tensor(m.weight)
        # nn.MultiheadAttention's out_proj: its forward reads the weight as a plain tensor
        and not isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear)
    ]


def _has_linear(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Linear) for m in model.modules())


def _linears_to_quantize(technique: Technique, model: nn.Module) -> list[nn.Linear]:
    """The float linears ``technique`` will quantize.

    Raises:
        TechniqueError: no linear layer at all, or every one already quantized or 2:4 sparse.
    """
    linears = _float_linears(model)
    if linears:
        return linears
    if not _has_linear(model) and not _has_ao_quantized(model):
        raise TechniqueError(f"{technique.describe()}: the model has no nn.Linear layer to quantize.")
    raise TechniqueError(
        f"{technique.describe()}: the model's linear layers are already quantized or 2:4 sparse; "
        "use one integer quantization per configuration."
    )


def _has_ao_quantized(model: nn.Module) -> bool:
    """True when eager ``torch.ao`` quantized modules (from ``quantize_dynamic``) are in ``model``."""
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())


def _torchao_quantize(technique: Technique, model: nn.Module, config: Any, linears: list[nn.Linear]) -> nn.Module:
    ao, _ = _torchao()
    assert ao is not None  # available() was checked by the caller
    if semi_structured_linears(model):
        raise TechniqueError(
            f"{technique.describe()}: torchao cannot quantize 2:4 sparse weights; drop prune_2_4 or this technique."
        )
    chosen = {id(m) for m in _not_left_alone(technique, model, linears)}
    ao.quantize_(model, config, filter_fn=lambda module, _fqn: id(module) in chosen)
    return model


def _not_left_alone(technique: Technique, model: nn.Module, linears: list[nn.Linear]) -> list[nn.Linear]:
    """``linears`` but the layers ``technique`` leaves alone (``Technique.leave``).

    Raises:
        TechniqueError: it leaves every one of them alone.
    """
    if not technique.leave:
        return linears
    names = {id(m): name for name, m in model.named_modules()}
    kept = [m for m in linears if not technique.leaves(names.get(id(m), ""))]
    if not kept:
        raise TechniqueError(f"{technique.describe()}: every linear layer it would quantize is left alone.")
    return kept


@register
class Int8Dynamic(Technique):
    """Weights stored as int8, activations quantized on the fly per batch; every ``nn.Linear``.

    Cuts weight bytes by 4x, not FLOPs: it pays off where the linear layers are memory-bound.
    Kernels: PyTorch's eager ``quantize_dynamic`` (torch.ao, CPU only) or torchao's
    ``Int8DynamicActivationInt8WeightConfig`` (CPU and CUDA; the optional extra). Unset, the CPU
    takes torch.ao's and CUDA torchao's: side by side on a 2-core AMD EPYC, torch.ao's ran the demo
    MLP 3.33x faster than the float model at the median where torchao's ran it 1.59x, MiniLM 2.15x
    against 0.74x (torchao's lost less fidelity there: 0.27 points against 5.13), BENCHMARKS.md. A
    search may list both (``kernels: [torch.ao, torchao]``).

    Args:
        kernels: ``"torch.ao"`` or ``"torchao"``; unset (None): torch.ao on the CPU (torchao for a
            half-precision model, which torch.ao cannot take), torchao elsewhere.
    """

    name: ClassVar[str] = "int8_dynamic"
    leaves_layers: ClassVar[bool] = True
    artifact_note: ClassVar[str | None] = (
        "torch.ao backend: quantized::linear_dynamic with packed int8 weights (TorchScript); "
        "torchao backend: torchao's int8 operators (loading needs torchao)"
    )
    cpu_native: ClassVar[CpuRule | None] = INT8_DOT_PRODUCTS
    #: PyTorch's dynamic int8 runs FBGEMM's kernels on a CPU
    cpu_kernels: ClassVar[str] = "fbgemm"
    excludes: ClassVar[frozenset[str]] = frozenset(
        {"fp8", "int4_weight_only", "int8_static", "int8_weight_only", "prune_2_4"}
    )
    #: torch.ao / torchao modules and tensor subclasses: the ONNX exporter has no mapping for them
    backends: ClassVar[tuple[Backend, ...]] = ("eager", "compile")
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "int8 weights, activations quantized per batch on the fly, every nn.Linear"
    #: torchao's int8 weights report the float dtype they stand for; the matmuls run on int8 activations
    #: (torch.ao's quantized Linear says qint8 itself)
    compute_dtype: ClassVar[str | None] = "int8"

    kernels: Literal["torch.ao", "torchao"] | None = None

    def backend(self, device: str) -> str | None:
        """``"torch.ao"`` (eager, CPU), ``"torchao"``, or None when the chosen (or neither) cannot run on ``device``."""
        if self.kernels != "torchao" and device.startswith("cpu") and self._eager_reason() is None:
            return "torch.ao"
        if self.kernels != "torch.ao" and _torchao_reason("Int8DynamicActivationInt8WeightConfig") is None:
            return "torchao"
        return None

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is not None and not _has_linear(task.model):
            return "the model has no nn.Linear layer to quantize."
        if self.backend(device) is not None:
            return None
        if self.kernels == "torchao":
            return _torchao_reason("Int8DynamicActivationInt8WeightConfig")
        if not device.startswith("cpu"):
            if self.kernels == "torch.ao":
                return "torch.ao's int8 dynamic kernels run on the CPU only; on CUDA use kernels=torchao."
            return f"int8 dynamic quantization runs on the CPU only without torchao; on CUDA it {TORCHAO_HINT}."
        return self._eager_reason()

    @classmethod
    def pair_reason(cls, other: str, device: str, space: dict[str, Any]) -> str | None:
        """After a cast (bf16, fp16), every kernels choice of ``space`` that would take torch.ao's eager
        int8 (which needs float32 linears) fails here: torchao, which takes a cast model, absent or chosen
        against."""
        if other not in ("bf16", "fp16"):
            return None
        choices = space.get("kernels", [None])
        choices = choices if isinstance(choices, list) else [choices]
        torchao = _torchao_reason("Int8DynamicActivationInt8WeightConfig") is None
        if any(kernels == "torchao" or (kernels is None and torchao) for kernels in choices):
            return None
        instead = "choose kernels=torchao" if torchao else f"int8 on a cast model {TORCHAO_HINT}"
        return f"PyTorch's eager int8 dynamic quantization needs float32 linear layers ({instead})"

    @staticmethod
    def _eager_reason() -> str | None:
        if _quantize_dynamic() is None:
            return f"torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic; it {TORCHAO_HINT}."
        engines = [e for e in _INT8_ENGINES if e in torch.backends.quantized.supported_engines]
        if not engines:
            return "this torch build has no quantized CPU engine (x86, fbgemm or qnnpack)."
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with every float ``nn.Linear`` quantized to int8 (dynamic activations).

        Raises:
            TechniqueError: no ``nn.Linear`` to quantize, or no backend on the model's device.
        """
        linears = _linears_to_quantize(self, model)
        device = str(linears[0].weight.device)
        backend = self.backend(device)
        if backend is None:
            raise TechniqueError(f"{self.describe()}: {self.available(device)}")
        half = any(m.weight.dtype != torch.float32 for m in linears)
        torchao = _torchao_reason("Int8DynamicActivationInt8WeightConfig") is None
        if backend == "torch.ao" and half and self.kernels is None and torchao:
            backend = "torchao"  # unset kernels: torch.ao cannot take fp16/bf16 linears, torchao can
        if backend == "torchao":
            if device.startswith("cuda"):
                linears = _int8_kernel_linears(self, linears)
            return _torchao_quantize(self, model, _torchao_config("Int8DynamicActivationInt8WeightConfig"), linears)
        if half:
            instead = "use kernels=torchao" if torchao else f"it {TORCHAO_HINT}"
            raise TechniqueError(
                f"{self.describe()}: PyTorch's eager int8 dynamic quantization needs float32 linear layers; "
                f"with fp16 or bf16 {instead}."
            )
        quantize_dynamic = _quantize_dynamic()
        assert quantize_dynamic is not None  # backend() checked it
        spec: Any = {nn.Linear}
        if self.leave:  # by name: every float linear but those left alone
            from torch.ao.quantization import default_dynamic_qconfig

            names = {id(m): name for name, m in model.named_modules()}
            spec = {names[id(m)]: default_dynamic_qconfig for m in _not_left_alone(self, model, linears)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=False)


#: torch._int_mm (int8 x int8 -> int32 on CUDA) takes widths that are multiples of 8; torchao copies
#: the operands to the host for any other width, which is no int8 kernel at all.
INT8_CUDA_MULTIPLE = 8


def _int8_kernel_linears(technique: Technique, linears: list[nn.Linear]) -> list[nn.Linear]:
    """The linears whose widths CUDA's int8 matmul takes; the others stay in floating point.

    Raises:
        TechniqueError: none has such widths.
    """
    m = INT8_CUDA_MULTIPLE
    kept = [lin for lin in linears if lin.in_features % m == 0 and lin.out_features % m == 0]
    if not kept:
        raise TechniqueError(
            f"{technique.describe()}: no nn.Linear has input and output widths that are multiples of {m}, "
            "which CUDA's int8 matmul needs."
        )
    return kept


@register
class Int8WeightOnly(Technique):
    """Weights stored as int8 (per output channel), activations stay in floating point; torchao only.

    Halves or quarters weight bytes with no activation quantization: a fit for memory-bound,
    small-batch decoding. No hand-written fallback: without torchao it is unavailable.
    """

    name: ClassVar[str] = "int8_weight_only"
    leaves_layers: ClassVar[bool] = True
    artifact_note: ClassVar[str | None] = (
        "torchao int8 weight tensors traced into torchao's operators; loading needs torchao"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {}
    cuda_default_order: ClassVar[int] = 70
    excludes: ClassVar[frozenset[str]] = frozenset(
        {"fp8", "int4_weight_only", "int8_dynamic", "int8_static", "prune_2_4"}
    )
    #: torch.ao / torchao modules and tensor subclasses: the ONNX exporter has no mapping for them
    backends: ClassVar[tuple[Backend, ...]] = ("eager", "compile")
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "int8 weights, floating-point activations, every nn.Linear (torchao)"

    def backend(self, device: str) -> str | None:
        return "torchao" if _torchao_reason("Int8WeightOnlyConfig") is None else None

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is not None and not _has_linear(task.model):
            return "the model has no nn.Linear layer to quantize."
        return _torchao_reason("Int8WeightOnlyConfig")

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` with every float ``nn.Linear`` weight replaced by torchao's int8 tensor.

        Raises:
            TechniqueError: torchao missing, or no ``nn.Linear`` to quantize.
        """
        reason = _torchao_reason("Int8WeightOnlyConfig")
        if reason is not None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        linears = _linears_to_quantize(self, model)
        return _torchao_quantize(self, model, _torchao_config("Int8WeightOnlyConfig"), linears)


@register
class Int4WeightOnly(Technique):
    """Weights as int4 in groups of ``group_size`` input features (tinygemm kernels), bfloat16 compute.

    CUDA only (compute capability 8.0 or newer) and torchao only. The model is cast to bfloat16
    first (as ``bf16`` does) unless it already is; layers whose input width is not a multiple of
    ``group_size`` are left alone. Without MSLK, torchao's tile-packed layout pads every input width
    to a multiple of 1024 (``INT4_TILE_INNER``; a 128-wide layer 8x): int4 is not available for a task
    whose weights that would more than double (``INT4_MAX_PADDING``). With ``compile`` the pair is
    probed on the GPU before it is drawn (``compile_pair_reason``).

    Args:
        group_size: Input features sharing one scale and zero point.
    """

    name: ClassVar[str] = "int4_weight_only"
    leaves_layers: ClassVar[bool] = True
    artifact_note: ClassVar[str | None] = (
        "torchao int4 weight tensors traced into torchao's operators; loading needs torchao and CUDA"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {"group_size": [64, 128]}
    cuda_default_order: ClassVar[int] = 60
    excludes: ClassVar[frozenset[str]] = frozenset(
        {"fp16", "fp8", "int8_dynamic", "int8_static", "int8_weight_only", "prune_2_4"}
    )
    #: torch.ao / torchao modules and tensor subclasses: the ONNX exporter has no mapping for them
    backends: ClassVar[tuple[Backend, ...]] = ("eager", "compile")
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "int4 grouped weights, bfloat16 activations, nn.Linear (torchao, CUDA)"

    group_size: Literal[32, 64, 128, 256] = 128

    def cuda_width_multiple(self) -> int:
        """A Linear's input width must be a multiple of the group size."""
        return self.group_size

    def backend(self, device: str) -> str | None:
        kernels = "MSLK" if int4_packing() == "plain" else "tinygemm"
        return f"torchao ({kernels})" if self.available(device) is None else None

    def available(self, device: str, task: Task | None = None) -> str | None:
        reason = _gpu_kernels_reason("int4 weight-only kernels", (8, 0), ("Int4WeightOnlyConfig",), device, task)
        if reason is None and task is not None and int4_packing() == "tile_packed_to_4d":
            return _int4_padding_reason(task.model, self.group_size)
        return reason

    @classmethod
    def pair_reason(cls, other: str, device: str, space: dict[str, Any]) -> str | None:
        """With ``compile``: why a probe through both fails on ``device`` (``compile_pair_reason``)."""
        return compile_pair_reason(cls, other, device, space)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` in bfloat16 with eligible ``nn.Linear`` weights as torchao int4 tensors.

        Raises:
            TechniqueError: not on a capable CUDA device, torchao missing, the model cast to fp16,
                or no linear layer whose input width is a multiple of ``group_size``.
        """
        linears = _linears_to_quantize(self, model)
        device = str(linears[0].weight.device)
        reason = self.available(device)
        if reason is not None:
            raise TechniqueError(
                f"{self.describe()}: {reason} (the pipeline moves the model to the device given to apply)"
            )
        model = _in_bfloat16(model, self)
        eligible = [m for m in _float_linears(model) if m.in_features % self.group_size == 0]
        if not eligible:
            raise TechniqueError(
                f"{self.describe()}: no nn.Linear has an input width that is a multiple of {self.group_size}."
            )
        config = _torchao_config("Int4WeightOnlyConfig", group_size=self.group_size, int4_packing_format=int4_packing())
        return _torchao_quantize(self, model, config, eligible)


def int4_packing() -> str:
    """torchao's int4 packing: ``"plain"`` (MSLK's kernels) where the MSLK package is installed, else
    ``"tile_packed_to_4d"``, tinygemm's layout, whose kernel ships with PyTorch itself (torchao's default,
    plain, needs MSLK: "Requires mslk >= 1.0.0" without it). A string: torchao's packing enum is a
    ``str`` enum, and not every torchao release exports it."""
    return "plain" if importlib.util.find_spec("mslk") is not None else "tile_packed_to_4d"


def _gpu_kernels_reason(
    kernels: str, minimum: tuple[int, int], configs: tuple[str, ...], device: str, task: Task | None
) -> str | None:
    """Why torchao's ``kernels`` (built from ``configs``) cannot run on ``device`` for ``task``: not a CUDA
    GPU of compute capability ``minimum`` or newer, torchao missing, or no Linear; None when they can."""
    need = f"compute capability {minimum[0]}.{minimum[1]} or newer"
    if not device.startswith("cuda"):
        return f"{kernels} need a CUDA GPU of {need}; this device is {device}."
    reason = next((r for r in map(_torchao_reason, configs) if r is not None), None)
    if reason is not None:
        return reason
    capability = cuda_capability(device)
    if capability is None:
        return f"torch sees no CUDA device {device!r}."
    if capability < minimum:
        return f"{kernels} need {need}; {device} has {capability[0]}.{capability[1]}."
    if task is not None and not _has_linear(task.model):
        return "the model has no nn.Linear layer to quantize."
    return None


def compile_pair_reason(cls: type[Technique], other: str, device: str, space: dict[str, Any]) -> str | None:
    """Why ``cls`` (torchao's float8 or int4 weights), built from the first choice of each of its parameters
    in ``space``, cannot run under ``torch.compile`` on ``device``, or None: the pair is probed on the GPU
    first (``pareto.compress.kernels.pair_reason``, cached), since Dynamo cannot trace these weights on
    some torch and torchao releases (torch 2.11 with torchao 0.17: "Polyfill handler ... does not have a
    traceable function"), and such a trial fails only after paying the compile. The probe compiles in the
    default mode, which is also how the compile backend serves a configuration. None for another
    ``other``, and where ``cls`` cannot run alone (off CUDA, too old a GPU): nothing to pair there."""
    if other != "compile":
        return None
    technique = cls(**{name: _first_choice(choices) for name, choices in space.items()})
    if technique.available(device) is not None:
        return None
    reason = kernel_probes.pair_reason(technique, get_technique("compile"), device)
    return reason.rstrip(".") if reason is not None else None


def _first_choice(choices: Any) -> Any:
    """A search space's first value for one parameter: a list's first, a range's low end, a fixed value."""
    if isinstance(choices, list):
        return choices[0]
    if isinstance(choices, dict) and "low" in choices:
        return choices["low"]
    return getattr(choices, "low", choices)


#: torchao's tinygemm int4 layout (``tile_packed_to_4d``) pads each weight's input width, and each
#: activation's, to a multiple of this: ``Int4TilePackedTo4dTensor.from_hp`` and its linear, in
#: torchao/quantization/quantize_/workflows/int4/int4_tile_packed_to_4d_tensor.py
#: (``find_multiple(in_features, 1024)``). MSLK's ``plain`` layout does not pad.
INT4_TILE_INNER = 1024
#: int4 is not offered where the padded weights hold more than this many times the real ones.
INT4_MAX_PADDING = 2.0


def _int4_padding_reason(model: nn.Module, group_size: int) -> str | None:
    """Why int4 in the tile-packed layout does not pay on ``model``: the Linear weights it would quantize,
    their input widths padded to ``INT4_TILE_INNER``, are more than ``INT4_MAX_PADDING`` times the real
    ones (the padding's zeros are stored and multiplied as the weights are); None otherwise."""
    linears = [m for m in _float_linears(model) if m.in_features % group_size == 0]
    real = sum(m.out_features * m.in_features for m in linears)
    padded = sum(m.out_features * -(-m.in_features // INT4_TILE_INNER) * INT4_TILE_INNER for m in linears)
    if not real or padded <= INT4_MAX_PADDING * real:
        return None
    widths = ", ".join(str(w) for w in sorted({m.in_features for m in linears}))
    return (
        f"torchao's tile-packed int4 layout (without MSLK) pads each Linear's input width to a multiple of "
        f"{INT4_TILE_INNER}: this model's ({widths}) would be padded {padded / real:.1f}x, so most of what int4 "
        "stores and multiplies would be padding."
    )


#: float8 matmuls (torch._scaled_mm) take widths that are multiples of 16.
FP8_MULTIPLE = 16


@register
class Fp8(Technique):
    """float8 (e4m3) weights and activations, each scaled per row, activations quantized on the fly.

    torchao's ``Float8DynamicActivationFloat8WeightConfig`` with ``PerRow`` granularity; the rest of
    the model runs in bfloat16 (it is cast first, as ``bf16`` does, unless it already is). Linears whose
    widths are not multiples of 16 stay in bfloat16. CUDA only, compute capability 8.9 or newer
    (Ada, Hopper), torchao only. Halves the bytes of bf16 weights and doubles the tensor cores' peak:
    it pays where the matmuls are large enough to compute, not on a launch-bound model. With
    ``compile`` the pair is probed on the GPU before it is drawn (``compile_pair_reason``).
    """

    name: ClassVar[str] = "fp8"
    leaves_layers: ClassVar[bool] = True
    artifact_note: ClassVar[str | None] = (
        "torchao float8 weight tensors (per-row scales) in torchao's operators; loading needs torchao and CUDA"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {}
    cuda_default_order: ClassVar[int] = 50
    excludes: ClassVar[frozenset[str]] = frozenset(
        {"fp16", "int4_weight_only", "int8_dynamic", "int8_static", "int8_weight_only", "prune_2_4"}
    )
    backends: ClassVar[tuple[Backend, ...]] = ("eager", "compile")
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "float8 weights and activations per row, bfloat16 elsewhere (torchao, CUDA sm89+)"
    # after the casts (bf16 before it), beside the integer quantizations
    order_in_family: ClassVar[int] = 1
    #: torchao's float8 weights report bfloat16
    compute_dtype: ClassVar[str | None] = "fp8"

    def cuda_width_multiple(self) -> int:
        return FP8_MULTIPLE

    def backend(self, device: str) -> str | None:
        return "torchao" if self.available(device) is None else None

    def available(self, device: str, task: Task | None = None) -> str | None:
        configs = ("Float8DynamicActivationFloat8WeightConfig", "PerRow")
        reason = _gpu_kernels_reason("float8 matmuls", (8, 9), configs, device, task)
        if reason is None and task is not None and not _fp8_linears(task.model):
            # resnet's 128 -> 10 head: skipped as unavailable, not a trial that fails
            return f"the model has no nn.Linear whose widths are multiples of {FP8_MULTIPLE} (float8 matmuls need it)."
        return reason

    @classmethod
    def pair_reason(cls, other: str, device: str, space: dict[str, Any]) -> str | None:
        """With ``compile``: why a probe through both fails on ``device`` (``compile_pair_reason``)."""
        return compile_pair_reason(cls, other, device, space)

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` in bfloat16 with eligible ``nn.Linear`` weights as torchao float8 tensors.

        Raises:
            TechniqueError: not on a capable CUDA device, torchao missing, the model cast to fp16,
                or no linear layer with widths that are multiples of 16.
        """
        linears = _linears_to_quantize(self, model)
        reason = self.available(str(linears[0].weight.device))
        if reason is not None:
            raise TechniqueError(f"{self.describe()}: {reason}")
        model = _in_bfloat16(model, self)
        eligible = _fp8_linears(model)
        if not eligible:
            raise TechniqueError(f"{self.describe()}: no nn.Linear has widths that are multiples of {FP8_MULTIPLE}.")
        ao, _ = _torchao()
        assert ao is not None
        config = _torchao_config("Float8DynamicActivationFloat8WeightConfig", granularity=ao.PerRow())
        return _torchao_quantize(self, model, config, eligible)


def _fp8_linears(model: nn.Module) -> list[nn.Linear]:
    """The float Linear layers whose input and output widths float8 matmuls take."""
    m = FP8_MULTIPLE
    return [lin for lin in _float_linears(model) if lin.in_features % m == 0 and lin.out_features % m == 0]


def _in_bfloat16(model: nn.Module, technique: Technique) -> nn.Module:
    """``model`` cast to bfloat16 (as ``bf16`` does) unless it is already; an fp16 model is refused.

    Raises:
        TechniqueError: the model was cast to fp16.
    """
    if isinstance(model, HalfPrecision):
        if model.dtype != torch.bfloat16:
            raise TechniqueError(
                f"{technique.describe()}: its kernels compute in bfloat16; combine it with bf16, not fp16."
            )
        return model
    return _cast(model, torch.bfloat16, technique)


class HalfPrecision(nn.Module):
    """Run ``module`` in ``dtype``: floating inputs are cast to it, floating outputs back to float32.

    The wrapper keeps a half-precision model a drop-in replacement: the task's ``example_input``
    and ``evaluate`` go on feeding and reading float32 tensors.

    Attributes:
        implied_by: The technique that cast the model because its kernels need half precision
            (``prune_2_4`` on Hopper), or None when a cast was asked for; a cast asked for later in
            the configuration decides the precision then.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype, implied_by: str | None = None) -> None:
        super().__init__()
        self.module = module
        self.dtype = dtype
        self.implied_by = implied_by

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*_cast_floats(args, self.dtype), **_cast_floats(kwargs, self.dtype))
        return _cast_floats(out, torch.float32)


def _cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # named tuples keep their type
        return type(obj)(*(_cast_floats(v, dtype) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast_floats(v, dtype) for v in obj)
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


@functools.cache
def _half_matmul_reason(dtype: torch.dtype) -> str | None:
    """Why a ``dtype`` Linear does not run on this CPU, or None (checked once per process)."""
    try:
        with torch.inference_mode():
            nn.Linear(8, 8, dtype=dtype)(torch.ones(2, 8, dtype=dtype))
    except RuntimeError as exc:
        return f"this torch build has no {dtype} linear kernel on the CPU: {exc}"
    return None


def cast_for(model: nn.Module, dtype: torch.dtype, technique: Technique) -> HalfPrecision:
    """``model`` in ``dtype`` because ``technique``'s kernels need it (a later fp16 or bf16 decides instead)."""
    cast = _cast(model, dtype, technique)
    cast.implied_by = technique.name
    return cast


def _cast(model: nn.Module, dtype: torch.dtype, technique: Technique) -> HalfPrecision:
    """``model`` with its floating-point parameters and buffers in ``dtype``, wrapped in ``HalfPrecision``.

    Raises:
        TechniqueError: already cast, or no floating-point parameter.
    """
    if isinstance(model, HalfPrecision) and model.implied_by is not None:
        model = model.module  # a cast another technique implied (its weights rounded to it): this one decides
    if any(isinstance(m, HalfPrecision) for m in model.modules()):
        raise TechniqueError(f"{technique.describe()}: the model is already cast; use one of fp16 and bf16.")
    if _has_ao_quantized(model):
        raise TechniqueError(f"{technique.describe()}: cast before integer quantization, not after.")
    if not any(p.is_floating_point() for p in model.parameters()):
        raise TechniqueError(f"{technique.describe()}: the model has no floating-point parameter to cast.")
    sparse = semi_structured_linears(model)
    to_dense_weights(sparse)  # 2:4 sparse weights are cast through dense form and packed again
    model = model.to(dtype)
    to_semi_structured_weights(sparse)
    return HalfPrecision(model, dtype)


class _HalfCast(Technique):
    """Shared body of ``fp16`` and ``bf16``."""

    dtype: ClassVar[torch.dtype]
    #: a half-precision PyTorch model is not exported to ONNX (the exporter fails on the cast wrapper, and
    #: ONNX Runtime's CPU provider has few half kernels): eager or compiled only
    backends: ClassVar[tuple[Backend, ...]] = ("eager", "compile")

    def available(self, device: str, task: Task | None = None) -> str | None:
        if task is not None and not any(p.is_floating_point() for p in task.model.parameters()):
            return "the model has no floating-point parameter to cast."
        if device.startswith("cpu"):
            return _half_matmul_reason(self.dtype)
        if self.dtype == torch.bfloat16:
            capability = cuda_capability(device)
            if capability is not None and capability < (8, 0):
                return f"bfloat16 needs compute capability 8.0 or newer; {device} has {capability[0]}.{capability[1]}."
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return ``model`` cast to half precision, wrapped so inputs and outputs stay float32.

        Raises:
            TechniqueError: already cast, or no floating-point parameter.
        """
        return _cast(model, self.dtype, self)


@register
class Fp16(_HalfCast):
    """Parameters and activations in float16 (IEEE half: 5 exponent bits, range to 65504).

    Halves every floating-point byte; on GPUs with tensor cores it also runs the math faster.
    """

    name: ClassVar[str] = "fp16"
    artifact_note: ClassVar[str | None] = (
        "weights in float16; the graph casts float inputs to float16 and its outputs back to float32"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {}
    cuda_default_order: ClassVar[int] = 40
    cpu_native: ClassVar[CpuRule | None] = Cast(
        native=(
            ("amx_fp16", "AMX fp16 tiles (oneDNN)"),
            ("avx512_fp16", "AVX-512 FP16 arithmetic (oneDNN)"),
            ("asimdhp", "Arm half-precision SIMD"),
        ),
        otherwise="not native (F16C converts, it does not compute): usually slower than float32",
    )
    excludes: ClassVar[frozenset[str]] = frozenset({"bf16"})
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "parameters and activations in float16; inputs and outputs stay float32"
    dtype: ClassVar[torch.dtype] = torch.float16


@register
class Bf16(_HalfCast):
    """Parameters and activations in bfloat16 (float32's range, 8 bits of mantissa).

    Halves every floating-point byte; overflow-safe where fp16 is not, at lower precision.
    """

    name: ClassVar[str] = "bf16"
    artifact_note: ClassVar[str | None] = (
        "weights in bfloat16; the graph casts float inputs to bfloat16 and its outputs back to float32"
    )
    cuda_default: ClassVar[dict[str, Any] | None] = {}
    cuda_default_order: ClassVar[int] = 30
    cpu_native: ClassVar[CpuRule | None] = Cast(
        native=(
            ("amx_bf16", "AMX bf16 tiles (oneDNN matmuls and convolutions); pays most on the compile backend"),
            ("avx512_bf16", "AVX-512 BF16 dot products (oneDNN); pays most on the compile backend"),
            ("bf16", "Arm BF16 matrix multiply (oneDNN/ACL)"),
        ),
        otherwise="not native (no AMX or AVX-512 BF16): converted around each op, often slower than float32",
    )
    family: ClassVar[Family] = "quantize"
    summary: ClassVar[str] = "parameters and activations in bfloat16; inputs and outputs stay float32"
    dtype: ClassVar[torch.dtype] = torch.bfloat16
