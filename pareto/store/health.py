"""The statement ``pareto serve`` runs to ask a database whether it answers (whether its rows changed:
``pareto.store.version``)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine

_PING = text("SELECT 1")


def ping(engine: Engine) -> None:
    """Run the cheapest statement there is on ``engine``.

    Raises:
        SQLAlchemyError: the database does not answer.
    """
    with engine.connect() as connection:
        connection.execute(_PING)
