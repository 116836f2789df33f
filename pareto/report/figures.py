"""The figures of `pareto report`: each drawn from the loaded ``ReportData`` with matplotlib's Agg
canvas (no display, no pyplot state) and written as a PNG beside the page, or the one sentence
saying why the data cannot support it.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.errors import UsageError
from pareto.metrics import METHOD_SEPARATOR
from pareto.report.data import Ceilings, ReportData, escape, trial_status
from pareto.store.records import NightStatus
from pareto.units import format_ms

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Figure size in inches and the resolution written.
_SIZE = (9.0, 5.0)
_DPI = 160

#: One color per SLO outcome, the same in every figure.
_STATUS = {
    "meets": ("#1b9e77", "meets the SLO"),
    "uncertain": ("#e6a817", "P99 verdict uncertain"),
    "misses": ("#a6a6a6", "misses the SLO"),
    "unjudged": ("#4c72b0", "trial (no SLO set)"),
}
#: How the page counts each outcome: "3 meet the SLO".
_OUTCOME_WORDS = {
    "meets": "meet the SLO",
    "uncertain": "have an uncertain P99 verdict",
    "misses": "miss it",
    "unjudged": "judged against no SLO",
}
_PICK_COLOR = "#d62728"
_BASELINE_COLOR = "#222222"
#: At most this many throughput curves in one figure.
_MAX_CURVES = 6
_QUANTILES = (("latency_p50_ms", 0.5), ("latency_p90_ms", 0.9), ("latency_p99_ms", 0.99), ("latency_p999_ms", 0.999))


@dataclass
class ReportFigure:
    """A figure written to disk, or the sentence saying why it was skipped."""

    key: str
    title: str
    file: str | None = None
    alt: str = ""
    caption: str = ""
    skipped: str | None = None
    width: int = 0
    height: int = 0


#: A figure's key, title and drawing function (alt text and caption back, or ``Skip``).
Drawer = tuple[str, str, "Callable[[ReportData, Figure], tuple[str, str]]"]


def draw_all(data: ReportData, target: Path, first: Sequence[Drawer] | None = None) -> list[ReportFigure]:
    """Draw every figure of the page into ``target``, in the page's order; one the data cannot support is
    returned with the sentence saying why instead of a file. ``first``: the figures that open the page in
    place of the Pareto front against the P99 (a study at a request rate: ``pareto.report.traffic``)."""
    opening: list[Drawer] = (
        list(first) if first else [("pareto", "Pareto front: accuracy against the P99 upper bound", _pareto_figure)]
    )
    drawers: list[Drawer] = [
        *opening,
        ("latency", "Latency distribution of the pick and the baseline", _latency_figure),
        ("roofline", "The roofline", _roofline_figure),
        ("throughput", "Throughput against latency over the batch sweep", _throughput_figure),
        ("compression", "Theoretical compression ratio against measured speedup", _compression_figure),
        ("history", "Nightly history: the pick's P99 measured and with the machine's drift taken out", _history_figure),
    ]
    return [_draw(key, title, draw, data, target) for key, title, draw in drawers]


class Skip(Exception):
    """A figure the data cannot support; the message is the page's one sentence about it."""


