"""Small tasks for tests: real training on synthetic data with signal, in well under a second."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from pareto import Task


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, 16, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def _trained(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    x, y = _data(512, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: thread wake-ups would cost more than the math
    try:
        for _ in range(60):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _task(name: str, model: nn.Module) -> Task:
    x_test, y_test = _data(256, seed=2)

    def evaluate(m: nn.Module) -> float:
        with torch.inference_mode():
            return float((m(x_test).argmax(dim=1) == y_test).float().mean())

    return Task(
        name=name,
        model=_trained(model),
        example_input=lambda batch_size: x_test[:batch_size].clone(),
        evaluate=evaluate,
        batch_size=8,
    )


def make_task() -> Task:
    """An MLP every built-in technique can act on."""
    torch.manual_seed(0)
    return _task("tiny", nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)))


def make_conv_task() -> Task:
    """Conv, batch norm and ReLU twice, a pooled Linear head, and 6 batches of training inputs (no labels)
    for static quantization to calibrate on; batch-norm statistics that are not the identity."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    with torch.no_grad():  # batch-norm statistics that are not the identity: folding them is then checked
        for bn in (model[1], model[4]):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    x = torch.randn(96, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    return Task(
        name="conv",
        model=model,
        example_input=lambda batch_size: x[:batch_size].clone(),
        evaluate=lambda m: 1.0,
        train_data=[(x[i : i + 16], None) for i in range(0, 96, 16)],
        batch_size=8,
    )


def make_single_layer_task() -> Task:
    """One Linear layer: structured pruning has no hidden units to remove, so it fails on this model."""
    torch.manual_seed(0)
    return _task("single", nn.Sequential(nn.Linear(16, 4)))


def make_broken_task() -> Task:
    """A factory that raises, as user code sometimes does."""
    raise RuntimeError("weights file missing")


def make_mismatched_task() -> Task:
    """example_input that does not fit the model."""
    task = make_task()
    task.example_input = lambda batch_size: torch.randn(batch_size, 3)
    return task


class _ReadsItsWeight(nn.Module):
    """A model that reads a layer's weight tensor directly, as some real models do; int8 breaks it."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(x)) @ self.head.weight.t() + self.head.bias


def make_fragile_task() -> Task:
    """Every technique applies; int8 quantization then breaks the model's forward."""
    torch.manual_seed(0)
    return _task("fragile", _ReadsItsWeight())


class _Slowed(nn.Module):
    """Wraps a model and sleeps before each call: a model that got slower between two nightlies."""

    def __init__(self, inner: nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner, self.seconds = inner, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner(x)


def make_slowable_task() -> Task:
    """The tiny MLP, made slower by ``PARETO_TEST_SLOWDOWN_MS`` milliseconds a call when that is set."""
    task = make_task()
    task.model = _Slowed(task.model, float(os.environ.get("PARETO_TEST_SLOWDOWN_MS", "0")) / 1000).eval()
    return task


class _CastsItsActivations(nn.Module):
    """A model whose own code casts an activation to float32, as some real models do: bf16 and fp16 break it."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(x)).float())


def make_cast_sensitive_task() -> Task:
    """Every technique applies but a cast: bf16 breaks the model's forward, whatever it is combined with."""
    torch.manual_seed(0)
    return _task("cast-sensitive", _CastsItsActivations())


class _GroupsItsWidth(nn.Module):
    """A model that splits its hidden width into groups of 16 (as attention splits heads): structured
    pruning that leaves a width off that multiple breaks it."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.hidden(x))
        if h.shape[-1] % 16:
            raise ValueError(f"the hidden width {h.shape[-1]} is not a multiple of 16")
        return self.head(h)


def make_width_sensitive_task() -> Task:
    """Structured pruning to 48 or 32 units runs; to 40 or 24 it breaks the model (a failure of some
    parameters of a technique that runs alone)."""
    torch.manual_seed(0)
    return _task("width-sensitive", _GroupsItsWidth())


def make_interrupting_task() -> Task:
    """The tiny MLP whose ``evaluate`` presses Ctrl-C: on its ``PARETO_TEST_SIGINT_AT``-th call (default 3)
    it sends its own process SIGINT ``PARETO_TEST_SIGINTS`` times (default 1), then scores the model."""
    import signal

    task = make_task()
    evaluate, at = task.evaluate, int(os.environ.get("PARETO_TEST_SIGINT_AT", "3"))
    times, calls = int(os.environ.get("PARETO_TEST_SIGINTS", "1")), [0]

    def interrupting(model: nn.Module) -> float:
        calls[0] += 1
        if calls[0] == at:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs before os.kill returns
        return evaluate(model)

    task.evaluate = interrupting
    return task


class _ReadsWeight(nn.Module):
    """A model whose forward reads its middle layer's weight directly, as a user's own code may."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 128)
        self.mid = nn.Linear(128, 128)
        self.head = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = torch.relu(h @ self.mid.weight.t() + self.mid.bias)  # the layer's weight, read here
        return self.head(h)


def make_reads_weight_task() -> Task:
    """Low-rank and the quantizers replace ``mid`` (a factor pair, a packed weight) and break it there only."""
    torch.manual_seed(0)
    return _task("reads-weight", _ReadsWeight())
