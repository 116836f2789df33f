"""The Task contract: what a user writes to plug a model into pareto.

Example::

    from pareto import Task

    def make_task() -> Task:
        return Task(name="my-model", model=model,
                    example_input=lambda batch_size: torch.randn(batch_size, 64),
                    evaluate=lambda model: accuracy(model),
                    train_data=None)

Load it with ``pareto search --task package.module:make_task``.

Where tensors live: write the task for the CPU (or for wherever your data is); pareto measures on
the device you ask for (``--device cuda``) and keeps one rule. The model is copied and put on the
device by pareto; ``example_input`` and ``train_data`` are moved there before any model sees them;
``evaluate`` receives a model that moves the inputs your code passes (tensors, and tuples, lists and
dicts of them) to its device and moves its outputs back to where those inputs were, so the metric is
computed where your data is. Latency is timed on inputs already on the device: no host-device copy
is in a timed call. Your task object and your model are never changed.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.errors import TaskError, exception_line
from pareto.tasks.rows import FLOOR_ROOM, MIN_EVALUATION, rows_needed
from pareto.tasks.source import ModelSource, is_source_ref

if TYPE_CHECKING:
    from torch import nn

#: Built-in tasks by name; each value is a ``module:factory`` reference like a user's own.
BUILTIN_TASKS: dict[str, str] = {
    "demo": "pareto.tasks.demo:make_task",
    "transformer": "pareto.tasks.transformer:make_task",
    "minilm": "pareto.tasks.minilm:make_task",
    "resnet": "pareto.tasks.resnet:make_task",
    "transformer-large": "pareto.tasks.transformer_large:make_task",
}

#: The module that makes a task of a model folder and a data file (``ModelSource``).
FOLDER_TASK = "pareto.tasks.folder"


@dataclass(frozen=True)
class AttentionShape:
    """What a transformer task holds per token at inference, for the KV-cache term of memory.

    Args:
        layers: Attention layers that keep keys and values.
        width: Model width (heads × head dimension) of the keys and of the values.
        sequence: Tokens of context kept in the cache.
        heads: Attention heads per layer (for head pruning and reports).
    """

    layers: int
    width: int
    sequence: int
    heads: int | None = None


@dataclass
class Task:
    """A model, a way to make its inputs, and a way to score it.

    Args:
        name: Short name stored with every trial.
        model: The uncompressed ``torch.nn.Module``; pareto never modifies it in place (nor moves it).
        example_input: ``batch_size -> input`` (a tensor or a tuple of tensors) used for timing; pareto
            moves it to the measured device.
        evaluate: ``model -> float``, higher is better (accuracy, F1, fidelity...); the model it gets
            takes your inputs wherever they are and gives its outputs back there.
        train_data: Optional iterable of ``(inputs, targets)`` for distillation or recovery fine-tuning;
            pareto moves each batch to the measured device.
        batch_size: The batch size the task is served at when the search space does not say.
        attention: For transformer tasks, the shape behind the KV cache; None otherwise.
        timing_inputs: Optional ``batch_size -> list of inputs``: the real requests, timed one per call in
            turn (cycled), so that the P99 covers the long ones; None times ``example_input`` every call.
        inputs_note: What ``timing_inputs`` holds, for the measurement's method (which rows, what lengths,
            how they are padded).
        evaluation_rows: How many examples ``evaluate`` scores, when the task knows (an accuracy floor
            finer than one row in a few is refused).
    """

    name: str
    model: nn.Module
    example_input: Callable[[int], Any]
    evaluate: Callable[[nn.Module], float]
    train_data: Iterable[Any] | None = None
    batch_size: int = 1
    attention: AttentionShape | None = None
    timing_inputs: Callable[[int], list[Any]] | None = None
    inputs_note: str | None = None
    evaluation_rows: int | None = None


def load_task(ref: str) -> Task:
    """Build a task from a built-in name (``demo``), a ``package.module:factory`` reference, or a model
    folder and data file (``ModelSource.ref()``, ``model:…``: nothing is imported from it).

    Raises:
        TaskError: the name is unknown, the module does not import, or the factory fails.
    """
    if is_source_ref(ref):  # a model folder and a data file: data, not code
        # by name, as the built-in tasks are: the task modules import this one
        folder: Any = importlib.import_module(FOLDER_TASK)
        made: Task = folder.make_task(ModelSource.from_ref(ref))
        return made
    target = BUILTIN_TASKS.get(ref, ref)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_TASKS))
        raise TaskError(f"Unknown task {ref!r}: use a built-in task ({known}) or 'package.module:factory'.")
    module_name, _, attr = target.partition(":")
    if module_name.partition(".")[0] != "pareto" and os.getcwd() not in sys.path and "" not in sys.path:
        # `pareto search --task mymodule:make_task` finds modules beside the user; last, so that a stray
        # file there (a `sklearn.py`) never shadows an installed module that pareto or the task imports
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is reported, not raised
        raise TaskError(f"Task module {module_name!r} could not be imported: {exception_line(exc)}.") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise TaskError(f"Module {module_name!r} has no callable {attr!r} to build the task.")
    try:
        task = factory()
    except TaskError:
        raise  # already one sentence for the user (a built-in task's missing extra, say)
    except Exception as exc:  # the factory is user code; its failure is a task error
        raise TaskError(f"Task factory {target!r} failed: {exception_line(exc)}.") from exc
    if not isinstance(task, Task):
        raise TaskError(f"Task factory {target!r} returned {type(task).__name__}, not pareto.Task.")
    if task.batch_size < 1:
        raise TaskError(f"Task {task.name!r} has batch_size {task.batch_size}; it must be at least 1.")
    return task


def check_evaluation_rows(task: Task, min_accuracy: float | None) -> None:
    """Raises TaskError when the task scores too few examples for its accuracy floor (``rows_needed``)."""
    needed = rows_needed(min_accuracy)
    if task.evaluation_rows is not None and task.evaluation_rows < needed:
        floor = f"an accuracy floor of {min_accuracy:g} needs" if min_accuracy is not None else "a study needs"
        raise TaskError(
            f"The data gives {task.evaluation_rows} evaluation rows and {floor} {needed:,} (one wrong row must not "
            f"decide the floor: {FLOOR_ROOM} rows' room under a perfect score, and {MIN_EVALUATION} rows at least); "
            "add rows to the data file or lower --min-accuracy."
        )
