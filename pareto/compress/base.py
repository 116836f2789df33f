"""The Technique contract and its registry.

A technique is data (a frozen pydantic model of its parameters) plus one verb, ``apply``,
in the spirit of ``quantize_(model, Config())``: easy to store, hash, compare and search over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from pareto.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

    from pareto.task import Task

Family = Literal["distill", "prune", "lowrank", "quantize", "compile"]

#: The pipeline applies families in this order, whatever order a config lists them in.
CANONICAL_ORDER: tuple[Family, ...] = ("distill", "prune", "lowrank", "quantize", "compile")

_REGISTRY: dict[str, type[Technique]] = {}


class Technique(BaseModel):
    """Base class: subclasses declare ``name``, ``family``, their parameters as fields, and ``apply``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ClassVar[str]
    family: ClassVar[Family]

    def available(self, device: str) -> str | None:
        """Return why this technique cannot run on ``device`` ("cpu", "cuda:0"), or None if it can."""
        return None

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        """Return the compressed model; may modify ``model`` (the pipeline passes a copy)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return self.model_dump()

    def describe(self) -> str:
        args = ",".join(f"{k}={_fmt(v)}" for k, v in self.params().items())
        return f"{self.name}({args})" if args else self.name


def register(cls: type[Technique]) -> type[Technique]:
    """Class decorator that makes a technique available by its ``name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"technique {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[Technique]]:
    """All registered techniques by name (importing the built-in ones first)."""
    import pareto.compress  # noqa: F401  (registers the built-in techniques)

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
        raise UsageError(f"Technique {name!r}: {where}: {err['msg']}.") from exc


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
