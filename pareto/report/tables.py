"""Tables, cards and the live progress of a search (rich)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pareto.metrics import LOAD_RUN, METHOD_SEPARATOR, served_capacity
from pareto.naming import describe_config
from pareto.store.records import NightStatus, TrialState
from pareto.tasks.source import score_name
from pareto.units import format_bytes, format_ms

if TYPE_CHECKING:
    from pareto.front import Candidate
    from pareto.study.confirmation import ConfirmResult
    from pareto.study.search import TrialOutcome

#: A nightly status as the tables colour it (by its stored string); any other status is yellow.
_NIGHT_COLOURS = {NightStatus.OK.value: "green", NightStatus.REGRESSION.value: "red"}


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


#: Frontier columns, most important first; a narrow terminal shows as many as fit, in this order.
_COLUMNS: list[tuple[str, str, int]] = [  # (name, justify, priority: lower shows first)
    ("trial", "right", 0),
    ("configuration", "left", 0),
    ("batch", "right", 3),
    ("accuracy", "right", 0),
    ("p50", "right", 2),
    ("p99", "right", 2),
    ("p99 ≤", "right", 0),
    ("throughput/s", "right", 3),
    ("memory", "right", 2),
    ("params", "right", 3),
    ("compression", "right", 1),
    ("speedup p99", "right", 1),
    ("SLO", "left", 0),
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
    traffic = next((r["metrics"]["qps"] for r in rows if r["metrics"].get("scenario")), None)
    if traffic is not None:  # at a request rate: the requests' P99 there and the capacity, after the call's
        at = shown.index(("p99 ≤", "right")) + 1 if ("p99 ≤", "right") in shown else len(shown) - 1
        shown[at:at] = [(f"req p99 ≤ @{traffic:,.4g}/s", "right"), ("capacity/s", "right")]
    table = Table(title=title, title_justify="left")
    score = score_label(rows[0]["metrics"]) if rows else "accuracy"
    for name, justify in shown:
        header = score if name == "accuracy" else name  # fidelity, macro-F1: what the column holds
        table.add_column(header, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        m, slo = r["metrics"], r.get("slo") or {}
        feasible = slo.get("feasible")
        mark, style = {True: ("meets", "green"), False: ("misses", "red"), None: ("—", "dim")}[feasible]
        if feasible is False and slo.get("undecided_only"):
            mark, style = "uncertain", "yellow"  # too few samples to say; not a miss
        if r.get("confirmation"):
            mark += " ✓"  # confirmed in interleaved rounds with the baseline
        cells: dict[str, str | Text] = {
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
        if traffic is not None:
            cells[f"req p99 ≤ @{traffic:,.4g}/s"] = format_ms(m.get("request_p99_upper_ms"))
            cells["capacity/s"] = _capacity_cell(m)
        table.add_row(*(cells[name] for name, _ in shown))
    if rows:
        m = rows[0]["metrics"]
        table.caption = (
            f"p99 ≤: {_bound_words(m)}; the SLO verdict uses it. ✓: confirmed in interleaved rounds with the "
            "baseline. Speedup: over the uncompressed model timed in the same run, at the same batch size."
        )
        if traffic is not None:
            table.caption = (
                f"p99 ≤: one call at the batch size, {_bound_words(m)}. req p99 ≤: every request's at "
                f"{traffic:,.4g} requests/s (Poisson), queue and batcher simulated on the served batch costs, "
                "its bound the SLO verdict uses; capacity: the highest rate within the SLO, found by load runs "
                "(load-run) or simulated on the served batch costs (sim); a rate is judged by the load-run one "
                "where it exists. ✓: confirmed with the baseline. Batch: the batcher's largest."
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
    score = score_label(m)
    grid.add_row(score, _accuracy(m))
    delta = m.get("accuracy_delta")
    if slo.get("min_accuracy") is None and delta is not None and delta < -0.01:
        grid.add_row(
            "",
            Text(
                f"warning: {-delta:.4f} below the baseline and no {score} floor was set; "
                "pass --min-accuracy to bound the loss",
                style="yellow",
            ),
        )
    grid.add_row("latency p99", _p99_text(m))
    grid.add_row("latency p50 / p90", f"{format_ms(m['latency_p50_ms'])} / {format_ms(m['latency_p90_ms'])}")
    grid.add_row("p99 / p50", f"{m['p99_p50_ratio']:.2f}")
    grid.add_row("throughput", f"{m['throughput_per_s']:,.0f} samples/s at batch {m['batch_size']}")
    grid.add_row(
        "parameters", f"{format_bytes(m['params_bytes'])} stored, {format_bytes(m['theoretical_bytes'])} ideal"
    )
    axes_rows(grid, m)
    grid.add_row(
        "compression / speedup",
        f"{_ratio(m.get('compression_ratio'))} theoretical size,  {_ratio(m.get('speedup_p50'))} p50,  "
        f"{_ratio(m.get('speedup_p99'))} p99",
    )
    traffic_rows(grid, pick)
    grid.add_row("SLO", _slo_text(slo, score))
    grid.add_row("confirmed", _confirmation_text(pick.get("confirmation")))
    grid.add_row("method", _latency_method(m))
    grid.add_row("environment", _environment(env))
    return Panel(grid, title="Best configuration", title_align="left", border_style="green", expand=False)


def traffic_rows(grid: Table, pick: dict[str, Any]) -> None:
    """At a request rate: the requests' P99 there with the batcher, the capacity, and the load run if any."""
    m = pick["metrics"]
    if m.get("scenario") is None:
        return
    upper = m.get("request_p99_upper_ms")
    grid.add_row(
        f"at {m['qps']:,.4g} requests/s",
        f"request P99 {format_ms(m['request_p99_ms'])} (≤ {format_ms(upper)}), P50 {format_ms(m['request_p50_ms'])}, "
        f"max batch {m['max_batch']}, wait {format_ms(m['max_wait_ms'])} (simulated: {m['requests']} requests)",
    )
    grid.add_row("capacity", capacity_words(m))
    load = pick.get("load_run")
    if load:
        kept = "kept up" if load["kept_up"] else "did not keep up"
        valid = "valid" if load["valid"] else f"not valid: {str(load['reason']).rstrip('.')}"
        runs = f" over {load['replications']} runs" if load.get("replications", 1) > 1 else ""
        grid.add_row(
            "load run",
            f"request P99 {format_ms(load['p99_ms'])} (≤ {format_ms(load.get('p99_upper_ms'))}) at "
            f"{load['qps']:,.4g}/s, {load['requests']} requests{runs}, max batch {load['max_batch']}, wait "
            f"{format_ms(load['max_wait_ms'])}{_instances(load.get('instances'))}{_threads(load.get('threads'))}, "
            f"{kept}, {valid}",
        )


