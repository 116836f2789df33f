"""The demo task: an MLP digit classifier, trained once on scikit-learn's bundled digits and cached.

Sized so the FP32 baseline misses a 7 ms P99 SLO on a 2-core CPU at the default batch, while
structured pruning or int8 dynamic quantization bring it well under: the product's headline trade-off.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pareto.task import Task
from pareto.tasks._cache import cache_path, classification_task, fit_classifier, minibatches, trained_model

#: Hidden width of the three hidden layers (64 -> W -> W -> W -> 10).
HIDDEN_WIDTH = 1024
#: The batch the demo is served at: FP32 takes ~9 ms on 2 CPU threads, structured pruning (0.5) ~2 ms.
BATCH_SIZE = 256
SEED = 0
EPOCHS = 8
TRAIN_BATCH_SIZE = 64
LEARNING_RATE = 1e-3
TEST_FRACTION = 0.3


def make_task() -> Task:
    """Build the demo task, training the model on first use and loading it from the cache after."""
    x_train, y_train, x_test, y_test = _digits()
    model = trained_model(_cache_path(), _build_model, lambda: _train(x_train, y_train))
    return classification_task(
        "demo",
        model,
        x_test,
        y_test,
        train_data=minibatches(x_train, y_train, TRAIN_BATCH_SIZE),
        batch_size=BATCH_SIZE,
    )


def _build_model() -> nn.Sequential:
    w = HIDDEN_WIDTH
    return nn.Sequential(
        nn.Linear(64, w),
        nn.ReLU(),
        nn.Linear(w, w),
        nn.ReLU(),
        nn.Linear(w, w),
        nn.ReLU(),
        nn.Linear(w, 10),
    )


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardized, stratified train/test split of the 8x8 digits (bundled with scikit-learn)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    features, labels = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=TEST_FRACTION, stratify=labels, random_state=SEED
    )
    scaler = StandardScaler().fit(x_train)
    return (
        torch.tensor(scaler.transform(x_train), dtype=torch.float32),
        torch.tensor(y_train, dtype=torch.long),
        torch.tensor(scaler.transform(x_test), dtype=torch.float32),
        torch.tensor(y_test, dtype=torch.long),
    )


def _train(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Train deterministically; the caller's global RNG state is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = _build_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        fit_classifier(model, x, y, optimizer, epochs=EPOCHS, batch_size=TRAIN_BATCH_SIZE)
    return model.state_dict()


def _cache_path() -> Path:
    """State-dict file keyed by everything that changes the trained weights."""
    recipe = {
        "layers": [64, HIDDEN_WIDTH, HIDDEN_WIDTH, HIDDEN_WIDTH, 10],
        "activation": "relu",
        "seed": SEED,
        "epochs": EPOCHS,
        "train_batch_size": TRAIN_BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "test_fraction": TEST_FRACTION,
    }
    return cache_path("demo-mlp", recipe)
