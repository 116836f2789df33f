"""A configuration (techniques, batch size, serving backend) and the one verb that applies it."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pareto.compress.base import Backend, Technique, canonical_key, conflict, get_technique, needed_multiple
from pareto.compress.served import Served, Step
from pareto.errors import TechniqueError, UsageError
from pareto.naming import describe_config

if TYPE_CHECKING:
    from torch import nn

    from pareto.task import Task


class Config(BaseModel):
    """One point of the search space: which techniques, with which parameters, at which batch size, served how.

    ``backend`` is where the configuration runs when measured and served: ``"eager"`` (PyTorch as it
    is), ``"compile"`` (``torch.compile``, default mode, after every technique) or ``"onnxruntime"``
    (exported to ONNX and run by ONNX Runtime's CPU execution provider). The baseline is the
    uncompressed model on ``"eager"``: speedups are against the model as the user has it.
    """

    model_config = ConfigDict(frozen=True)

    techniques: tuple[Technique, ...] = ()
    batch_size: int = Field(ge=1)
    backend: Backend = "eager"

    @field_validator("techniques")
    @classmethod
    def _canonical(cls, value: tuple[Technique, ...]) -> tuple[Technique, ...]:
        names = [t.name for t in value]
        if len(set(names)) != len(names):
            raise ValueError(f"a technique appears twice in {names}")
        return tuple(sorted(value, key=canonical_key))

    @model_validator(mode="after")
    def _combinable(self) -> Config:
        pair = conflict([t.name for t in self.techniques])
        if pair is not None:
            raise ValueError(f"{pair[0]} and {pair[1]} cannot share a configuration: use one of the two")
        return self

    @model_validator(mode="after")
    def _served_where_it_runs(self) -> Config:
        for technique in self.techniques:
            if self.backend not in technique.backends:
                where = " or ".join(technique.backends)
                raise ValueError(f"{technique.name} runs on the {where} backend, not on {self.backend}")
        return self

    def without(self, name: str) -> Config:
        """The same configuration without technique ``name`` (its smaller twin)."""
        return self.model_copy(update={"techniques": tuple(t for t in self.techniques if t.name != name)})

    @property
    def is_baseline(self) -> bool:
        return not self.techniques and self.backend == "eager"

    def to_dict(self) -> dict[str, Any]:
        """Stored and hashed; ``backend`` only when it is not ``"eager"``, so eager keys stay as they were."""
        data: dict[str, Any] = {
            "batch_size": self.batch_size,
            "techniques": [{"name": t.name, "params": t.params()} for t in self.techniques],
        }
        if self.backend != "eager":
            data["backend"] = self.backend
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        """A stored configuration (``to_dict``).

        Raises:
            UsageError: an unknown technique or parameter, or a configuration this version refuses (one
                stored by an older pareto: ``cuda_graphs`` on the compile backend), in one sentence.
        """
        from pydantic import ValidationError

        techniques = tuple(get_technique(t["name"], t.get("params")) for t in data.get("techniques", []))
        try:
            return cls(techniques=techniques, batch_size=data["batch_size"], backend=data.get("backend", "eager"))
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ").rstrip(".")
            raise UsageError(
                f"The stored configuration {describe_config(data)} cannot be built here: {reason}."
            ) from exc

    def key(self) -> str:
        """Content hash of the configuration: equal configs share a key."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return describe_config(self.to_dict())


def apply(
    model: nn.Module, config: Config, task: Task, *, device: str | None = None, threads: int | None = None
) -> Served:
    """Return a compressed copy of ``model``, served as ``config`` says, with what is known about serving it.

    The original is never modified. This is where a model moves: the copy is put on ``device`` before the
    first technique, and the techniques see the task's view there (``pareto.devices.on_device``:
    example inputs, training batches and the reference model on the device), with ``batch_size`` set to
    the configuration's (``compile`` warms up on it). Then the model is put on the configuration's
    backend (compiled, or exported to ONNX Runtime), and the techniques that work on the served graph
    (``on_graph``: ORT's quantizer) follow. What the techniques declare (``compute_dtype``,
    ``inductor_freezing``, ``requires``) and what each serving step returns (its seconds, ONNX
    Runtime's graph dtype and source module, a CUDA-graph pool) are gathered in the ``Served`` record.

    Args:
        model: The uncompressed model.
        config: The techniques, applied in canonical order, and the batch size.
        task: The task the model belongs to (``train_data`` for distillation and fine-tuning).
        device: Where to build and serve the copy ("cpu", "cuda:0"); None leaves it where ``model`` is.
        threads: The intra-op thread count the served model will be timed at: its serving form (compiled,
            exported) is built at it, since Inductor's CPU code and oneDNN's prepacked weights are made
            for the count they were built at (PT2E int8 on MiniLM built at 2 threads ran 3.5x slower at 1).
            None: the current count.

    Returns:
        The record: ``module`` is what serves the configuration, ``eager`` the model before
        torch.compile, ONNX Runtime or CUDA graphs, ``compile_s`` the seconds spent building those.

    Raises:
        TechniqueError: a technique broke on this model, or the backend cannot serve it (the reason is kept).
    """
    from pareto.compress.onnxrt import graph_file_reason
    from pareto.devices import model_device, on_device, torch_threads

    for technique in config.techniques:
        why = graph_file_reason(technique.name, technique.on_graph, model)
        if why is not None:
            raise TechniqueError(why)
    where = device if device is not None else str(model_device(model))
    compressed = copy.deepcopy(model).eval().to(where)
    view = dataclasses.replace(on_device(task, where), batch_size=config.batch_size)
    on_module = [t for t in config.techniques if not t.on_graph]
    notes: list[str] = []
    changed: dict[str, str] = {}
    # structured pruning and low-rank leave widths the configuration's quantizers take (fp8, int4, 2:4)
    with needed_multiple(config.techniques):
        for technique in (t for t in on_module if t.family != "compile"):
            before = _layer_kinds(compressed) if technique.leaves_layers else {}
            step = _apply_one(technique, compressed, view)
            compressed, notes = step.module, [*notes, *step.notes]
            after = _layer_kinds(compressed) if before else {}
            changed |= {name: technique.name for name, kind in before.items() if after.get(name) != kind}
            _route_around_fused_encoder_kernel(compressed)  # before the next technique (compile) sees it
    served = dataclasses.replace(
        _declared(compressed, config.techniques), notes=tuple(notes), changed=tuple(changed.items())
    )
    with torch_threads(threads):
        for technique in (t for t in on_module if t.family == "compile"):  # torch.compile, CUDA graphs
            served = served.then(_apply_one(technique, served.module, view))
            _route_around_fused_encoder_kernel(served.module)
        served = served.then(_serve(served, config, view))
        # on the served graph, fusions (ORT's optimizer) before the quantizers that read the fused operators
        for technique in sorted((t for t in config.techniques if t.on_graph), key=lambda t: t.family != "compile"):
            served = served.then(_apply_one(technique, served.module, view))
    served.module.eval()
    return served


def _layer_kinds(model: nn.Module) -> dict[str, tuple[type, type]]:
    """Each named layer's type and its weight's (a quantized weight is another tensor type, or a method)."""
    return {name: (type(m), type(getattr(m, "weight", None))) for name, m in model.named_modules() if name}


def _declared(model: nn.Module, techniques: tuple[Technique, ...]) -> Served:
    """``model`` after its techniques, not served yet, with what they declare: the compute dtype torch
    cannot tell (the last technique's that says), Inductor's freezing, the libraries loading it needs."""
    dtypes = [t.compute_dtype for t in techniques if t.compute_dtype is not None]
    return Served(
        module=model,
        eager=model,
        compute_dtype=dtypes[-1] if dtypes else None,
        requires=tuple(dict.fromkeys(name for t in techniques for name in t.requires())),
        inductor_freezing=any(t.inductor_freezing for t in techniques),
    )


def _apply_one(technique: Technique, model: nn.Module, task: Task) -> Step:
    return _reason_kept(technique, functools.partial(technique.build, model, task))


def _reason_kept(technique: Technique, build: Callable[[], Step]) -> Step:
    """``build()``; any failure but a ``TechniqueError`` becomes one that names ``technique`` and keeps the reason."""
    try:
        return build()
    except TechniqueError:
        raise
    except Exception as exc:  # a model that breaks under a technique fails the trial, reason kept
        raise TechniqueError(f"{technique.describe()} failed on this model: {type(exc).__name__}: {exc}") from exc


def _serve(served: Served, config: Config, task: Task) -> Step:
    """``served.module`` on the configuration's backend, with the seconds that took (None on eager)."""
    if config.backend == "compile":
        from pareto.compress.compile import Compile
        from pareto.compress.onnxrt import graph_file_reason

        why = graph_file_reason("compile", False, served.module)
        if why is not None:
            raise TechniqueError(why)

        compile_ = Compile()  # the compile technique in its default mode; a PT2E graph with Inductor's freezing
        build = functools.partial(compile_.build, served.module, task, freezing=served.inductor_freezing)
        return _reason_kept(compile_, build)
    from pareto.compress.onnxrt import OrtModule, opened, to_onnxruntime

    if config.backend == "onnxruntime":
        return to_onnxruntime(served.module, task)
    if isinstance(served.module, OrtModule):  # an ONNX file's graph: ONNX Runtime is where it runs
        return opened(served.module)
    return Step(served.module)


def _route_around_fused_encoder_kernel(model: nn.Module) -> None:
    """Send ``nn.TransformerEncoderLayer`` through its modules once a technique has replaced its linears.

    In eval mode the layer's fused fast path passes ``linear1.weight``, ``linear2.weight`` and the
    attention's ``out_proj.weight`` straight to one kernel: a factor pair, a quantized module or a
    packed weight there breaks it. Its regular path calls the modules and computes the same function.
    """
    from torch import nn
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    def plain(module: object) -> bool:
        weight = getattr(module, "weight", None)
        return isinstance(weight, nn.Parameter) and not is_traceable_wrapper_subclass(weight)

    for layer in model.modules():
        if isinstance(layer, nn.TransformerEncoderLayer) and not all(
            plain(m) for m in (layer.linear1, layer.linear2, getattr(layer.self_attn, "out_proj", None))
        ):
            layer.activation_relu_or_gelu = 0  # the fast path's gate: the layer runs module by module
