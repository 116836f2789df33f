"""`pareto report`: a study as a self-contained HTML page with PNG figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from pareto._cli.options import count, db_option, err, limits_options, out
from pareto.report.html import write_report

if TYPE_CHECKING:
    from pareto.limits import Limits


@click.command("report")
@limits_options
@click.option(
    "-o",
    "--output",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder to write index.html and its PNG figures into (created; must be empty unless --force).",
)
@click.option("--force", is_flag=True, help="Write into a folder that already holds files (same names replaced).")
@db_option
def command(limits: Limits, out_dir: Path, force: bool, db: str | None) -> None:
    """Write a study's report: Pareto front, latency CDFs, roofline, throughput, compression vs speedup.

    The page (DIR/index.html) needs nothing but the PNGs beside it; nothing in the database changes.
    Needs matplotlib: pip install 'pareto-slo[report]'.
    """

    result = write_report(out_dir, limits, force=force, db=db)
    if result["note"]:
        err.print(result["note"], markup=False)
    out.print(f"{result['index']} ({count(len(result['figures']), 'figure')})", markup=False, soft_wrap=True)
