"""The `pareto` command tree: the group and its entry point; each command lives in pareto/_cli/<name>.py."""

from __future__ import annotations

import sys

import click

from pareto._cli import (
    best,
    calibrate,
    confirm,
    db,
    explain,
    export,
    frontier,
    hardware,
    history,
    load,
    measure,
    nightly,
    report,
    roofline,
    search,
    serve,
    studies,
    techniques,
)
from pareto._cli.options import err
from pareto.errors import ParetoError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="pareto-slo")
def cli() -> None:
    """Measure compressed models on your hardware; pick the best one for your latency SLO."""


# each command lives in its own module under pareto/_cli/, which defines ``command``
for _module in (
    search,
    best,
    frontier,
    explain,
    confirm,
    load,
    measure,
    studies,
    nightly,
    history,
    report,
    export,
    serve,
    calibrate,
    roofline,
    hardware,
    techniques,
    db,
):
    cli.add_command(_module.command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one sentence and a non-zero exit code for every error a user can cause."""
    try:
        result = cli.main(args=argv, prog_name="pareto", standalone_mode=False)
    except click.exceptions.ClickException as exc:
        err.print(f"Error: {exc.format_message()}", markup=False)
        return 2
    except click.exceptions.Abort:
        err.print("Aborted.")
        return 130
    except ParetoError as exc:
        err.print(f"Error: {exc}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("Interrupted; everything measured so far is stored.")
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
