"""`pareto load`: a real load run of a stored configuration at a request rate, or its capacity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from pareto._cli.options import db_option, json_option, limits_options, out, print_json
from pareto.api import load_run as run
from pareto.units import format_ms

if TYPE_CHECKING:
    from pareto.limits import Limits


@click.command("load")
@limits_options
@click.option("--trial", type=click.IntRange(min=0), help="The trial to serve [default: the pick].")
@click.option(
    "--capacity",
    is_flag=True,
    help="Find the highest rate whose load run meets the SLO, bisecting around the simulated capacity.",
)
@click.option("--requests", type=click.IntRange(min=1), help="Requests per load run [default: the study's, 3000].")
@click.option("--device", help="auto, cpu, cuda or cuda:N [default: the study's].")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads [default: the study's].")
@db_option
@json_option
def command(
    limits: Limits,
    trial: int | None,
    capacity: bool,
    requests: int | None,
    device: str | None,
    threads: int | None,
    db: str | None,
    as_json: bool,
) -> int:
    """Serve a configuration behind the batcher and send it Poisson requests at the rate (--qps, default the
    study's): each request timed from its arrival to its answer. Exit 1 when the run misses the SLO."""

    result = run(limits, trial=trial, capacity=capacity, requests=requests, device=device, threads=threads, db=db)
    if as_json:
        print_json(result)
    else:
        out.print(_table(result))
    if capacity:
        return 0 if result["load_capacity_qps"] else 1
    return 0 if result["meets"] else 1


def _table(result: dict[str, Any]) -> Table:
    runs = result["runs"] if "runs" in result else [result["load_run"]]
    title = f"Load runs of trial {result['trial']} ({result['description']}), SLO P99 ≤ {format_ms(result['slo_ms'])}"
    table = Table(title=title, title_justify="left")
    for name in ("rate/s", "batcher", "requests", "p50", "p99", "p99 ≤", "mean batch", "kept up", "valid"):
        table.add_column(name, justify="left" if name in ("batcher", "valid") else "right")
    for r in runs:
        table.add_row(
            f"{r['qps']:,.4g}",
            f"max {r['max_batch']}, wait {format_ms(r['max_wait_ms'])}"
            + (f", {r['instances']} instances" if r.get("instances", 1) > 1 else ""),
            str(r["requests"]),
            format_ms(r["p50_ms"]),
            format_ms(r["p99_ms"]),
            format_ms(r.get("p99_upper_ms")),
            f"{r['mean_batch']:.2f}",
            "yes" if r["kept_up"] else "no",
            "yes" if r["valid"] else str(r["reason"]),
        )
    if "runs" in result:
        found = result["load_capacity_qps"]
        table.caption = f"capacity: simulated {result['simulated_capacity_qps']:,.0f}/s, load runs " + (
            f"{found:,.0f}/s ({found / result['simulated_capacity_qps']:.2f}×)" if found else "none within the SLO"
        )
    else:
        sim = result.get("simulated_p99_upper_ms")
        table.caption = (
            ("meets" if result["meets"] else "misses")
            + " the SLO"
            + (f"; simulated request P99 ≤ {format_ms(sim)} at this rate" if sim is not None else "")
        )
    return table
