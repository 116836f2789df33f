"""Options, parameter types, consoles and printers the pareto commands share."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import click
from rich.console import Console

from pareto.errors import UsageError
from pareto.limits import Limits
from pareto.units import parse_duration_ms, parse_rate_per_s, parse_request_rate, parse_size_bytes

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
REQUEST_RATE = _Checked("request rate", parse_request_rate)

db_option = click.option(
    "--db", envvar="PARETO_DB_URL", help="Database URL [env PARETO_DB_URL; default sqlite:///pareto.db]."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
#: The longest study name the database holds (``pareto_studies.name``; a test keeps them equal).
MAX_STUDY_NAME = 256


class _StudyName(click.ParamType):
    """A study name: not empty (which would silently mean the default study) and one the database can hold."""

    name = "name"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not str(value).strip():
            self.fail("a study name cannot be empty.", param, ctx)
        if len(str(value)) > MAX_STUDY_NAME:
            self.fail(f"a study name has at most {MAX_STUDY_NAME} characters, this one {len(str(value))}.", param, ctx)
        return value


STUDY_NAME = _StudyName()
study_option = click.option("--study", type=STUDY_NAME, help="Study name (default: the only study in the database).")
environment_option = click.option(
    "--environment",
    metavar="KEY|latest|all",
    help="Compare measurements from this environment only [default: latest, where the study was last measured].",
)


throughput_option = click.option("--min-throughput", type=RATE, help="Throughput floor, e.g. 500/s.")


def slo_options(func: Any) -> Any:
    func = click.option("--max-memory", type=SIZE, help="Memory budget (params + activations + KV), e.g. 2GB.")(func)
    func = click.option("--min-accuracy", type=float, help="Accuracy floor (the task's metric).")(func)
    func = click.option(
        "--qps",
        type=REQUEST_RATE,
        help="Requests per second arriving (Poisson), e.g. 800/s or 800: the P99 is then every request's at that rate, "
        "queued behind a dynamic batcher (a search needs --slo-p99; a read takes the study's SLO and rate).",
    )(func)
    func = click.option("--slo-p99", type=DURATION, help="P99 latency bound, e.g. 7ms, 500us.")(func)
    return func


#: the options ``limits_options`` gathers, named as the fields of ``pareto.limits.Limits``
LIMIT_OPTIONS = ("study", "environment", "slo_p99", "qps", "min_accuracy", "max_memory", "min_throughput")


def limits_options(func: Any) -> Any:
    """--study, the SLO options and --environment, handed to the command as one ``limits`` keyword
    (a ``pareto.limits.Limits``): a new limit is a field there and an option here."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in LIMIT_OPTIONS}
        return func(*args, limits=Limits(**given), **kwargs)

    return study_option(slo_options(throughput_option(environment_option(command))))


def environment_note(environment: dict[str, Any]) -> None:
    """The note a read adds about the environment it answered from (on stderr), if any."""
    if environment.get("note"):
        err.print(environment["note"], markup=False)


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
