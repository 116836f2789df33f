"""Where tensors live: one rule, kept by pareto, not by each caller.

The bench (``pareto.study.bench.Bench``) resolves the device once. ``pareto.compress.apply(..., device=...)``
puts each compressed copy there, and everything that feeds a model gets its data from the bench's
task view (``on_device``): example inputs, training batches and the reference model already sit on
the device, and the task's own ``evaluate`` sees the model through ``Fed``, which moves the inputs the
task passes (tensors in nested tuples, lists and dicts too) to the model's device and the outputs
back to where the task's inputs were. A task written for the CPU runs unchanged on a GPU.

A model on PyTorch's ``meta`` device (shapes only, no data) works through the same view: tests use it
to catch a tensor left behind on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pareto.errors import UsageError
from pareto.task import Task


def resolve_device(spec: str) -> str:
    """Turn a device spec ("auto", "cpu", "cuda", "cuda:N") into "cpu" or "cuda:N".

    Raises:
        UsageError: an unknown spec, or a CUDA device torch does not see.
    """
    name = spec.strip().lower()
    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise UsageError(f"Unknown device {spec!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'.")
    index = int(match.group(1) or 0)
    device = f"cuda:{index}"
    if not torch.cuda.is_available():
        raise UsageError(f"CUDA device {device!r} was requested but torch sees no CUDA device; use --device cpu.")
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(
            f"CUDA device {device!r} was requested but torch sees only {count} CUDA device(s); "
            f"use cuda:0 to cuda:{count - 1}."
        )
    return device


def device_here(measured: str) -> str:
    """A device this machine has for work measured on ``measured``: the same GPU kind when it has one, else the CPU."""
    if measured.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(measured).index or 0
        return f"cuda:{index}" if index < torch.cuda.device_count() else "cuda:0"
    return "cpu"


def device_identity(device: str) -> str:
    """What names the physical device across processes: a GPU's UUID (the same whatever
    ``CUDA_VISIBLE_DEVICES`` numbers it), else the device name itself."""
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            return f"gpu-{uuid}"
    return device


def to_device(obj: Any, device: str | torch.device) -> Any:
    """``obj`` with every tensor in it on ``device``: a tensor, or tuples (named too), lists and dict values
    of them, nested; anything else as it is. A tensor already there is returned as it is (no copy)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple keeps its type
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    return obj


class InputCycle(list[Any]):
    """Inputs timed call after call, in order and then again from the first: the real requests a task
    takes (``Task.timing_inputs``), where ``example_input`` is one fixed input. Each item is what
    ``example_input`` returns (a tensor or a tuple of them)."""


def timed_inputs(task: Task, batch_size: int) -> Any:
    """What latency is timed on at ``batch_size``: the task's real requests in turn (an ``InputCycle``)
    where it has them, else its ``example_input``."""
    if task.timing_inputs is None:
        return task.example_input(batch_size)
    return InputCycle(task.timing_inputs(batch_size))


def as_args(inputs: Any) -> tuple[Any, ...]:
    """The positional arguments of ``model(*args)`` for an ``example_input`` value: a tensor, or a tuple or list."""
    return (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)


def first_device(obj: Any) -> torch.device | None:
    """The device of the first tensor found in ``obj`` (nested as in ``to_device``), or None."""
    if isinstance(obj, torch.Tensor):
        return obj.device
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    for value in values:
        found = first_device(value)
        if found is not None:
            return found
    return None


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (or buffer); the CPU for a model with neither."""
    first: torch.Tensor | None = next(iter(model.parameters()), None)
    if first is None:
        first = next(iter(model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def same_device(a: str | torch.device, b: str | torch.device) -> bool:
    """True when ``a`` and ``b`` name one device ("cuda" and "cuda:0" on a one-GPU view count as one)."""
    da, db = torch.device(a), torch.device(b)
    if da.type != db.type:
        return False
    return (da.index or 0) == (db.index or 0)


class Fed(nn.Module):
    """A model as the task's own ``evaluate`` sees it: what the task passes in goes to the model's
    device, what comes out goes back to where the task's inputs were.

    Attributes the wrapper does not have are read from the model, so an ``evaluate`` that calls
    ``candidate.eval()`` or reads a model attribute keeps working. A meta tensor has no data to copy
    back, so outputs of a model on the meta device stay there (a shape-only evaluate reads them).
    """

    def __init__(self, model: nn.Module, device: str) -> None:
        super().__init__()
        self.model = model
        self.device = device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        home = first_device((args, kwargs))
        out = self.model(*to_device(args, self.device), **to_device(kwargs, self.device))
        if home is None or same_device(home, self.device) or torch.device(self.device).type == "meta":
            return out
        return to_device(out, home)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)


class _OnDevice(Iterable[Any]):
    """A task's training batches, each moved to the device as it is read (a list is moved once)."""

    def __init__(self, batches: Iterable[Any], device: str) -> None:
        self.batches, self.device = batches, device

    def __iter__(self) -> Iterator[Any]:
        return (to_device(batch, self.device) for batch in self.batches)


@dataclass
class DeviceTask(Task):
    """A task as the bench sees it: its data on ``device`` (built by ``on_device``, never by hand)."""

    device: str = "cpu"


def on_device(task: Task, device: str) -> DeviceTask:
    """The bench's view of ``task`` on ``device``: the reference model, example inputs and training
    batches there, and ``evaluate`` fed through ``Fed``. The user's task and model are never changed
    (the reference model is a copy when it has to move). A view already on ``device`` is itself.
    """
    if isinstance(task, DeviceTask) and same_device(task.device, device):
        return task
    model = task.model
    if not same_device(model_device(model), device):
        model = copy.deepcopy(model).to(device).eval()
    train_data: Iterable[Any] | None = task.train_data
    if isinstance(train_data, (list, tuple)):
        train_data = [to_device(batch, device) for batch in train_data]
    elif train_data is not None:
        train_data = _OnDevice(train_data, device)
    evaluate, example_input, timing = task.evaluate, task.example_input, task.timing_inputs
    fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(Task)}
    fields.update(
        model=model,
        example_input=lambda batch_size: to_device(example_input(batch_size), device),
        timing_inputs=None if timing is None else lambda batch_size: InputCycle(to_device(timing(batch_size), device)),
        evaluate=lambda candidate: evaluate(Fed(candidate, device)),
        train_data=train_data,
    )
    return DeviceTask(**fields, device=device)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """``torch.set_num_threads(threads)`` inside the block, the previous count restored after; None
    (or the count already set) changes nothing."""
    previous = torch.get_num_threads()
    if threads is None or threads == previous:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def recompile_settings(limit: int) -> dict[str, Any]:
    """Dynamo's settings for at most ``limit`` graphs per compiled frame, with a hit an error: past its
    limit Dynamo would otherwise run the frame eagerly, silently (for a PT2E graph, the float graph)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    settings: dict[str, Any] = {name: limit}
    if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
        settings["fail_on_recompile_limit_hit"] = True
    return settings
