"""The `pareto` command tree: parse, call pareto.*, print. No logic lives here."""

from __future__ import annotations

import sys
from typing import Any, get_args

import click
from rich.markup import escape
from rich.table import Table

from pareto._cli.options import (
    DURATION,
    RATE,
    count,
    db_option,
    environment_option,
    err,
    json_option,
    out,
    print_json,
    slo_options,
    study_option,
)
from pareto.errors import ParetoError, UsageError
from pareto.naming import BACKENDS, SAMPLER_HELP, SamplerName
from pareto.units import format_ms


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="pareto-slo")
def cli() -> None:
    """Measure compressed models on your hardware; pick the best one for your latency SLO."""


@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML search spec (see configs/).")
@click.option("--task", help="Built-in task name (demo) or package.module:factory.")
@click.option("--study", help="Study name; re-using one continues it [default: the task's name].")
@slo_options
@click.option("--min-throughput", type=RATE, help="Throughput floor, e.g. 500/s.")
@click.option(
    "--objective", "objectives", help="Comma-separated: accuracy,p99,p50,memory,throughput,bytes_moved,flops."
)
@click.option(
    "--scenario",
    type=click.Choice(["mobile", "serving", "realtime", "edge"]),
    help="Preset objectives and batch sizes for a deployment case.",
)
@click.option("--hardware", help="Roofline profile (see `pareto hardware`), host, auto or none.")
@click.option("--n-trials", type=click.IntRange(min=1), help="Trials to run now [default 30].")
@click.option("--timeout", type=DURATION, help="Stop starting trials after this long, e.g. 10min.")
@click.option("--seed", type=int, help="Sampler seed [default 0].")
@click.option("--sampler", type=click.Choice(get_args(SamplerName)), help=SAMPLER_HELP)
@click.option(
    "--early-reject/--no-early-reject",
    default=None,
    help="Stop timing a configuration after its first round when its P99 is over the SLO with confidence "
    "(stored as pruned, accuracy not evaluated) [default on].",
)
@click.option(
    "--backend",
    "backends",
    type=click.Choice(BACKENDS),
    multiple=True,
    help="Where configurations are served and measured: eager, compile (torch.compile) or onnxruntime "
    "(ONNX export, ORT CPU); repeat it to let the sampler choose [default eager]. The baseline stays eager.",
)
@click.option("--device", help="auto, cpu, cuda or cuda:N [default auto].")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads while timing [default torch's].")
@click.option("--samples", type=click.IntRange(min=1), help="Fewest timed calls per trial [default 662].")
@click.option("--rounds", type=click.IntRange(min=1), help="Rounds the calls are split into [default 20].")
@click.option("--warmup", type=click.IntRange(min=0), help="Untimed warm-up calls [default 50].")
@click.option(
    "--confidence",
    type=click.FloatRange(min=0.9, max=1, max_open=True),
    help="One-sided confidence of every latency bound [default 0.99].",
)
@click.option(
    "--contention-limit",
    type=click.FloatRange(min=1, min_open=True),
    help="Discard a round when the probe is this many times slower than quiet [default 1.5].",
)
@click.option("--no-guard", is_flag=True, help="Time without the contention probe between rounds.")
@click.option(
    "--adaptive-budget",
    type=DURATION,
    help="Keep timing past --samples until the P99 verdict is decided, up to this long a trial (e.g. 20s).",
)
@click.option(
    "--confirm-top",
    type=click.IntRange(min=0),
    help="Confirm this many of the best configurations after the trials [default 3; 0: none].",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=64),
    default=1,
    show_default=True,
    help="Local worker processes on this study: compression and accuracy in parallel, timing one at a time "
    "per device (one worker per GPU with --device cuda).",
)
@click.option("--spec-json", type=click.Path(dir_okay=False), hidden=True)  # a worker's spec, from --workers
@click.option("--worker", "as_worker", is_flag=True, hidden=True)  # trial lines on stderr, JSON on stdout
@db_option
@json_option
def search(
    config_path: str | None,
    db: str | None,
    as_json: bool,
    workers: int,
    spec_json: str | None,
    as_worker: bool,
    **flags: Any,
) -> int:
    """Search compression configurations, measuring every trial; re-running continues the study."""
    from pareto.api import search as run
    from pareto.spec import load_spec, load_stored_spec

    overrides = {key: flags[flag] for key, flag in _SPEC_FLAGS.items()}
    overrides["objectives"] = flags["objectives"].split(",") if flags["objectives"] else None
    overrides["space.backend"] = list(flags["backends"]) or None
    spec = load_stored_spec(spec_json) if spec_json else load_spec(config_path, overrides)
    if flags["no_guard"]:
        spec = spec.model_copy(update={"measure": spec.measure.model_copy(update={"contention_limit": None})})
    from pareto.report import ProgressReporter

    with ProgressReporter(err, enabled=as_worker or not as_json) as reporter:
        result = run(spec, db=db, reporter=reporter, workers=workers)
    if as_json or as_worker:
        print_json(_search_json(result))
        return _search_exit(result)
    _print_search(result)
    return _search_exit(result)


