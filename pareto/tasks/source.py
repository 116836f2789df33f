"""A user's own model and data, named without code: ``pareto search --model FOLDER --data FILE``.

A ``ModelSource`` is the task reference a study stores (``model:path=…&data=…&…``): the model folder,
the data file, how the data is read and served, and a SHA-256 content digest of each. The reference is
data, never code: loading it imports nothing the database names. Every load checks both digests
against the files, so a continued study, a confirmation, a nightly or an export measures the same
model on the same rows, or says in one sentence that a file changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

from pareto.errors import TaskError
from pareto.tasks.rows import file_digest, listed_images

__all__ = [
    "GRAPH_FILES",
    "METRICS",
    "ONNX",
    "PADDINGS",
    "PREFIX",
    "PROGRAM",
    "ModelSource",
    "data_digest",
    "folder_digest",
    "is_source_ref",
    "model_digest",
    "score_name",
]

PREFIX = "model:"
#: The suffix of a torch.export program given as the model (in its Hugging Face folder).
PROGRAM = ".pt2"
#: The suffix of an ONNX file given as the model (in its Hugging Face folder), served by ONNX Runtime.
ONNX = ".onnx"
#: The model files read from a folder (the folder gives the kind, the labels and the tokenizer).
GRAPH_FILES = (PROGRAM, ONNX)
#: How a served text model's requests are shaped: at the request's own length (each batch padded to its
#: longest row), padded up to the next length bucket (``BUCKETS``), or always to the model's max length.
PADDINGS = ("request", "bucket", "max")
#: A folder's score: a classifier's accuracy or macro-F1 over the labels; a sentence-transformers folder's
#: fidelity to the uncompressed model's embeddings (set from the folder, never asked for).
METRICS = ("accuracy", "f1", "fidelity")
#: What the accuracy column holds, by metric, as tables and cards name it.
SCORE_NAMES = {"accuracy": "accuracy", "f1": "macro-F1", "fidelity": "fidelity"}
#: Built-in tasks scored by fidelity to their uncompressed model (no labels).
_FIDELITY_TASKS = ("minilm", "pareto.tasks.minilm:make_task")
#: Digest characters kept in the reference (of SHA-256's 64): enough to tell any two versions apart.
DIGEST_CHARS = 24
_SKIPPED = {".git", "__pycache__", ".cache"}


@dataclass(frozen=True)
class ModelSource:
    """A model folder and a data file, and how to read and serve them."""

    model: str
    data: str
    text_field: str = "text"
    label_field: str | None = "label"
    #: an image classifier's data: the field holding each image's path (a JSONL or CSV file's)
    image_field: str = "image"
    metric: str = "accuracy"
    padding: str = "request"
    max_length: int | None = None
    trust_remote_code: bool = False
    model_sha256: str = ""
    data_sha256: str = ""

    def __post_init__(self) -> None:
        if self.padding not in PADDINGS:
            raise TaskError(f"Padding {self.padding!r} is not one of {', '.join(PADDINGS)}.")
        if self.metric not in METRICS:
            raise TaskError(f"Metric {self.metric!r} is not one of {', '.join(METRICS)}.")
        if self.max_length is not None and self.max_length < 2:
            raise TaskError(f"--max-length {self.max_length} is too short; give at least 2 tokens.")

    @classmethod
    def open(cls, model: str | Path, data: str | Path, **settings: object) -> ModelSource:
        """The source with absolute paths and the files' digests taken now.

        Raises:
            TaskError: either path does not exist.
        """
        try:
            model_path, data_path = Path(model).expanduser().resolve(), Path(data).expanduser().resolve()
            if not model_path.exists():
                raise TaskError(
                    f"No model at {str(model)[:200]!r}: give a Hugging Face model folder (or a {PROGRAM} "
                    f"program or an {ONNX} file in one)."
                )
            if not data_path.exists():
                raise TaskError(
                    f"No data at {str(data)[:200]!r}: give a .jsonl or .csv file (or, for images, a folder)."
                )
            source = cls(str(model_path), str(data_path), **settings)  # type: ignore[arg-type]
            folder = model_path.parent if model_path.is_file() else model_path
            if (folder / "modules.json").is_file():  # sentence-transformers: no labels, scored by fidelity
                if source.metric == "f1":
                    raise TaskError(
                        f"{folder.name} is a sentence-transformers folder, scored by fidelity to its own "
                        "embeddings (no labels): leave out --metric."
                    )
                source = replace(source, metric="fidelity")
            model_sha256, data_sha256 = model_digest(model_path), data_digest(data_path, source.image_field)
            return replace(source, model_sha256=model_sha256, data_sha256=data_sha256)
        except OSError as exc:  # a name too long for the file system, a folder it may not read
            raise TaskError(f"Cannot read {str(exc.filename or model)[:200]!r}: {exc.strerror or exc}.") from exc

    @property
    def name(self) -> str:
        """The task's name: the model folder's name (a program's or an ONNX file's: its folder's and its own,
        ``clf-model``)."""
        path = Path(self.model)
        if path.suffix in GRAPH_FILES:
            return f"{path.parent.name}-{path.stem}"
        return path.name or "model"

    def ref(self) -> str:
        """The reference a study stores (``load_task`` reads it back)."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        for key in ("model_sha256", "data_sha256"):
            fields[key] = str(fields[key])[:DIGEST_CHARS]
        fields["trust_remote_code"] = int(self.trust_remote_code)
        return PREFIX + urlencode(fields, quote_via=quote, safe="/")

    @classmethod
    def from_ref(cls, ref: str) -> ModelSource:
        """The source a ``ref()`` names.

        Raises:
            TaskError: the reference is not one.
        """
        if not is_source_ref(ref):
            raise TaskError(f"{ref!r} is not a model reference (it starts with {PREFIX!r}).")
        fields: dict[str, object] = dict(parse_qsl(ref[len(PREFIX) :], keep_blank_values=True))
        known = set(cls.__dataclass_fields__)
        if not {"model", "data"} <= set(fields) or set(fields) - known:
            raise TaskError(f"{ref!r} is not a model reference pareto wrote.")
        if "max_length" in fields:
            fields["max_length"] = int(str(fields["max_length"]))
        fields["trust_remote_code"] = fields.get("trust_remote_code") == "1"
        return cls(**fields)  # type: ignore[arg-type]

    def check_files(self) -> None:
        """Raises TaskError when the model folder or the data file is gone or no longer what the study measured."""
        for what, path, stored, digest in (
            ("model", Path(self.model), self.model_sha256, model_digest),
            ("data file", Path(self.data), self.data_sha256, lambda p: data_digest(p, self.image_field)),
        ):
            if not path.exists():
                raise TaskError(f"The {what} this study measured, {str(path)!r}, is gone.")
            if stored and not digest(path).startswith(stored):
                raise TaskError(
                    f"The {what} at {str(path)!r} changed since this study measured it (its SHA-256 no longer "
                    f"starts {stored[:12]}); start a new study (--study NAME) for the new files."
                )


