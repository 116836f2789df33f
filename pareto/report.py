"""Tables, cards and the live progress of a search (rich)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pareto.units import format_bytes, format_ms

if TYPE_CHECKING:
    from pareto.frontier import Candidate
    from pareto.search import TrialOutcome

def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


#: Frontier columns, most important first; a narrow terminal shows as many as fit, in this order.
_COLUMNS: list[tuple[str, str, int]] = [  # (name, justify, priority: lower shows first)
    ("trial", "right", 0), ("configuration", "left", 0), ("batch", "right", 3), ("accuracy", "right", 0),
    ("p50", "right", 2), ("p99", "right", 2), ("p99 ≤", "right", 0), ("throughput/s", "right", 3),
    ("memory", "right", 2), ("params", "right", 3),
    ("compression", "right", 1), ("speedup p99", "right", 1), ("SLO", "left", 0),
]


def frontier_table(
    front: list[Candidate] | list[dict[str, Any]], *, title: str = "Pareto frontier", width: int | None = None
) -> Table:
    """One row per frontier configuration, fastest first; ``width`` drops lesser columns to fit."""
    rows = [c if isinstance(c, dict) else c.to_dict() for c in front]
    if rows and title == "Pareto frontier":
        title = f"Pareto frontier of study {rows[0]['study']!r}"
    max_priority = 3 if width is None or width >= 150 else 2 if width >= 125 else 1 if width >= 100 else 0
    shown = [(name, justify) for name, justify, priority in _COLUMNS if priority <= max_priority]
    table = Table(title=title, title_justify="left")
    for name, justify in shown:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        m, slo = r["metrics"], r.get("slo") or {}
        feasible = slo.get("feasible")
        mark, style = {True: ("meets", "green"), False: ("misses", "red"), None: ("—", "dim")}[feasible]
        if feasible is False and slo.get("undecided_only"):
            mark, style = "uncertain", "yellow"  # too few samples to say; not a miss
        cells = {
            "trial": str(r["trial"]),
            "configuration": _describe(r, with_batch=max_priority < 3),
            "batch": str(m["batch_size"]),
            "accuracy": f"{m['accuracy']:.4f}",
            "p50": format_ms(m["latency_p50_ms"]),
            "p99": format_ms(m["latency_p99_ms"]),
            "p99 ≤": format_ms(m.get("latency_p99_upper_ms")),
            "throughput/s": f"{m['throughput_per_s']:,.0f}",
            "memory": format_bytes(m.get("memory_bytes")),
            "params": format_bytes(m["params_bytes"]),
            "compression": _ratio(m.get("compression_ratio")),
            "speedup p99": _ratio(m.get("speedup_p99")),
            "SLO": Text(mark, style=style),
        }
        table.add_row(*(cells[name] for name, _ in shown))
    if rows:
        m = rows[0]["metrics"]
        table.caption = (
            f"p99 ≤: upper end of a distribution-free {m['confidence']:.0%} interval from {m['samples']} timed calls; "
            "the SLO verdict uses it. Speedup: over the uncompressed model at the same batch size."
        )
    return table


def best_card(pick: dict[str, Any]) -> Panel:
    """The chosen configuration with the figures that justify it."""
    m, slo, env = pick["metrics"], pick.get("slo") or {}, pick["environment"]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("study / trial", f"{pick['study']} / {pick['trial']}")
    grid.add_row("configuration", _describe(pick))
    grid.add_row("accuracy", _accuracy(m))
    delta = m.get("accuracy_delta")
    if slo.get("min_accuracy") is None and delta is not None and delta < -0.01:
        grid.add_row("", Text(f"warning: {-delta:.4f} below the baseline and no accuracy floor was set; "
                              "pass --min-accuracy to bound the loss", style="yellow"))
    grid.add_row(
        "latency p99",
        f"{format_ms(m['latency_p99_ms'])}  ({m['confidence']:.0%} CI {format_ms(m.get('latency_p99_lower_ms'))}"
        f" – {format_ms(m.get('latency_p99_upper_ms'))})",
    )
    grid.add_row("latency p50 / p90", f"{format_ms(m['latency_p50_ms'])} / {format_ms(m['latency_p90_ms'])}")
    grid.add_row("p99 / p50", f"{m['p99_p50_ratio']:.2f}")
    grid.add_row("throughput", f"{m['throughput_per_s']:,.0f} samples/s at batch {m['batch_size']}")
    grid.add_row("parameters", f"{format_bytes(m['params_bytes'])} stored, {format_bytes(m['theoretical_bytes'])} ideal")
    axes_rows(grid, m)
    grid.add_row(
        "compression / speedup",
        f"{_ratio(m.get('compression_ratio'))} theoretical size,  {_ratio(m.get('speedup_p50'))} p50,  "
        f"{_ratio(m.get('speedup_p99'))} p99",
    )
    grid.add_row("SLO", _slo_text(slo))
    grid.add_row("method", _latency_method(m))
    grid.add_row("environment", _environment(env))
    return Panel(grid, title="Best configuration", title_align="left", border_style="green", expand=False)


def _describe(r: dict[str, Any], *, with_batch: bool = True) -> str:
    config = r.get("config") or {}
    techniques = config.get("techniques")
    if techniques is None:
        return r.get("description", "")
    parts = []
    for t in techniques:
        params = ",".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items())
        parts.append(f"{t['name']}({params})" if params else t["name"])
    body = " + ".join(parts) or "baseline"
    return f"{body} @ batch {config['batch_size']}" if with_batch else body


def _accuracy(m: dict[str, Any]) -> str:
    delta = m.get("accuracy_delta")
    return f"{m['accuracy']:.4f}" + ("" if delta is None else f"  ({delta:+.4f} vs baseline)")


def _slo_text(slo: dict[str, Any]) -> str:
    parts = []
    if slo.get("p99_ms") is not None:
        parts.append(f"P99 ≤ {format_ms(slo['p99_ms'])}: {slo.get('p99_verdict')}")
    if slo.get("min_accuracy") is not None:
        parts.append(f"accuracy ≥ {slo['min_accuracy']:g}")
    if slo.get("max_memory_bytes") is not None:
        parts.append(f"parameters ≤ {format_bytes(slo['max_memory_bytes'])}")
    return "; ".join(parts) or "none"


class ProgressReporter:
    """Live progress of a search: trials done, best feasible so far, time left; one line per trial."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console, self.enabled = console, enabled
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("trials"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=console,
            disable=not enabled,
            transient=True,
        )
        self.best_line = Text("best feasible so far: none yet", style="dim")
        self.task_id: Any = None
        self.started = time.monotonic()
        self.timeout_s: float | None = None
        self.done = 0
        self.total = 0

    def __enter__(self) -> ProgressReporter:
        if self.enabled:
            from rich.live import Live

            self.live = Live(Group(self.progress, self.best_line), console=self.console, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.live.__exit__(*exc)

    def start(self, *, study: str, task: str, n_trials: int, timeout_s: float | None, stored: int) -> None:
        self.total, self.timeout_s, self.started = n_trials, timeout_s, time.monotonic()
        resumed = f", continuing after {stored} stored trial{'s' if stored != 1 else ''}" if stored else ""
        self._print(f"Study [bold]{study}[/] on task [bold]{task}[/]: {n_trials} trial{'s' if n_trials != 1 else ''}{resumed}.")
        self.task_id = self.progress.add_task(study, total=n_trials, left="")

    def notice(self, message: str) -> None:
        self._print(f"[yellow]{escape(message)}[/]")

    def trial_done(self, outcome: TrialOutcome, best: Candidate | None) -> None:
        self.done += 1
        m = outcome.metrics
        if outcome.state == "FAILED":
            line = f"trial {outcome.number:>3}  [red]failed[/]  {escape(outcome.description)}: {escape(outcome.error or '')}"
        else:
            line = (
                f"trial {outcome.number:>3}  {outcome.description:<58}  acc {m['accuracy']:.4f}  "
                f"p50 {format_ms(m['latency_p50_ms'])}  p99 {format_ms(m['latency_p99_ms'])} "
                f"(≤ {format_ms(m.get('latency_p99_upper_ms'))})"
                + ("  [dim](duplicate, not re-measured)[/]" if outcome.state == "DUPLICATE" else "")
            )
        self._print(line)
        if best is not None:
            bm = best.metrics
            self.best_line.plain = (
                f"best feasible so far: trial {best.trial} {best.description}, accuracy {bm['accuracy']:.4f}, "
                f"P99 ≤ {format_ms(bm['latency_p99_upper_ms'])}"
            )
            self.best_line.style = "green"
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done)
        if self.timeout_s is not None:
            left = min(left, max(self.timeout_s - elapsed, 0.0))
        if self.task_id is not None:
            self.progress.update(self.task_id, advance=1, left=f"~{_clock(left)} left")

    def _print(self, message: str) -> None:
        if self.enabled:
            self.console.print(message)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _flops(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} "


