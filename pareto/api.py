"""The Python API: the same answers as the CLI, as plain dicts.

Example::

    import pareto
    pick = pareto.best(study="demo", slo_p99="7ms")
    print(pick["config"], pick["metrics"]["latency_p99_upper_ms"])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.frontier import Candidate, Constraints, objective_metrics, select_best
from pareto.frontier import frontier as _frontier
from pareto.measure.stats import MIN_SAMPLES_P99
from pareto.store import queries
from pareto.store.engine import open_engine, require_schema, resolve_url, session_scope
from pareto.store.models import Study
from pareto.units import parse_duration_ms, parse_size_bytes

if TYPE_CHECKING:
    from pareto.search import Reporter, SearchResult
    from pareto.spec import SearchSpec


def best(
    *,
    study: str | None = None,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    db: str | None = None,
) -> dict[str, Any]:
    """The stored configuration with the highest accuracy that meets the SLOs (conservative bounds).

    Args:
        study: Study name; may be omitted when the database holds one study.
        slo_p99: P99 bound, ``"7ms"`` or milliseconds; defaults to the study's own SLO.
        min_accuracy: Accuracy floor; defaults to the study's.
        max_memory: Parameter memory budget, ``"2GB"`` or bytes; defaults to the study's.
        db: Database URL; defaults to ``PARETO_DB_URL`` or ``sqlite:///pareto.db``.

    Raises:
        NoFeasibleConfiguration: nothing stored meets the SLOs (the message names the closest).
        UsageError: unknown study or malformed SLO.
    """
    loaded = _load(study, slo_p99, min_accuracy, max_memory, db)
    return select_best(loaded.candidates, loaded.constraints, study=loaded.name).to_dict()


def frontier(
    *,
    study: str | None = None,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    db: str | None = None,
) -> list[dict[str, Any]]:
    """The Pareto frontier (accuracy up, P99 upper bound down), fastest first, each with its SLO verdict."""
    from pareto.frontier import evaluate

    loaded = _load(study, slo_p99, min_accuracy, max_memory, db)
    front = _frontier(loaded.candidates, objective_metrics(loaded.objectives))
    for c in front:
        evaluate(c, loaded.constraints)
    return [c.to_dict() for c in front]


def studies(*, db: str | None = None) -> list[dict[str, Any]]:
    """Every study in the database with its trial counts."""
    engine = open_engine(resolve_url(db), create=False)
    require_schema(engine)
    with session_scope(engine) as session:
        return queries.study_summaries(session)


def search(spec: SearchSpec | None = None, *, db: str | None = None, reporter: Reporter | None = None) -> SearchResult:
    """Run or continue a search (imports torch and Optuna); see ``pareto.spec.SearchSpec``."""
    from pareto.search import run_search
    from pareto.spec import SearchSpec as _Spec

    return run_search(spec or _Spec(), db_url=resolve_url(db), reporter=reporter)


@dataclass
class _Loaded:
    candidates: list[Candidate]
    constraints: Constraints
    name: str
    objectives: list[str]


def _load(
    study: str | None,
    slo_p99: str | float | None,
    min_accuracy: float | None,
    max_memory: str | int | None,
    db: str | None,
) -> _Loaded:
    p99_ms = _duration(slo_p99)
    memory = parse_size_bytes(max_memory) if isinstance(max_memory, str) else max_memory
    engine = open_engine(resolve_url(db), create=False)
    require_schema(engine)
    with session_scope(engine) as session:
        row: Study = queries.get_study(session, study) if study else queries.default_study(session)
        stored_slo = row.spec.get("slo", {})
        stored_budget = row.spec.get("budget", {})
        constraints = Constraints(
            p99_ms=p99_ms if p99_ms is not None else stored_slo.get("p99"),
            min_accuracy=min_accuracy if min_accuracy is not None else stored_slo.get("min_accuracy"),
            max_memory_bytes=memory if memory is not None else stored_budget.get("max_memory"),
            min_throughput_per_s=stored_slo.get("min_throughput"),
            min_samples=MIN_SAMPLES_P99,
        )
        return _Loaded(
            candidates=queries.candidates(session, row),
            constraints=constraints,
            name=row.name,
            objectives=row.spec.get("objectives", ["accuracy", "p99"]),
        )


def _duration(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration_ms(value)
    if value <= 0:
        from pareto.errors import UsageError

        raise UsageError(f"P99 SLO {value!r} ms must be positive.")
    return float(value)
