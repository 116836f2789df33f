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
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

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
    import io
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


def thaw(blob: bytes, kind: str = FROZEN) -> nn.Module:
    """A stored program of ``kind`` as a module, on the device it was frozen on (an exported program is
    always in inference form; the wrapper takes ``eval()``, which the program itself refuses)."""
    import io
    import warnings

    if kind.startswith(TRACED):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _Frozen(torch.jit.load(io.BytesIO(blob)))
    return _Frozen(torch.export.load(io.BytesIO(blob)).module())


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
    terms): batches double from 1 until a call takes longer than the target or ``max_batch`` is reached."""
    import math

    from pareto.devices import torch_threads

    best, best_gap, batch = 1, math.inf, 1
    with torch_threads(threads):
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
