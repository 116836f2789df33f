"""The resnet task: a small residual CNN with batch norm, trained once on scikit-learn's bundled digits and cached.

A stem convolution, two residual blocks (the second halves the resolution and doubles the channels,
with a 1x1 projection on its shortcut) and a pooled linear head: the shape of a ResNet, sized for a
2-core CPU. Its channels are coupled through the residual adds and the batch norms, which is what
structured pruning has to keep consistent. Served at batch 32, where the convolutions dominate.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from pareto.task import Task
from pareto.tasks._cache import cache_path, classification_task, fit_classifier, minibatches, trained_model

#: Channels of the stem and the first block; the second block has twice as many.
WIDTH = 64
BATCH_SIZE = 32
SEED = 0
EPOCHS = 12
TRAIN_BATCH_SIZE = 64
LEARNING_RATE = 2e-3
TEST_FRACTION = 0.3


class BasicBlock(nn.Module):
    """``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))``, the residual block of ResNet-18/34 (He et al., 2016)."""

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """Stem, ``BasicBlock(w, w)``, ``BasicBlock(w, 2w, stride 2)``, global average pool, linear head."""

    def __init__(self, width: int = WIDTH, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.block1 = BasicBlock(width, width)
        self.block2 = BasicBlock(width, 2 * width, stride=2)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def make_task() -> Task:
    """Build the resnet task, training the model on first use (~1 min on 2 CPU cores) and loading it after."""
    x_train, y_train, x_test, y_test = _digits()
    model = trained_model(_cache_path(), ResNet, lambda: _train(x_train, y_train))
    return classification_task(
        "resnet",
        model,
        x_test,
        y_test,
        train_data=minibatches(x_train, y_train, TRAIN_BATCH_SIZE),
        batch_size=BATCH_SIZE,
    )


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 8x8 digits as 1-channel images in [0, 1], centred on the training mean; a stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images, labels = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        images / 16.0, labels, test_size=TEST_FRACTION, stratify=labels, random_state=SEED
    )
    mean = x_train.mean()

    def tensor(x: object) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) - float(mean)

    return tensor(x_train), torch.tensor(y_train), tensor(x_test), torch.tensor(y_test)


def _train(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Train deterministically (Adam, cosine schedule); the caller's global RNG state is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = ResNet()
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        steps = EPOCHS * math.ceil(len(x) / TRAIN_BATCH_SIZE)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
        fit_classifier(model, x, y, optimizer, epochs=EPOCHS, batch_size=TRAIN_BATCH_SIZE, schedule=schedule)
    return model.state_dict()


def _cache_path() -> Path:
    """State-dict file keyed by everything that changes the trained weights."""
    recipe = {
        "model": "resnet-basicblock-2",
        "width": WIDTH,
        "seed": SEED,
        "epochs": EPOCHS,
        "train_batch_size": TRAIN_BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "schedule": "cosine",
        "test_fraction": TEST_FRACTION,
    }
    return cache_path("resnet", recipe)
