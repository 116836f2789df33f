"""`pareto db`: database maintenance (`pareto db upgrade`)."""

from __future__ import annotations

import click

from pareto._cli.options import db_option, out
from pareto.store.engine import current_revision, display_url, open_engine, resolve_url, upgrade


@click.group("db")
def command() -> None:
    """Database maintenance."""


@command.command("upgrade")
@db_option
def db_upgrade(db: str | None) -> None:
    """Create or migrate pareto's tables to the latest revision."""

    engine = open_engine(resolve_url(db))
    upgrade(engine)
    out.print(f"Database {display_url(engine.url)} is at revision {current_revision(engine)}.", markup=False)
