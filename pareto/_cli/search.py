"""`pareto search`: search compression configurations, measuring every trial; re-running continues the study."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, get_args

import click
from rich.markup import escape

from pareto._cli.options import (
    DURATION,
    STUDY_NAME,
    count,
    db_option,
    err,
    json_option,
    out,
    print_json,
    slo_options,
    throughput_option,
)
from pareto.api import search as run
from pareto.naming import BACKENDS, SAMPLER_HELP, SamplerName
from pareto.report.tables import ProgressReporter, best_card, confirmation_table, frontier_table
from pareto.spec import load_spec, load_stored_spec

if TYPE_CHECKING:
    from pareto.study.result import SearchResult


@click.command("search")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML search spec (see configs/).")
@click.option("--task", help="Built-in task name (demo) or package.module:factory.")
@click.option(
    "--model",
    "model_path",
    type=click.Path(),
    help="A Hugging Face model folder to search in place of --task (a sequence classifier or a sentence-transformers "
    "folder), read offline; needs --data.",
)
@click.option(
    "--data",
    "data_path",
    type=click.Path(),
    help="The model's data file: JSONL or CSV, one example per row (images: also a folder of label subfolders).",
)
@click.option("--text-field", help="The data's text field [default text].")
@click.option("--image-field", help="For an image classifier: the field with each image's path [default image].")
@click.option("--label-field", help="The data's label field (label names or ids) [default label].")
@click.option("--metric", type=click.Choice(["accuracy", "f1"]), help="A classifier's score [default accuracy].")
@click.option(
    "--padding",
    type=click.Choice(["request", "bucket", "max"]),
    help="How requests are shaped: at their own length, padded up to a length bucket, or to --max-length "
    "[default request].",
)
@click.option("--max-length", type=click.IntRange(min=2), help="Cut requests to this many tokens [default 512].")
@click.option(
    "--trust-remote-code", is_flag=True, default=None, help="Run the model folder's own code (auto_map): read it first."
)
@click.option("--study", type=STUDY_NAME, help="Study name; re-using one continues it [default: the task's name].")
@slo_options
@throughput_option
@click.option(
    "--objective",
    "objectives",
    help="Comma-separated: accuracy,p99,p50,memory,throughput,bytes_moved,flops,capacity (with --qps).",
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
@click.option(
    "--keep",
    "keep",
    multiple=True,
    help="A CPU lever (bf16, fp16, int8_dynamic, int8_static, ort_int8_dynamic, ort_int8_static) to search even "
    "where the lever probe times it slower than float32 here; repeat it for several.",
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
def command(
    config_path: str | None,
    db: str | None,
    as_json: bool,
    workers: int,
    spec_json: str | None,
    as_worker: bool,
    **flags: Any,
) -> int:
    """Search compression configurations, measuring every trial; re-running continues the study."""

    overrides = {key: flags[flag] for key, flag in _SPEC_FLAGS.items()}
    overrides["objectives"] = flags["objectives"].split(",") if flags["objectives"] else None
    overrides["space.backend"] = list(flags["backends"]) or None
    overrides["search.keep"] = list(flags["keep"]) or None
    spec = load_stored_spec(spec_json) if spec_json else load_spec(config_path, overrides)
    if flags["no_guard"]:
        spec = spec.model_copy(update={"measure": spec.measure.model_copy(update={"contention_limit": None})})

    with ProgressReporter(err, enabled=as_worker or not as_json) as reporter:
        result = run(spec, db=db, reporter=reporter, workers=workers)
    if as_json or as_worker:
        print_json(result.to_dict())
        return _search_exit(result)
    _print_search(result)
    return _search_exit(result)


#: ``pareto search`` flags and the spec keys they set (CLI flags override the YAML).
_SPEC_FLAGS = {
    "task": "task",
    "model": "model_path",
    "data": "data_path",
    "inputs.text_field": "text_field",
    "inputs.image_field": "image_field",
    "inputs.label_field": "label_field",
    "inputs.metric": "metric",
    "inputs.padding": "padding",
    "inputs.max_length": "max_length",
    "inputs.trust_remote_code": "trust_remote_code",
    "study": "study",
    "slo.p99": "slo_p99",
    "slo.min_accuracy": "min_accuracy",
    "slo.min_throughput": "min_throughput",
    "traffic.qps": "qps",
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


def _print_search(result: SearchResult) -> None:
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
            f"accuracy not evaluated); {count(result.repeats, 'repeat')} of configurations tried already, "
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


def _search_exit(result: SearchResult) -> int:
    """130 after Ctrl-C; 75 (EX_TEMPFAIL) when the machine stayed busy and the search stopped early; 1 when
    a worker ended on an error (what the others measured is stored, its share of the trials is not run)."""
    if result.interrupted:
        return 130
    return 75 if result.stopped_busy else 1 if result.failed_workers else 0
