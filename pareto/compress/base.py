"""The Technique contract, its registry and the listing behind ``pareto techniques``.

A technique is data (a frozen pydantic model of its parameters) plus one verb, ``apply``,
in the spirit of ``quantize_(model, Config())``: easy to store, hash, compare and search over.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from pareto.compress.served import Step
from pareto.errors import UsageError
from pareto.measure import environment
from pareto.naming import BACKENDS, Backend, describe_technique

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pareto.compress.cpu import CpuRule
    from pareto.task import Task

Family = Literal["distill", "prune", "lowrank", "finetune", "quantize", "compile"]

#: The pipeline applies families in this order, whatever order a config lists them in: a student is
#: distilled first, recovery fine-tuning follows pruning and low-rank, quantization comes after training.
CANONICAL_ORDER: tuple[Family, ...] = ("distill", "prune", "lowrank", "finetune", "quantize", "compile")

_REGISTRY: dict[str, type[Technique]] = {}


class Technique(BaseModel):
    """Base class: subclasses declare ``name``, ``family``, ``summary``, their parameters as fields, and ``apply``.

    ``example`` holds representative values for parameters without a default, so that
    ``describe_techniques`` can build every technique; defaults fill the rest.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ClassVar[str]
    family: ClassVar[Family]
    summary: ClassVar[str] = ""
    example: ClassVar[dict[str, Any]] = {}
    #: Rank within the family when several of its techniques are combined (then by name).
    order_in_family: ClassVar[int] = 0
    #: The backends a configuration with this technique can be served on.
    backends: ClassVar[tuple[Backend, ...]] = BACKENDS
    #: Applied to the served graph after the backend's conversion (ORT's quantizer), not to the PyTorch module.
    on_graph: ClassVar[bool] = False
    #: Techniques that cannot share a configuration with this one (either side naming the other is
    #: enough): two weight quantizations, two casts, 2:4 weights that torchao cannot quantize.
    excludes: ClassVar[frozenset[str]] = frozenset()
    #: The dtype its kernels compute in where torch's dispatch cannot tell (torchao's int8 and float8
    #: weights report the float dtype they stand for); ``pareto.compress.apply`` gathers it into ``Served``.
    compute_dtype: ClassVar[str | None] = None
    #: Its result is compiled with Inductor's freezing and static shapes (a PT2E graph), as measured and exported.
    inductor_freezing: ClassVar[bool] = False
    #: What it becomes in an exported artifact (the manifest's ``in_the_artifact``); None: applied by
    #: pareto before serialization.
    artifact_note: ClassVar[str | None] = None
    #: Its parameters' choices in the search space a CUDA device gets when a spec names no techniques
    #: (``pareto.spec.default_cuda_space``); None: not offered there.
    cuda_default: ClassVar[dict[str, Any] | None] = None
    #: Its place in that default space (lowest first): what pays most on a GPU comes first.
    cuda_default_order: ClassVar[int] = 0
    #: What a CPU's instructions do for it (``pareto.compress.cpu``'s rules: a ``Cast`` with its flags,
    #: ``INT8_DOT_PRODUCTS``, ``INDUCTOR_VECTORS``); a lever rule makes it one of the CPU's levers. None:
    #: the instructions do not decide it.
    cpu_native: ClassVar[CpuRule | None] = None
    #: Whose kernels it runs on a CPU, as ``pareto.measure.environment.host_cpu`` names them: "onednn"
    #: (casts, PT2E int8, Inductor), "fbgemm" (PyTorch's dynamic int8), "mlas" (ONNX Runtime).
    cpu_kernels: ClassVar[str] = "onednn"
    #: It replaces layers one by one and honours ``leave`` (low-rank, the weight quantizers).
    leaves_layers: ClassVar[bool] = False

    #: The layers (names as ``named_modules`` gives them) it leaves as they are: a study learns them from
    #: a failure there (``pareto.study.layers``), as torchao's ``filter_fn`` leaves layers out. None: none.
    leave: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _leave_honoured(self) -> Technique:
        if self.leave and not self.leaves_layers:
            raise ValueError(f"{self.name} replaces no layer one by one, so it cannot leave {list(self.leave)} alone")
        return self

    def leaves(self, layer: str) -> bool:
        """Whether ``layer`` (a module name in the model) is one it leaves as it is."""
        return layer in (self.leave or ())

    @classmethod
    def on_this_cpu(cls, features: str | None, capability: str | None = None) -> str | None:
        """What a CPU's instructions (its ``KERNEL_FEATURES``, space-separated, and torch's dispatch level)
        do for this technique (``cpu_native``); None where they do not decide."""
        if cls.cpu_native is None:
            return None
        return cls.cpu_native.judge(set((features or "").split()), capability)

    @classmethod
    def cpu_facts(cls) -> str | None:
        """``on_this_cpu`` for this machine's CPU, as the kernels it runs on (``cpu_kernels``) may use it."""
        if cls.cpu_native is None:
            return None
        return cls.on_this_cpu(*environment.host_cpu(cls.cpu_kernels))

    def cuda_width_multiple(self) -> int:
        """The multiple of a Linear's widths this technique's CUDA kernels take (fp8: 16, int4: its group
        size, 2:4: 64); structured pruning and low-rank in the same configuration round to it
        (``needed_multiple``), so that no layer they shrink falls out of the kernels. 1: any width."""
        return 1

    def available(self, device: str, task: Task | None = None) -> str | None:
        """Return why this technique cannot run on ``device`` ("cpu", "cuda:0") for ``task``, or None if it can.

        Without a task only the device and the installed libraries are checked.
        """
        return None

    @classmethod
    def pair_reason(cls, other: str, device: str, space: dict[str, Any]) -> str | None:
        """Why this technique, searched over ``space`` (its parameters' choices), cannot share a configuration
        with technique ``other`` on ``device`` with the libraries installed here, or None. Pairs that never
        run together anywhere are ``excludes``; this is for what the install decides."""
        return None

    def backend(self, device: str) -> str | None:
        """The library whose kernels this technique would use on ``device`` (e.g. "torchao"), if it says."""
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return the compressed model; may modify ``model`` (the pipeline passes a copy)."""
        raise NotImplementedError

    def build(self, model: nn.Module, task: Task) -> Step:
        """``apply``'s module with what only this application knows (seconds spent building a serving form);
        the pipeline calls this. Techniques that build a serving form override it, and ``apply`` returns
        its module."""
        return Step(self.apply(model, task))

    def requires(self) -> tuple[str, ...]:
        """Modules beside torch that loading a model with this technique imports (none by default)."""
        return ()

    def params(self) -> dict[str, Any]:
        """Parameters as stored and hashed; unset optional ones (None) are left out, and the layers left
        alone (``leave``) are a list, as stored JSON reads them back."""
        data = self.model_dump(exclude_none=True)
        if "leave" in data:
            data["leave"] = list(data["leave"])
        return data

    def describe(self) -> str:
        return describe_technique(self.name, self.params())


def canonical_key(technique: Technique | type[Technique]) -> tuple[int, int, str]:
    """Sort key giving the order in which the pipeline applies techniques."""
    return (CANONICAL_ORDER.index(technique.family), technique.order_in_family, technique.name)


#: Pairs of technique names that cannot share a configuration on this install (``install_conflicts``); a
#: pair may also hold a backend's marker (``on_backend``): that technique is never served on that backend.
Pairs = frozenset[frozenset[str]]


def on_backend(backend: str) -> str:
    """The marker that stands for serving on ``backend`` in a pair of ``Pairs``: ``"backend:compile"``."""
    return f"backend:{backend}"


def runs_on(name: str, backend: str, extra: Pairs = frozenset()) -> bool:
    """Whether a configuration served on ``backend`` can use technique ``name``: the technique runs on
    that backend, and this install does not pair it with the backend's marker (``install_conflicts``)."""
    return backend in registry()[name].backends and frozenset((name, on_backend(backend))) not in extra


