"""Alembic environment for pareto's own tables (Optuna keeps its tables and history separately)."""

from __future__ import annotations

from alembic import context

from pareto.store.engine import VERSION_TABLE, migration_connection, open_engine
from pareto.store.models import Base

config = context.config
target_metadata = Base.metadata


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    # autogenerate must never touch Optuna's tables, which share the database
    return type_ != "table" or bool(name and name.startswith("pareto_"))


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=_include_name,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # the alembic command line: the same one transaction and lock as ``pareto db upgrade``
        engine = open_engine(config.get_main_option("sqlalchemy.url"))
        try:
            with migration_connection(engine) as conn:
                _run(conn)
        finally:
            engine.dispose()
    else:
        _run(connection)


def _run(connection: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=_include_name,
        render_as_batch=True,  # SQLite alters tables by copying them
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
