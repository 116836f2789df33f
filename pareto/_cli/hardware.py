"""`pareto hardware`: the datasheet hardware profiles."""

from __future__ import annotations

import click

from pareto._cli.options import json_option, out, print_json
from pareto.api import hardware as run
from pareto.report.tables import profile_table


@click.command("hardware")
@json_option
def command(as_json: bool) -> None:
    """The datasheet hardware profiles (peak FLOP/s per dtype, bandwidth, ridge point)."""

    profiles = run()
    if as_json:
        print_json(profiles)
        return

    out.print(profile_table(profiles, title="Hardware profiles (configs/hardware; dense peaks)"))
