"""`pareto techniques`: every compression technique, its parameters, and whether it can run here."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from pareto._cli.options import json_option, out, print_json
from pareto.api import techniques as run
from pareto.errors import UsageError
from pareto.machine import describe_cpu_features
from pareto.measure.environment import host_cpu
from pareto.naming import BACKENDS
from pareto.tasks.source import ModelSource


@click.command("techniques")
@click.option("--device", default="auto", show_default=True, help="Judge availability on this device.")
@click.option("--task", help="Also judge availability for this task (train_data, layers).")
@click.option(
    "--model", "model_path", type=click.Path(), help="Judge it for a Hugging Face model folder (with --data)."
)
@click.option("--data", "data_path", type=click.Path(), help="The model folder's data file (JSONL or CSV).")
@json_option
def command(device: str, task: str | None, model_path: str | None, data_path: str | None, as_json: bool) -> None:
    """Every compression technique, its parameters, and whether it can run here (and if not, why)."""

    if model_path is not None or data_path is not None:
        if model_path is None or data_path is None or task is not None:
            raise UsageError("Judge a model folder with --model and --data together (and no --task).")
        task = ModelSource.open(model_path, data_path).ref()
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
            escape(_what(t)),
        )
    out.print(table)
    if any(t.get("on_this_cpu") for t in listing):  # judged on the CPU
        features, capability = host_cpu()
        out.print(f"This CPU: {describe_cpu_features(features)}; torch dispatches its own kernels at {capability}.")
    out.print(
        "backends: where a configuration with the technique can be served (pareto search --backend); "
        "the techniques run in order on the PyTorch model, then it is compiled or exported to ONNX "
        "Runtime, then ort_int8_dynamic quantizes the exported graph."
    )


def _what(technique: dict[str, object]) -> str:
    """What it does (and what this CPU's instructions do for it), or why it cannot run."""
    if not technique["available"]:
        return str(technique["reason"])
    here = technique.get("on_this_cpu")
    return f"{technique['summary']}\non this CPU: {here}" if here else str(technique["summary"])
