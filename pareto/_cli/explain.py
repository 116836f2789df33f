"""`pareto explain`: why each frontier configuration was or was not chosen."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pareto._cli.options import db_option, err, json_option, limits_options, out, print_json
from pareto.api import explain
from pareto.units import format_ms

if TYPE_CHECKING:
    from pareto.limits import Limits

_STYLES = {"chosen": "bold green", "misses": "red", "dominated": "dim", "tie": "yellow", "incomparable": "cyan"}


@click.command("explain")
@limits_options
@db_option
@json_option
def command(limits: Limits, db: str | None, as_json: bool) -> None:
    """Why each frontier configuration was or was not chosen for these limits."""

    result = explain(limits, db=db)
    if result["environment"].get("note"):
        err.print(escape(result["environment"]["note"]))
    if as_json:
        print_json(result)
        return
    out.print(_table(result))
    if result["pick"] is None:
        out.print(f"Nothing on the frontier meets {escape(result['constraints']['described'])}.")
        for near in result["nearest"]:
            relaxed = ", ".join(_relaxed(k, v) for k, v in near["would_qualify_with"].items())
            line = f"  trial {near['trial']} ({escape(near['description'])}) needs {'; '.join(near['needs'])}"
            out.print(line + (f" — it qualifies with {relaxed}." if relaxed else "."))


def _table(result: dict[str, Any]) -> Table:
    title = f"Why each frontier configuration of study {result['study']!r} was or was not chosen"
    table = Table(title=f"{title} ({result['constraints']['described']})", title_justify="left")
    score = result.get("score", "accuracy")  # fidelity, macro-F1: what the accuracy figures are
    for name, justify in (("trial", "right"), ("configuration", "left"), (score, "right"), ("p99 ≤", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("verdict")
    table.add_column("why", overflow="fold")
    for item in result["items"]:
        table.add_row(
            str(item["trial"]),
            escape(item["description"]),
            f"{item['accuracy']:.4f}",
            format_ms(item["p99_upper_ms"]),
            Text(item["verdict"], style=_STYLES.get(item["verdict"], "")),
            escape(item["reason"]),
        )
    return table


def _relaxed(key: str, value: float) -> str:
    if key == "slo_p99_ms":  # rounded up, so that the bound really is within it
        digits = max(0, 2 - math.floor(math.log10(value))) if value > 0 else 0
        return f"--slo-p99 {math.ceil(value * 10**digits) / 10**digits:g}ms"
    if key == "min_accuracy":  # rounded down, so that the accuracy really is above it
        digits = max(0, 3 - math.floor(math.log10(abs(value)))) if value else 0
        return f"--min-accuracy {math.floor(value * 10**digits) / 10**digits:g}"
    if key == "max_memory_bytes":
        return f"--max-memory {int(value)}"
    if key == "qps":  # rounded down, so that the capacity really is above it
        return f"--qps {math.floor(value):d}/s"
    return f"a throughput floor of {value:,.0f}/s"
