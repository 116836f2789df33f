"""`pareto nightly`: re-measure a study's pick and frontier, search on, report regressions."""

from __future__ import annotations

import click

from pareto._cli.options import DURATION, STUDY_NAME, db_option, err, json_option, out, print_json
from pareto.api import nightly as run
from pareto.report.tables import ProgressReporter, nightly_card
from pareto.spec import load_nightly


@click.command("nightly")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Nightly config (configs/nightly.yaml).")
@click.option("--study", type=STUDY_NAME, help="Study name [default: the config's].")
@click.option("--task", help="Task [default: the config's].")
@click.option("--time-budget", type=DURATION, help="The whole job's time, e.g. 10min [default: the config's].")
@db_option
@json_option
def command(
    config_path: str | None,
    study: str | None,
    task: str | None,
    time_budget: str | None,
    db: str | None,
    as_json: bool,
) -> int:
    """Re-measure a study's pick and frontier, search on, report regressions (exit 3) and keep history."""

    overrides = {"study": study, "task": task, "nightly.time_budget": time_budget}
    spec, settings, config_db = load_nightly(config_path, overrides)
    with ProgressReporter(err, enabled=not as_json) as reporter:
        result = run(spec, settings, db=db or config_db, reporter=reporter, notice=lambda m: err.print(m, markup=False))
    if as_json:
        print_json(result.summary)
    else:
        out.print(nightly_card(result.summary))
    err.print(f"Summary written to {result.markdown_path} and {result.json_path}.", markup=False)
    return result.exit_code
