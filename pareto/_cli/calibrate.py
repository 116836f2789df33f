"""`pareto calibrate`: this machine's peak FLOP/s per dtype and memory bandwidth, stored as its profile."""

from __future__ import annotations

import click

from pareto._cli.options import db_option, json_option, out, print_json
from pareto.api import calibrate as run
from pareto.report.tables import profile_table


@click.command("calibrate")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads [default torch's].")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.5, max=600),
    default=5.0,
    show_default=True,
    help="Time budget for the measurements.",
)
@db_option
@json_option
def command(device: str, threads: int | None, seconds: float, db: str | None, as_json: bool) -> None:
    """Measure this machine's peak FLOP/s per dtype and memory bandwidth; store them as its profile."""

    profile = run(device=device, threads=threads, seconds=seconds, db=db)
    if as_json:
        print_json(profile)
        return

    out.print(profile_table([profile], title=f"Calibrated: {profile['description']}"))
    out.print(f"method: {profile['method']}", markup=False)
    out.print("Stored; searches on this machine use it for the roofline (--hardware auto or host).")