def conflict(names: list[str], extra: Pairs = frozenset()) -> tuple[str, str] | None:
    """The first pair of ``names`` that cannot share a configuration (``Technique.excludes``, or one of the
    ``extra`` pairs this install adds), or None."""
    techniques = registry()
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if b in techniques[a].excludes or a in techniques[b].excludes or frozenset((a, b)) in extra:
                return a, b
    return None


def install_conflicts(
    space: dict[str, dict[str, Any]], device: str, backends: Sequence[str] = ("eager",)
) -> list[tuple[str, str, str]]:
    """The pairs of a search space's techniques that cannot run together on this install, though each can
    alone (``Technique.pair_reason``): ``(a, b, why)``, never drawn together and skipped by the grid.

    With the compile backend among ``backends``, a technique whose pair with ``compile`` fails is also
    paired with that backend's marker (``(name, on_backend("compile"), why)``): the backend serves a
    configuration through ``torch.compile``'s default mode, which is what the pair is judged by."""
    techniques = registry()
    names = list(space)
    found = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if conflict([a, b]) is not None:
                continue  # never together anywhere
            why = techniques[a].pair_reason(b, device, space[a]) or techniques[b].pair_reason(a, device, space[b])
            if why is not None:
                found.append((a, b, why))
    if "compile" in backends:
        for name in names:
            if "compile" in techniques[name].backends:
                why = techniques[name].pair_reason("compile", device, space[name])
                if why is not None:
                    found.append((name, on_backend("compile"), why))
    return found


