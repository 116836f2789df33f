"""The nightly's frozen reference is loaded onto the device the night runs on, whatever device it was
frozen on, and with torchao imported first when the program holds torchao's tensors.

Without a GPU, ``meta`` stands for the other device: a program frozen on the CPU is loaded onto
``meta``, and one frozen on ``meta`` (a device this process does not run on) is loaded onto the CPU.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from pareto.measure import reference as reference_module
from pareto.measure.reference import Reference, freeze, thaw


class _WithConstant(nn.Module):
    """A linear layer, a buffer, and a tensor made in forward on the input's device (a device argument
    in the exported graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.register_buffer("shift", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.shift + torch.ones(4, device=x.device)


def _devices(module: nn.Module) -> set[torch.device]:
    program = module.program
    return {t.device for t in [*program.parameters(), *program.buffers()]}


def _graph_devices(module: nn.Module) -> set[str]:
    program = module.program
    return {str(n.kwargs["device"]) for n in program.graph.nodes if "device" in n.kwargs}


def test_a_reference_frozen_on_the_cpu_is_loaded_onto_the_nights_device() -> None:
    model, x = _WithConstant().eval(), torch.randn(3, 8)
    blob, kind = freeze(model, x)
    there = thaw(blob, kind, device="meta")
    assert _devices(there) == {torch.device("meta")}
    assert _graph_devices(there) == {"meta"}  # the graph's own device argument moved too
    out = there(x.to("meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)
    here = thaw(blob, kind, device="cpu")  # where it was frozen: as it was
    assert _devices(here) == {torch.device("cpu")}
    torch.testing.assert_close(here(x), model(x))


def test_a_reference_frozen_on_another_device_runs_where_the_night_runs() -> None:
    model = _WithConstant().eval().to("meta")
    blob, kind = freeze(model, torch.randn(3, 8, device="meta"))
    loaded = thaw(blob, kind, device="cpu")
    assert _devices(loaded) == {torch.device("cpu")} and _graph_devices(loaded) == {"cpu"}
    out = loaded(torch.randn(3, 8))
    assert out.device.type == "cpu" and out.shape == (3, 4)


def test_a_torchao_reference_frozen_on_another_device_is_loaded_with_its_tensor_subclasses() -> None:
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    subclass = type(model[0].weight)
    model.to("meta")  # the quantized weights are pickled, with the device they were saved from
    blob, kind = freeze(model, torch.randn(4, 64, device="meta"))
    loaded = thaw(blob, kind, device="cpu")
    weights = list(loaded.program.parameters())
    assert any(type(w) is subclass for w in weights) and {w.device.type for w in weights} == {"cpu"}
    assert loaded(torch.randn(4, 64)).device.type == "cpu"


def _spy_order(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the loader does, in order: each module imported through ``importlib`` and each program load."""
    order: list[str] = []
    real_import, real_load = importlib.import_module, torch.export.load

    def imported(name: str, package: str | None = None) -> Any:
        order.append(f"import {name}")
        return real_import(name, package)

    def loaded(*args: Any, **kwargs: Any) -> Any:
        order.append("load")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", imported)
    monkeypatch.setattr(torch.export, "load", loaded)
    return order


def test_torchao_is_imported_before_a_program_that_holds_its_tensors_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = nn.Sequential(nn.Linear(64, 8)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(2, 64)
    blob, kind = freeze(model, x)
    plain_blob, plain_kind = freeze(nn.Linear(64, 8).eval(), x)
    order = _spy_order(monkeypatch)
    thaw(blob, kind, device="cpu")
    assert order[:2] == ["import torchao", "load"], order
    order.clear()
    thaw(plain_blob, plain_kind, device="cpu")  # a program without torchao does not pay its import
    assert order == ["load"], order
    order.clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)  # torchao not installed
    with contextlib.suppress(Exception):  # the load itself says what is missing
        thaw(blob, kind, device="cpu")
    assert "import torchao" not in order


def test_the_nightly_loads_its_stored_reference_onto_the_bench_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.nightly_job.history import BenchReferences
    from pareto.store import storage

    blob, kind = freeze(_WithConstant().eval(), torch.randn(2, 8))
    monkeypatch.setattr(storage, "reference_program", lambda _engine, _study, _digest: blob)
    task = SimpleNamespace(example_input=lambda batch: torch.randn(batch, 8, device="meta"))
    bench = SimpleNamespace(device="meta", engine=None, task=task)
    timed = BenchReferences(bench, 1, lambda _: None).load(Reference(batch=2, kind=kind))
    assert timed is not None and _devices(timed.model) == {torch.device("meta")}
    assert timed.model(timed.inputs).device.type == "meta"


def test_a_stored_reference_that_does_not_match_its_digest_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.nightly_job.history import BenchReferences
    from pareto.store import storage

    blob, kind = freeze(_WithConstant().eval(), torch.randn(2, 8))
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])  # one bit of the last byte flipped
    monkeypatch.setattr(storage, "reference_program", lambda _engine, _study, _digest: tampered)
    loaded = _spy_order(monkeypatch)
    notices: list[str] = []
    bench = SimpleNamespace(device="cpu", engine=None, task=SimpleNamespace(example_input=torch.randn))
    assert BenchReferences(bench, 1, notices.append).load(Reference(batch=2, kind=kind)) is None
    assert loaded == [] and "does not match its digest" in notices[0]


def test_the_torchao_check_reads_compressed_records_too() -> None:
    import io
    import zipfile

    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data/weights/weight_0", b"torchao.quantization.Int8Tensor" * 20)
    assert b"torchao" not in packed.getvalue() and reference_module._refers_to_torchao(packed.getvalue())
    assert not reference_module._refers_to_torchao(b"not an archive")
