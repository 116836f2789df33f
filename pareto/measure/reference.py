"""The nightly's reference workload: a frozen model timed beside the pick, so that the machine's drift
can be taken out of a night-to-night comparison.

On a shared machine every workload on the host gets slower together when a neighbour takes the
cores, the caches or the memory bandwidth, or the host lowers its clock. A model that never changes,
timed in the same interleaved rounds as the pick and the baseline, moves with the machine and not
with the model: the pick's time divided by the reference's, measured in the same rounds, is the
pick's time in units of "this machine tonight". Chromium's performance bots run a reference build
beside the build under test for the same reason.

The reference is a **frozen copy**: the pick as it is served, exported once with ``torch.export``
(or, where export refuses it, as PyTorch's eager int8 kernels are, traced to TorchScript) and stored
in the database, so it has the pick's kernels and memory traffic (a neighbour that thrashes the cache
slows a model that streams its weights and not one that fits in L2; int8 and fp32 kernels drift
apart between processes by tens of per cent on a shared VM) but none of the code that a later change
to the model, the task or pareto could make slower. When the pick can be neither exported nor
traced (ONNX Runtime) the baseline model is frozen instead, and when it cannot either, a fixed-seed
multilayer perceptron is the reference. Its batch is chosen once, so that a call takes about as long
as one call of the pick.

A stored program names the device it was frozen on (its weights, and device arguments in its graph);
``thaw`` loads it onto the device the night runs on instead, so a nightly on another GPU index, or
under another ``CUDA_VISIBLE_DEVICES``, times it there. A program with torchao's tensor subclasses in
it is loaded with torchao imported first (its subclasses and operators are registered on import).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pareto.locks import timing_lock

#: The reference's name: its shape and seed. A different kind is a different reference, never compared.
KIND = "mlp-256x3-seed0"
_WIDTH, _LAYERS, _SEED = 256, 3, 0
#: Batches tried when sizing the reference: 1, 2, 4, ... up to this.
MAX_BATCH = 8192
_SIZING_CALLS = 20


#: A frozen program's kind: this prefix and its digest (``torch.export``), or ``TRACED`` and its digest
#: (a TorchScript trace, for what export refuses).
FROZEN = "frozen:"
TRACED = "traced:"


@dataclass(frozen=True)
class Reference:
    """Which reference workload a study's nights time: its kind and its batch (fixed once chosen).

    ``kind`` is ``KIND`` (the fixed MLP), ``"frozen:<digest>"`` (a stored ``torch.export`` program) or
    ``"traced:<digest>"`` (a stored TorchScript trace); ``source`` says what was frozen.
    """

    batch: int
    kind: str = KIND
    source: str = ""

    @property
    def frozen(self) -> bool:
        return self.kind.startswith((FROZEN, TRACED))

    @property
    def digest(self) -> str:
        return self.kind.removeprefix(FROZEN).removeprefix(TRACED)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "batch": self.batch, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Reference | None:
        """The reference a summary recorded; None for none, or for a kind this version does not build."""
        if not data or not isinstance(data.get("batch"), int):
            return None
        kind = data.get("kind")
        if kind != KIND and not (isinstance(kind, str) and kind.startswith((FROZEN, TRACED))):
            return None
        return cls(batch=data["batch"], kind=kind, source=str(data.get("source") or ""))

    def describe(self) -> str:
        if self.frozen:
            how = "torch.export program" if self.kind.startswith(FROZEN) else "TorchScript trace"
            return f"frozen copy of {self.source} ({how} {self.digest[:12]}) at batch {self.batch}"
        return f"reference MLP ({_LAYERS} × {_WIDTH}-wide Linear, fixed seed) at batch {self.batch}"


def freeze(module: nn.Module, example: Any) -> tuple[bytes, str]:
    """``module`` frozen at ``example`` and serialized: the program, and its kind (``FROZEN`` or ``TRACED``
    and the blob's SHA-256).

    ``torch.export`` first; a module it refuses (PyTorch's eager int8 kernels hold packed weights it
    cannot flatten) is traced to TorchScript, which records the same kernels.

    Raises:
        Exception: what the TorchScript trace raises for a module neither can freeze (the export's
        reason is chained).
    """
    import hashlib
    import warnings

    from pareto.devices import as_args

    args = as_args(example)
    buffer = io.BytesIO()
    with torch.no_grad():
        try:
            torch.export.save(torch.export.export(module, args), buffer)
            prefix = FROZEN
        except Exception as refused:
            buffer = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TorchScript's deprecation and tracer warnings
                try:
                    torch.jit.save(torch.jit.trace(module, args, check_trace=False), buffer)
                except Exception as exc:
                    raise exc from refused
            prefix = TRACED
    blob = buffer.getvalue()
    return blob, prefix + hashlib.sha256(blob).hexdigest()


def thaw(blob: bytes, kind: str = FROZEN, *, device: str | None = None) -> nn.Module:
    """A stored program of ``kind`` as a module on ``device`` (None: on the device it was frozen on).

    An exported program is always in inference form; the wrapper takes ``eval()``, which the program
    itself refuses. With ``device``, its weights, constants and the device arguments in its graph are
    placed there (``torch.export.passes.move_to_device_pass``; a torch without it moves the weights
    only); a TorchScript trace is loaded with ``map_location=device``, which places its weights.
    """
    import warnings

    if kind.startswith(TRACED):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _Frozen(torch.jit.load(io.BytesIO(blob), map_location=device))
    if _refers_to_torchao(blob) and importlib.util.find_spec("torchao") is not None:
        importlib.import_module("torchao")  # registers its tensor subclasses and operators before the load
    if device is None:
        return _Frozen(torch.export.load(io.BytesIO(blob)).module())
    with _loading_onto(torch.device(device)):
        program = torch.export.load(io.BytesIO(blob))
    return _Frozen(_placed(program, torch.device(device)))


def _refers_to_torchao(blob: bytes) -> bool:
    """Whether a ``torch.export`` archive names torchao (a pickled tensor subclass, an operator): its
    records are stored uncompressed, and compressed ones are read too."""
    import zipfile

    if b"torchao" in blob:
        return True
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            packed = [i for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
            return any(b"torchao" in archive.read(info) for info in packed)
    except (zipfile.BadZipFile, OSError):
        return False


class _Onto(torch.overrides.TorchFunctionMode):
    """While a program loads: every tensor made or moved onto a device other than the CPU goes to
    ``target`` instead (``torch.export.load`` places each weight on the device it was saved from)."""

    def __init__(self, target: torch.device) -> None:
        super().__init__()
        self.target = target

    def _map(self, value: Any) -> Any:
        return self.target if isinstance(value, torch.device) and value.type != "cpu" else value

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if isinstance(kwargs.get("device"), str):
            kwargs["device"] = torch.device(kwargs["device"])
        if "device" in kwargs:
            kwargs["device"] = self._map(kwargs["device"])
        return func(*(self._map(a) for a in args), **kwargs)


class _AwayFromCpu(dict):
    """``torch.load``'s ``map_location``: every location but the CPU read as ``target`` (a mapping, the one
    form that tensor subclasses rebuilt from a pickle honour besides a single device)."""

    def __init__(self, target: torch.device) -> None:
        super().__init__()
        self.target = str(target)

    def get(self, key: Any, default: Any = None) -> Any:
        return key if str(key).startswith("cpu") else self.target


@contextmanager
def _loading_onto(target: torch.device) -> Iterator[None]:
    """``torch.export.load`` with what it places on another device than the CPU placed on ``target``:
    its plain weights through ``_Onto``; what it unpickles (tensor subclasses, sample inputs) through
    ``torch.load``'s ``map_location``, which the loader does not pass: ``torch.load`` is replaced in
    this process for the load's duration (the nightly loads its reference in one thread)."""
    load = torch.load

    def load_onto(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("map_location", _AwayFromCpu(target))
        return load(*args, **kwargs)

    torch.load = load_onto
    try:
        with _Onto(target):
            yield
    finally:
        torch.load = load


def _placed(program: Any, target: torch.device) -> nn.Module:
    """``program`` as a module on ``target``: every device it names other than the CPU (a program all
    on the CPU: the CPU) moved there, its graph's device arguments included."""
    found = _devices_in(program)
    away = {d for d in found if d.type != "cpu"} or ({torch.device("cpu")} if found else set())
    moves = {str(d): str(target) for d in away if d != target}
    if not moves:
        return program.module()
    try:
        from torch.export.passes import move_to_device_pass
    except ImportError:  # an older torch: the weights move, device arguments in the graph stay
        return program.module().to(target)
    return move_to_device_pass(program, moves).module()


def _devices_in(program: Any) -> set[torch.device]:
    """The devices a loaded program names: its weights' and constants', its graph's values' and the
    device arguments of its graph's calls."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    found = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    for node in program.graph.nodes:
        values = node.meta.get("val")
        for value in values if isinstance(values, (tuple, list)) else [values]:
            if isinstance(value, torch.Tensor):
                found.add(value.device)
        named = node.kwargs.get("device")
        if named is not None:
            found.add(torch.device(named))
        if node.target is torch.ops.aten.to.device and len(node.args) > 1:
            found.add(torch.device(node.args[1]))
    return found


class _Frozen(nn.Module):
    program: nn.Module

    def __init__(self, program: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "program", program)  # not a child: eval() and train() do not reach it

    def forward(self, *args: Any) -> Any:
        return self.program(*args)


def reference_model(device: str) -> nn.Module:
    """The reference network on ``device``, in eval mode: the same weights in every process."""
    generator = torch.Generator().manual_seed(_SEED)
    layers: list[nn.Module] = []
    for index in range(_LAYERS):
        linear = nn.Linear(_WIDTH, _WIDTH)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(_WIDTH, _WIDTH, generator=generator) / _WIDTH**0.5)
            linear.bias.copy_(torch.randn(_WIDTH, generator=generator) * 0.01)
        layers.append(linear)
        if index < _LAYERS - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).eval().to(device)


def reference_input(reference: Reference, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_SEED + 1)
    return torch.randn(reference.batch, _WIDTH, generator=generator).to(device)


def size_reference(target_ms: float, device: str, *, threads: int | None = None) -> Reference:
    """The MLP's batch whose call takes closest to ``target_ms`` here."""
    model = reference_model(device)
    batch = size_batch(model, lambda b: reference_input(Reference(b), device), target_ms, device, threads=threads)
    return Reference(batch=batch)


def size_batch(
    model: nn.Module,
    make_input: Callable[[int], Any],
    target_ms: float,
    device: str,
    *,
    threads: int | None = None,
    max_batch: int = MAX_BATCH,
) -> int:
    """The batch whose call of ``model`` takes closest to ``target_ms`` (the median of a few calls, in log
    terms): batches double from 1 until a call takes longer than the target or ``max_batch`` is reached.

    On a GPU the calls are timed holding its timing and work locks (``pareto.locks.timing_lock``): no
    other pareto process's timing or GPU work runs beside them."""
    import math
    from contextlib import nullcontext

    from pareto.devices import torch_threads

    best, best_gap, batch = 1, math.inf, 1
    held = timing_lock(device, what="sizing the nightly's reference") if device.startswith("cuda") else nullcontext()
    with held, torch_threads(threads):
        while batch <= max_batch:
            ms = _median_ms(model, make_input(batch), device)
            gap = abs(math.log(ms / target_ms))
            if gap < best_gap:
                best, best_gap = batch, gap
            if ms >= target_ms:
                break
            batch *= 2
    return best


def _median_ms(model: nn.Module, x: Any, device: str) -> float:
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    times = []
    from pareto.devices import as_args

    args = as_args(x)
    with torch.inference_mode():
        for _ in range(3):
            model(*args)
        for _ in range(_SIZING_CALLS):
            sync()
            start = time.perf_counter()
            model(*args)
            sync()
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)
