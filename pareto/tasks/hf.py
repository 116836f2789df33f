"""What every Hugging Face folder task shares: telling the folder's kind, importing ``transformers`` offline
and quietly, and scoring labels (the model's label ids, accuracy or macro-F1)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pareto.errors import TaskError
from pareto.tasks.source import GRAPH_FILES, ONNX, PROGRAM, ModelSource

__all__ = [
    "SUPPORTED",
    "folder_kind",
    "label_ids",
    "macro_f1",
    "model_folder",
    "quiet",
    "read_json",
    "transformers_offline",
]

SUPPORTED = (
    "pareto reads a Hugging Face folder of a sequence classifier (architectures …ForSequenceClassification), "
    "an image classifier (…ForImageClassification) or a sentence-transformers folder (modules.json)"
)


def read_json(path: Path) -> dict[str, object]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TaskError(f"{path} cannot be read as JSON ({type(exc).__name__}).") from exc
    if not isinstance(value, dict):
        raise TaskError(f"{path} is not a JSON object.")
    return value


def model_folder(source: ModelSource) -> Path:
    """The Hugging Face folder of a source: the model itself, or the folder a ``.pt2`` program or an ``.onnx``
    file lies in."""
    path = Path(source.model)
    return path.parent if path.is_file() else path


def folder_kind(source: ModelSource) -> str:
    """ "classifier", "image" or "sentence", told from the folder's ``config.json`` and ``modules.json`` (a
    ``.pt2`` program's or an ``.onnx`` file's: the folder it lies in).

    Raises:
        TaskError: not a folder of a supported kind (or a file other than a program or an ONNX file);
            custom code without ``trust_remote_code``.
    """
    given = Path(source.model)
    if given.is_file() and given.suffix not in GRAPH_FILES:
        raise TaskError(
            f"{given.name} is a file; {SUPPORTED}, or a torch.export program ({PROGRAM}) or an ONNX file "
            f"({ONNX}) in such a folder."
        )
    folder = model_folder(source)
    if not (folder / "config.json").is_file():
        raise TaskError(f"{folder} has no config.json, so it is not a Hugging Face model folder; {SUPPORTED}.")
    config = read_json(folder / "config.json")
    if config.get("auto_map") and not source.trust_remote_code:
        raise TaskError(
            f"{folder.name} runs custom code of its own (auto_map in config.json); read it and pass "
            "--trust-remote-code to run it."
        )
    if (folder / "modules.json").is_file():
        return "sentence"
    named = config.get("architectures")
    architectures = [str(a) for a in named] if isinstance(named, list) else []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "classifier"
    if any(a.endswith("ForImageClassification") for a in architectures):
        return "image"
    raise TaskError(f"{folder.name} is a {', '.join(architectures) or 'no architectures'} model; {SUPPORTED}.")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Library log lines and warnings off the terminal while ``transformers`` imports and loads (it imports
    torchao, which logs each kernel library this machine cannot load; torch's pytree warns about enums)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def transformers_offline() -> Any:
    """``transformers``, imported with the hub switched off."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # read once by huggingface_hub at import
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise TaskError("A Hugging Face model folder needs transformers: pip install 'pareto-slo[hf]'.") from exc
    hf_logging.disable_progress_bar()  # a per-tensor "Loading weights" bar would break the CLI's output
    hf_logging.set_verbosity_error()
    return transformers


def label_ids(labels: Sequence[str], config: Any, data: str) -> list[int]:
    """Each row's label as the model's id: a label name (``config.label2id``) or an id as written.

    Raises:
        TaskError: a label the model does not have (the first one, with the model's labels).
    """
    by_name = {str(k): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
    count = int(getattr(config, "num_labels", len(by_name)) or len(by_name))
    out = []
    for label in labels:
        if label in by_name:
            out.append(by_name[label])
        elif label.strip().lstrip("-").isdigit() and 0 <= int(label) < count:
            out.append(int(label))
        else:
            names = ", ".join(sorted(by_name, key=by_name.__getitem__)) or f"ids 0–{count - 1}"
            raise TaskError(f"{Path(data).name} has the label {label!r}, which the model does not have ({names}).")
    return out


def macro_f1(predicted: Sequence[int], truth: Sequence[int]) -> float:
    """Macro-averaged F1 over the classes seen in either sequence."""
    scores = []
    for c in sorted(set(predicted) | set(truth)):
        tp = sum(p == c and t == c for p, t in zip(predicted, truth, strict=True))
        fp = sum(p == c and t != c for p, t in zip(predicted, truth, strict=True))
        fn = sum(p != c and t == c for p, t in zip(predicted, truth, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0)
    return sum(scores) / len(scores) if scores else 0.0