#: ``pareto search`` flags and the spec keys they set (CLI flags override the YAML).
_SPEC_FLAGS = {
    "task": "task",
    "study": "study",
    "slo.p99": "slo_p99",
    "slo.min_accuracy": "min_accuracy",
    "slo.min_throughput": "min_throughput",
    "scenario": "scenario",
    "measure.hardware": "hardware",
    "budget.max_memory": "max_memory",
    "search.n_trials": "n_trials",
    "search.timeout": "timeout",
    "search.seed": "seed",
    "search.sampler": "sampler",
    "search.early_reject": "early_reject",
    "search.confirm_top": "confirm_top",
    "measure.device": "device",
    "measure.threads": "threads",
    "measure.samples": "samples",
    "measure.rounds": "rounds",
    "measure.warmup": "warmup",
    "measure.confidence": "confidence",
    "measure.contention_limit": "contention_limit",
    "measure.adaptive_budget": "adaptive_budget",
}


def _search_json(result: Any) -> dict[str, Any]:
    return {
        "study": result.study,
        "trials_run": result.trials_run,
        "measured": result.measured,
        "interrupted": result.interrupted,
        "frontier": [c.to_dict() for c in result.frontier],
        "best": result.best.to_dict() if result.best else None,
        "no_best_reason": result.no_best_reason,
        "busy_trials": result.busy,
        "sampler": result.sampler,
        "repeats": result.repeats,
        "rejected_early": result.rejected,
        "exhausted": result.exhausted,
        "stopped_busy": result.stopped_busy,
        "confirmation": result.confirmation.to_dict() if result.confirmation else None,
    }


def _print_search(result: Any) -> None:
    from pareto.report import best_card, confirmation_table, frontier_table

    if result.interrupted:
        err.print(
            f"Interrupted: {count(result.measured, 'trial')} measured in this run, all stored. "
            "Run the same command to continue the study."
        )
    if result.repeats or result.rejected:
        new = result.trials_run - result.repeats - result.busy
        failed = new - result.measured - result.rejected
        err.print(
            f"{count(new, 'new configuration')} tried with the {result.sampler} sampler: {result.measured} measured, "
            + (f"{failed} failed, " if failed else "")
            + f"{result.rejected} rejected early (P99 over the SLO after the first round: stored as pruned, "
            f"accuracy not evaluated); {count(result.repeats, 'repeat')} of configurations measured already, "
            "answered from the database and not counted."
        )
    if result.busy:
        err.print(
            f"{count(result.busy, 'trial')} could not be judged: the machine stayed busy (stored as BUSY, "
            "not shown to the sampler; measured again when proposed again)."
        )
    if result.confirmation is not None and result.confirmation.items:
        out.print(confirmation_table(result.confirmation.to_dict()))
    out.print(frontier_table(result.frontier, width=out.width))
    if result.best is not None:
        out.print(best_card(result.best.to_dict()))
    else:
        out.print(f"[bold red]{escape(result.no_best_reason or '')}[/]")


def _search_exit(result: Any) -> int:
    """130 after Ctrl-C; 75 (EX_TEMPFAIL) when the machine stayed busy and the search stopped early."""
    return 130 if result.interrupted else 75 if result.stopped_busy else 0


