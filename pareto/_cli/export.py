"""`pareto export`: write a stored trial's compressed model for serving without pareto, with its manifest."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pareto._cli.options import db_option, err, json_option, limits_options, out, print_json
from pareto.export.bundle import export

if TYPE_CHECKING:
    from pareto.limits import Limits


@click.command("export")
@limits_options
@click.option("--trial", type=click.IntRange(min=0), help="The trial to export.")
@click.option("--best", "use_best", is_flag=True, help="Export the pick of `pareto best` under the SLOs.")
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(file_okay=False, path_type=str),
    help="Folder to write the artifact and manifest.json to (empty or absent).",
)
@click.option("--force", is_flag=True, help="Write into a non-empty folder, replacing an earlier export's files.")
@db_option
@json_option
def command(
    limits: Limits, trial: int | None, use_best: bool, output: str, force: bool, db: str | None, as_json: bool
) -> None:
    """Rebuild a stored trial's compressed model and write it in a format plain torch loads, with manifest.json.

    The artifact is checked before it is kept: loaded in a fresh Python process without pareto, its
    outputs on the task's example input must match the compressed model's. The database is only read.
    """

    result = export(limits, out_dir=output, trial=trial, best=use_best, force=force, db=db)
    for warning in result.warnings:
        err.print(warning, markup=False)
    manifest = result.manifest
    if as_json:
        print_json(manifest)
        return
    check, artifact = manifest["reload_check"], manifest["artifact"]
    where = "in a fresh Python process without pareto" if check["fresh_process"] else "in this process"
    lines = [
        f"Exported trial {manifest['trial']} of study {manifest['study']!r}: {manifest['description']}",
        f"artifact   {result.artifact}",
        f"format     {result.format}; {artifact['batch_note']}",
        f"load       {artifact['load']}",
        f"check      max abs difference {result.max_abs_diff:.3g} against the compressed model on "
        f"example_input({check['batch_size']}), reloaded {where} (rtol {check['rtol']:g}, atol {check['atol']:g})",
        f"manifest   {result.manifest_path}",
    ]
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)
