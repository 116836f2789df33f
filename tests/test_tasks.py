"""The built-in demo task: a real trained classifier, cached once and reused."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from pareto.task import Task, load_task
from pareto.tasks import demo


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # conftest's session cache, set here as well: module fixtures run before its autouse fixture
    path = tmp_path_factory.getbasetemp() / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARETO_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def task(cache_dir: Path) -> Task:
    return demo.make_task()


def _cache_file(cache_dir: Path) -> Path:
    (path,) = cache_dir.glob("demo-mlp-*.pt")
    return path


def _never_train(*args: object) -> dict[str, torch.Tensor]:
    raise AssertionError("the demo model was retrained instead of loaded from the cache")


def test_demo_task_contract(task: Task) -> None:
    assert task.name == "demo"
    assert task.batch_size == demo.BATCH_SIZE
    linears = [m for m in task.model.modules() if isinstance(m, nn.Linear)]
    widths = [linears[0].in_features] + [m.out_features for m in linears]
    assert isinstance(task.model, nn.Sequential)
    assert widths == [64, demo.HIDDEN_WIDTH, demo.HIDDEN_WIDTH, demo.HIDDEN_WIDTH, 10]


def test_demo_model_is_accurate(task: Task) -> None:
    assert task.evaluate(task.model) > 0.9


def test_evaluate_scores_a_useless_model_at_chance(task: Task) -> None:
    constant = nn.Linear(64, 10)
    nn.init.zeros_(constant.weight)
    nn.init.zeros_(constant.bias)
    assert task.evaluate(constant) == pytest.approx(0.1, abs=0.02)  # stratified split: ~10 % per class


def test_example_input_is_real_rows_repeated_past_the_test_split(task: Task) -> None:
    small = task.example_input(7)
    assert small.shape == (7, 64) and small.dtype == torch.float32
    big = task.example_input(2000)
    assert big.shape == (2000, 64)
    assert torch.equal(big[:7], small)
    n_test = math.ceil(1797 * demo.TEST_FRACTION)  # scikit-learn rounds the test share up
    assert torch.equal(big[n_test], big[0]) and not torch.equal(big[n_test - 1], big[0])


def test_train_data_is_minibatches_of_the_training_split(task: Task) -> None:
    batches = list(task.train_data or [])
    assert batches
    assert sum(len(targets) for _, targets in batches) > 1000
    for inputs, targets in batches:
        assert inputs.shape[1] == 64 and inputs.dtype == torch.float32
        assert targets.dtype == torch.long and len(inputs) == len(targets)


def test_the_cache_is_written_once_and_reused(task: Task, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cache_file(cache_dir)
    written = path.stat().st_mtime_ns
    monkeypatch.setattr(demo, "_train", _never_train)
    again = load_task("demo")
    assert path.stat().st_mtime_ns == written
    assert not list(cache_dir.glob("*.tmp"))
    for key, value in task.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[key], value), key


def test_a_corrupt_cache_file_is_replaced(
    task: Task, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARETO_CACHE_DIR", str(tmp_path))
    good = _cache_file(cache_dir)
    path = tmp_path / good.name
    path.write_bytes(good.read_bytes()[:1000])  # a half-written file left by some other tool
    monkeypatch.setattr(demo, "_train", lambda x, y: task.model.state_dict())
    demo.make_task()
    monkeypatch.setattr(demo, "_train", _never_train)
    assert demo.make_task().evaluate(task.model) > 0.9  # the rewritten file loads


STRAY = 'raise ImportError("the stray sklearn.py in the working directory was imported")\n'
MINE = """
from tests.tiny_task import make_task as tiny

def make_task():
    task = tiny()
    task.name = "mine"
    return task
"""
LOADS = """
import os, sys
from pareto.task import load_task
assert load_task("mytask:make_task").name == "mine"  # a user task beside the user: the folder is searched
assert load_task("demo").name == "demo"  # which imports scikit-learn: the installed one, not the stray file
print(sys.modules["sklearn"].__file__)
assert sys.path[-1] == os.getcwd(), sys.path  # the folder is searched last
"""


def test_a_stray_module_in_the_working_folder_never_shadows_what_a_task_imports(
    task: Task, cache_dir: Path, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    cwd, scripts = tmp_path / "work", tmp_path / "scripts"
    cwd.mkdir(), scripts.mkdir()
    (cwd / "sklearn.py").write_text(STRAY)
    (cwd / "mytask.py").write_text(MINE)
    (scripts / "loads.py").write_text(LOADS)  # run as a file: Python puts its folder, not the cwd, on the path
    env = {**os.environ, "PYTHONPATH": str(root), "PARETO_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run(
        [sys.executable, str(scripts / "loads.py")], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert not proc.stdout.strip().startswith(str(cwd)), proc.stdout


def test_a_built_in_task_leaves_the_import_path_alone(
    task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    before = list(sys.path)
    assert load_task("demo").name == "demo"
    assert sys.path == before