@cli.command()
@study_option
@slo_options
@environment_option
@db_option
@json_option
def best(
    study: str | None,
    slo_p99: str | None,
    min_accuracy: float | None,
    max_memory: str | None,
    environment: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """The stored configuration with the highest accuracy that meets the SLO (conservative bound)."""
    from pareto.api import best as query

    pick = query(
        study=study, slo_p99=slo_p99, min_accuracy=min_accuracy, max_memory=max_memory, environment=environment, db=db
    )
    _environment_note(pick["environment"])
    if as_json:
        print_json(pick)
        return
    from pareto.report import best_card

    out.print(best_card(pick))


@cli.command()
@study_option
@slo_options
@environment_option
@db_option
@json_option
def frontier(
    study: str | None,
    slo_p99: str | None,
    min_accuracy: float | None,
    max_memory: str | None,
    environment: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """The Pareto frontier of a study: accuracy against the P99 upper bound."""
    from pareto.api import frontier as query

    front = query(
        study=study, slo_p99=slo_p99, min_accuracy=min_accuracy, max_memory=max_memory, environment=environment, db=db
    )
    if front:
        _environment_note(front[0]["environment"])
    if as_json:
        print_json(front)
        return
    from pareto.report import frontier_table

    groups: dict[str, list[dict[str, Any]]] = {}
    for row in front:
        groups.setdefault(row["environment"]["key"], []).append(row)
    for rows in groups.values() or [[]]:
        title = (
            "Pareto frontier" if len(groups) < 2 else f"Pareto frontier in environment {rows[0]['environment']['key']}"
        )
        out.print(frontier_table(rows, title=title, width=out.width))


@cli.command()
@study_option
@slo_options
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Confirm this many of the best feasible and near-feasible configurations.",
)
@click.option(
    "--margin",
    type=click.FloatRange(min=1),
    default=1.5,
    show_default=True,
    help="Near-feasible: a P99 upper bound within this multiple of the SLO.",
)
@environment_option
@click.option("--device", help="auto, cpu, cuda or cuda:N [default: the study's].")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads while timing [default: the study's].")
@db_option
@json_option
def confirm(
    study: str | None,
    slo_p99: str | None,
    min_accuracy: float | None,
    max_memory: str | None,
    top: int,
    margin: float,
    environment: str | None,
    device: str | None,
    threads: int | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Re-measure the best configurations in interleaved rounds with the baseline; `best` then prefers them."""
    from pareto.api import confirm as run

    result = run(
        study=study,
        slo_p99=slo_p99,
        min_accuracy=min_accuracy,
        max_memory=max_memory,
        top=top,
        margin=margin,
        environment=environment,
        device=device,
        threads=threads,
        db=db,
    )
    if as_json:
        print_json(result)
        return
    from pareto.report import confirmation_table

    out.print(confirmation_table(result))


def _environment_note(environment: dict[str, Any]) -> None:
    if environment.get("note"):
        err.print(environment["note"], markup=False)


@cli.group(invoke_without_command=True)
@db_option
@json_option
@click.pass_context
def studies(ctx: click.Context, db: str | None, as_json: bool) -> None:
    """The studies in the database: trial counts, environments, last nightly. `studies delete NAME` removes one."""
    if ctx.invoked_subcommand is not None:
        return
    from pareto.api import studies as query

    rows = query(db=db)
    if as_json:
        print_json(rows)
        return
    table = Table(title="Studies")
    columns = ("study", "task", "scenario", "objectives", "complete", "failed", "duplicate", "busy", "running")
    for column in (*columns, "P99 SLO", "environments", "last nightly", "updated"):
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
            f"{nightly['started_at'][:16].replace('T', ' ')} {nightly['status']}" if nightly else "—",
            r["updated_at"][:19].replace("T", " "),
        )
    out.print(table)


@studies.command("create")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML search spec (see configs/).")
@click.option("--task", help="Built-in task name (demo) or package.module:factory.")
@study_option
@click.option("--objective", "objectives", help="Comma-separated objectives [default accuracy,p99].")
@db_option
def studies_create(
    config_path: str | None, task: str | None, study: str | None, objectives: str | None, db: str | None
) -> None:
    """Create a study before its workers start (a study-creator job); an existing one is checked and kept."""
    from pareto.api import create_study
    from pareto.spec import load_spec

    overrides = {"task": task, "study": study, "objectives": objectives.split(",") if objectives else None}
    name = create_study(load_spec(config_path, overrides), db=db)
    out.print(f"Study {name!r} is ready for workers.")


@studies.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask.")
@db_option
def studies_delete(name: str, yes: bool, db: str | None) -> int:
    """Remove study NAME: its trials, measurements, runs, nightly history, and Optuna's study of that name."""
    from pareto.api import delete_study
    from pareto.api import studies as query

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
        f"{count(removed['nightly_runs'], 'nightly run')}; Optuna's study {removed['optuna']}."
    )
    return 0


@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Nightly config (configs/nightly.yaml).")
@click.option("--study", help="Study name [default: the config's].")
@click.option("--task", help="Task [default: the config's].")
@click.option("--time-budget", type=DURATION, help="The whole job's time, e.g. 10min [default: the config's].")
@db_option
@json_option
def nightly(
    config_path: str | None,
    study: str | None,
    task: str | None,
    time_budget: str | None,
    db: str | None,
    as_json: bool,
) -> int:
    """Re-measure a study's pick and frontier, search on, report regressions (exit 3) and keep history."""
    from pareto.api import nightly as run
    from pareto.report import ProgressReporter
    from pareto.spec import load_nightly

    overrides = {"study": study, "task": task, "nightly.time_budget": time_budget}
    spec, settings, config_db = load_nightly(config_path, overrides)
    with ProgressReporter(err, enabled=not as_json) as reporter:
        result = run(spec, settings, db=db or config_db, reporter=reporter, notice=lambda m: err.print(m, markup=False))
    if as_json:
        print_json(result.summary)
    else:
        from pareto.report import nightly_card

        out.print(nightly_card(result.summary))
    err.print(f"Summary written to {result.markdown_path} and {result.json_path}.", markup=False)
    return result.exit_code


@cli.command()
@study_option
@db_option
@json_option
def history(study: str | None, db: str | None, as_json: bool) -> None:
    """Every nightly run of a study: status, pick before and after, its P99, regressions, environment changes."""
    from pareto.api import history as query

    rows = query(study=study, db=db)
    if as_json:
        print_json(rows)
        return
    from pareto.report import history_table

    out.print(history_table(rows))


@cli.command()
@click.option("--task", default="demo", show_default=True, help="Built-in task name or package.module:factory.")
@click.option(
    "--technique",
    "techniques",
    multiple=True,
    metavar="NAME[:key=value,…]",
    help="A technique to apply, repeatable, e.g. prune_structured:ratio=0.5.",
)
@click.option("--study", help="With --trial: the study whose stored trial to measure again.")
@click.option("--trial", type=click.IntRange(min=0), help="Measure this stored trial again with its stored method.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Batch size [default: the task's].")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="eager",
    show_default=True,
    help="Serve the configuration with PyTorch (eager), torch.compile (compile) or ONNX Runtime (onnxruntime).",
)
@click.option("--slo-p99", type=DURATION, help="Judge the P99 against this bound, e.g. 7ms.")
@click.option("--hardware", default="auto", show_default=True, help="Roofline profile, host, auto or none.")
@click.option("--device", help="auto, cpu, cuda or cuda:N [default auto; with --trial: the stored one].")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads while timing.")
@click.option("--samples", type=click.IntRange(min=1), default=662, show_default=True, help="Fewest timed calls.")
@click.option(
    "--rounds", type=click.IntRange(min=1), default=20, show_default=True, help="Rounds the calls are split into."
)
@click.option("--warmup", type=click.IntRange(min=0), default=50, show_default=True, help="Warm-up calls.")
@click.option(
    "--confidence",
    type=click.FloatRange(min=0.9, max=1, max_open=True),
    default=0.99,
    show_default=True,
    help="One-sided confidence of every latency bound.",
)
@click.option("--sweep", is_flag=True, help="Also measure the throughput curve over a batch sweep.")
@click.option(
    "--adaptive-budget",
    type=DURATION,
    default="20s",
    show_default=True,
    help="With --slo-p99: keep timing until the verdict is decided, up to this long.",
)
@click.option(
    "--contention-limit",
    type=click.FloatRange(min=1, min_open=True),
    default=1.5,
    show_default=True,
    help="Discard a round when the probe is this many times slower than quiet.",
)
@click.option("--no-guard", is_flag=True, help="Time without the contention probe between rounds.")
@db_option
@json_option
def measure(
    task: str,
    techniques: tuple[str, ...],
    study: str | None,
    trial: int | None,
    batch_size: int | None,
    backend: str,
    slo_p99: str | None,
    hardware: str,
    device: str | None,
    threads: int | None,
    samples: int,
    rounds: int,
    warmup: int,
    confidence: float,
    sweep: bool,
    adaptive_budget: str,
    contention_limit: float,
    no_guard: bool,
    db: str | None,
    as_json: bool,
) -> None:
    """Measure one configuration on all four axes beside the uncompressed model, or a stored trial again."""
    if trial is not None:
        _remeasure(study, trial, slo_p99, device, db, as_json)
        return
    if study is not None:
        raise UsageError("--study needs --trial N: name the stored trial to measure again.")
    from pareto.api import measure as run

    card = run(
        task,
        techniques=techniques,
        batch_size=batch_size,
        backend=backend,
        slo_p99=slo_p99,
        hardware=None if hardware.lower() == "none" else hardware,
        device=device or "auto",
        threads=threads,
        samples=samples,
        rounds=rounds,
        warmup=warmup,
        confidence=confidence,
        sweep=sweep,
        adaptive_budget=adaptive_budget,
        contention_limit=None if no_guard else contention_limit,
        db=db,
    )
    notes = card.pop("notes")
    if as_json:
        print_json(card)
        return
    from pareto.report import measure_card

    out.print(measure_card(card))
    for note in notes:
        err.print(note)


def _remeasure(
    study: str | None, trial: int, slo_p99: str | None, device: str | None, db: str | None, as_json: bool
) -> None:
    from pareto.api import remeasure

    card = remeasure(study=study, trial=trial, slo_p99=slo_p99, device=device, db=db)
    notes = card.pop("notes")
    for note in notes:
        err.print(note, markup=False)
    if as_json:
        print_json(card)
        return
    from pareto.report import remeasure_card

    out.print(remeasure_card(card))


@cli.command()
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads [default torch's].")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.5, max=600),
    default=5.0,
    show_default=True,
    help="Time budget for the measurements.",
)
@db_option
@json_option
def calibrate(device: str, threads: int | None, seconds: float, db: str | None, as_json: bool) -> None:
    """Measure this machine's peak FLOP/s per dtype and memory bandwidth; store them as its profile."""
    from pareto.api import calibrate as run

    profile = run(device=device, threads=threads, seconds=seconds, db=db)
    if as_json:
        print_json(profile)
        return
    from pareto.report import profile_table

    out.print(profile_table([profile], title=f"Calibrated: {profile['description']}"))
    out.print(f"method: {profile['method']}", markup=False)
    out.print("Stored; searches on this machine use it for the roofline (--hardware auto or host).")


@cli.command()
@click.option("--task", default="demo", show_default=True, help="Built-in task name or package.module:factory.")
@click.option(
    "--hardware", default="auto", show_default=True, help="Profile name (see `pareto hardware`), host or auto."
)
@click.option("--batch-size", type=click.IntRange(min=1), help="Batch size [default: the task's].")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@db_option
@json_option
def roofline(task: str, hardware: str, batch_size: int | None, device: str, db: str | None, as_json: bool) -> None:
    """Where each layer type of a model sits on the roofline, to predict which techniques can pay off."""
    from pareto.api import roofline as run

    result = run(task, hardware=hardware, batch_size=batch_size, device=device, db=db)
    if as_json:
        print_json(result)
        return
    from pareto.report import roofline_table

    out.print(roofline_table(result))


@cli.command()
@json_option
def hardware(as_json: bool) -> None:
    """The datasheet hardware profiles (peak FLOP/s per dtype, bandwidth, ridge point)."""
    from pareto.api import hardware as run

    profiles = run()
    if as_json:
        print_json(profiles)
        return
    from pareto.report import profile_table

    out.print(profile_table(profiles, title="Hardware profiles (configs/hardware; dense peaks)"))


@cli.command()
@click.option("--device", default="auto", show_default=True, help="Judge availability on this device.")
@click.option("--task", help="Also judge availability for this task (train_data, layers).")
@json_option
def techniques(device: str, task: str | None, as_json: bool) -> None:
    """Every compression technique, its parameters, and whether it can run here (and if not, why)."""
    from pareto.api import techniques as run

    listing = run(device=device, task=task)
    if as_json:
        print_json(listing)
        return
    table = Table(
        title="Techniques (applied in this order: distill → prune → lowrank → finetune → quantize → compile)",
        title_justify="left",
    )
    for column in ("name", "family", "parameters", "backends", "available", "what it does / why not"):
        table.add_column(column, overflow="fold")
    for t in listing:
        params = "\n".join(f"{k}: {v}" for k, v in t["parameters"].items()) or "—"
        table.add_row(
            t["name"],
            t["family"],
            params,
            "all" if len(t["backends"]) == len(BACKENDS) else ", ".join(t["backends"]),
            "[green]yes[/]" if t["available"] else "[red]no[/]",
            escape(t["summary"] if t["available"] else t["reason"]),
        )
    out.print(table)
    out.print(
        "backends: where a configuration with the technique can be served (pareto search --backend); "
        "the techniques run in order on the PyTorch model, then it is compiled or exported to ONNX "
        "Runtime, then ort_int8_dynamic quantizes the exported graph."
    )


@cli.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@db_option
def db_upgrade(db: str | None) -> None:
    """Create or migrate pareto's tables to the latest revision."""
    from pareto.store.engine import current_revision, open_engine, resolve_url, upgrade

    engine = open_engine(resolve_url(db))
    upgrade(engine)
    out.print(f"Database {engine.url.render_as_string(hide_password=True)} is at revision {current_revision(engine)}.")


# commands that live in their own modules under pareto/_cli/, each defining ``command``
def _add_module_commands() -> None:
    from pareto._cli import explain, export, report, serve

    for module in (explain, export, report, serve):
        cli.add_command(module.command)


_add_module_commands()


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
