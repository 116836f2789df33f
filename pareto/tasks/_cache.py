"""Trained weights of built-in tasks, cached once per recipe under $PARETO_CACHE_DIR (~/.cache/pareto)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch


def cache_path(prefix: str, recipe: dict[str, Any]) -> Path:
    """A state-dict file named by a hash of everything that changes the trained weights (torch minor included)."""
    major, minor = torch.__version__.split(".")[:2]
    blob = json.dumps({**recipe, "torch": f"{major}.{minor}"}, sort_keys=True).encode()
    root = os.environ.get("PARETO_CACHE_DIR") or Path.home() / ".cache" / "pareto"
    return Path(root) / f"{prefix}-{hashlib.sha256(blob).hexdigest()[:16]}.pt"


def load_state(path: Path) -> dict[str, torch.Tensor] | None:
    """The cached weights, or None when there is no readable cache file (then the model is retrained)."""
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError):
        return None


def save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write to a temporary file and rename, so a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
