"""A Hugging Face model folder and a data file as a task, read offline (``pareto search --model --data``).

Three kinds of folder, told from the folder itself (``pareto.tasks.hf.folder_kind``):

- a **sequence classifier** (``config.json``'s ``architectures`` ends in ``ForSequenceClassification``):
  scored by accuracy (or macro-F1) on the data's labels, which are the model's label names
  (``config.id2label``) or their ids;
- a **sentence-transformers** folder (``modules.json``: a Transformer, a Pooling and optionally a
  Normalize module): scored by **fidelity** to the uncompressed model's embeddings of the evaluation
  rows (mean cosine similarity × nearest-neighbour agreement, as the minilm task scores it), since
  the file needs no labels;
- an **image classifier** (``…ForImageClassification``): ``pareto.tasks.images``.

Anything else is refused in one sentence naming these three; a folder with custom code (``auto_map``)
is refused unless ``trust_remote_code``. The hub is never contacted (``HF_HUB_OFFLINE`` and
``TRANSFORMERS_OFFLINE`` are set before ``transformers`` is imported, and every load is
``local_files_only``).

Latency is timed on the data's own requests: the evaluation rows, in a seeded order, a batch at a
time, each shaped by ``ModelSource.padding`` (the request's own length, a length bucket, or the
model's max length), so the P99 covers the long requests as they come. Calibration and recovery
training use the disjoint calibration slice.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from pareto.errors import TaskError
from pareto.task import AttentionShape, Task
from pareto.tasks.hf import folder_kind, label_ids, macro_f1, model_folder, quiet, read_json, transformers_offline
from pareto.tasks.images import make_image_task
from pareto.tasks.minilm import embedding_fidelity
from pareto.tasks.onnx_graph import load_model_file
from pareto.tasks.program import Program, ProgramShape, quiet_copies
from pareto.tasks.rows import Rows, read_rows
from pareto.tasks.source import ONNX, PROGRAM, ModelSource

__all__ = ["BUCKETS", "Classifier", "SentencePooler", "make_task", "padded_length"]

#: The lengths a ``bucket``-padded request is padded up to (then the model's max length).
BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
#: Most distinct timed batches (each a batch of real rows).
MAX_TIMED_BATCHES = 512
#: ``example_input`` (what is traced and exported) pads to the longest of this many rows, at every batch.
EXAMPLE_ROWS = 8
#: Rows per forward pass in ``evaluate`` (grouped by length) and per recovery-training batch.
EVALUATE_CHUNK = 16
TRAIN_BATCH = 8
#: The longest a request is cut to when neither the folder nor ``--max-length`` says.
DEFAULT_MAX_LENGTH = 512
_ST = "sentence_transformers.models."
#: What a text model is called with.
TEXT_INPUTS = ("input_ids", "attention_mask")


class Classifier(nn.Module):
    """A Hugging Face sequence classifier called as ``model(input_ids, attention_mask) -> logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, labels]``."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class SentencePooler(nn.Module):
    """A transformer, then sentence-transformers' pooling (``mean``, ``cls`` or ``max`` over real tokens)
    and, when the folder has a Normalize module, L2 normalization."""

    def __init__(self, transformer: nn.Module, mode: str, normalize: bool) -> None:
        super().__init__()
        self.transformer, self.mode, self.normalize = transformer, mode, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings ``[batch, width]``."""
        if isinstance(self.transformer, Program):  # a program gives the hidden states themselves
            hidden = self.transformer(input_ids, attention_mask)
        else:
            hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if self.mode == "cls":
            pooled = hidden[:, 0]
        elif self.mode == "max":
            pooled = hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).amax(dim=1)
        else:
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def padded_length(longest: int, padding: str, max_length: int) -> int:
    """The length a batch whose longest row has ``longest`` tokens is run at."""
    if padding == "max":
        return max_length
    if padding == "bucket":
        return min(next((b for b in BUCKETS if b >= longest), max_length), max_length)
    return longest


def _pooling(folder: Path) -> tuple[str, bool, str]:
    """The sentence-transformers folder's pooling mode, whether it normalizes, and the transformer's subfolder."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    kinds = {str(m.get("type", "")).removeprefix(_ST): m for m in modules if isinstance(m, dict)}
    other = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if "Transformer" not in kinds or "Pooling" not in kinds or other:
        raise TaskError(
            f"{folder.name}'s modules.json has {', '.join(kinds) or 'no modules'}; pareto reads a "
            "Transformer, a Pooling and optionally a Normalize module."
        )
    pooling_dir = folder / str(kinds["Pooling"].get("path", ""))
    settings = read_json(pooling_dir / "config.json") if (pooling_dir / "config.json").is_file() else {}
    mode = "mean"
    if settings.get("pooling_mode_cls_token"):
        mode = "cls"
    elif settings.get("pooling_mode_max_tokens"):
        mode = "max"
    return mode, "Normalize" in kinds, str(kinds["Transformer"].get("path", ""))