def _threads(count: int | None) -> str:
    return f", {count} intra-op thread{'s' if count != 1 else ''}" if count else ""


def _instances(count: int | None) -> str:
    """ ", 2 model instances" beside a batcher served by more than one (one says nothing, as before)."""
    return f", {count} model instances" if count and count > 1 else ""


def capacity_words(m: dict[str, Any]) -> str:
    """The capacity a rate is judged by, its source and batcher, and the simulated one beside a load-run one."""
    simulated = m.get("capacity_qps")
    sim = (
        f"{simulated:,.0f} requests/s simulated, not load-run (max batch {m['capacity_max_batch']}, wait "
        f"{format_ms(m['capacity_max_wait_ms'])}{_instances(m.get('serve_instances'))}"
        f"{_threads(m.get('serve_threads'))})"
        if simulated
        else "none simulated: its requests miss the SLO even at the lowest rate tried"
    )
    load = m.get("load_capacity_qps")
    if load is None:
        return sim
    batcher = (
        f"max batch {m.get('load_capacity_max_batch')}, wait {format_ms(m.get('load_capacity_max_wait_ms'))}"
        f"{_instances(m.get('load_capacity_instances') or m.get('serve_instances'))}"
        f"{_threads(m.get('load_capacity_threads'))}"
    )
    found = f"{load:,.0f} requests/s load-run ({batcher})" if load else "none load-run: no rate tried met the SLO"
    return f"{found}; {sim}"


