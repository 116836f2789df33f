"""A failure learned per layer: the layer a technique broke a model at, and that layer left alone.

A user's own model may read a layer's weight in its own code, tie it to another, or check its type
(Hugging Face models tie embeddings and heads). A technique that replaces such a layer (low-rank's
factor pair, a quantizer's module or weight) breaks the model there, and only at the parameters that
touch it. When a trial fails, ``culprits`` traces the failure to the layers the configuration replaced
(``Served.changed``): the deepest frame of the traceback whose module is one of them, else the names a
failing line of the model's own code reads (``self.mid.weight``). The search stores each (technique,
layer) for the study (``pareto_technique_checks``, kind ``"leave"``) and, from then on, builds every
configuration with that technique leaving the layer as it is (``Technique.leave``, torchao's
``filter_fn`` shape): the same cause does not fail a second trial.
"""

from __future__ import annotations

import hashlib
import linecache
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pareto.errors import NoEffect, TechniqueError, Transient
from pareto.store import storage
from pareto.store.records import CheckRecord

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from pareto.compress import Config
    from pareto.compress.served import Served

#: The kind of technique check a learned layer is stored as.
KIND = "leave"
_SELF_ATTRIBUTE = re.compile(r"\bself\.([A-Za-z_][\w.]*)")


@contextmanager
def tracing_layers(served: Served) -> Iterator[None]:
    """Around the work on a built configuration: a ``TechniqueError`` raised out of it carries the layers
    its failure came from (``TechniqueError.layers``)."""
    try:
        yield
    except (Transient, NoEffect):
        raise
    except TechniqueError as exc:
        exc.layers = culprits(exc, served)
        raise


def culprits(exc: BaseException, served: Served) -> tuple[tuple[str, str], ...]:
    """The (technique, layer) pairs ``exc`` came from: the deepest frame, over its chain of causes, whose
    module is a layer the configuration replaced; else the replaced layers the model's own code read on
    the deepest line of a module's frame that names one (``self.mid.weight``); else none."""
    from torch import nn

    changed = dict(served.changed)
    if not changed:
        return ()
    names = {id(m): name for name, m in served.eager.named_modules()}
    frames: list[tuple[str, str]] = []  # (the frame's module, its line), outermost first
    for error in reversed(_chain(exc)):  # the first cause raised is the deepest
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            module = frame.f_locals.get("self")
            if isinstance(module, nn.Module) and id(module) in names:
                frames.append((names[id(module)], linecache.getline(frame.f_code.co_filename, lineno)))
    for name, text in reversed(frames):
        if name in changed:
            return ((changed[name], name),)
        read = {_replaced(name, path, changed) for path in _SELF_ATTRIBUTE.findall(text)} - {None}
        if read:
            return tuple(sorted((changed[layer], layer) for layer in read if layer is not None))
    return ()


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first (at most 16)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(found) < 16:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _replaced(owner: str, path: str, changed: dict[str, str]) -> str | None:
    """The longest prefix of ``owner``.``path`` that names a replaced layer, or None."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join([owner, *parts[:end]] if owner else parts[:end])
        if name in changed:
            return name
    return None


def learned(engine: Engine, study_id: int, env_id: int) -> dict[str, tuple[str, ...]]:
    """Per technique, the layers the study learned it must leave alone."""
    found: dict[str, set[str]] = {}
    for record in storage.technique_checks(engine, study_id, env_id, KIND).values():
        found.setdefault(record.technique, set()).add(str(record.details["layer"]))
    return {technique: tuple(sorted(layers)) for technique, layers in found.items()}


def remember(engine: Engine, study_id: int, env_id: int, layers: tuple[tuple[str, str], ...], reason: str) -> None:
    """Store each (technique, layer) of a failure, with its reason."""
    for technique, layer in layers:
        record = CheckRecord(technique, False, reason, {"layer": layer})
        key = hashlib.sha256(f"{technique}\0{layer}".encode()).hexdigest()[:16]
        storage.save_technique_check(engine, study_id, env_id, KIND, key, record)


def with_learned(config: Config, leave: dict[str, tuple[str, ...]]) -> Config:
    """``config`` with each technique leaving alone the layers learned for it (``Technique.leave``)."""
    if not leave or not any(t.name in leave for t in config.techniques):
        return config
    techniques = tuple(
        t.model_copy(update={"leave": tuple(sorted({*(t.leave or ()), *leave[t.name]}))})
        if t.name in leave and t.leaves_layers
        else t
        for t in config.techniques
    )
    return config.model_copy(update={"techniques": techniques})


def said(layers: tuple[tuple[str, str], ...]) -> str:
    """The line a search prints when it learned layers."""
    pairs = "; ".join(f"{technique} leaves layer {layer!r} alone" for technique, layer in layers)
    return f"{pairs} for the rest of the study (the failure came from there)."
