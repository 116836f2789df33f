"""The search spec: pydantic models loaded from YAML (configs/*.yaml), with CLI flags on top."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from pareto.errors import UsageError
from pareto.units import parse_duration_ms, parse_size_bytes

DurationMs = Annotated[float, BeforeValidator(parse_duration_ms)]
SizeBytes = Annotated[int, BeforeValidator(parse_size_bytes)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLO(_Strict):
    """What a configuration must meet: a P99 latency bound and an accuracy floor."""

    p99: DurationMs | None = Field(default=None, description="P99 latency bound in ms ('7ms').")
    min_accuracy: float | None = None

    @property
    def p99_ms(self) -> float | None:
        return self.p99


class Budget(_Strict):
    """Resource limits: parameter memory as stored."""

    max_memory: SizeBytes | None = Field(default=None, description="Bytes ('512MiB', '2GB').")


class Range(_Strict):
    """A numeric interval to search: ``{low: 0.1, high: 0.9}`` (``step``/``log`` optional)."""

    low: float
    high: float
    step: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        return self


ParamSpace = Range | list[float | int | str | bool]


class Space(_Strict):
    """Which batch sizes and techniques (with their parameter spaces) the search may combine."""

    batch_size: list[Annotated[int, Field(ge=1)]] | None = None
    techniques: dict[str, dict[str, ParamSpace]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_techniques(self) -> Space:
        from pareto.compress.base import get_technique, registry

        techniques = registry()
        for name, params in self.techniques.items():
            cls = techniques.get(name)
            if cls is None:
                raise ValueError(f"unknown technique {name!r}; known: {', '.join(sorted(techniques))}")
            for pname in params:
                if pname not in cls.model_fields:
                    fields = ", ".join(cls.model_fields) or "none"
                    raise ValueError(f"technique {name!r} has no parameter {pname!r} (it has: {fields})")
            for pname, field in cls.model_fields.items():
                if field.is_required() and pname not in params:
                    raise ValueError(f"technique {name!r} needs a space for {pname!r}")
            # every end of every range, and every listed choice, must make a valid technique
            for pname, pspace in params.items():
                values = [pspace.low, pspace.high] if isinstance(pspace, Range) else pspace
                if not values:
                    raise ValueError(f"technique {name!r}: {pname!r} lists no choices")
                for value in values:
                    others = {k: _first(v) for k, v in params.items() if k != pname}
                    try:
                        get_technique(name, {**others, pname: value})
                    except UsageError as exc:
                        raise ValueError(str(exc).rstrip(".")) from None
        return self


def _first(space: ParamSpace) -> Any:
    return space.low if isinstance(space, Range) else space[0]


class Search(_Strict):
    n_trials: int = Field(default=30, ge=1)
    timeout: DurationMs | None = None
    seed: int | None = 0
    sampler: Literal["tpe", "nsga2", "random"] = "tpe"


class Measure(_Strict):
    device: str = "auto"
    threads: int | None = Field(default=None, ge=1)
    samples: int = Field(default=662, ge=1)
    warmup: int = Field(default=50, ge=0)
    confidence: float = Field(default=0.95, gt=0, lt=1)


class SearchSpec(_Strict):
    """Everything a search needs; ``configs/demo.yaml`` is the default spelled out."""

    task: str = "demo"
    study: str | None = None
    slo: SLO = SLO()
    budget: Budget = Budget()
    search: Search = Search()
    measure: Measure = Measure()
    space: Space = Field(default_factory=lambda: Space.model_validate(DEFAULT_SPACE))

    @property
    def study_name(self) -> str:
        return self.study or self.task.rsplit(":", 1)[-1].replace(".", "-")


#: The demo search space; configs/demo.yaml writes the same out (a test keeps them equal).
DEFAULT_SPACE: dict[str, Any] = {
    "batch_size": None,
    "techniques": {
        "int8_dynamic": {},
        "prune_unstructured": {"sparsity": {"low": 0.5, "high": 0.95}},
        "prune_structured": {"ratio": {"low": 0.2, "high": 0.9}},
        "lowrank": {"rank_ratio": {"low": 0.05, "high": 0.5}},
    },
}


def load_spec(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> SearchSpec:
    """Read a YAML spec (or the built-in default) and apply CLI overrides on top.

    ``overrides`` uses dotted keys: ``{"slo.p99": "7ms", "search.n_trials": 20}``; None values are ignored.

    Raises:
        UsageError: unreadable or malformed YAML, unknown keys, or invalid values.
    """
    data: dict[str, Any] = {}
    where = "search spec"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise UsageError(f"Cannot read config {where}: {exc.strerror or exc}.") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise UsageError(f"Config {where} is malformed YAML{at}: {problem}.") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UsageError(f"Config {where} must be a YAML mapping, not {type(loaded).__name__}.")
        data = loaded
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[leaf] = value
    return validate_spec(data, where)


def validate_spec(data: dict[str, Any], where: str = "search spec") -> SearchSpec:
    try:
        return SearchSpec.model_validate(data)
    except UsageError as exc:
        if where == "search spec":
            raise
        raise UsageError(f"{where}: {exc}") from exc
    except ValidationError as exc:
        raise UsageError(f"{where}: {describe_validation_error(exc)}.") from exc


def describe_validation_error(exc: ValidationError) -> str:
    """The first error of a pydantic ValidationError as one readable clause."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "list[", "Range")))
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, UsageError):
        msg = str(ctx_error).rstrip(".")
    return f"{loc}: {msg}" if loc else msg