def _capacity_cell(m: dict[str, Any]) -> str:
    capacity, source = served_capacity(m)
    if not capacity:
        return "none"
    return f"{capacity:,.0f} {'load-run' if source == LOAD_RUN else 'sim'}"


def _p99_text(m: dict[str, Any]) -> str:
    return (
        f"{format_ms(m['latency_p99_ms'])}  (bounds {format_ms(m.get('latency_p99_lower_ms'))} – "
        f"{format_ms(m.get('latency_p99_upper_ms'))}, each {m['confidence']:.3g} one-sided, "
        f"{m.get('rounds') or 1} rounds{_discarded(m)})"
    )


def _discarded(m: dict[str, Any]) -> str:
    n = m.get("discarded_rounds")
    return f", {n} discarded for contention" if n else ""


def _bound_words(m: dict[str, Any]) -> str:
    rounds = m.get("rounds") or 1
    return (
        f"{m['confidence']:.3g} one-sided upper bound from {m['samples']} calls in {rounds} rounds, covering the "
        "spread between rounds"
    )


def _confirmation_text(confirmation: dict[str, Any] | None) -> Text:
    if not confirmation:
        return Text(
            "no: measured once, during the search; run 'pareto confirm' to re-measure it with the baseline",
            style="yellow",
        )
    when = str(confirmation.get("confirmed_at", ""))[:16].replace("T", " ")
    discarded = confirmation.get("discarded_rounds") or 0
    return Text(
        f"yes: {confirmation.get('rounds')} rounds interleaved with the baseline at {when} UTC, "
        f"{discarded} discarded for contention",
        style="green",
    )


def _describe(r: dict[str, Any], *, with_batch: bool = True) -> str:
    config = r.get("config") or {}
    if config.get("techniques") is None:
        return str(r.get("description", ""))
    return describe_config(config, with_batch=with_batch)


def _accuracy(m: dict[str, Any]) -> str:
    delta = m.get("accuracy_delta")
    return f"{m['accuracy']:.4f}" + ("" if delta is None else f"  ({delta:+.4f} vs baseline)")


def score_label(metrics: Mapping[str, object]) -> str:
    """What the accuracy figure is, as a read stores it beside the metrics: "accuracy", "macro-F1", "fidelity"."""
    return str(metrics.get("accuracy_metric") or "accuracy")