def axes_rows(grid: Table, m: dict[str, Any]) -> None:
    """The memory, compute and roofline lines shared by the best and measure cards."""
    if m.get("memory_bytes") is not None:
        grid.add_row(
            "memory",
            f"{format_bytes(m['memory_bytes'])} = params {format_bytes(m['params_bytes'])} + activations "
            f"{format_bytes(m.get('activation_bytes'))} + KV cache {format_bytes(m.get('kv_cache_bytes'))} "
            "+ optimizer 0 B (inference)",
        )
    if m.get("flops") is not None:
        intensity = m.get("arithmetic_intensity")
        grid.add_row(
            "compute",
            f"{_flops(m['flops'])}FLOP per batch, {format_bytes(m.get('bytes_moved'))} moved, "
            f"intensity {'—' if intensity is None else f'{intensity:.1f}'} FLOP/byte",
        )
    if m.get("roofline_bound_ms") is not None:
        fraction = m["achieved_fraction"]
        gap = f", the measured p50 is {1 / fraction:,.3g}× that bound" if fraction else ""
        grid.add_row(
            "roofline", f"{m['regime']} on {m['hardware_profile']}: bound {format_ms(m['roofline_bound_ms'])}{gap}"
        )
    if m.get("throughput_curve"):
        curve = ", ".join(f"B={p['batch']}: {p['throughput_per_s']:,.0f}/s" for p in m["throughput_curve"])
        grid.add_row("throughput curve", curve)
        grid.add_row("", f"saturates at batch {m.get('saturation_batch')}; largest batch meeting the SLO: "
                         f"{m.get('max_batch_within_slo') or '—'}")