def register(cls: type[Technique]) -> type[Technique]:
    """Class decorator that makes a technique available by its ``name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"technique {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[Technique]]:
    """All registered techniques by name (the built-in ones are registered by importing any module of
    ``pareto.compress``: the package imports them all first)."""
    return dict(_REGISTRY)


def get_technique(name: str, params: dict[str, Any] | None = None) -> Technique:
    """Build a technique from its name and parameters.

    Raises:
        UsageError: unknown name, unknown parameter or a value out of range.
    """
    techniques = registry()
    cls = techniques.get(name)
    if cls is None:
        known = ", ".join(sorted(techniques))
        raise UsageError(f"Unknown technique {name!r}; known techniques: {known}.")
    from pydantic import ValidationError

    try:
        return cls(**(params or {}))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "parameters"
        message = err["msg"].removeprefix("Value error, ").rstrip(".")
        raise UsageError(f"Technique {name!r}: {where}: {message}.") from exc


def cuda_capability(device: str) -> tuple[int, int] | None:
    """Compute capability of the CUDA device ``device`` ("cuda", "cuda:N"); None for another device or none seen."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        return None
    return torch.cuda.get_device_capability(torch.cuda.current_device() if index is None else index)


#: On CUDA, widths that structured pruning and low-rank leave are multiples of this: tensor-core
#: kernels tile matrices in multiples of 8 (fp16/bf16), and a width off the tile falls back to slower
#: kernels or padding (Torch-Pruning's ``round_to`` serves the same purpose).
CUDA_WIDTH_MULTIPLE = 8


#: The multiple the techniques of the configuration being built need (``needed_multiple``).
_NEEDED = contextvars.ContextVar("pareto_needed_width_multiple", default=1)


def width_multiple(device: torch.device | str) -> int:
    """The multiple a pruned or factored width is rounded to on ``device``: on CUDA 8 and what the other
    techniques of the configuration being built need (``needed_multiple``: fp8's 16, int4's group
    size…), their least common multiple; 1 elsewhere."""
    import torch

    return math.lcm(CUDA_WIDTH_MULTIPLE, _NEEDED.get()) if torch.device(device).type == "cuda" else 1


@contextlib.contextmanager
def needed_multiple(techniques: Sequence[Technique]) -> Iterator[int]:
    """While ``techniques`` are applied as one configuration: ``width_multiple`` on CUDA includes the
    least common multiple of their ``cuda_width_multiple``; yields that multiple."""
    multiple = math.lcm(1, *(t.cuda_width_multiple() for t in techniques))
    token = _NEEDED.set(multiple)
    try:
        yield multiple
    finally:
        _NEEDED.reset(token)


def round_up(units: int, multiple: int) -> int:
    """``units`` rounded up to a multiple of ``multiple``."""
    return -(-units // multiple) * multiple
