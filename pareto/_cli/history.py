"""`pareto history`: every nightly run of a study."""

from __future__ import annotations

import click

from pareto._cli.options import db_option, json_option, out, print_json, study_option
from pareto.api import history as query
from pareto.report.tables import history_table


@click.command("history")
@study_option
@db_option
@json_option
def command(study: str | None, db: str | None, as_json: bool) -> None:
    """Every nightly run of a study: status, pick before and after, its P99, regressions, environment changes."""

    rows = query(study=study, db=db)
    if as_json:
        print_json(rows)
        return

    out.print(history_table(rows))
