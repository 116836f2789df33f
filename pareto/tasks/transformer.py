"""The transformer task: a small encoder classifier of synthetic topic sentences, trained once and cached.

Each sentence is ``SEQUENCE_LENGTH`` tokens: filler words and 4-10 words from four topic
vocabularies, and its label is the topic with the most words (ties are never drawn, and the winning
margin is often one word). Labels depend on exact counts spread over the whole sequence, so a
compressed model that blurs its representation loses accuracy step by step. Chance is 0.25; the
trained encoder scores about 0.97 on the held-out split.

Built from standard modules (``nn.Embedding``, ``nn.TransformerEncoder``, plain ``nn.Linear``) and
declares its attention shape, so the KV-cache term, int8 dynamic quantization, FFN/head pruning and
low-rank factorization all have something to act on.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch
from torch import nn

from pareto.task import AttentionShape, Task
from pareto.tasks._cache import cache_path, classification_task, fit_classifier, minibatches, trained_model

CLASSES = 4
VOCAB_SIZE = 64
#: Token ids: eight words per topic (topic t owns ids 8t..8t+7), then filler words up to VOCAB_SIZE.
TOPIC_WORDS = tuple(range(8 * t, 8 * t + 8) for t in range(CLASSES))
FILLER = range(8 * CLASSES, VOCAB_SIZE)
SEQUENCE_LENGTH = 32
WIDTH = 128
HEADS = 4
LAYERS = 2
FFN_WIDTH = 4 * WIDTH
#: The batch the task is served at: 1024 tokens a call.
BATCH_SIZE = 32
SEED = 0
TRAIN_SIZE = 5120
TEST_SIZE = 1024
#: One pass over the training split, 160 steps: about 25 s on one busy CPU thread.
EPOCHS = 1
TRAIN_BATCH_SIZE = 32
LEARNING_RATE = 3e-3
WARMUP_STEPS = 16


class TransformerClassifier(nn.Module):
    """Token + learned position embeddings, a pre-norm ``nn.TransformerEncoder``, mean pooling, an MLP head.

    Args:
        vocab_size: Number of token ids.
        sequence_length: Longest input; the position table has one row per position.
        width: Model width (embedding size, attention width).
        heads: Attention heads per layer.
        layers: Encoder layers.
        ffn_width: Hidden width of each layer's feed-forward block (``linear1 -> linear2``).
        classes: Output logits.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        sequence_length: int,
        width: int,
        heads: int,
        layers: int,
        ffn_width: int,
        classes: int,
    ) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(sequence_length, width)
        # SiLU is not one of the two activations (relu, gelu) of the layer's fused inference fast
        # path, which reads linear1/linear2 .weight tensors directly: it would bypass any compressed
        # Linear swapped in and crash on a quantized one. Off the fast path every module really runs.
        layer = nn.TransformerEncoderLayer(
            width, heads, ffn_width, dropout=0.0, activation=nn.SiLU(), batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(width), enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, classes))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, classes]`` for token ids ``[batch, sequence]``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.encoder(self.token(tokens) + self.position(positions))
        return self.head(hidden.mean(dim=1))


def make_task() -> Task:
    """Build the transformer task, training the model on first use and loading it from the cache after."""
    x_train, y_train = sentences(TRAIN_SIZE, seed=SEED + 1)
    x_test, y_test = sentences(TEST_SIZE, seed=SEED + 2)
    model = trained_model(_cache_path(), _build_model, lambda: _train(x_train, y_train))
    return classification_task(
        "transformer",
        model,
        x_test,
        y_test,
        train_data=minibatches(x_train, y_train, TRAIN_BATCH_SIZE),
        batch_size=BATCH_SIZE,
        attention=AttentionShape(layers=LAYERS, width=WIDTH, sequence=SEQUENCE_LENGTH, heads=HEADS),
    )


def sentences(n: int, *, seed: int, length: int = SEQUENCE_LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` token sequences ``[n, length]`` and their topics, classes balanced, deterministic.

    Each sentence of 32 tokens holds 4-10 topic words among filler words (a longer one as many per 32
    tokens); a topic word belongs to a favoured topic with probability 0.4, else to a topic drawn
    uniformly. The label is the topic with the most words; sentences with a tie for first are drawn
    again, so the winning margin is often a single word.
    """
    per_32 = max(1, length // 32)
    rng = random.Random(seed)
    rows: list[list[int]] = []
    labels: list[int] = []
    per_label = [0] * CLASSES
    while len(rows) < n:
        favoured = rng.randrange(CLASSES)
        tokens = [rng.choice(FILLER) for _ in range(length)]
        counts = [0] * CLASSES
        for slot in rng.sample(range(length), rng.randint(4, 10) * per_32):
            topic = favoured if rng.random() < 0.4 else rng.randrange(CLASSES)
            tokens[slot] = rng.choice(TOPIC_WORDS[topic])
            counts[topic] += 1
        label = max(range(CLASSES), key=counts.__getitem__)
        if counts.count(counts[label]) > 1 or per_label[label] >= -(-n // CLASSES):
            continue
        per_label[label] += 1
        rows.append(tokens)
        labels.append(label)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


def _build_model() -> TransformerClassifier:
    return TransformerClassifier(
        vocab_size=VOCAB_SIZE,
        sequence_length=SEQUENCE_LENGTH,
        width=WIDTH,
        heads=HEADS,
        layers=LAYERS,
        ffn_width=FFN_WIDTH,
        classes=CLASSES,
    )


def _train(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Train deterministically (AdamW, linear warm-up, cosine decay); the caller's RNG state is left untouched."""
    threads = torch.get_num_threads()
    # one thread: these matmuls are small, and on a busy 2-core machine a second thread mostly waits
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = _build_model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
            steps = EPOCHS * math.ceil(len(x) / TRAIN_BATCH_SIZE)
            schedule = torch.optim.lr_scheduler.SequentialLR(
                optimizer,
                [
                    torch.optim.lr_scheduler.LinearLR(optimizer, 0.05, 1.0, total_iters=WARMUP_STEPS),
                    torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps - WARMUP_STEPS),
                ],
                milestones=[WARMUP_STEPS],
            )
            fit_classifier(model, x, y, optimizer, epochs=EPOCHS, batch_size=TRAIN_BATCH_SIZE, schedule=schedule)
    finally:
        torch.set_num_threads(threads)
    return model.state_dict()


def _cache_path() -> Path:
    """State-dict file keyed by everything that changes the trained weights."""
    recipe = {
        "model": "encoder-prenorm-silu-meanpool-mlphead",
        "vocab_size": VOCAB_SIZE,
        "sequence_length": SEQUENCE_LENGTH,
        "width": WIDTH,
        "heads": HEADS,
        "layers": LAYERS,
        "ffn_width": FFN_WIDTH,
        "classes": CLASSES,
        "data": "topic-majority-v1",
        "train_size": TRAIN_SIZE,
        "seed": SEED,
        "epochs": EPOCHS,
        "train_batch_size": TRAIN_BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "warmup_steps": WARMUP_STEPS,
    }
    return cache_path("transformer", recipe)