def _load(source: ModelSource, kind: str) -> tuple[nn.Module, Any, Any, ProgramShape]:
    """The model as pareto calls it, its tokenizer, its Hugging Face config, and the lengths it takes."""
    with quiet():
        return _load_quietly(source, kind)


def _load_quietly(source: ModelSource, kind: str) -> tuple[nn.Module, Any, Any, ProgramShape]:
    hf = transformers_offline()
    folder = model_folder(source)
    program = Path(source.model) if Path(source.model).is_file() else None
    remote = {"local_files_only": True, "trust_remote_code": source.trust_remote_code}
    try:
        if kind == "classifier":
            tokenizer = hf.AutoTokenizer.from_pretrained(folder, **remote)
            if program is not None:
                model, lengths = load_model_file(program, TEXT_INPUTS, "logits")
                return model, tokenizer, hf.AutoConfig.from_pretrained(folder, **remote), lengths
            inner = hf.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32, **remote)
            return Classifier(inner).eval(), tokenizer, inner.config, ProgramShape()
        if program is not None and program.suffix == ONNX:
            raise TaskError(
                f"{program.name} is an ONNX file in a sentence-transformers folder, whose pooling runs outside "
                f"the graph; pareto reads such a folder itself or a {PROGRAM} program of its transformer."
            )
        mode, normalize, sub = _pooling(folder)
        where = folder / sub
        tokenizer = hf.AutoTokenizer.from_pretrained(where, **remote)
        if program is not None:  # the program is the transformer; the folder's pooling follows it
            transformer, lengths = load_model_file(program, TEXT_INPUTS, "last_hidden_state")
            config = hf.AutoConfig.from_pretrained(where, **remote)
            return SentencePooler(transformer, mode, normalize).eval(), tokenizer, config, lengths
        inner = hf.AutoModel.from_pretrained(where, dtype=torch.float32, **remote)
        return SentencePooler(inner, mode, normalize).eval(), tokenizer, inner.config, ProgramShape()
    except TaskError:
        raise
    except Exception as exc:  # a broken folder: one sentence, the library's own first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"{folder.name} could not be loaded: {first}") from exc


def _max_length(source: ModelSource, tokenizer: Any, config: Any, lengths: ProgramShape) -> int:
    if lengths.fixed is not None:
        return lengths.fixed
    limits = [source.max_length or DEFAULT_MAX_LENGTH, *([lengths.longest] if lengths.longest else [])]
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    if isinstance(getattr(tokenizer, "model_max_length", None), int) and tokenizer.model_max_length < 1_000_000:
        limits.append(tokenizer.model_max_length)
    return min(limits)


