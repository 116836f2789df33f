"""The transformer-large task: the transformer task's encoder at BERT-large width, for a GPU to compute.

The built-in tasks are launch-bound on a datacenter GPU: an H200 runs the small transformer's fp32
forward at batch 32 in about 0.7 ms, most of it kernel launches, so precision, int4 or 2:4 sparsity
have no arithmetic to save there. This task is the same classifier of synthetic topic sentences
(:func:`pareto.tasks.transformer.sentences`) at width 1024, 16 heads, 12 layers and 128 tokens: about
150 M parameters and 1.2 TFLOP a call at its serving batch of 32 (4 096 tokens). Its matrix products
have an arithmetic intensity of several hundred FLOP per byte, above an H200's ridge point in every
precision, so at batch 32 it is compute-bound and what each lever does to the arithmetic shows.

Trained once on a CUDA device (bfloat16 autocast, AdamW, 512 steps of about 7 TFLOP: seconds on an H200)
and cached like the other tasks' weights. Training it on a CPU would take hours, so without cached
weights and without a CUDA device the task refuses in one sentence; the weights file trained on a GPU
can be copied into the cache of a machine without one.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from pareto.errors import TaskError
from pareto.task import AttentionShape, Task
from pareto.tasks._cache import cache_path, cache_root, classification_task, load_state, minibatches, save_state
from pareto.tasks.transformer import CLASSES, VOCAB_SIZE, TransformerClassifier, sentences

SEQUENCE_LENGTH = 128
WIDTH = 1024
HEADS = 16
LAYERS = 12
#: The batch the task is served at: 4 096 tokens a call.
BATCH_SIZE = 32
SEED = 0
TRAIN_SIZE = 16384
TEST_SIZE = 1024
#: Two passes over the training split at 64 sentences a step: 512 steps.
EPOCHS = 2
TRAIN_BATCH_SIZE = 64
LEARNING_RATE = 3e-4
WARMUP_STEPS = 32
#: Gradients clipped to this norm: a deep post-warm-up encoder at this width can take a large step.
CLIP_NORM = 1.0
#: Sentences per forward when the task scores a model (the test split in 4 slices).
EVAL_BATCH = 256


def make_task() -> Task:
    """Build the task, training the model on a CUDA device on first use and loading it from the cache after."""
    x_train, y_train = sentences(TRAIN_SIZE, seed=SEED + 1, length=SEQUENCE_LENGTH)
    x_test, y_test = sentences(TEST_SIZE, seed=SEED + 2, length=SEQUENCE_LENGTH)
    path = _cache_path()
    state = load_state(path)
    if state is None:
        device = _training_device()
        if device is None:
            raise TaskError(
                f"The transformer-large task is trained once on a CUDA GPU (seconds on an H200, hours on a CPU) "
                f"and this machine has none: run it on a GPU machine first, or copy that machine's {path.name} "
                f"into {cache_root()}."
            )
        state = train(x_train, y_train, device=device)
        save_state(state, path)
    with torch.device("meta"):
        model = build_model()
    model.load_state_dict(state, assign=True)
    return classification_task(
        "transformer-large",
        model.eval(),
        x_test,
        y_test,
        train_data=minibatches(x_train, y_train, TRAIN_BATCH_SIZE),
        batch_size=BATCH_SIZE,
        eval_batch=EVAL_BATCH,
        attention=AttentionShape(layers=LAYERS, width=WIDTH, sequence=SEQUENCE_LENGTH, heads=HEADS),
    )


def build_model(*, width: int | None = None, heads: int | None = None, layers: int | None = None) -> nn.Module:
    """The classifier at this task's shape, or a smaller one (for tests of the recipe)."""
    width = width or WIDTH
    return TransformerClassifier(
        vocab_size=VOCAB_SIZE,
        sequence_length=SEQUENCE_LENGTH,
        width=width,
        heads=heads or HEADS,
        layers=layers or LAYERS,
        ffn_width=4 * width,
        classes=CLASSES,
    )


def _training_device() -> torch.device | None:
    """Where the model is trained: the current CUDA device, or None (then the task refuses)."""
    return torch.device("cuda") if torch.cuda.is_available() else None


def train(x: torch.Tensor, y: torch.Tensor, *, device: torch.device, **shape: int) -> dict[str, torch.Tensor]:
    """Train on ``device`` (AdamW, linear warm-up, cosine decay, clipped gradients; bfloat16 autocast on CUDA).

    The caller's RNG state is left untouched; the weights come back float32 on the CPU.
    """
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(SEED)
        model = build_model(**shape).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
        steps = EPOCHS * math.ceil(len(x) / TRAIN_BATCH_SIZE)
        schedule = torch.optim.lr_scheduler.SequentialLR(
            optimizer,
            [
                torch.optim.lr_scheduler.LinearLR(optimizer, 0.05, 1.0, total_iters=WARMUP_STEPS),
                torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps - WARMUP_STEPS)),
            ],
            milestones=[WARMUP_STEPS],
        )
        loss_fn = nn.CrossEntropyLoss()
        x, y = x.to(device), y.to(device)
        model.train()
        for _ in range(EPOCHS):
            order = torch.randperm(len(x), device=device)
            for inputs, targets in minibatches(x[order], y[order], TRAIN_BATCH_SIZE):
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    loss = loss_fn(model(inputs), targets)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
                optimizer.step()
                schedule.step()
    return {name: tensor.detach().float().cpu() for name, tensor in model.state_dict().items()}


def _cache_path() -> Path:
    """State-dict file keyed by everything that changes the trained weights."""
    recipe = {
        "model": "encoder-prenorm-silu-meanpool-mlphead",
        "vocab_size": VOCAB_SIZE,
        "sequence_length": SEQUENCE_LENGTH,
        "width": WIDTH,
        "heads": HEADS,
        "layers": LAYERS,
        "ffn_width": 4 * WIDTH,
        "classes": CLASSES,
        "data": "topic-majority-v1",
        "train_size": TRAIN_SIZE,
        "seed": SEED,
        "epochs": EPOCHS,
        "train_batch_size": TRAIN_BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "warmup_steps": WARMUP_STEPS,
        "clip_norm": CLIP_NORM,
        "trained_on": "cuda-bf16-autocast",
    }
    return cache_path("transformer-large", recipe)