def _slo_text(slo: dict[str, Any], score: str = "accuracy") -> str:
    parts = []
    if slo.get("p99_ms") is not None:
        rate = f" at {slo['qps']:,.4g} requests/s" if slo.get("qps") else ""
        parts.append(f"P99 ≤ {format_ms(slo['p99_ms'])}{rate}: {slo.get('p99_verdict')}")
    if slo.get("min_accuracy") is not None:
        parts.append(f"{score} ≥ {slo['min_accuracy']:g}")
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
        self.score = "accuracy"  # what the accuracy figure is (``start`` reads it from the task)

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
        self.score = score_name(task)
        resumed = f", continuing after {stored} stored trial{'s' if stored != 1 else ''}" if stored else ""
        self._print(
            f"Study [bold]{escape(study)}[/] on task [bold]{escape(task)}[/]: {n_trials} new configuration"
            f"{'s' if n_trials != 1 else ''}{resumed} (a repeat of one measured already is not counted)."
        )
        self.task_id = self.progress.add_task(study, total=n_trials, left="")

    def notice(self, message: str) -> None:
        self._print(f"[yellow]{escape(message)}[/]")

    def trial_done(self, outcome: TrialOutcome, best: Candidate | None) -> None:
        self._print(_trial_line(outcome, self.score))
        # a repeat, or nothing measured: not one of the --n-trials
        if outcome.state in (TrialState.DUPLICATE, TrialState.BUSY):
            return
        self.done += 1
        if best is not None:
            bm = best.metrics
            self.best_line.plain = (
                f"best feasible so far: trial {best.trial} {best.description}, {self.score} {bm['accuracy']:.4f}, "
                f"P99 ≤ {format_ms(bm['latency_p99_upper_ms'])}"
            )
            self.best_line.style = "green"
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done)
        if self.timeout_s is not None:
            left = min(left, max(self.timeout_s - elapsed, 0.0))
        if self.task_id is not None:
            self.progress.update(self.task_id, advance=1, left=f"~{_clock(left)} left")

    def confirmed(self, result: ConfirmResult) -> None:
        kept = [i for i in result.items if i.after is not None]
        self._print(
            f"Confirmed {len(kept)} of {len(result.items)} configurations (the baseline included) in "
            f"interleaved rounds; {escape(result.guard)}."
            if result.items
            else f"[yellow]Confirmation: {escape(result.note or 'nothing to confirm')}.[/]"
        )

    def _print(self, message: str) -> None:
        if self.enabled:
            self.console.print(message)


#: The progress line's short name for each score.
_SHORT = {"accuracy": "acc", "macro-F1": "F1", "fidelity": "fid"}


def _trial_line(outcome: TrialOutcome, score: str = "accuracy") -> str:
    """One line per finished trial; the contention guard's discarded rounds are said, a busy trial too."""
    head = f"trial {outcome.number:>3}  "
    if outcome.state == TrialState.FAILED:
        return head + f"[red]failed[/]  {escape(outcome.description)}: {escape(outcome.error or '')}"
    if outcome.state == TrialState.BUSY:
        return (
            head + f"[yellow]machine busy[/]  {escape(outcome.description)}: {escape(outcome.error or '')}; no verdict"
        )
    if outcome.state == TrialState.PRUNED:
        return head + f"[yellow]rejected early[/]  {escape(outcome.description)}: {escape(outcome.error or '')}"
    if outcome.state == TrialState.DUPLICATE and "accuracy" not in outcome.metrics:
        # one that broke there says so (its outcome's error); one rejected early there, that
        note = f"{outcome.error or f'repeat of trial {outcome.repeat_of}, rejected early there'}; not counted"
        return head + f"{escape(outcome.description)}  [dim]({note})[/]"
    m = outcome.metrics
    line = (
        f"{head}{escape(outcome.description):<58}  {_SHORT.get(score, 'acc')} {m['accuracy']:.4f}  "
        f"p50 {format_ms(m['latency_p50_ms'])}  p99 {format_ms(m['latency_p99_ms'])} "
        f"(≤ {format_ms(m.get('latency_p99_upper_ms'))})"
    )
    if outcome.state == TrialState.DUPLICATE:
        return line + f"  [dim](repeat of trial {outcome.repeat_of}, answered from the database; not counted)[/]"
    if m.get("scenario"):
        capacity = f"{m['capacity_qps']:,.0f}/s simulated" if m.get("capacity_qps") else "none"
        line += f"  @{m['qps']:,.4g}/s req p99 ≤ {format_ms(m.get('request_p99_upper_ms'))}  capacity {capacity}"
    if m.get("discarded_rounds"):
        line += f"  [yellow]({m['discarded_rounds']} rounds discarded for contention)[/]"
    return line