class _Shaper:
    """Token rows padded into batches as the source says."""

    def __init__(self, rows: list[list[int]], pad_id: int, padding: str, max_length: int, shortest: int = 1) -> None:
        self.rows, self.pad_id, self.padding, self.max_length = rows, pad_id, padding, max_length
        self.shortest = shortest  # a program's dynamic length may start above 1 (torch.export's default: 2)

    def batch(self, index: Sequence[int], length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows ``index`` as ``(input_ids, attention_mask)``, at ``length`` or as the padding says."""
        chosen = [self.rows[i] for i in index]
        if length is None:
            length = padded_length(max(len(r) for r in chosen), self.padding, self.max_length)
        length = max(length, self.shortest)
        ids = torch.full((len(chosen), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chosen), length), dtype=torch.long)
        for i, row in enumerate(chosen):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return ids, mask

    def by_length(self) -> list[list[int]]:
        """The rows in chunks of ``EVALUATE_CHUNK``, grouped by length (little compute spent on padding)."""
        order = sorted(range(len(self.rows)), key=lambda i: len(self.rows[i]))
        return [order[s : s + EVALUATE_CHUNK] for s in range(0, len(order), EVALUATE_CHUNK)]


def _outputs(model: nn.Module, shaper: _Shaper) -> torch.Tensor:
    """The model's outputs for every row, in row order."""
    model.eval()
    parts = []
    with torch.inference_mode():
        for chunk in shaper.by_length():
            parts.append((chunk, model(*shaper.batch(chunk)).float()))
    out = torch.empty(len(shaper.rows), parts[0][1].shape[1])
    for chunk, values in parts:
        out[chunk] = values
    return out


def _tokens(tokenizer: Any, rows: Rows, max_length: int) -> list[list[int]]:
    encoded = tokenizer(list(rows.texts), truncation=True, max_length=max_length)
    return [list(ids) for ids in encoded["input_ids"]]


def make_task(source: ModelSource) -> Task:
    """The task for a model folder and a data file.

    Raises:
        TaskError: a changed or missing file; a folder of another kind; a data file that cannot be read,
            lacks a field, or names a label the model does not have.
    """
    source.check_files()
    kind = folder_kind(source)
    if Path(source.model).is_file():  # a torch.export program
        quiet_copies()
    if kind == "image":
        return make_image_task(source)
    model, tokenizer, config, lengths = _load(source, kind)
    rows = read_rows(Path(source.data), source.text_field, source.label_field if kind == "classifier" else None)
    if kind == "classifier" and rows.labels is None:
        raise TaskError("A sequence classifier is scored on labels; name the data's label field with --label-field.")
    evaluation, calibration = rows.split()
    length = _max_length(source, tokenizer, config, lengths)
    scored, tuning = (_shaper(source, tokenizer, part, length, lengths) for part in (evaluation, calibration))
    evaluate, targets = _scorer(kind, source, model, scored, evaluation, calibration, config)
    order = [int(i) for i in np.random.default_rng(1).permutation(len(scored.rows))]

    def batches(batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        count = min(MAX_TIMED_BATCHES, math.ceil(len(order) / batch_size))
        picks = [[order[(k * batch_size + j) % len(order)] for j in range(batch_size)] for k in range(count)]
        return [scored.batch(rows) for rows in picks]

    # one input shape whatever the batch (tracing a batch of 2 serves a batch of 1): the first rows' longest
    example_length = padded_length(max(len(scored.rows[i]) for i in order[:EXAMPLE_ROWS]), scored.padding, length)
    example_length = max(example_length, scored.shortest)

    train = [
        (tuning.batch(range(s, min(s + TRAIN_BATCH, len(tuning.rows)))), targets(s, TRAIN_BATCH))
        for s in range(0, len(tuning.rows), TRAIN_BATCH)
    ]
    return Task(
        name=source.name,
        model=model,
        example_input=lambda batch_size: scored.batch(
            [order[j % len(order)] for j in range(batch_size)], example_length
        ),
        evaluate=evaluate,
        train_data=train,
        batch_size=1,
        attention=_attention(config, length),
        timing_inputs=batches,
        inputs_note=_inputs_note(source, scored, length, lengths),
        evaluation_rows=len(evaluation.texts),
    )


def _shaper(source: ModelSource, tokenizer: Any, rows: Rows, length: int, lengths: ProgramShape) -> _Shaper:
    """``rows`` tokenized, padded as the source says (a program exported at one length: always to it)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    padding = "max" if lengths.fixed is not None else source.padding
    return _Shaper(_tokens(tokenizer, rows, length), pad_id, padding, length, lengths.shortest)


def _scorer(
    kind: str, source: ModelSource, model: nn.Module, scored: _Shaper, evaluation: Rows, calibration: Rows, config: Any
) -> tuple[Any, Any]:
    """``evaluate(model) -> float`` and ``targets(start, count)`` for a recovery batch of the calibration rows."""
    if kind == "classifier":
        assert evaluation.labels is not None and calibration.labels is not None
        truth = label_ids(evaluation.labels, config, source.data)
        tuned = torch.tensor(label_ids(calibration.labels, config, source.data), dtype=torch.long)

        def evaluate(candidate: nn.Module) -> float:
            predicted = _outputs(candidate, scored).argmax(dim=1).tolist()
            if source.metric == "f1":
                return macro_f1(predicted, truth)
            return float(np.mean([p == t for p, t in zip(predicted, truth, strict=True)]))

        return evaluate, lambda start, count: tuned[start : start + count]
    reference = _outputs(model, scored)

    def fidelity(candidate: nn.Module) -> float:
        cosine, agreement = embedding_fidelity(_outputs(candidate, scored), reference)
        return cosine * agreement

    return fidelity, lambda start, count: None  # no labels: recovery distils from the uncompressed model


def _attention(config: Any, length: int) -> AttentionShape | None:
    layers, width = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(width, int):
        return None
    heads = getattr(config, "num_attention_heads", None)
    return AttentionShape(layers=layers, width=width, sequence=length, heads=heads)


def _inputs_note(source: ModelSource, scored: _Shaper, length: int, program: ProgramShape) -> str:
    lengths = [len(r) for r in scored.rows]
    how = {
        "request": "each batch run at its longest row's length",
        "bucket": f"each batch padded up to a length bucket ({', '.join(str(b) for b in BUCKETS if b < length)}, "
        f"{length})",
        "max": f"every request padded to {length} tokens",
    }[scored.padding]
    if program.fixed is not None:
        how += f" ({Path(source.model).name} was exported at {program.fixed} tokens only)"
    return (
        f"requests: the {len(lengths)} evaluation rows of {Path(source.data).name} in a seeded order, "
        f"{min(lengths)}–{max(lengths)} tokens (median {statistics.median(lengths):g}), {how}"
    )