def measure_card(card: dict[str, Any]) -> Panel:
    """`pareto measure`: the four axes of one configuration, its roofline, and ratio against speedup."""
    m, env = card["metrics"], card["environment"]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("configuration", _describe({"config": card["config"]}))
    grid.add_row("accuracy", _accuracy(m))
    grid.add_row(
        "latency",
        f"p50 {format_ms(m['latency_p50_ms'])}  p90 {format_ms(m['latency_p90_ms'])}  p99 {format_ms(m['latency_p99_ms'])} "
        f"({m['confidence']:.0%} CI {format_ms(m.get('latency_p99_lower_ms'))} – {format_ms(m.get('latency_p99_upper_ms'))})"
        f"  p99.9 {format_ms(m['latency_p999_ms'])}  p99/p50 {m['p99_p50_ratio']:.2f}",
    )
    if m.get("p99_verdict"):
        style = {"met": "green", "missed": "red"}.get(m["p99_verdict"], "yellow")
        grid.add_row("SLO", Text(f"P99 ≤ {format_ms(m['slo_p99_ms'])}: {m['p99_verdict']}", style=style))
    grid.add_row("throughput", f"{m['throughput_per_s']:,.0f} samples/s at batch {m['batch_size']}")
    grid.add_row("parameters", f"{format_bytes(m['params_bytes'])} stored, {format_bytes(m['theoretical_bytes'])} ideal")
    axes_rows(grid, m)
    grid.add_row(
        "ratio vs speedup",
        f"{_ratio(m.get('compression_ratio'))} smaller in theory;  {_ratio(m.get('speedup_p50'))} p50, "
        f"{_ratio(m.get('speedup_p99'))} p99 faster than the baseline measured in this run "
        f"({format_ms(m['baseline_latency_p50_ms'])} / {format_ms(m['baseline_latency_p99_ms'])})",
    )
    if m.get("compile_s") is not None:
        grid.add_row("compile", f"{m['compile_s']:.2f} s (first call, not counted as latency)")
    grid.add_row("method", _latency_method(m))
    grid.add_row("environment", _environment(env))
    return Panel(grid, title="Measurement", title_align="left", expand=False)


def profile_table(profiles: list[dict[str, Any]], *, title: str) -> Table:
    """Hardware profiles: peak per dtype, bandwidth and ridge point per dtype."""
    table = Table(title=title, title_justify="left")
    for name in ("profile", "dtype", "peak TFLOP/s", "bandwidth GB/s", "ridge FLOP/byte"):
        table.add_column(name, justify="left" if name in {"profile", "dtype"} else "right")
    for p in profiles:
        for i, (dtype, peak) in enumerate(p["peak_flops"].items()):
            table.add_row(
                p["name"] if i == 0 else "",
                dtype,
                f"{peak / 1e12:,.3g}",
                f"{p['memory_bandwidth_bytes_per_s'] / 1e9:,.0f}" if i == 0 else "",
                f"{p['ridge_flop_per_byte'][dtype]:,.1f}",
            )
    return table


def roofline_table(result: dict[str, Any]) -> Table:
    """`pareto roofline`: each layer type's intensity against the ridge, and what can pay off."""
    hw = result["hardware"]
    table = Table(
        title=f"Roofline of task {result['task']!r} at batch {result['batch_size']} ({result['dtype']}) on {hw['name']}: "
              f"ridge {result['ridge_flop_per_byte']:.1f} FLOP/byte",
        title_justify="left",
    )
    for name in ("layer type", "layers", "FLOP", "bytes moved", "FLOP/byte", "regime", "what can pay off"):
        table.add_column(name, justify="right" if name in {"layers", "FLOP", "bytes moved", "FLOP/byte"} else "left")
    for r in result["layers"]:
        table.add_row(r["type"], str(r["layers"]), _flops(r["flops"]), format_bytes(r["bytes_moved"]),
                      f"{r['arithmetic_intensity']:.1f}",
                      Text(r["regime"], style="cyan" if r["regime"] == "memory-bound" else "magenta"), r["pays_off"])
    table.caption = "Bytes count each layer's weights once plus its activations in and out (as if through memory)."
    return table


def _latency_method(m: dict[str, Any]) -> str:
    """The timing method in one line; every term's method is in the JSON output."""
    method = m.get("method") or "—"
    first, sep, _ = method.partition(" | ")  # assess.METHOD_SEPARATOR; not imported: no torch here
    return first + ("  (each term's method: --json)" if sep else "")


def _environment(env: dict[str, Any]) -> str:
    return f"{env['device']} · {env['device_name']} · torch {env['torch_version']} · {env['threads']} threads · {env['hostname']}"
