"""The statements ``pareto serve`` runs to ask a database whether it answers and whether its rows changed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

_PING = text("SELECT 1")

#: The highest measurement and environment ids, the number of studies and their latest update time.
_VERSION = text(
    "SELECT (SELECT MAX(id) FROM pareto_measurements), (SELECT MAX(id) FROM pareto_environments), "
    "(SELECT COUNT(*) FROM pareto_studies), (SELECT MAX(updated_at) FROM pareto_studies)"
)


def ping(engine: Engine) -> None:
    """Run the cheapest statement there is on ``engine``.

    Raises:
        SQLAlchemyError: the database does not answer.
    """
    with engine.connect() as connection:
        connection.execute(_PING)


def database_version(engine: Engine) -> tuple[Any, ...]:
    """The database's version, in one indexed statement: the highest measurement and environment ids, the
    number of studies and their latest update time. Every change that can alter a stored query's answer
    (a measurement or confirmation stored, a study created, continued with a new SLO, or deleted) moves
    one of them."""
    with engine.connect() as connection:
        return tuple(connection.execute(_VERSION).one())
