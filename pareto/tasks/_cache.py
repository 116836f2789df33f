"""Built-in tasks' trained weights, cached once per recipe under $PARETO_CACHE_DIR (~/.cache/pareto),
and the classification-task shape they share."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pareto.task import Task


def cache_root() -> Path:
    """Where pareto keeps what it computes once per machine: ``$PARETO_CACHE_DIR``, else ``~/.cache/pareto``."""
    return Path(os.environ.get("PARETO_CACHE_DIR") or Path.home() / ".cache" / "pareto")


def cache_path(prefix: str, recipe: dict[str, Any]) -> Path:
    """A state-dict file named by a hash of everything that changes the trained weights (torch minor included)."""
    major, minor = torch.__version__.split(".")[:2]
    blob = json.dumps({**recipe, "torch": f"{major}.{minor}"}, sort_keys=True).encode()
    return cache_root() / f"{prefix}-{hashlib.sha256(blob).hexdigest()[:16]}.pt"


def load_state(path: Path) -> dict[str, torch.Tensor] | None:
    """The cached weights, or None when there is no readable cache file (then the model is retrained)."""
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError):
        return None


def save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write to a temporary file and rename, so a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def trained_model(
    path: Path, build: Callable[[], nn.Module], train: Callable[[], dict[str, torch.Tensor]]
) -> nn.Module:
    """The model ``build`` makes, with weights from the cache at ``path``, trained by ``train`` on first use.

    Built on the meta device and given the stored tensors: no wasted init, the caller's RNG untouched.
    """
    state = load_state(path)
    if state is None:
        state = train()
        save_state(state, path)
    with torch.device("meta"):
        model = build()
    model.load_state_dict(state, assign=True)
    return model.eval()


def classification_task(
    name: str,
    model: nn.Module,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    eval_batch: int | None = None,
    **task_fields: Any,
) -> Task:
    """A Task scored by top-1 accuracy on a held-out split, timed on real rows of that split.

    ``eval_batch`` scores the split in slices of that many rows (a large model's activations for the
    whole split at once would not fit); unset, in one forward.
    """
    step = eval_batch or len(x_test)

    def evaluate(candidate: nn.Module) -> float:
        candidate.eval()
        correct = 0
        with torch.inference_mode():
            for start in range(0, len(x_test), step):
                predicted = candidate(x_test[start : start + step]).argmax(dim=1)
                correct += int((predicted.to(y_test.device) == y_test[start : start + step]).sum())
        # float32, as a mean over the predictions would round it: stored accuracies stay comparable
        return (torch.tensor(correct, dtype=torch.float32) / len(x_test)).item()

    def example_input(batch_size: int) -> torch.Tensor:
        # real rows, repeated when the batch is larger than the test split
        return x_test[torch.arange(batch_size) % len(x_test)]

    return Task(name=name, model=model, example_input=example_input, evaluate=evaluate, **task_fields)


def minibatches(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, labels)`` slices of ``size`` rows, in order (the last one may be shorter)."""
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def fit_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    batch_size: int,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Cross-entropy training, a fresh shuffle each epoch, ``schedule`` stepped per batch.

    Draws from torch's global RNG: callers seed it inside ``torch.random.fork_rng``.
    """
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for inputs, targets in minibatches(x[order], y[order], batch_size):
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
