"""An example of your own task: a model, its inputs, and its metric, plugged into pareto.

pareto needs one function that returns a ``pareto.Task`` (see "Your own model: the Task contract" in
the README). Point the search at it by module path, from the repository root (pareto puts the folder
it runs in on the import path)::

    pareto search --task examples.user_task:make_task --slo-p99 2ms
    pareto search --config configs/user-task.yaml

Here the model is a small MLP that tells malignant from benign tumours in scikit-learn's bundled
breast-cancer data (569 rows, 30 features), trained in about a second when the task is built. In
your own task, load your trained weights instead, and score the model on your validation set.

Run this file to check the task before searching: ``python examples/user_task.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from pareto import Task

HIDDEN_WIDTH = 256
#: The batch your service runs at; latency is timed at this size unless the search space says otherwise.
BATCH_SIZE = 64
SEED = 0


def make_task() -> Task:
    """Build the task: everything pareto needs to compress, time and score the model."""
    x_train, y_train, x_val, y_val = _breast_cancer()
    model = _trained_model(x_train, y_train)

    def accuracy(candidate: nn.Module) -> float:
        # pareto passes a compressed copy; higher is better, any metric works (F1, BLEU, fidelity...)
        candidate.eval()
        with torch.inference_mode():
            return (candidate(x_val).argmax(dim=1) == y_val).float().mean().item()

    def example_input(batch_size: int) -> torch.Tensor:
        # what latency is timed on: real rows at the requested batch size, repeated if the set is small
        return x_val[torch.arange(batch_size) % len(x_val)]

    return Task(
        name="breast-cancer-mlp",
        model=model,
        example_input=example_input,
        evaluate=accuracy,
        train_data=[(x_train[i : i + 32], y_train[i : i + 32]) for i in range(0, len(x_train), 32)],
        batch_size=BATCH_SIZE,
    )


def _breast_cancer() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardized, stratified 70/30 split of scikit-learn's breast-cancer data (ships with the package)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    features, labels = load_breast_cancer(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        features, labels, test_size=0.3, stratify=labels, random_state=SEED
    )
    scaler = StandardScaler().fit(x_train)
    return (
        torch.tensor(scaler.transform(x_train), dtype=torch.float32),
        torch.tensor(y_train, dtype=torch.long),
        torch.tensor(scaler.transform(x_val), dtype=torch.float32),
        torch.tensor(y_val, dtype=torch.long),
    )


def _trained_model(x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    """Stands in for loading your own trained weights: a deterministic full-batch fit, about a second."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: waking a second thread costs more than it saves
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = nn.Sequential(
                nn.Linear(x.shape[1], HIDDEN_WIDTH),
                nn.ReLU(),
                nn.Linear(HIDDEN_WIDTH, HIDDEN_WIDTH),
                nn.ReLU(),
                nn.Linear(HIDDEN_WIDTH, 2),
            )
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
            for _ in range(150):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


if __name__ == "__main__":
    task = make_task()
    print(
        f"task {task.name!r}: accuracy {task.evaluate(task.model):.4f} on the validation split, "
        f"served at batch {task.batch_size}, input {tuple(task.example_input(task.batch_size).shape)}"
    )
