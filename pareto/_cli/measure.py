"""`pareto measure`: one configuration on all four axes beside the uncompressed model, or a stored trial again."""

from __future__ import annotations

import click

from pareto._cli.options import DURATION, STUDY_NAME, db_option, err, json_option, out, print_json
from pareto.api import measure as run
from pareto.api import remeasure
from pareto.errors import UsageError
from pareto.naming import BACKENDS
from pareto.report.tables import measure_card, remeasure_card


@click.command("measure")
@click.option("--task", default="demo", show_default=True, help="Built-in task name or package.module:factory.")
@click.option(
    "--technique",
    "techniques",
    multiple=True,
    metavar="NAME[:key=value,…]",
    help="A technique to apply, repeatable, e.g. prune_structured:ratio=0.5.",
)
@click.option("--study", type=STUDY_NAME, help="With --trial: the study whose stored trial to measure again.")
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
def command(
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

    out.print(measure_card(card))
    for note in notes:
        err.print(note)


def _remeasure(
    study: str | None, trial: int, slo_p99: str | None, device: str | None, db: str | None, as_json: bool
) -> None:

    card = remeasure(study=study, trial=trial, slo_p99=slo_p99, device=device, db=db)
    notes = card.pop("notes")
    for note in notes:
        err.print(note, markup=False)
    if as_json:
        print_json(card)
        return

    out.print(remeasure_card(card))
