"""Write a small Hugging Face sequence classifier folder and a JSONL data file to try ``--model``/``--data`` on.

A 2-layer BERT (hidden width 64) with a word-level tokenizer, trained for a few seconds on the CPU to tell
positive from negative reviews made of stock words, saved with ``save_pretrained`` as any fine-tuned
model is; the data file holds 600 labelled reviews of 3 to 60 words. Nothing is downloaded. Then::

    python examples/tiny_classifier.py /tmp/reviews
    pareto search --model /tmp/reviews/classifier --data /tmp/reviews/reviews.jsonl --slo-p99 5ms --n-trials 12

The folder also holds ``model.pt2``, the same model as a ``torch.export`` program (``--model
/tmp/reviews/classifier/model.pt2`` searches the program: the techniques that run on a graph), and, where
the ``onnx`` extra is installed, ``model.onnx``, the same model as an ONNX file (``--model
/tmp/reviews/classifier/model.onnx`` searches it on ONNX Runtime with ONNX Runtime's own passes).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import warnings
from pathlib import Path

import torch

POSITIVE = ["good", "great", "loved", "wonderful", "fun", "moving", "clever", "superb", "charming"]
NEGATIVE = ["bad", "awful", "hated", "boring", "dull", "clumsy", "tedious", "weak", "bland"]
NEUTRAL = [
    "the",
    "a",
    "movie",
    "film",
    "plot",
    "actor",
    "story",
    "was",
    "is",
    "very",
    "really",
    "it",
    "and",
    "but",
    "this",
    "scene",
    "ending",
    "music",
    "cast",
]
LABELS = ("negative", "positive")
EPOCHS = 4


def review(rng: random.Random) -> dict[str, str]:
    """One review: neutral words with a few of one side's words (and sometimes one of the other's)."""
    label = rng.randrange(2)
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 60))]
    side, other = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
    for _ in range(rng.randint(1, 3)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(side))
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(other))
    return {"text": " ".join(words), "label": LABELS[label]}


def main(out: Path) -> None:
    logging.disable(logging.WARNING)  # transformers imports torchao, which logs each kernel it cannot load here
    warnings.simplefilter("ignore")
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    transformers.utils.logging.disable_progress_bar()

    argument = "vocab" if int(transformers.__version__.split(".")[0]) >= 5 else "vocab_file"  # renamed in 5

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    rows = [review(rng) for _ in range(600)]
    (out / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *POSITIVE, *NEGATIVE, *NEUTRAL]) + "\n")
    tokenizer = BertTokenizerFast(**{argument: str(vocab)})
    config = BertConfig(
        vocab_size=5 + len(POSITIVE) + len(NEGATIVE) + len(NEUTRAL),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    train = [review(random.Random(1 + k)) for k in range(2000)]  # other rows than the data file's
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(EPOCHS * len(train) // 32):
        batch = train[(step * 32) % len(train) :][:32]
        encoded = tokenizer([r["text"] for r in batch], padding=True, return_tensors="pt")
        labels = torch.tensor([LABELS.index(r["label"]) for r in batch])
        loss = model(**encoded, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out / "classifier")
    tokenizer.save_pretrained(out / "classifier")
    vocab.unlink()
    export_program(model, tokenizer, out / "classifier" / "model.pt2")
    graph = export_onnx(model, tokenizer, out / "classifier" / "model.onnx")
    also = ", and model.onnx, its ONNX file" if graph else ""
    print(
        f"wrote {out / 'classifier'} (with model.pt2, its torch.export program{also}) and {out / 'reviews.jsonl'} "
        "(600 rows)"
    )


def export_program(model: torch.nn.Module, tokenizer: object, path: Path) -> None:
    """The model as a torch.export program beside its folder's config and tokenizer, batch and length dynamic
    (a server batches requests of every length), as ``pareto search --model FOLDER/model.pt2`` reads it."""
    encoded = tokenizer(
        ["a short review", "a longer review of the film and its cast"], padding=True, return_tensors="pt"
    )
    batch, length = torch.export.Dim("batch", max=4096), torch.export.Dim("length", max=128)
    inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    program = torch.export.export(model, (), inputs, dynamic_shapes={k: {0: batch, 1: length} for k in inputs})
    torch.export.save(program, str(path))


def export_onnx(model: torch.nn.Module, tokenizer: object, path: Path) -> bool:
    """The model as an ONNX file beside its folder's config and tokenizer, batch and length dynamic, as
    ``pareto search --model FOLDER/model.onnx`` reads it; False (nothing written) without onnx and onnxscript."""
    import importlib.util

    if any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxscript")):
        return False
    encoded = tokenizer(
        ["a short review", "a longer review of the film and its cast"], padding=True, return_tensors="pt"
    )
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=128)
    inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    torch.onnx.export(
        model,
        (),
        str(path),
        kwargs=inputs,
        dynamo=True,
        dynamic_shapes={k: {0: batch, 1: length} for k in inputs},
        input_names=list(inputs),
        output_names=["logits"],
        verbose=False,
    )
    return True


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "reviews"))
