"""`pareto studies`: the studies in the database; `studies create` and `studies delete`."""

from __future__ import annotations

import click
from rich.table import Table

from pareto._cli.options import count, db_option, err, json_option, out, print_json, study_option
from pareto.api import create_study, delete_study
from pareto.api import studies as query
from pareto.errors import UsageError
from pareto.units import format_ms


@click.group("studies", invoke_without_command=True)
@db_option
@json_option
@click.pass_context
def command(ctx: click.Context, db: str | None, as_json: bool) -> None:
    """The studies in the database: trial counts, environments, last nightly. `studies delete NAME` removes one."""
    if ctx.invoked_subcommand is not None:
        return

    rows = query(db=db)
    if as_json:
        print_json(rows)
        return
    table = Table(title="Studies")
    columns = ("study", "task", "scenario", "objectives", "complete", "failed", "duplicate", "busy", "running")
    for column in (*columns, "P99 SLO", "environments", "CPU kernels", "last nightly", "updated"):
        table.add_column(column)
    for r in rows:
        p99 = r["slo"].get("p99")
        nightly = r["last_nightly"]
        table.add_row(
            r["study"],
            r["task"],
            r["scenario"] or "—",
            ",".join(r["objectives"]),
            str(r["complete"]),
            str(r["failed"]),
            str(r["duplicate"]),
            str(r["busy"]),
            str(r["running"]),
            format_ms(p99) if p99 else "—",
            str(r["environments"]),
            "; ".join(r["cpu_kernels"]) or "—",
            f"{nightly['started_at'][:16].replace('T', ' ')} {nightly['status']}" if nightly else "—",
            r["updated_at"][:19].replace("T", " "),
        )
    out.print(table)


@command.command("create")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML search spec (see configs/).")
@click.option("--task", help="Built-in task name (demo) or package.module:factory.")
@study_option
@click.option("--objective", "objectives", help="Comma-separated objectives [default accuracy,p99].")
@db_option
def studies_create(
    config_path: str | None, task: str | None, study: str | None, objectives: str | None, db: str | None
) -> None:
    """Create a study before its workers start (a study-creator job); an existing one is checked and kept."""
    from pareto.spec import load_spec  # pydantic's models: not for `pareto studies`, a read

    overrides = {"task": task, "study": study, "objectives": objectives.split(",") if objectives else None}
    name = create_study(load_spec(config_path, overrides), db=db)
    out.print(f"Study {name!r} is ready for workers.", markup=False)


@command.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask.")
@db_option
def studies_delete(name: str, yes: bool, db: str | None) -> int:
    """Remove study NAME: its trials, measurements, runs, nightly history, and Optuna's study of that name."""

    known = {r["study"]: r for r in query(db=db)}
    if name not in known:
        raise UsageError(f"No study named {name!r}; known studies: {', '.join(sorted(known)) or 'none'}.")
    row = known[name]
    if not yes and not click.confirm(
        f"Delete study {name!r} ({count(row['complete'], 'measured trial')}, "
        f"{count(row['environments'], 'environment')})? This cannot be undone",
        err=True,
    ):
        err.print("Nothing deleted.")
        return 1
    removed = delete_study(name, db=db)
    out.print(
        f"Deleted study {name!r}: {count(removed['trials'], 'trial')}, "
        f"{count(removed['measurements'], 'measurement')}, "
        f"{count(removed['nightly_runs'], 'nightly run')}; Optuna's study {removed['optuna']}.",
        markup=False,
    )
    return 0
