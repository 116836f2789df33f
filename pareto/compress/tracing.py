"""Inputs to trace a model on (``torch.export``, the ONNX exporter) and to calibrate static quantization with.

Shared by the techniques that export the model's graph: ONNX Runtime's (``onnxrt``) and PyTorch 2
export quantization (``pt2e``).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from pareto.devices import as_args

if TYPE_CHECKING:
    from pareto.task import Task

#: Batches of the task's data that static quantization calibrates activation ranges on, at most.
CALIBRATION_BATCHES = 32

T = TypeVar("T")


def trace_inputs(task: Task) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Argument tuples to trace the task's model on, each with a ``dynamic_shapes`` spec for it.

    Every tensor axis gets ``torch.export.Dim.AUTO``: an axis the graph fixes stays fixed, the others
    follow the input, so the traced graph takes other batch sizes too (evaluation, the throughput
    sweep). torch.export fixes an axis of size 1, so a batch of 1 is traced on ``example_input(2)``
    first, then on ``example_input(1)``; the caller tries them in order.
    """
    batches = [2, 1] if task.batch_size < 2 else [task.batch_size]
    for batch in batches:
        args = as_args(task.example_input(batch))
        dims = tuple(
            {axis: torch.export.Dim.AUTO for axis in range(a.dim())} if isinstance(a, torch.Tensor) else None
            for a in args
        )
        yield args, dims


def trace_first(task: Task, trace: Callable[[tuple[Any, ...], tuple[Any, ...]], T]) -> T:
    """``trace(args, dynamic_shapes)`` on each of ``trace_inputs(task)`` in turn, quietly; the first result.

    Raises:
        Exception: the last input's failure, when every one failed.
    """
    failure: Exception | None = None
    for args, dims in trace_inputs(task):
        try:
            with quiet():
                return trace(args, dims)
        except Exception as exc:  # try the next input; the caller words the last failure
            failure = exc
    assert failure is not None
    raise failure


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, without terminal colours (torch.onnx puts them in)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0] if text else "no message"


def calibration_inputs(task: Task) -> list[tuple[Any, ...]]:
    """Up to ``CALIBRATION_BATCHES`` argument tuples: ``train_data``'s inputs (not labels), else the example input."""
    inputs = [item[0] for item in itertools.islice(task.train_data or (), CALIBRATION_BATCHES)]
    return [as_args(x) for x in inputs or [task.example_input(task.batch_size)]]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep exporters' and quantizers' progress lines, warnings and advice off the terminal."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # "torchvision is not installed…", "consider pre-processing…"
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