def score_name(task: str) -> str:
    """What a study's accuracy column holds, told from its stored task reference: "accuracy", "macro-F1"
    (a classifier folder with ``--metric f1``) or "fidelity" (a sentence-transformers folder, the minilm task)."""
    if is_source_ref(task):
        return SCORE_NAMES[ModelSource.from_ref(task).metric]
    return "fidelity" if task in _FIDELITY_TASKS else "accuracy"


def is_source_ref(ref: str) -> bool:
    """Whether a stored task reference names a model folder and data file (not code)."""
    return ref.startswith(PREFIX)


def model_digest(path: Path) -> str:
    """The digest of what a model is read from: its folder (a program's or an ONNX file's: the folder it lies
    in, whose config and tokenizer it is read with)."""
    return folder_digest(path.parent if path.suffix in GRAPH_FILES and path.is_file() else path)


def data_digest(path: Path, image_field: str) -> str:
    """The digest of the data: a folder's files; a file's bytes, and where its rows list images
    (``image_field`` naming existing files) those images' bytes too, in row order, so that an image
    changed under an unchanged listing is changed data."""
    own = folder_digest(path)
    images = listed_images(path, image_field) if path.is_file() else []
    if not images:
        return own
    digest = hashlib.sha256(own.encode())
    for index, image in enumerate(images):
        digest.update(f"{index}\0{file_digest(image)}\n".encode())
    return digest.hexdigest()


def folder_digest(path: Path) -> str:
    """SHA-256 over a model folder's files (relative path and content digest of each, in sorted order);
    a single file's own digest. Hidden files and caches are left out."""
    if path.is_file():
        return file_digest(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path)
        if any(part in _SKIPPED or part.startswith(".") for part in relative.parts):
            continue
        digest.update(f"{relative.as_posix()}\0{file_digest(file)}\n".encode())
    return digest.hexdigest()
