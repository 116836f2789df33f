"""`pareto roofline`: where each layer type of a model sits on the roofline."""

from __future__ import annotations

import click

from pareto._cli.options import db_option, json_option, out, print_json
from pareto.api import roofline as run
from pareto.report.tables import roofline_table


@click.command("roofline")
@click.option("--task", default="demo", show_default=True, help="Built-in task name or package.module:factory.")
@click.option(
    "--hardware", default="auto", show_default=True, help="Profile name (see `pareto hardware`), host or auto."
)
@click.option("--batch-size", type=click.IntRange(min=1), help="Batch size [default: the task's].")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@db_option
@json_option
def command(task: str, hardware: str, batch_size: int | None, device: str, db: str | None, as_json: bool) -> None:
    """Where each layer type of a model sits on the roofline, to predict which techniques can pay off."""

    result = run(task, hardware=hardware, batch_size=batch_size, device=device, db=db)
    if as_json:
        print_json(result)
        return

    out.print(roofline_table(result))
