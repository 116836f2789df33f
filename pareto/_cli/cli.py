"""The `pareto` command tree: the group and its entry point; each command lives in pareto/_cli/<name>.py."""

from __future__ import annotations

import importlib
import sys

import click

from pareto._cli.options import err
from pareto.errors import ParetoError

#: Each command's module under pareto/_cli/, which defines ``command``: imported when the command runs
#: (or ``--help`` lists it), so that ``pareto best`` loads the store and not the search's stack.
COMMANDS = (
    "search",
    "best",
    "frontier",
    "explain",
    "confirm",
    "load",
    "measure",
    "studies",
    "nightly",
    "history",
    "report",
    "export",
    "serve",
    "calibrate",
    "roofline",
    "hardware",
    "techniques",
    "db",
)


class _Commands(click.Group):
    """The group whose commands are imported when asked for (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command: click.Command = importlib.import_module(f"pareto._cli.{cmd_name}").command
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="pareto-slo")
def cli() -> None:
    """Measure compressed models on your hardware; pick the best one for your latency SLO."""


def subcommands(group: click.Group) -> dict[str, click.Command]:
    """A group's commands by name, imported (the whole tree's, for ``--help`` pages and the layout's checks)."""
    ctx = click.Context(group)
    found = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


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
