"""`pareto frontier`: the Pareto frontier of a study."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pareto._cli.options import db_option, environment_note, json_option, limits_options, out, print_json
from pareto.api import frontier as query
from pareto.report.tables import frontier_table

if TYPE_CHECKING:
    from pareto.limits import Limits


@click.command("frontier")
@limits_options
@db_option
@json_option
def command(limits: Limits, db: str | None, as_json: bool) -> None:
    """The Pareto frontier of a study: accuracy against the P99 upper bound."""

    front = query(limits, db=db)
    if front:
        environment_note(front[0]["environment"])
    if as_json:
        print_json(front)
        return

    groups: dict[str, list[dict[str, Any]]] = {}
    for row in front:
        groups.setdefault(row["environment"]["key"], []).append(row)
    for rows in groups.values() or [[]]:
        title = (
            "Pareto frontier" if len(groups) < 2 else f"Pareto frontier in environment {rows[0]['environment']['key']}"
        )
        out.print(frontier_table(rows, title=title, width=out.width))