def confirmation_table(result: dict[str, Any]) -> Table | Text:
    """Each confirmed configuration's P99 before and after, with the verdicts."""
    if not result["items"]:
        return Text(f"Confirmation: {result.get('note') or 'nothing to confirm'}.", style="yellow")
    table = Table(
        title=f"Confirmation of study {result['study']!r}: interleaved rounds with the baseline, "
        "random order each round",
        title_justify="left",
    )
    for name, justify in (
        ("trial", "right"),
        ("configuration", "left"),
        ("p99 before", "right"),
        ("p99 ≤ before", "right"),
        ("p99 now", "right"),
        ("p99 ≤ now", "right"),
        ("verdict before → now", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for item in result["items"]:
        before, after = item["before"], item["after"] or {}
        verdict = f"{item['verdict_before'] or '—'} → {item['verdict_after'] or '—'}"
        if item.get("busy_reason"):
            verdict = f"not confirmed: {item['busy_reason']}"
        table.add_row(
            str(item["trial"]),
            escape(item["description"]),
            format_ms(before.get("latency_p99_ms")),
            format_ms(before.get("latency_p99_upper_ms")),
            format_ms(after.get("latency_p99_ms")),
            format_ms(after.get("latency_p99_upper_ms")),
            Text(verdict, style=_verdict_style(item.get("verdict_after"))),
        )
    table.caption = f"{result['guard']}. Environment {result['environment']['key']}."
    return table


def _verdict_style(verdict: str | None) -> str:
    return {"met": "green", "missed": "red"}.get(verdict or "", "yellow")


def remeasure_card(card: dict[str, Any]) -> Panel:
    """`pareto measure --trial N`: the stored figures beside the new ones, and whether the verdict holds."""
    m, stored = card["metrics"], card["stored"]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("study / trial", f"{card['study']} / {card['trial']}")
    grid.add_row("configuration", _describe({"config": card["config"]}))
    grid.add_row("p99 stored", _p99_text(stored))
    grid.add_row("p99 now", _p99_text(m))
    grid.add_row("p50 stored / now", f"{format_ms(stored['latency_p50_ms'])} / {format_ms(m['latency_p50_ms'])}")
    grid.add_row(
        "speedup now",
        f"{_ratio(m.get('speedup_p50'))} p50, {_ratio(m.get('speedup_p99'))} p99 over the "
        "baseline timed in the same rounds",
    )
    verdict = card["verdict"]
    if m.get("slo_p99_ms") is not None:
        holds = card["verdict_holds"]
        text = f"P99 ≤ {format_ms(m['slo_p99_ms'])}: stored {verdict['stored']}, now {verdict['now']} — "
        text += "the stored verdict holds" if holds else "the stored verdict does NOT hold"
        grid.add_row("SLO", Text(text, style="green" if holds else "red"))
    grid.add_row("method", _latency_method(m))
    grid.add_row("environment", _environment(card["environment"]))
    return Panel(grid, title="Measured again", title_align="left", expand=False)


def _clock(seconds: float) -> str:
    seconds = round(seconds)
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
    if m.get("roofline_bound_ms") is not None and m.get("roofline_suspect"):
        grid.add_row(
            "roofline",
            Text(
                f"not shown: the measured p50 ({format_ms(m['latency_p50_ms'])}) beat the bound of profile "
                f"{m['hardware_profile']} ({format_ms(m['roofline_bound_ms'])}), so its ceilings are wrong; "
                "run 'pareto calibrate' again (or name a datasheet profile with --hardware)",
                style="yellow",
            ),
        )
    elif m.get("roofline_bound_ms") is not None:
        fraction = m["achieved_fraction"]
        gap = f", the measured p50 is {1 / fraction:,.3g}× that bound" if fraction else ""
        grid.add_row(
            "roofline", f"{m['regime']} on {m['hardware_profile']}: bound {format_ms(m['roofline_bound_ms'])}{gap}"
        )
    if m.get("throughput_curve"):
        curve = ", ".join(f"B={p['batch']}: {p['throughput_per_s']:,.0f}/s" for p in m["throughput_curve"])
        grid.add_row("throughput curve", curve)
        grid.add_row(
            "",
            f"saturates at batch {m.get('saturation_batch')}; largest batch meeting the SLO: "
            f"{m.get('max_batch_within_slo') or '—'}",
        )


def measure_card(card: dict[str, Any]) -> Panel:
    """`pareto measure`: the four axes of one configuration, its roofline, and ratio against speedup."""
    m, env = card["metrics"], card["environment"]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("configuration", _describe({"config": card["config"]}))
    grid.add_row(score_label(m), _accuracy(m))
    grid.add_row(
        "latency",
        f"p50 {format_ms(m['latency_p50_ms'])}  p90 {format_ms(m['latency_p90_ms'])}  p99 {_p99_text(m)}"
        f"  p99.9 {format_ms(m['latency_p999_ms'])}  p99/p50 {m['p99_p50_ratio']:.2f}",
    )
    if m.get("p99_verdict"):
        style = {"met": "green", "missed": "red"}.get(m["p99_verdict"], "yellow")
        grid.add_row("SLO", Text(f"P99 ≤ {format_ms(m['slo_p99_ms'])}: {m['p99_verdict']}", style=style))
    grid.add_row("throughput", f"{m['throughput_per_s']:,.0f} samples/s at batch {m['batch_size']}")
    grid.add_row(
        "parameters", f"{format_bytes(m['params_bytes'])} stored, {format_bytes(m['theoretical_bytes'])} ideal"
    )
    axes_rows(grid, m)
    grid.add_row(
        "ratio vs speedup",
        f"{_ratio(m.get('compression_ratio'))} smaller in theory;  {_ratio(m.get('speedup_p50'))} p50, "
        f"{_ratio(m.get('speedup_p99'))} p99 faster than the baseline timed in the same rounds "
        f"({format_ms(m['baseline_latency_p50_ms'])} / {format_ms(m['baseline_latency_p99_ms'])})",
    )
    if m.get("compile_s") is not None:
        if (card["config"] or {}).get("backend") == "onnxruntime":
            built = "ONNX export, session and first call"
        else:
            built = "first call"
        grid.add_row("build", f"{m['compile_s']:.2f} s ({built}, not counted as latency)")
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
        title=f"Roofline of task {result['task']!r} at batch {result['batch_size']} ({result['dtype']}) "
        f"on {hw['name']}: ridge {result['ridge_flop_per_byte']:.1f} FLOP/byte",
        title_justify="left",
    )
    for name in ("layer type", "layers", "FLOP", "bytes moved", "FLOP/byte", "regime", "what can pay off"):
        table.add_column(name, justify="right" if name in {"layers", "FLOP", "bytes moved", "FLOP/byte"} else "left")
    for r in result["layers"]:
        table.add_row(
            r["type"],
            str(r["layers"]),
            _flops(r["flops"]),
            format_bytes(r["bytes_moved"]),
            f"{r['arithmetic_intensity']:.1f}",
            Text(r["regime"], style="cyan" if r["regime"] == "memory-bound" else "magenta"),
            r["pays_off"],
        )
    table.caption = "Bytes count each layer's weights once plus its activations in and out (as if through memory)."
    return table


def _latency_method(m: dict[str, Any]) -> str:
    """The timing method in one line; every term's method is in the JSON output."""
    method = m.get("method") or "—"
    first, sep, _ = method.partition(METHOD_SEPARATOR)
    return first + ("  (each term's method: --json)" if sep else "")


def _environment(env: dict[str, Any]) -> str:
    return (
        f"{env['device']} · {env['device_name']} · torch {env['torch_version']} · {env['threads']} threads · "
        f"{env['hostname']}"
    )


def nightly_card(summary: dict[str, Any]) -> Group:
    """A nightly job's outcome: status, environment changes, re-measured configurations, pick before and after."""
    from pareto.nightly_job.history import drift_lines
    from pareto.nightly_job.job import corrected_text

    status = summary["status"]
    style = "bold red" if status == NightStatus.REGRESSION else _NIGHT_COLOURS.get(status, "yellow")
    parts: list[Any] = [Text(f"Nightly of study {summary['study']!r}: {summary['status']}", style=style)]
    for change in summary.get("environment_changes") or []:
        parts.append(Text(f"Environment changed: {change}", style="yellow"))
    if summary.get("comparisons"):
        table = Table(title="Re-measured with the baseline (interleaved rounds)", title_justify="left")
        for name in (
            "trial",
            "configuration",
            "p99 before",
            "p99 now",
            "ratio",
            "drift-corrected (p50, p99)",
            "test",
            "finding",
        ):
            table.add_column(name, overflow="fold")
        for c in summary["comparisons"]:
            test = c["test"] + (f" p={c['p_value']:.2g}" if c["p_value"] is not None else "")
            table.add_row(
                str(c["trial"]),
                escape(c["description"]),
                format_ms(c["p99_before_ms"]),
                format_ms(c["p99_after_ms"]),
                f"{c['ratio']:.2f}x",
                corrected_text(c),
                test,
                Text(c["reason"], style="red" if c["regression"] else ""),
            )
        parts.append(table)
    parts += [Text(line, style="red" if line.startswith("Change point") else "") for line in drift_lines(summary)]
    for label in ("before", "after"):
        pick = summary.get(f"pick_{label}")
        text = (
            "none"
            if pick is None
            else (
                f"trial {pick['trial']} {pick['description']}: accuracy {pick['accuracy']:.4f}, "
                f"P99 {format_ms(pick['latency_p99_ms'])} (≤ {format_ms(pick['latency_p99_upper_ms'])})"
            )
        )
        parts.append(Text(f"Pick {label}: {text}"))
    parts.append(
        Text(
            f"{summary.get('trials_run', 0)} new trials; frontier added {summary.get('frontier_added')}, "
            f"removed {summary.get('frontier_removed')}; {summary.get('elapsed_s')} s.",
            style="dim",
        )
    )
    return Group(*parts)


def history_table(rows: list[dict[str, Any]]) -> Table | Text:
    """One row per nightly run, oldest first: the pick's P99 as measured and at the machine's usual speed
    (drift-corrected, beside the reference), with the band that counts as noise."""
    if not rows:
        return Text("No nightly runs of this study yet; run 'pareto nightly'.", style="yellow")
    table = Table(title="Nightly history", title_justify="left")
    columns = ("started (UTC)", "status", "host", "environment", "pick", "pick p99", "p99 ≤", "machine")
    for name in (*columns, "p99 drift-corrected", "noise up to", "new trials", "notes"):
        table.add_column(name, overflow="fold")
    for r in rows:
        pick = r["pick_after"] or r["pick_before"]
        drift, view = r.get("drift") or {}, (r.get("drift") or {}).get("pick") or {}
        notes = [*r["environment_changes"], *(c["reason"] for c in r["regressions"])]
        if r.get("change_point") and r["change_point"]["new"]:
            cp = r["change_point"]
            notes.append(f"change point: {cp['statistic'].upper()} ×{cp['ratio']:.2f} since {cp['since'][:10]}")
        if r["frontier_added"] or r["frontier_removed"]:
            notes.append(f"frontier +{r['frontier_added']} -{r['frontier_removed']}")
        machine = drift.get("reference_ratio")
        table.add_row(
            r["started_at"][:16].replace("T", " "),
            Text(r["status"], style=_NIGHT_COLOURS.get(r["status"], "yellow")),
            r["host"],
            r["environment"],
            str(pick["trial"]) if pick else "—",
            format_ms(pick["latency_p99_ms"]) if pick else "—",
            format_ms(pick["latency_p99_upper_ms"]) if pick else "—",
            f"×{machine:.2f}" if machine is not None else "—",
            _ms_or_dash(view.get("corrected_p99_ms")) + (f" (trial {view['trial']})" if view else ""),
            _ms_or_dash(view.get("band_upper_ms")),
            str(r["trials_run"]),
            escape("; ".join(notes)),
        )
    return table


def _ms_or_dash(value: float | None) -> str:
    return "—" if value is None else format_ms(value)
