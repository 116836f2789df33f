"""Theoretical compression multiplies across orthogonal techniques (Deep Compression's 9 × 5.5 ≈ 49 ×)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from pareto.compress import Config, apply, get_technique, quantize
from pareto.compress.quantize import Int8Dynamic
from pareto.measure.memory import theoretical_bytes
from pareto.task import Task


def _model() -> nn.Sequential:
    # no biases and no buffers: every byte is a weight, so the ratios are exact
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(90, 300, bias=False), nn.ReLU(), nn.Linear(300, 90, bias=False)).eval()


def _ratio(*techniques: tuple[str, dict[str, float]]) -> float:
    model = _model()
    task = Task(name="tiny", model=model, example_input=lambda b: torch.randn(b, 90), evaluate=lambda m: 0.0)
    config = Config(techniques=tuple(get_technique(n, p) for n, p in techniques), batch_size=1)
    return theoretical_bytes(model) / theoretical_bytes(apply(model, config, task).module)


PRUNE_9X = ("prune_unstructured", {"sparsity": 8 / 9})  # keeps 6,000 of 54,000 weights


def test_pruning_alone_keeps_one_ninth() -> None:
    assert _ratio(PRUNE_9X) == pytest.approx(9.0)


@pytest.fixture
def eager_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8_dynamic through torch.ao even where torchao is installed (whose tensors memory.py cannot count yet)."""
    monkeypatch.setattr(quantize, "_torchao", lambda: (None, quantize.TORCHAO_HINT))
    if Int8Dynamic().available("cpu") is not None:
        pytest.skip(Int8Dynamic().available("cpu") or "")


def test_pruning_times_int8_quantization_multiplies_to_36(eager_int8: None) -> None:
    # alone a bit over 4: the smallest dense weights round to int8 zeros, which count as pruned
    assert 4.0 <= _ratio(("int8_dynamic", {})) <= 4.04
    # the surviving weights are the largest, so none rounds to an int8 zero: exactly 9 × 4
    assert _ratio(PRUNE_9X, ("int8_dynamic", {})) == pytest.approx(36.0)


@pytest.mark.parametrize("cast", ["fp16", "bf16"])
def test_pruning_times_half_precision_multiplies_to_18(cast: str) -> None:
    assert _ratio((cast, {})) == pytest.approx(2.0)
    assert _ratio(PRUNE_9X, (cast, {})) == pytest.approx(18.0)


def test_low_rank_times_int8_quantization_multiplies(eager_int8: None) -> None:
    # rank 9 of 90: each 90x300 layer becomes 9 x (90 + 300) weights, 7.69x fewer (the head too, here)
    lowrank = ("lowrank", {"rank_ratio": 0.1, "keep_head": False})
    assert _ratio(lowrank) == pytest.approx(300 * 90 / (9 * 390))
    expected = 4 * 300 * 90 / (9 * 390)
    # at least the product; a little over it where small factor entries round to int8 zeros
    assert expected <= _ratio(lowrank, ("int8_dynamic", {})) <= 1.02 * expected


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is an optional extra")
def test_pruning_times_torchao_int8_multiplies_less_its_scales() -> None:
    # 6,000 int8 weights, plus a float32 scale and an int8 zero point per output row (390 rows)
    assert _ratio(PRUNE_9X, ("int8_weight_only", {})) == pytest.approx(54_000 * 4 / (6_000 + 390 * 5), rel=0.01)
