"""A Hugging Face image classifier folder and its images as a task (``--model FOLDER --data IMAGES``).

The folder's own image processor (``AutoImageProcessor``, read offline) turns each image into the
pixel tensor the model takes, once, before anything is timed; the model is called as
``model(pixel_values) -> logits`` and scored by accuracy (or macro-F1) on the images' labels (the
model's label names, ``config.id2label``, or their ids). The images come from a folder with one
subfolder per label, or from a JSONL/CSV file naming each image's path and label. Latency is timed on
the scored images in a seeded order, a batch of real images per call; every image has the one shape
the processor makes, so there is no padding to choose.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pareto.errors import TaskError
from pareto.task import Task
from pareto.tasks.hf import label_ids, macro_f1, model_folder, quiet, transformers_offline
from pareto.tasks.onnx_graph import load_model_file
from pareto.tasks.rows import Rows, read_image_rows
from pareto.tasks.source import ModelSource

__all__ = ["ImageClassifier", "make_image_task"]

#: Most distinct timed batches; images per forward pass in ``evaluate``; per recovery-training batch.
MAX_TIMED_BATCHES = 512
EVALUATE_CHUNK = 32
TRAIN_BATCH = 8


class ImageClassifier(nn.Module):
    """A Hugging Face image classifier called as ``model(pixel_values) -> logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, labels]``."""
        return self.model(pixel_values=pixel_values).logits


def _load(source: ModelSource) -> tuple[nn.Module, Any, Any]:
    with quiet():
        hf = transformers_offline()
        folder = model_folder(source)
        remote = {"local_files_only": True, "trust_remote_code": source.trust_remote_code}
        try:
            processor = hf.AutoImageProcessor.from_pretrained(folder, **remote)
            if Path(source.model).is_file():  # a torch.export program in the folder
                program, _ = load_model_file(Path(source.model), ("pixel_values",), "logits")
                return program, processor, hf.AutoConfig.from_pretrained(folder, **remote)
            inner = hf.AutoModelForImageClassification.from_pretrained(folder, dtype=torch.float32, **remote)
        except TaskError:
            raise
        except Exception as exc:  # a broken folder (no preprocessor_config.json…): the library's first line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TaskError(f"{folder.name} could not be loaded: {first}") from exc
    return ImageClassifier(inner).eval(), processor, inner.config


def _pixels(processor: Any, rows: Rows) -> torch.Tensor:
    """Every image of ``rows`` as the processor makes it, stacked ``[images, channels, height, width]``."""
    from PIL import Image, UnidentifiedImageError

    parts = []
    for start in range(0, len(rows.texts), EVALUATE_CHUNK):
        images = []
        for path in rows.texts[start : start + EVALUATE_CHUNK]:
            try:
                with Image.open(path) as image:
                    images.append(image.convert("RGB"))
            except (OSError, UnidentifiedImageError) as exc:
                raise TaskError(f"{path} cannot be read as an image ({type(exc).__name__}).") from exc
        with quiet():
            parts.append(processor(images=images, return_tensors="pt")["pixel_values"].float())
    return torch.cat(parts)


def make_image_task(source: ModelSource) -> Task:
    """The task for an image classifier folder and its images (``folder_kind`` said "image").

    Raises:
        TaskError: the folder cannot be loaded; the images cannot be read or carry a label the model lacks.
    """
    model, processor, config = _load(source)
    rows = read_image_rows(Path(source.data), source.image_field, source.label_field)
    if rows.labels is None:
        raise TaskError("An image classifier is scored on labels; name the data's label field with --label-field.")
    evaluation, calibration = rows.split()
    scored, tuning = _pixels(processor, evaluation), _pixels(processor, calibration)
    assert evaluation.labels is not None and calibration.labels is not None
    truth = label_ids(evaluation.labels, config, source.data)
    tuned = torch.tensor(label_ids(calibration.labels, config, source.data), dtype=torch.long)

    def evaluate(candidate: nn.Module) -> float:
        candidate.eval()
        with torch.inference_mode():
            logits = torch.cat(
                [candidate(scored[s : s + EVALUATE_CHUNK]) for s in range(0, len(scored), EVALUATE_CHUNK)]
            )
        predicted = logits.float().argmax(dim=1).tolist()
        if source.metric == "f1":
            return macro_f1(predicted, truth)
        return float(np.mean([p == t for p, t in zip(predicted, truth, strict=True)]))

    order = torch.from_numpy(np.random.default_rng(1).permutation(len(scored)))

    def batches(batch_size: int) -> list[torch.Tensor]:
        count = min(MAX_TIMED_BATCHES, math.ceil(len(order) / batch_size))
        return [scored[order[(torch.arange(batch_size) + k * batch_size) % len(order)]] for k in range(count)]

    shape = "×".join(str(d) for d in scored.shape[1:])
    starts = range(0, len(tuning), TRAIN_BATCH)
    return Task(
        name=source.name,
        model=model,
        example_input=lambda batch_size: scored[order[torch.arange(batch_size) % len(order)]],
        evaluate=evaluate,
        train_data=[(tuning[s : s + TRAIN_BATCH], tuned[s : s + TRAIN_BATCH]) for s in starts],
        batch_size=1,
        timing_inputs=batches,
        inputs_note=(
            f"requests: the {len(scored)} evaluation images of {Path(source.data).name} in a seeded order, "
            f"as the folder's image processor makes them ({shape})"
        ),
        evaluation_rows=len(scored),
    )
