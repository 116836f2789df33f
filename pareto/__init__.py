"""pareto: measure compressed models on your hardware and pick the best one for a latency SLO.

The query functions (``best``, ``frontier``, ``studies``) read only the database and never import
torch; ``search`` runs the measurements (and imports torch and Optuna when called).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from pareto._version import __version__ as __version__

# the public API (``__all__``), imported on first use (PEP 562) so that ``import pareto.X`` loads X and
# what it needs only: a read's cold start is Python's and the database driver's. No function here
# shares its name with a module of the package (a test checks): the search runs in `pareto.study`,
# the nightly job in `pareto.nightly_job`, the frontier in `pareto.front`
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
#: Where each name lives: the API functions in ``pareto.api``, the records in their modules.
_HOMES = dict.fromkeys(__all__, "pareto.api") | {
    "Limits": "pareto.limits",
    "AttentionShape": "pareto.task",
    "Task": "pareto.task",
}

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    """A name of the public API, imported from its module on first use; or a submodule (``pareto.api``
    after ``import pareto``, as when the package imported the API eagerly)."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"pareto.{name}") is not None:
        value = importlib.import_module(f"pareto.{name}")
    else:
        raise AttributeError(f"module 'pareto' has no attribute {name!r}")
    globals()[name] = value
    return value
