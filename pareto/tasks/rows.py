"""A user's data file: rows of text (and labels) read from JSONL or CSV, split into evaluation and calibration.

The split is deterministic (Python's ``random.Random(SPLIT_SEED)`` shuffle): the same file always gives the
same rows to score the model on and a disjoint slice to calibrate quantization and train recovery on.
Every problem with the file is one sentence (``TaskError``): a missing file, an unreadable row, a
missing field, an empty text, too few rows.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from pareto.errors import TaskError

__all__ = ["Rows", "file_digest", "listed_images", "read_rows", "rows_needed"]

#: The seed of the evaluation/calibration split.
SPLIT_SEED = 0
#: The calibration slice: this share of the rows, at most ``MAX_CALIBRATION`` and at least ``MIN_CALIBRATION``.
CALIBRATION_SHARE = 0.2
MIN_CALIBRATION = 8
MAX_CALIBRATION = 512
#: The fewest evaluation rows any study takes: one row is then 2 points of accuracy.
MIN_EVALUATION = 50
#: Errors' worth of room under a perfect score that the accuracy floor must leave (see ``rows_needed``).
FLOOR_ROOM = 10
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}


@dataclass(frozen=True)
class Rows:
    """Texts and, where the file has them, their labels (as written in the file), in file order."""

    texts: tuple[str, ...]
    labels: tuple[str, ...] | None

    def split(self) -> tuple[Rows, Rows]:
        """``(evaluation, calibration)``: disjoint, deterministic (a seeded shuffle), calibration
        ``CALIBRATION_SHARE`` of the rows within [``MIN_CALIBRATION``, ``MAX_CALIBRATION``]."""
        n = len(self.texts)
        size = min(MAX_CALIBRATION, max(MIN_CALIBRATION, round(CALIBRATION_SHARE * n)))
        order = list(range(n))
        random.Random(SPLIT_SEED).shuffle(order)
        return self._take(sorted(order[size:])), self._take(sorted(order[:size]))

    def _take(self, index: list[int]) -> Rows:
        labels = None if self.labels is None else tuple(self.labels[i] for i in index)
        return Rows(tuple(self.texts[i] for i in index), labels)


def rows_needed(min_accuracy: float | None) -> int:
    """The evaluation rows an accuracy floor needs: at least ``MIN_EVALUATION``, and enough that the floor
    leaves ``FLOOR_ROOM`` wrong rows under a perfect score (a floor of 0.99 needs 1 000 rows: on 100, one
    wrong row more or less decides it)."""
    if min_accuracy is None or min_accuracy >= 1.0:
        return MIN_EVALUATION
    return max(MIN_EVALUATION, math.ceil(FLOOR_ROOM / (1.0 - max(0.0, min_accuracy)) - 1e-9))


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_rows(path: Path, text_field: str, label_field: str | None) -> Rows:
    """Every row of a JSONL (one object per line) or CSV/TSV (a header row) file.

    Raises:
        TaskError: the file is missing or of another kind, a row cannot be read, a field is missing or
            empty in a row (named with its line), or the file has no rows.
    """
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise TaskError(f"Cannot read data file {str(path)!r}: pareto reads .jsonl and .csv (or .tsv) files.")
    if not path.is_file():
        raise TaskError(f"No data file at {str(path)!r}.")
    try:
        records = _jsonl(path) if kind == "jsonl" else _csv(path, "\t" if kind == "tsv" else ",")
    except UnicodeDecodeError as exc:
        raise TaskError(f"Data file {str(path)!r} is not UTF-8 text (byte {exc.start}).") from exc
    texts: list[str] = []
    labels: list[str] = []
    for line, record in records:
        texts.append(_field(record, text_field, path, line, "--text-field"))
        if label_field is not None:
            labels.append(_field(record, label_field, path, line, "--label-field"))
    if not texts:
        raise TaskError(f"Data file {str(path)!r} has no rows.")
    return Rows(tuple(texts), tuple(labels) if label_field is not None else None)


def _jsonl(path: Path) -> list[tuple[int, dict[str, object]]]:
    records = []
    with path.open(encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path.name} line {line} is not JSON ({exc.msg}).") from exc
            if not isinstance(record, dict):
                raise TaskError(f"{path.name} line {line} is not a JSON object; write one object per line.")
            records.append((line, record))
    return records


def _csv(path: Path, delimiter: str) -> list[tuple[int, dict[str, object]]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        try:
            return [(reader.line_num, dict(record)) for record in reader]
        except csv.Error as exc:
            raise TaskError(f"{path.name} line {reader.line_num} cannot be read as CSV ({exc}).") from exc


def _field(record: dict[str, object], name: str, path: Path, line: int, option: str) -> str:
    value = record.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        have = ", ".join(sorted(str(k) for k in record)) or "none"
        what = "has no field" if value is None else "has an empty"
        raise TaskError(f"{path.name} line {line} {what} {name!r} (its fields: {have}); name the field with {option}.")
    if isinstance(value, (dict, list)):
        raise TaskError(f"{path.name} line {line}: {name!r} is a {type(value).__name__}, not text or a label.")
    return str(value)


#: The image files a folder of images is read for.
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def read_image_rows(path: Path, image_field: str, label_field: str | None) -> Rows:
    """Images and labels: a folder with one subfolder per label (the subfolder's name is the label, as
    torchvision's ImageFolder reads it), or a JSONL/CSV file whose ``image_field`` holds each image's path
    (relative to the file's folder). The rows' texts are the images' absolute paths.

    Raises:
        TaskError: no images, a label field missing, or an image file that does not exist.
    """
    if path.is_dir():
        found = sorted(
            (image, label.name)
            for label in path.iterdir()
            if label.is_dir()
            for image in label.rglob("*")
            if image.suffix.lower() in IMAGE_SUFFIXES
        )
        if not found:
            raise TaskError(f"{path} holds no images in label subfolders (one folder per label, images inside).")
        return Rows(tuple(str(image) for image, _ in found), tuple(label for _, label in found))
    rows = read_rows(path, image_field, label_field)
    images = tuple(str((path.parent / text).resolve()) for text in rows.texts)
    missing = next((i for i, image in enumerate(images) if not _is_file(Path(image))), None)
    if missing is not None:
        raise TaskError(f"{path.name} row {missing + 1} names {rows.texts[missing]!r}, which is not a file.")
    return Rows(images, rows.labels)


def listed_images(path: Path, image_field: str) -> list[Path]:
    """The images a data file lists in ``image_field``, in row order; [] for a file that lists none (text
    rows, a field it lacks) or one that cannot be read as a listing (its own reading says why, later)."""
    try:
        return [Path(image) for image in read_image_rows(path, image_field, None).texts]
    except TaskError:
        return []


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False too for a name the file system cannot hold (too long)."""
    try:
        return path.is_file()
    except OSError:
        return False
