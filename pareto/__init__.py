"""pareto: measure compressed models on your hardware and pick the best one for a latency SLO.

The query functions (``best``, ``frontier``, ``studies``) read only the database and never import
torch; ``search`` runs the measurements (and imports torch and Optuna when called).
"""

from __future__ import annotations

# imported after the submodules they share names with, so `pareto.frontier` is the function; the
# search runs in `pareto._search` and the nightly job in `pareto._nightly`, whose names no public function shares
from pareto.api import (
    best,
    confirm,
    delete_study,
    explain,
    frontier,
    history,
    nightly,
    remeasure,
    search,
    studies,
    trials,
)
from pareto.limits import Limits
from pareto.task import AttentionShape, Task

__all__ = [
    "AttentionShape",
    "Limits",
    "Task",
    "best",
    "confirm",
    "delete_study",
    "explain",
    "frontier",
    "history",
    "nightly",
    "remeasure",
    "search",
    "studies",
    "trials",
]
__version__ = "0.1.0"
