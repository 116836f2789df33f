"""`pareto confirm`: re-measure the best configurations in interleaved rounds with the baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pareto._cli.options import db_option, json_option, limits_options, out, print_json
from pareto.api import confirm as run
from pareto.report.tables import confirmation_table

if TYPE_CHECKING:
    from pareto.limits import Limits


@click.command("confirm")
@limits_options
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Confirm this many of the best feasible and near-feasible configurations.",
)
@click.option(
    "--margin",
    type=click.FloatRange(min=1),
    default=1.5,
    show_default=True,
    help="Near-feasible: a P99 upper bound within this multiple of the SLO.",
)
@click.option("--device", help="auto, cpu, cuda or cuda:N [default: the study's].")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads while timing [default: the study's].")
@db_option
@json_option
def command(
    limits: Limits,
    top: int,
    margin: float,
    device: str | None,
    threads: int | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Re-measure the best configurations in interleaved rounds with the baseline; `best` then prefers them."""

    result = run(limits, top=top, margin=margin, device=device, threads=threads, db=db)
    if as_json:
        print_json(result)
        return

    out.print(confirmation_table(result))
