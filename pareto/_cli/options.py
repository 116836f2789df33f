"""Options, parameter types, consoles and printers the pareto commands share."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console

from pareto.errors import UsageError
from pareto.units import parse_duration_ms, parse_rate_per_s, parse_size_bytes

# piped or captured output gets full-width tables instead of rich's 80-column default
out = Console(highlight=False, width=None if sys.stdout.isatty() else 180)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Checked(click.ParamType):
    """A string option checked by a pareto parser and passed on unchanged."""

    def __init__(self, name: str, parser: Any) -> None:
        self.name, self.parser = name, parser

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            self.parser(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)
        return value


DURATION = _Checked("duration", parse_duration_ms)
SIZE = _Checked("size", parse_size_bytes)
RATE = _Checked("rate", parse_rate_per_s)

db_option = click.option(
    "--db", envvar="PARETO_DB_URL", help="Database URL [env PARETO_DB_URL; default sqlite:///pareto.db]."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
study_option = click.option("--study", help="Study name (default: the only study in the database).")
environment_option = click.option(
    "--environment",
    metavar="KEY|latest|all",
    help="Compare measurements from this environment only [default: latest, where the study was last measured].",
)


def slo_options(func: Any) -> Any:
    func = click.option("--max-memory", type=SIZE, help="Memory budget (params + activations + KV), e.g. 2GB.")(func)
    func = click.option("--min-accuracy", type=float, help="Accuracy floor (the task's metric).")(func)
    func = click.option("--slo-p99", type=DURATION, help="P99 latency bound, e.g. 7ms, 500us.")(func)
    return func


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
