"""pareto: measure compressed models on your hardware and pick the best one for a latency SLO.

The query functions (``best``, ``frontier``, ``studies``) read only the database and never import
torch; ``search`` runs the measurements (and imports torch and Optuna when called).
"""

from __future__ import annotations

from pareto._version import __version__ as __version__

# the public API (``__all__``); no function here shares its name with a module of the package (a test
# checks): the search runs in `pareto.study`, the nightly job in `pareto.drift`, the frontier in `pareto.front`
from pareto.api import (
    best,
    confirm,
    delete_study,
    explain,
    frontier,
    history,
    load_run,
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
    "load_run",
    "nightly",
    "remeasure",
    "search",
    "studies",
    "trials",
]
