"""`pareto best`: the stored configuration with the highest accuracy that meets the SLO."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pareto._cli.options import db_option, environment_note, json_option, limits_options, out, print_json
from pareto.api import best as query
from pareto.report.tables import best_card

if TYPE_CHECKING:
    from pareto.limits import Limits


@click.command("best")
@limits_options
@db_option
@json_option
def command(limits: Limits, db: str | None, as_json: bool) -> None:
    """The stored configuration with the highest accuracy that meets the SLO (conservative bound)."""

    pick = query(limits, db=db)
    environment_note(pick["environment"])
    if as_json:
        print_json(pick)
        return

    out.print(best_card(pick))