def _draw(
    key: str, title: str, draw: Callable[[ReportData, Figure], tuple[str, str]], data: ReportData, target: Path
) -> ReportFigure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not data.rows:
        return ReportFigure(key, title, skipped="Not drawn: the study has no completed trial in this environment.")
    fig = Figure(figsize=_SIZE, layout="constrained")
    FigureCanvasAgg(fig)
    try:
        alt, caption = draw(data, fig)
    except Skip as why:
        return ReportFigure(key, title, skipped=str(why))
    name = f"{key}.png"
    path = target / name
    try:
        fig.savefig(path, dpi=_DPI, facecolor="white")
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {path}: {exc.strerror or exc}.") from exc
    width, height = _png_size(path)
    return ReportFigure(key, title, file=name, alt=alt, caption=caption, width=width, height=height)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels from a PNG's IHDR chunk."""
    with path.open("rb") as f:
        head = f.read(24)
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _values(rows: Sequence[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> Any:
    """A float array of ``get(metrics)`` per row; NaN where missing, not finite or not positive."""
    import numpy as np

    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        value = get(r["metrics"])
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            out[i] = float(value)
    return out


def _scatter_by_status(ax: Axes, rows: Sequence[dict[str, Any]], x: Any, y: Any) -> int:
    """One rasterized scatter per SLO outcome (legend entries with readable markers); returns how many
    points were drawn."""
    import numpy as np

    statuses = np.array([trial_status(r) for r in rows])
    ok = np.isfinite(x) & np.isfinite(y)
    n = int(ok.sum())
    size = 30 if n < 300 else 12 if n < 5000 else 3
    for status, (color, label) in _STATUS.items():
        mask = ok & (statuses == status)
        count = int(mask.sum())
        if count:
            ax.scatter(
                x[mask],
                y[mask],
                s=size,
                c=color,
                alpha=0.85 if n < 5000 else 0.4,
                edgecolors="none",
                rasterized=True,
                zorder=2,
            )
            ax.plot([], [], "o", color=color, markersize=6, label=f"{label} ({count:,})")
    return n


_LABEL_BOX = {"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}


def _mark(ax: Axes, data: ReportData, xy: Callable[[dict[str, Any]], tuple[float | None, float | None]]) -> None:
    """The pick (or the closest) as a star and the baseline as a diamond, each labelled on a white box
    on the side of the point with room for it, the baseline's moved off the pick's. Call it once the
    axes' limits and the legend are final."""
    focus, base = data.focus, data.baseline
    same = focus is not None and base is not None and focus["trial"] == base["trial"]
    engine = ax.figure.get_layout_engine()
    if engine is not None:  # place the labels where the axes will be once the legend has its room
        engine.execute(ax.figure)  # type: ignore[arg-type]
    placed: list[Any] = []
    if focus is not None:
        fx, fy = xy(focus)
        if fx is not None and fy is not None and _positive(fx) and _positive(fy):
            what = "pick" if data.pick else "closest"
            label = f"{what} = baseline (trial {focus['trial']})" if same else f"{what} (trial {focus['trial']})"
            ax.scatter([fx], [fy], marker="*", s=260, c=_PICK_COLOR, edgecolors="white", linewidths=0.8, zorder=5)
            placed.append(_label(ax, label, fx, fy, _PICK_COLOR, below=False, avoid=placed))
    if base is not None and not same:
        bx, by = xy(base)
        if bx is not None and by is not None and _positive(bx) and _positive(by):
            ax.scatter([bx], [by], marker="D", s=70, c="white", edgecolors=_BASELINE_COLOR, linewidths=1.8, zorder=4)
            placed.append(
                _label(ax, f"baseline (trial {base['trial']})", bx, by, _BASELINE_COLOR, below=True, avoid=placed)
            )


def _label(ax: Axes, text: str, x: float, y: float, color: str, *, below: bool, avoid: list[Any]) -> Any:
    """A label beside a point, towards the middle of the axes so that it stays inside them, and moved
    further along until it no longer covers the labels in ``avoid``."""
    ax.get_xlim(), ax.get_ylim()  # settle autoscaling before reading the transform
    fx, fy = ax.transAxes.inverted().transform(ax.transData.transform((x, y)))
    right = fx < 0.6
    down = fy > 0.85 or (below and fy > 0.15)
    dx, dy = (10 if right else -10), (-14 if down else 10)
    note = ax.annotate(
        text,
        (x, y),
        xytext=(dx, dy),
        textcoords="offset points",
        ha="left" if right else "right",
        va="top" if down else "bottom",
        fontsize=9,
        color=color,
        bbox=_LABEL_BOX,
        zorder=6,
    )
    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    for _ in range(6):
        box = note.get_window_extent(renderer)
        if not any(box.overlaps(other.get_window_extent(renderer)) for other in avoid):
            break
        dy += -16 if down else 16
        note.xyann = (dx, dy)
    return note


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _legend(ax: Axes) -> None:
    """The legend outside the axes, on the right: it never hides a point."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)


def _axis_scale(ax: Axes, values: Any, axis: str, unit: str | None = None) -> None:
    """A log axis (ticks at 1, 2 and 5 of each decade up to 3 decades) when the values span more than 8×, else a
    linear one; with ``unit``, tick labels carry SI prefixes (``2 GFLOP/s``)."""
    import numpy as np
    from matplotlib.ticker import EngFormatter, FuncFormatter, LogLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    finite = values[np.isfinite(values) & (values > 0)]
    if finite.size and finite.max() / finite.min() > 8:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        decades = math.log10(finite.max() / finite.min())
        target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
        target.set_minor_formatter(NullFormatter())
        target.set_major_formatter(EngFormatter(unit=unit) if unit else FuncFormatter(lambda v, _: f"{v:g}"))
    elif unit:
        target.set_major_formatter(EngFormatter(unit=unit))


def _slo_lines(ax: Axes, data: ReportData, *, accuracy: bool) -> None:
    c = data.constraints
    if c.p99_ms is not None:
        ax.axvline(c.p99_ms, color=_PICK_COLOR, linestyle="--", linewidth=1.2, label=f"P99 SLO {format_ms(c.p99_ms)}")
    if accuracy and c.min_accuracy is not None:
        ax.axhline(
            c.min_accuracy, color="#7b3294", linestyle="--", linewidth=1.2, label=f"{data.score} ≥ {c.min_accuracy:g}"
        )


def _pareto_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows = data.rows
    x = _values(rows, lambda m: m.get("latency_p99_upper_ms"))
    y = np.array([float(r["metrics"]["accuracy"]) for r in rows])
    if not np.isfinite(x).any():
        raise Skip("Not drawn: no trial has a P99 upper bound (each needs enough timed calls to bound it).")
    ax = fig.add_subplot()
    drawn = _scatter_by_status(ax, rows, x, y)
    front = [r for r in data.front if _positive(r["metrics"].get("latency_p99_upper_ms"))]
    fx = np.array([r["metrics"]["latency_p99_upper_ms"] for r in front])
    fy = np.array([r["metrics"]["accuracy"] for r in front])
    if len(front):
        ax.scatter(fx, fy, s=60, facecolors="none", edgecolors="black", linewidths=1.2, zorder=3, label="frontier")
        if list(data.objectives) == ["accuracy", "p99"]:
            order = np.argsort(fx)
            ax.step(fx[order], fy[order], where="post", color="black", linewidth=1, zorder=3)
    _slo_lines(ax, data, accuracy=True)
    slo = [data.constraints.p99_ms] if data.constraints.p99_ms is not None else []
    _axis_scale(ax, np.append(x, slo), "x")
    ax.set_xlabel(f"P99 upper bound (ms, {_confidence(data)} one-sided)")
    ax.set_ylabel(data.score)
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    _mark(ax, data, lambda r: (r["metrics"].get("latency_p99_upper_ms"), r["metrics"]["accuracy"]))
    missing = len(rows) - drawn
    unbounded = f" {missing:,} trials without a P99 upper bound are not drawn." if missing else ""
    objectives = ", ".join(data.objectives)
    outcomes = Counter(trial_status(r) for r in rows)
    judged = ", ".join(f"{outcomes[k]:,} {_OUTCOME_WORDS[k]}" for k in _STATUS if outcomes[k])
    caption = (
        f"Each point is one trial ({drawn:,} drawn), at its conservative P99 (the upper confidence bound the SLO "
        f"verdict uses): {judged}. Circled: the Pareto frontier over the study's objectives ({escape(objectives)}). "
        f"Dashed lines: the SLO ({escape(data.constraints.describe())}).{unbounded}"
    )
    alt = (
        f"Scatter of accuracy against P99 upper bound for {drawn:,} trials of study {data.study}, "
        f"{len(front)} on the frontier{_focus_words(data)}."
    )
    return alt, caption


def _latency_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    series = _latency_series(data)
    ax = fig.add_subplot()
    xs, medians_shown = _latency_curves(ax, series)
    _latency_axes(ax, data, xs, medians_shown=medians_shown)
    first = series[0][1]["metrics"]
    caption = (
        "The CDF is drawn through the stored percentiles (p50, p90, p99, p99.9), straight between them on this "
        "scale; the raw per-call times are not stored, so nothing between two percentiles is measured. Dotted: "
        "the mean. Shaded at p99: the P99's lower and upper confidence bounds. "
        + ("Ticks at the bottom: the median of each kept round. " if medians_shown else "")
        + f"Method: {escape(_latency_method_short(first))}."
    )
    names = " and ".join(f"{label} (trial {row['trial']})" for label, row, _ in series)
    alt = f"Latency CDF through the stored percentiles of the {names}."
    return alt, caption


def _latency_series(data: ReportData) -> list[tuple[str, dict[str, Any], str]]:
    """The pick (or the closest) and the baseline, each as (label, row, color); one when they are the same trial."""
    series = []
    if data.focus is not None:
        series.append(("pick" if data.pick else "closest", data.focus, _PICK_COLOR))
    if data.baseline is not None and (data.focus is None or data.baseline["trial"] != data.focus["trial"]):
        series.append(("baseline", data.baseline, _BASELINE_COLOR))
    elif series and data.baseline is not None:
        series[0] = (f"{series[0][0]} = baseline", series[0][1], series[0][2])
    if not series:
        raise Skip("Not drawn: there is neither a pick nor a baseline measurement to show.")
    return series


def _latency_curves(ax: Axes, series: list[tuple[str, dict[str, Any], str]]) -> tuple[list[float], bool]:
    """Each series' CDF through its stored percentiles, its P99 bounds, its mean and its round medians (a
    rug at the bottom); returns every latency drawn (for the axis' scale) and whether any medians were."""
    from matplotlib.transforms import blended_transform_factory

    rug = blended_transform_factory(ax.transData, ax.transAxes)
    xs: list[float] = []
    medians_shown = False
    for i, (label, row, color) in enumerate(series):
        m = row["metrics"]
        points = [(m.get(key), q) for key, q in _QUANTILES if _positive(m.get(key))]
        px, py = [p[0] for p in points], [p[1] for p in points]
        xs += px
        ax.plot(px, py, marker="o", color=color, linewidth=1.8, label=f"{label} (trial {row['trial']})", zorder=3)
        lower, upper = m.get("latency_p99_lower_ms"), m.get("latency_p99_upper_ms")
        if _positive(upper):
            lo = lower if _positive(lower) else m["latency_p99_ms"]
            ax.plot([lo, upper], [0.99, 0.99], color=color, linewidth=7, alpha=0.25, solid_capstyle="butt", zorder=2)
            xs += [lo, upper]
        if _positive(m.get("latency_mean_ms")):
            ax.axvline(m["latency_mean_ms"], color=color, linestyle=":", linewidth=1.2, label=f"{label} mean")
            xs.append(m["latency_mean_ms"])
        medians = [v for v in (m.get("round_medians_ms") or []) if _positive(v)]
        if medians:
            medians_shown = True
            ax.plot(medians, [0.03 + 0.05 * i] * len(medians), "|", color=color, markersize=12, transform=rug)
            xs += medians
    return xs, medians_shown


def _latency_axes(ax: Axes, data: ReportData, xs: list[float], *, medians_shown: bool) -> None:
    """The P99 SLO line, the logit quantile axis, the latency axis' scale, and the legend with entries for
    the bounds and the round medians."""
    import numpy as np

    slo = [data.constraints.p99_ms] if data.constraints.p99_ms is not None else []
    if slo:
        _slo_lines(ax, data, accuracy=False)
    ax.set_yscale("logit")
    ax.set_ylim(0.3, 0.9995)
    ax.set_yticks([0.5, 0.9, 0.99, 0.999], labels=["p50", "p90", "p99", "p99.9"])
    ax.minorticks_off()
    _axis_scale(ax, np.array([*xs, *slo]), "x")
    ax.set_xlabel("latency per call (ms)")
    ax.set_ylabel("fraction of calls at or below (logit scale)")
    ax.grid(True, alpha=0.3)
    ax.plot([], [], color="grey", linewidth=7, alpha=0.25, label="P99 lower–upper bound")
    if medians_shown:
        ax.plot([], [], "|", color="grey", markersize=12, label="median of each round")
    _legend(ax)


def _roofline_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows = data.rows
    intensity, achieved = _roofline_points(rows)
    usage = Counter(r["metrics"].get("hardware_profile") for r in rows if r["metrics"].get("hardware_profile"))
    ceilings = data.ceilings.get(usage.most_common(1)[0][0]) if usage else None
    ax = fig.add_subplot()
    drawn = _scatter_by_status(ax, rows, intensity, achieved)
    notes: list[str] = []
    if len(usage) > 1:
        others = sorted(str(name) for name in usage if name != usage.most_common(1)[0][0])
        notes.append(f"The ceilings are those most trials were placed on; other profiles: {', '.join(others)}.")
    roof_x, roof_y = intensity, achieved
    if isinstance(ceilings, Ceilings):
        grid, roof, ceiling_words = _roofs(ax, rows, ceilings, intensity, notes)
        roof_x, roof_y = np.concatenate([intensity, grid]), np.concatenate([achieved, roof])
    else:
        ceiling_words = _no_roof_words(ceilings)
    suspect = sum(1 for r in rows if r["metrics"].get("roofline_suspect"))
    if suspect:
        notes.append(
            f"{suspect:,} trial{'s' if suspect > 1 else ''} ran faster than the roof allows: those ceilings are "
            "wrong for this device, not the model."
        )
    _axis_scale(ax, roof_x, "x")
    _axis_scale(ax, roof_y, "y", "FLOP/s")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("achieved FLOPs per second (FLOPs ÷ measured p50)")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    _mark(ax, data, lambda r: _roofline_point(r["metrics"]))
    caption = (
        f"Each trial ({drawn:,} drawn) at its arithmetic intensity and achieved FLOP/s = FLOPs per batch ÷ its "
        "measured p50. FLOPs count matmul, convolution and attention (2 per multiply-accumulate); bytes are a "
        "lower bound (weights read once, inputs and outputs). " + ceiling_words + " ".join(escape(n) for n in notes)
    )
    alt = f"Roofline: achieved FLOP/s against arithmetic intensity for {drawn:,} trials{_focus_words(data)}."
    return alt, caption


def _roofline_points(rows: Sequence[dict[str, Any]]) -> tuple[Any, Any]:
    """Each trial's arithmetic intensity (FLOP per byte moved) and achieved FLOP/s (FLOPs ÷ its p50), as
    float arrays with NaN where a number is missing."""
    import numpy as np

    flops = _values(rows, lambda m: m.get("flops"))
    moved = _values(rows, lambda m: m.get("bytes_moved"))
    p50 = _values(rows, lambda m: m.get("latency_p50_ms"))
    intensity = flops / moved
    achieved = flops / (p50 / 1e3)
    if not (np.isfinite(intensity) & np.isfinite(achieved)).any():
        raise Skip("Not drawn: no trial stores its FLOPs and bytes moved, which place it on the roofline.")
    return intensity, achieved


def _roofs(
    ax: Axes, rows: Sequence[dict[str, Any]], ceilings: Ceilings, intensity: Any, notes: list[str]
) -> tuple[Any, Any, str]:
    """One roof per dtype the trials were bounded with, over the intensities drawn and the ridges; returns the
    intensity grid, the roofs' values on it (for the axes' scale) and the caption's words on them. Appends
    to ``notes`` why the roofs may not fit."""
    import numpy as np

    dtypes, note = _roof_dtypes(rows, ceilings)
    if note:
        notes.append(note)
    finite = intensity[np.isfinite(intensity)]
    ridges = [ceilings.peak_flops[d] / ceilings.bandwidth for d in dtypes]
    lo, hi = min([*finite, *ridges]) / 4, max([*finite, *ridges]) * 4
    grid = np.geomspace(lo, hi, 200)
    roof = np.full(0, np.nan)
    styles = ["-", "--", "-.", ":"]
    for i, dtype in enumerate(dtypes):
        peak = ceilings.peak_flops[dtype]
        line = np.minimum(peak, ceilings.bandwidth * grid)
        roof = np.concatenate([roof, line])
        ax.plot(
            grid,
            line,
            color="#444444",
            linestyle=styles[i % len(styles)],
            linewidth=1.5,
            label=f"roof, {dtype}: peak {_si(peak)}FLOP/s",
            zorder=1,
        )
    ax.plot([], [], " ", label=f"bandwidth {_si(ceilings.bandwidth)}B/s")
    words = (
        f"Lines: the roof min(peak FLOP/s, bandwidth × intensity) of {escape(ceilings.origin)}, for "
        f"{escape(', '.join(dtypes))} (the dtype{'s' if len(dtypes) > 1 else ''} the trials' stored bounds were "
        "computed with). "
    )
    if ceilings.warning:
        notes.append(f"Note: {ceilings.warning}.")
    return grid, roof, words


def _no_roof_words(ceilings: str | None) -> str:
    """The caption's words when no roof is drawn: why the ceilings could not be loaded, or that the trials
    were placed on none."""
    if isinstance(ceilings, str):
        return f"No ceilings drawn: {escape(ceilings)}. "
    return (
        "No ceilings drawn: the trials were measured without a hardware profile; run 'pareto calibrate' once "
        "(or search with --hardware NAME) to place them on a roof. "
    )


def _roofline_point(m: dict[str, Any]) -> tuple[float | None, float | None]:
    flops, moved, p50 = m.get("flops"), m.get("bytes_moved"), m.get("latency_p50_ms")
    if flops is None or moved is None or p50 is None or not (_positive(flops) and _positive(moved) and _positive(p50)):
        return None, None
    return float(flops) / float(moved), float(flops) / (float(p50) / 1e3)


def _roof_dtypes(rows: Sequence[dict[str, Any]], ceilings: Ceilings) -> tuple[list[str], str | None]:
    """The dtypes whose roof the trials' stored bounds were computed with (a compute-bound bound names
    its peak), fp32 when none does; and a note when no stored bound fits these ceilings."""
    found: Counter[str] = Counter()
    bounded = fits = 0
    for r in rows:
        m = r["metrics"]
        bound, flops, moved = m.get("roofline_bound_ms"), m.get("flops"), m.get("bytes_moved")
        if m.get("hardware_profile") != ceilings.name or not (_positive(bound) and _positive(flops) and moved):
            continue
        bounded += 1
        memory_ms = moved / ceilings.bandwidth * 1e3
        matches = [
            d
            for d, peak in ceilings.peak_flops.items()
            if math.isclose(max(flops / peak * 1e3, memory_ms), bound, rel_tol=1e-6)
        ]
        fits += bool(matches)
        if len(matches) == 1 or (matches and not math.isclose(memory_ms, bound, rel_tol=1e-6)):
            found.update(matches[:1] if len(matches) == 1 else [])
    dtypes = [d for d, _ in found.most_common(3)] or [
        "fp32" if "fp32" in ceilings.peak_flops else max(ceilings.peak_flops, key=ceilings.peak_flops.__getitem__)
    ]
    note = None
    if bounded and not fits:
        note = (
            f"the trials' stored roofline bounds do not fit these ceilings ({ceilings.name} was calibrated again "
            "since they were measured)"
        )
    return dtypes, note


def _throughput_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    import numpy as np

    with_curve = [r for r in data.rows if r["metrics"].get("throughput_curve")]
    if not with_curve:
        raise Skip(
            "No throughput curve was measured in this study: set 'measure: {throughput_sweep: true}' in the search "
            "config (pareto search --config FILE) to time a batch sweep per trial, or run 'pareto measure --sweep' "
            "for one configuration."
        )
    chosen = _throughput_chosen(data, with_curve)
    ax = fig.add_subplot()
    all_x, all_y, unbounded = _throughput_curves(ax, chosen)
    if data.constraints.p99_ms is not None:
        _slo_lines(ax, data, accuracy=False)
        all_x.append(data.constraints.p99_ms)
    _axis_scale(ax, np.array(all_x), "x")
    _axis_scale(ax, np.array(all_y), "y", "/s")
    ax.set_xlabel(f"P99 upper bound per call (ms, {_confidence(data)} one-sided)")
    ax.set_ylabel("throughput (samples per second)")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    others = len(with_curve) - len(chosen)
    caption = (
        "Each line is one configuration timed at each batch size of its sweep: throughput = batch ÷ mean latency "
        "per call, against that batch's P99 upper bound. Labels: the batch size B, on the first line. "
        + (f"{others:,} other trials with a curve are not drawn. " if others > 0 else "")
        + (f"{unbounded:,} sweep points without a P99 upper bound are left out." if unbounded else "")
    )
    alt = f"Throughput against P99 upper bound over the batch sweep for {len(chosen)} configurations."
    return alt, caption


def _throughput_chosen(data: ReportData, with_curve: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """The curves to draw as (label, row, color), at most ``_MAX_CURVES``: the pick (or the closest), the
    baseline, the frontier, and in a small study every trial with a curve."""
    chosen: list[tuple[str, dict[str, Any], str]] = []
    palette = ["#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]

    def add(label: str, row: dict[str, Any] | None, color: str | None = None) -> None:
        if row is None or any(row["trial"] == c[1]["trial"] for c in chosen) or len(chosen) >= _MAX_CURVES:
            return
        if row["metrics"].get("throughput_curve"):
            chosen.append((label, row, color or palette[len(chosen) % len(palette)]))

    same = data.focus is not None and data.baseline is not None and data.focus["trial"] == data.baseline["trial"]
    add(("pick" if data.pick else "closest") + (" = baseline" if same else ""), data.focus, _PICK_COLOR)
    add("baseline", data.baseline, _BASELINE_COLOR)
    for r in data.front:
        add("frontier", r)
    for r in with_curve:  # a small study: every curve
        if len(with_curve) <= _MAX_CURVES:
            add("", r)
    return chosen


def _throughput_curves(ax: Axes, chosen: list[tuple[str, dict[str, Any], str]]) -> tuple[list[float], list[float], int]:
    """Each chosen trial's sweep as a line of (P99 upper bound, throughput), the first one's points labelled
    with their batch sizes; returns the x and y values drawn and how many points lacked a bound."""
    unbounded = 0
    all_x: list[float] = []
    all_y: list[float] = []
    for i, (label, row, color) in enumerate(chosen):
        points = row["metrics"]["throughput_curve"]
        usable = [p for p in points if _positive(p.get("p99_upper_ms")) and _positive(p.get("throughput_per_s"))]
        unbounded += len(points) - len(usable)
        px = [float(p["p99_upper_ms"]) for p in usable]
        py = [float(p["throughput_per_s"]) for p in usable]
        all_x += px
        all_y += py
        name = f"{label} (trial {row['trial']})" if label else f"trial {row['trial']}"
        ax.plot(px, py, marker="o", color=color, linewidth=1.6, label=name, zorder=3)
        if i == 0:
            for p, x, y in zip(usable, px, py, strict=True):
                ax.annotate(
                    f"B={p['batch']}", (x, y), xytext=(6, -4), textcoords="offset points", fontsize=8, color=color
                )
    return all_x, all_y, unbounded


def _compression_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows = data.rows
    x = _values(rows, lambda m: m.get("compression_ratio"))
    y = _values(rows, lambda m: m.get("speedup_p99"))
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        raise Skip("Not drawn: no trial has a speedup (it needs the baseline timed in the same environment).")
    ax = fig.add_subplot()
    drawn = _scatter_by_status(ax, rows, x, y)
    both = np.concatenate([x[ok], y[ok]])
    lo, hi = float(both.min()) / 1.4, float(both.max()) * 1.4
    ax.plot([lo, hi], [lo, hi], color="#444444", linestyle="--", linewidth=1.2, label="speedup = compression", zorder=1)
    ax.axhline(1.0, color="#888888", linestyle=":", linewidth=1, label="no speedup", zorder=1)
    _axis_scale(ax, both, "x")
    _axis_scale(ax, both, "y")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("theoretical compression ratio (baseline's ideal bytes ÷ this one's)")
    ax.set_ylabel("measured P99 speedup over the baseline")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    _mark(ax, data, lambda r: (r["metrics"].get("compression_ratio"), r["metrics"].get("speedup_p99")))
    below = int((y[ok] < x[ok]).sum())
    caption = (
        f"One point per trial ({drawn:,} drawn). Below the dashed line a configuration is smaller in theory than it "
        f"is faster in practice: {below:,} of {drawn:,} are. Speedup: the baseline's P99 ÷ this trial's, both timed "
        "in the same run at the same batch size."
    )
    alt = f"Log-log scatter of measured P99 speedup against theoretical compression ratio for {drawn:,} trials."
    return alt, caption


def _history_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    nights = [r for r in data.nightly if (r.get("drift") or {}).get("pick")]
    if not nights:
        raise Skip(
            "No nightly run has measured this study's pick beside the reference workload in this environment "
            "yet: run 'pareto nightly' (configs/nightly.yaml) to start its history."
        )
    import numpy as np

    views = [r["drift"]["pick"] for r in nights]
    xs = np.arange(1, len(nights) + 1)

    def series(key: str) -> Any:
        return np.array([np.nan if v.get(key) is None else v[key] for v in views], dtype=float)

    ax = fig.add_subplot()
    ax.fill_between(xs, series("level_ms"), series("band_upper_ms"), color=_STATUS["meets"][0], alpha=0.18,
                    label="noise band: the level up to the band's top", step="mid")  # fmt: skip
    ax.plot(xs, series("level_ms"), color=_STATUS["meets"][0], linewidth=1, drawstyle="steps-mid")
    ax.plot(xs, series("p99_ms"), "o", color=_STATUS["misses"][0], label="P99 as measured")
    ax.plot(xs, series("corrected_p99_ms"), "o-", color=_PICK_COLOR, label="P99 at the machine's usual speed")
    bad = [i for i, r in enumerate(nights) if r["status"] == NightStatus.REGRESSION]
    if bad:
        ax.plot(xs[bad], series("corrected_p99_ms")[bad], "x", color=_BASELINE_COLOR, markersize=11, label="regression")
    for i, r in enumerate(nights):
        if (r.get("change_point") or {}).get("new"):
            since = r["change_point"]["since"]
            start = next((k for k, n in enumerate(nights) if n["started_at"] >= since), i)
            ax.axvline(xs[start] - 0.5, color=_BASELINE_COLOR, linestyle="--", linewidth=1, label="change point")
    ax.set_xlabel("night (oldest first)")
    ax.set_ylabel("pick's P99 (ms)")
    ax.set_xlim(0.5, len(nights) + 0.5)
    _legend(ax)
    trials = sorted({v["trial"] for v in views})
    alt = (
        f"The pick's P99 over {len(nights)} nights: measured {np.nanmin(series('p99_ms')):.3g} to "
        f"{np.nanmax(series('p99_ms')):.3g} ms, drift-corrected {np.nanmin(series('corrected_p99_ms')):.3g} to "
        f"{np.nanmax(series('corrected_p99_ms')):.3g} ms; {len(bad)} nights called a regression."
    )
    caption = (
        "Each night the pick, the baseline and a frozen reference model are timed in the same interleaved "
        "rounds. The drift-corrected P99 is the pick's P99 over the reference's, times the reference's usual "
        "P99: what the pick would have measured on the machine at its usual speed. The band runs from the "
        "pick's level (the median of its last 7 nights) to the top of the noise band learned from the study's "
        "history; a night above it (and above the P50's band, not drawn) is slower when a second pass agrees. "
        f"Dashed: a change point (e-divisive means). The pick of each night: trial{'s' if len(trials) > 1 else ''} "
        f"{', '.join(map(str, trials))}."
    )
    return alt, caption


def _si(value: float) -> str:
    """``80.5 G`` for 8.05e10: three significant digits and an SI prefix, ready for a unit."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


def _confidence(data: ReportData) -> str:
    focus = data.focus or (data.rows[0] if data.rows else None)
    return f"{focus['metrics']['confidence']:.3g}" if focus else "0.99"


def _focus_words(data: ReportData) -> str:
    if data.focus is None:
        return ""
    return f"; the {'pick' if data.pick else 'closest configuration'} is trial {data.focus['trial']}"


def _latency_method_short(m: dict[str, Any]) -> str:
    return str(m.get("method") or "—").partition(METHOD_SEPARATOR)[0]
