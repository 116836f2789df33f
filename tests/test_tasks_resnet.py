"""The built-in resnet task: a residual CNN with batch norm that structured pruning and recovery make faster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from pareto.compress import Config, apply, get_technique
from pareto.task import Task, load_task
from pareto.tasks import resnet


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Task]:
    # conftest's session cache, set here as well: module fixtures run before its autouse fixture
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARETO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield load_task("resnet")


def _channels(model: nn.Module) -> list[int]:
    return [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)]


def test_resnet_task_contract(task: Task) -> None:
    assert (task.name, task.batch_size) == ("resnet", resnet.BATCH_SIZE)
    assert isinstance(task.model, resnet.ResNet) and not task.model.training
    assert task.example_input(3).shape == (3, 1, 8, 8)
    assert task.train_data is not None
    assert _channels(task.model) == [64, 64, 64, 128, 128, 128]  # stem, block 1, block 2 and its projection


def test_resnet_model_is_accurate(task: Task) -> None:
    assert task.evaluate(task.model) >= 0.97


def test_structured_pruning_and_recovery_keep_the_residual_net_whole_and_accurate(task: Task) -> None:
    techniques = (
        get_technique("prune_structured", {"ratio": 0.5}),
        get_technique("finetune", {"steps": 100, "lr": 1e-3}),
    )
    pruned = apply(task.model, Config(techniques=techniques[:1], batch_size=4), task).module
    recovered = apply(task.model, Config(techniques=techniques, batch_size=4), task).module
    assert _channels(pruned) == [32, 32, 32, 64, 64, 64]  # the shortcut adds pruned consistently
    assert pruned(task.example_input(4)).shape == (4, 10)
    baseline = task.evaluate(task.model)
    # pruning alone costs accuracy; 100 steps of recovery win most of it back
    assert task.evaluate(pruned) < baseline - 0.05
    assert task.evaluate(recovered) > baseline - 0.03


def test_resnet_cache_is_keyed_by_its_recipe(task: Task) -> None:
    path = resnet._cache_path()
    assert path.name.startswith("resnet-") and path.exists()
    assert torch.load(path, weights_only=True).keys() == task.model.state_dict().keys()
