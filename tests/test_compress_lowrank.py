"""Low-rank factorization by retained energy."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pareto.compress.lowrank import LowRank, _rank_for_energy
from pareto.errors import TechniqueError
from pareto.task import Task


def _task(model: nn.Module) -> Task:
    return Task(name="tiny", model=model, example_input=lambda b: torch.randn(b, 64), evaluate=lambda m: 0.0)


def _spectrum_layer(singular_values: list[float], n_in: int = 64, n_out: int = 48) -> nn.Linear:
    """A Linear whose weight has exactly the given singular values."""
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(n_out, n_out, generator=g))
    v, _ = torch.linalg.qr(torch.randn(n_in, n_in, generator=g))
    s = torch.zeros(n_out)
    s[: len(singular_values)] = torch.tensor(singular_values)
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        layer.weight.copy_(u @ torch.diag(s) @ v[:, :n_out].T)
    return layer


def test_rank_for_energy_is_the_smallest_rank_holding_that_fraction() -> None:
    s = torch.tensor([3.0, 2.0, 1.0, 1.0])  # squares 9, 4, 1, 1 of 15
    assert _rank_for_energy(s, 0.5) == 1  # 9/15 = 0.6
    assert _rank_for_energy(s, 0.6) == 1
    assert _rank_for_energy(s, 0.61) == 2  # 13/15
    assert _rank_for_energy(s, 0.9) == 3  # 14/15
    assert _rank_for_energy(s, 1.0) == 4
    assert _rank_for_energy(torch.zeros(3), 0.9) == 1


def test_energy_picks_each_layers_rank_from_its_spectrum() -> None:
    # squares 16, 4, 1, .25, .0625: cumulative energy .751, .938, .985, .997, 1
    layer = _spectrum_layer([4.0, 2.0, 1.0, 0.5, 0.25])
    for energy, rank in [(0.75, 1), (0.9, 2), (0.95, 3), (0.99, 4)]:
        down, up = LowRank(energy=energy, keep_head=False, min_rank=1).apply(copy.deepcopy(layer), _task(layer))
        assert (down.out_features, up.in_features) == (rank, rank), energy
    down, up = LowRank(energy=0.99, keep_head=False, min_rank=1).apply(copy.deepcopy(layer), _task(layer))
    # rank 4 of a rank-5 weight: only the smallest direction is lost (Eckart–Young)
    error = (up.weight @ down.weight - layer.weight).norm() / layer.weight.norm()
    assert error.item() == pytest.approx(0.25 / 21.3125**0.5, rel=1e-3)


def test_energy_leaves_full_rank_layers_that_would_grow() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), _spectrum_layer([1.0, 1.0]))
    factored = LowRank(energy=0.9, keep_head=False, min_rank=1).apply(copy.deepcopy(model), _task(model))
    assert type(factored[0]) is nn.Linear  # a random square weight needs most of its rank
    assert isinstance(factored[2], nn.Sequential) and factored[2][0].out_features == 2
    with pytest.raises(TechniqueError, match="no nn.Linear layer gets smaller at this energy"):
        LowRank(energy=1.0, keep_head=False).apply(nn.Sequential(nn.Linear(8, 8)), _task(model))
