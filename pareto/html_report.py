"""`pareto report`: one study as a self-contained HTML page with PNG figures beside it.

The page reads the database only (``pareto.api``'s ``trials``, ``frontier``, ``best`` and ``studies``,
plus the host's calibration for the roofline ceilings) and changes nothing in it. Figures are drawn
with matplotlib's Agg canvas (no display, no pyplot state); the page needs no script, stylesheet or
font from anywhere else.
"""

from __future__ import annotations

import html
import math
import os
import shlex
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pareto.errors import NoFeasibleConfiguration, ParetoError, UsageError
from pareto.frontier import DEFAULT_OBJECTIVE_NAMES, Constraints, evaluate
from pareto.metrics import METHOD_SEPARATOR
from pareto.naming import describe_config
from pareto.units import format_bytes, format_ms

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: What to install when matplotlib is missing.
INSTALL_HINT = "pip install 'pareto-slo[report]'"
#: The file the page is written to inside the output folder.
INDEX = "index.html"

#: Figure size in inches and the resolution written; the page shows each PNG at ``1 / _ZOOM`` its pixels.
_SIZE = (9.0, 5.0)
_DPI = 160
_ZOOM = 1.6

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
class _Figure:
    """A figure written to disk, or the sentence saying why it was skipped."""

    key: str
    title: str
    file: str | None = None
    alt: str = ""
    caption: str = ""
    skipped: str | None = None
    width: int = 0
    height: int = 0


@dataclass
class _Ceilings:
    """A roofline profile's ceilings as the report draws them."""

    name: str
    peak_flops: dict[str, float]
    bandwidth: float
    origin: str  #: where the numbers come from, for the caption
    warning: str | None = None


@dataclass
class _Data:
    """Everything the page shows, loaded once."""

    study: str
    task: str
    objectives: list[str]
    rows: list[dict[str, Any]]
    front: list[dict[str, Any]]
    constraints: Constraints
    pick: dict[str, Any] | None
    no_pick: str | None
    closest: dict[str, Any] | None
    baseline: dict[str, Any] | None
    environment: dict[str, Any] | None
    ceilings: dict[str, _Ceilings | str] = field(default_factory=dict)

    @property
    def focus(self) -> dict[str, Any] | None:
        """The configuration the page is about: the pick, else the closest one."""
        return self.pick or self.closest


def write_report(
    out_dir: str | os.PathLike[str],
    *,
    study: str | None = None,
    slo_p99: str | float | None = None,
    min_accuracy: float | None = None,
    max_memory: str | int | None = None,
    environment: str | None = None,
    force: bool = False,
    db: str | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/index.html`` and its PNG figures for one study in one environment.

    Args:
        out_dir: The folder to write; created when missing. An existing folder must be empty unless ``force``.
        study: Study name; may be omitted when the database holds one study.
        slo_p99, min_accuracy, max_memory: SLOs to judge by; default: the study's own.
        environment: ``latest`` (default) or an environment key; not ``all``.
        force: Write into a folder that already holds files (same-named files are replaced).
        db: Database URL; defaults to ``PARETO_DB_URL`` or ``sqlite:///pareto.db``.

    Returns:
        ``{"index", "figures", "skipped", "study", "trials", "frontier", "pick", "note"}``: the page's
        path, the figures' paths, ``{figure: why}`` for each one left out, the trial counts, the
        pick's trial number (None when nothing meets the SLOs) and the environment note, if any.

    Raises:
        ParetoError: matplotlib is not installed.
        UsageError: the folder is not empty (without ``force``) or cannot be written; bad SLOs;
            ``environment="all"``.
        NotFound: no such study.
    """
    _require_matplotlib()
    target = Path(out_dir).expanduser().absolute()
    _check_target(target, force=force)
    data = _load(study, slo_p99, min_accuracy, max_memory, environment, db)
    _make_dir(target)
    figures = _draw_all(data, target)
    page = _page(data, figures)
    index = target / INDEX
    try:
        index.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {index}: {exc.strerror or exc}.") from exc
    return {
        "index": str(index),
        "figures": [str(target / f.file) for f in figures if f.file],
        "skipped": {f.key: f.skipped for f in figures if f.skipped},
        "study": data.study,
        "trials": len(data.rows),
        "frontier": len(data.front),
        "pick": data.pick["trial"] if data.pick else None,
        "note": (data.environment or {}).get("note"),
    }


# --- input checks ----------------------------------------------------------------------------------


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ParetoError(
            f"The HTML report draws its figures with matplotlib, which is missing: {INSTALL_HINT}"
        ) from exc


def _check_target(target: Path, *, force: bool) -> None:
    """Refuse a non-empty folder (without ``force``) or a path that cannot become a folder, creating nothing."""
    if target.exists():
        if not target.is_dir():
            raise UsageError(f"Cannot write the report to {target}: it is a file, not a folder.")
        if not force and any(target.iterdir()):
            raise UsageError(f"Folder {target} is not empty; choose another -o or pass --force to write into it.")
        if not os.access(target, os.W_OK | os.X_OK):
            raise UsageError(f"Cannot write the report to {target}: the folder is not writable.")
        return
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"Cannot write the report to {target}: {parent} is a file, not a folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"Cannot write the report to {target}: folder {parent} is not writable.")


def _make_dir(target: Path) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {target}: {exc.strerror or exc}.") from exc


# --- data ------------------------------------------------------------------------------------------


def _load(
    study: str | None,
    slo_p99: str | float | None,
    min_accuracy: float | None,
    max_memory: str | int | None,
    environment: str | None,
    db: str | None,
) -> _Data:
    from pareto import api

    if environment == "all":
        raise UsageError("A report compares measurements within one environment; name one with --environment KEY.")
    rows = api.trials(
        study=study,
        slo_p99=slo_p99,
        min_accuracy=min_accuracy,
        max_memory=max_memory,
        environment=environment,
        db=db,
    )
    summaries = api.studies(db=db)
    name = rows[0]["study"] if rows else study
    summary = next((s for s in summaries if s["study"] == name), summaries[0] if len(summaries) == 1 else {})
    name = summary.get("study", name or "?")
    constraints = _constraints(rows, summary, slo_p99, min_accuracy, max_memory)
    # the same study and environment as the trials: the frontier and the pick `pareto frontier` and `best` give
    asked: dict[str, Any] = {
        "study": name,
        "environment": environment,
        "db": db,
        "slo_p99": slo_p99,
        "min_accuracy": min_accuracy,
        "max_memory": max_memory,
    }
    by_trial = {r["trial"]: r for r in rows}
    front = [by_trial.get(r["trial"], r) for r in api.frontier(**asked)] if rows else []
    pick, no_pick, closest = None, None, None
    try:
        chosen = api.best(**asked)
        pick = by_trial.get(chosen["trial"], chosen)
    except NoFeasibleConfiguration as exc:
        no_pick = str(exc)
        if rows:  # the one the message names: the lowest distance, then the lowest trial number
            closest = by_trial[min((evaluate(r["metrics"], constraints).distance, r["trial"]) for r in rows)[1]]
    data = _Data(
        study=name,
        task=str(summary.get("task", "?")),
        objectives=list(summary.get("objectives") or DEFAULT_OBJECTIVE_NAMES),
        rows=rows,
        front=front,
        constraints=constraints,
        pick=pick,
        no_pick=no_pick,
        closest=closest,
        baseline=_baseline(rows, pick or closest),
        environment=rows[0]["environment"] if rows else None,
    )
    data.ceilings = _ceilings(rows, db)
    return data


def _constraints(
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    slo_p99: str | float | None,
    min_accuracy: float | None,
    max_memory: str | int | None,
) -> Constraints:
    """The constraints each trial was judged by (the same on every row); with no trial, the arguments
    and the study's stored SLO."""
    if rows:
        slo = rows[0]["slo"]
        return Constraints(
            p99_ms=slo.get("p99_ms"),
            min_accuracy=slo.get("min_accuracy"),
            max_memory_bytes=slo.get("max_memory_bytes"),
            min_throughput_per_s=slo.get("min_throughput_per_s"),
        )
    from pareto.units import parse_duration_ms, parse_size_bytes

    stored = summary.get("slo") or {}
    p99 = parse_duration_ms(slo_p99) if isinstance(slo_p99, str) else slo_p99
    memory = parse_size_bytes(max_memory) if isinstance(max_memory, str) else max_memory
    return Constraints(
        p99_ms=p99 if p99 is not None else stored.get("p99"),
        min_accuracy=min_accuracy if min_accuracy is not None else stored.get("min_accuracy"),
        max_memory_bytes=memory,
        min_throughput_per_s=stored.get("min_throughput"),
    )


def _is_baseline(row: dict[str, Any]) -> bool:
    config = row.get("config") or {}
    return not config.get("techniques") and config.get("backend", "eager") == "eager"


def _baseline(rows: list[dict[str, Any]], focus: dict[str, Any] | None) -> dict[str, Any] | None:
    """The uncompressed model at the focus's batch size (what its speedup divides by), else the first one."""
    bases = [r for r in rows if _is_baseline(r)]
    if focus is not None:
        same = [r for r in bases if r["metrics"]["batch_size"] == focus["metrics"]["batch_size"]]
        bases = same or bases
    return bases[0] if bases else None


def _ceilings(rows: list[dict[str, Any]], db: str | None) -> dict[str, _Ceilings | str]:
    """Each roofline profile the trials were placed on: its ceilings, or why they cannot be drawn."""
    from pareto.measure.roofline import load_profile

    names = {r["metrics"].get("hardware_profile") for r in rows} - {None}
    result: dict[str, _Ceilings | str] = {}
    for name in sorted(str(n) for n in names):
        if name.startswith("host-"):
            result[name] = _host_ceilings(name, rows[0]["environment"], db)
            continue
        try:
            profile = load_profile(name)
        except UsageError as exc:
            result[name] = str(exc)
            continue
        result[name] = _Ceilings(
            name=profile.name,
            peak_flops=dict(profile.peak_flops),
            bandwidth=profile.memory_bandwidth_bytes_per_s,
            origin=f"datasheet profile {profile.name} ({profile.description})",
        )
    return result


def _host_ceilings(name: str, env: dict[str, Any], db: str | None) -> _Ceilings | str:
    """The latest `pareto calibrate` of this environment (else of the same device, host and torch),
    read without writing."""
    from sqlalchemy import select

    from pareto.store.engine import open_engine, resolve_url
    from pareto.store.models import Environment, HardwareCalibration

    engine = open_engine(resolve_url(db), create=False)
    columns = (
        HardwareCalibration.peak_flops,
        HardwareCalibration.memory_bandwidth_bytes_per_s,
        HardwareCalibration.suspect_reason,
        HardwareCalibration.created_at,
        Environment.hostname,
    )
    newest = (HardwareCalibration.created_at.desc(), HardwareCalibration.id.desc())
    try:
        with engine.connect() as conn:
            query = select(*columns).join(Environment, HardwareCalibration.environment_id == Environment.id)
            row = conn.execute(query.where(Environment.key == env["key"]).order_by(*newest).limit(1)).first()
            if row is None:
                same_device = query.where(
                    Environment.hostname == env["hostname"],
                    Environment.device == env["device"],
                    Environment.device_name == env["device_name"],
                    Environment.torch_version == env["torch_version"],
                )
                row = conn.execute(same_device.order_by(*newest).limit(1)).first()
    finally:
        engine.dispose()
    if row is None:
        return f"profile {name} is a calibration of {env['hostname']}, and none is stored any more"
    peaks, bandwidth, suspect, created, hostname = row
    when = created.strftime("%Y-%m-%d %H:%M") if created else "?"
    return _Ceilings(
        name=name,
        peak_flops={str(k): float(v) for k, v in dict(peaks).items()},
        bandwidth=float(bandwidth),
        origin=f"host {hostname}'s calibration ({when} UTC; 'pareto calibrate' keeps the best of several matmul and "
        "copy sizes)",
        warning=f"that calibration is marked suspect: {suspect}" if suspect else None,
    )


# --- figures ---------------------------------------------------------------------------------------


def _draw_all(data: _Data, target: Path) -> list[_Figure]:
    drawers: list[tuple[str, str, Callable[[_Data, Figure], tuple[str, str]]]] = [
        ("pareto", "Pareto front: accuracy against the P99 upper bound", _pareto_figure),
        ("latency", "Latency distribution of the pick and the baseline", _latency_figure),
        ("roofline", "The roofline", _roofline_figure),
        ("throughput", "Throughput against latency over the batch sweep", _throughput_figure),
        ("compression", "Theoretical compression ratio against measured speedup", _compression_figure),
    ]
    return [_draw(key, title, draw, data, target) for key, title, draw in drawers]


class _Skip(Exception):
    """A figure the data cannot support; the message is the page's one sentence about it."""


def _draw(key: str, title: str, draw: Callable[[_Data, Figure], tuple[str, str]], data: _Data, target: Path) -> _Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not data.rows:
        return _Figure(key, title, skipped="Not drawn: the study has no completed trial in this environment.")
    fig = Figure(figsize=_SIZE, layout="constrained")
    FigureCanvasAgg(fig)
    try:
        alt, caption = draw(data, fig)
    except _Skip as why:
        return _Figure(key, title, skipped=str(why))
    name = f"{key}.png"
    path = target / name
    try:
        fig.savefig(path, dpi=_DPI, facecolor="white")
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {path}: {exc.strerror or exc}.") from exc
    width, height = _png_size(path)
    return _Figure(key, title, file=name, alt=alt, caption=caption, width=width, height=height)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels from a PNG's IHDR chunk."""
    with path.open("rb") as f:
        head = f.read(24)
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _status(row: dict[str, Any]) -> str:
    slo = row.get("slo") or {}
    feasible = slo.get("feasible")
    if feasible is None:
        return "unjudged"
    if feasible:
        return "meets"
    return "uncertain" if slo.get("undecided_only") else "misses"


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

    statuses = np.array([_status(r) for r in rows])
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


def _mark(ax: Axes, data: _Data, xy: Callable[[dict[str, Any]], tuple[float | None, float | None]]) -> None:
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


def _slo_lines(ax: Axes, data: _Data, *, accuracy: bool) -> None:
    c = data.constraints
    if c.p99_ms is not None:
        ax.axvline(c.p99_ms, color=_PICK_COLOR, linestyle="--", linewidth=1.2, label=f"P99 SLO {format_ms(c.p99_ms)}")
    if accuracy and c.min_accuracy is not None:
        ax.axhline(
            c.min_accuracy, color="#7b3294", linestyle="--", linewidth=1.2, label=f"accuracy ≥ {c.min_accuracy:g}"
        )


def _pareto_figure(data: _Data, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows = data.rows
    x = _values(rows, lambda m: m.get("latency_p99_upper_ms"))
    y = np.array([float(r["metrics"]["accuracy"]) for r in rows])
    if not np.isfinite(x).any():
        raise _Skip("Not drawn: no trial has a P99 upper bound (each needs enough timed calls to bound it).")
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
    ax.set_ylabel("accuracy")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    _mark(ax, data, lambda r: (r["metrics"].get("latency_p99_upper_ms"), r["metrics"]["accuracy"]))
    missing = len(rows) - drawn
    unbounded = f" {missing:,} trials without a P99 upper bound are not drawn." if missing else ""
    objectives = ", ".join(data.objectives)
    outcomes = Counter(_status(r) for r in rows)
    judged = ", ".join(f"{outcomes[k]:,} {_OUTCOME_WORDS[k]}" for k in _STATUS if outcomes[k])
    caption = (
        f"Each point is one trial ({drawn:,} drawn), at its conservative P99 (the upper confidence bound the SLO "
        f"verdict uses): {judged}. Circled: the Pareto frontier over the study's objectives ({_e(objectives)}). "
        f"Dashed lines: the SLO ({_e(data.constraints.describe())}).{unbounded}"
    )
    alt = (
        f"Scatter of accuracy against P99 upper bound for {drawn:,} trials of study {data.study}, "
        f"{len(front)} on the frontier{_focus_words(data)}."
    )
    return alt, caption


def _latency_figure(data: _Data, fig: Figure) -> tuple[str, str]:
    import numpy as np
    from matplotlib.transforms import blended_transform_factory

    series = []
    if data.focus is not None:
        series.append(("pick" if data.pick else "closest", data.focus, _PICK_COLOR))
    if data.baseline is not None and (data.focus is None or data.baseline["trial"] != data.focus["trial"]):
        series.append(("baseline", data.baseline, _BASELINE_COLOR))
    elif series and data.baseline is not None:
        series[0] = (f"{series[0][0]} = baseline", series[0][1], series[0][2])
    if not series:
        raise _Skip("Not drawn: there is neither a pick nor a baseline measurement to show.")
    ax = fig.add_subplot()
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
    if data.constraints.p99_ms is not None:
        _slo_lines(ax, data, accuracy=False)
        xs.append(data.constraints.p99_ms)
    ax.set_yscale("logit")
    ax.set_ylim(0.3, 0.9995)
    ax.set_yticks([0.5, 0.9, 0.99, 0.999], labels=["p50", "p90", "p99", "p99.9"])
    ax.minorticks_off()
    _axis_scale(ax, np.array(xs), "x")
    ax.set_xlabel("latency per call (ms)")
    ax.set_ylabel("fraction of calls at or below (logit scale)")
    ax.grid(True, alpha=0.3)
    ax.plot([], [], color="grey", linewidth=7, alpha=0.25, label="P99 lower–upper bound")
    if medians_shown:
        ax.plot([], [], "|", color="grey", markersize=12, label="median of each round")
    _legend(ax)
    first = series[0][1]["metrics"]
    caption = (
        "The CDF is drawn through the stored percentiles (p50, p90, p99, p99.9), straight between them on this "
        "scale; the raw per-call times are not stored, so nothing between two percentiles is measured. Dotted: "
        "the mean. Shaded at p99: the P99's lower and upper confidence bounds. "
        + ("Ticks at the bottom: the median of each kept round. " if medians_shown else "")
        + f"Method: {_e(_latency_method_short(first))}."
    )
    names = " and ".join(f"{label} (trial {row['trial']})" for label, row, _ in series)
    alt = f"Latency CDF through the stored percentiles of the {names}."
    return alt, caption


def _roofline_figure(data: _Data, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows = data.rows
    flops = _values(rows, lambda m: m.get("flops"))
    moved = _values(rows, lambda m: m.get("bytes_moved"))
    p50 = _values(rows, lambda m: m.get("latency_p50_ms"))
    intensity = flops / moved
    achieved = flops / (p50 / 1e3)
    if not (np.isfinite(intensity) & np.isfinite(achieved)).any():
        raise _Skip("Not drawn: no trial stores its FLOPs and bytes moved, which place it on the roofline.")
    usage = Counter(r["metrics"].get("hardware_profile") for r in rows if r["metrics"].get("hardware_profile"))
    ceilings = data.ceilings.get(usage.most_common(1)[0][0]) if usage else None
    ax = fig.add_subplot()
    drawn = _scatter_by_status(ax, rows, intensity, achieved)
    notes: list[str] = []
    if len(usage) > 1:
        others = sorted(str(name) for name in usage if name != usage.most_common(1)[0][0])
        notes.append(f"The ceilings are those most trials were placed on; other profiles: {', '.join(others)}.")
    if isinstance(ceilings, _Ceilings):
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
        ceiling_words = (
            f"Lines: the roof min(peak FLOP/s, bandwidth × intensity) of {_e(ceilings.origin)}, for "
            f"{_e(', '.join(dtypes))} (the dtype{'s' if len(dtypes) > 1 else ''} the trials' stored bounds were "
            "computed with). "
        )
        if ceilings.warning:
            notes.append(f"Note: {ceilings.warning}.")
    elif isinstance(ceilings, str):
        ceiling_words = f"No ceilings drawn: {_e(ceilings)}. "
    else:
        ceiling_words = (
            "No ceilings drawn: the trials were measured without a hardware profile; run 'pareto calibrate' once "
            "(or search with --hardware NAME) to place them on a roof. "
        )
    suspect = sum(1 for r in rows if r["metrics"].get("roofline_suspect"))
    if suspect:
        notes.append(
            f"{suspect:,} trial{'s' if suspect > 1 else ''} ran faster than the roof allows: those ceilings are "
            "wrong for this device, not the model."
        )
    roof_x = np.concatenate([intensity, grid]) if isinstance(ceilings, _Ceilings) else intensity
    roof_y = np.concatenate([achieved, roof]) if isinstance(ceilings, _Ceilings) else achieved
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
        "lower bound (weights read once, inputs and outputs). " + ceiling_words + " ".join(_e(n) for n in notes)
    )
    alt = f"Roofline: achieved FLOP/s against arithmetic intensity for {drawn:,} trials{_focus_words(data)}."
    return alt, caption


def _roofline_point(m: dict[str, Any]) -> tuple[float | None, float | None]:
    flops, moved, p50 = m.get("flops"), m.get("bytes_moved"), m.get("latency_p50_ms")
    if flops is None or moved is None or p50 is None or not (_positive(flops) and _positive(moved) and _positive(p50)):
        return None, None
    return float(flops) / float(moved), float(flops) / (float(p50) / 1e3)


def _roof_dtypes(rows: Sequence[dict[str, Any]], ceilings: _Ceilings) -> tuple[list[str], str | None]:
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


def _throughput_figure(data: _Data, fig: Figure) -> tuple[str, str]:
    import numpy as np

    with_curve = [r for r in data.rows if r["metrics"].get("throughput_curve")]
    if not with_curve:
        raise _Skip(
            "No throughput curve was measured in this study: set 'measure: {throughput_sweep: true}' in the search "
            "config (pareto search --config FILE) to time a batch sweep per trial, or run 'pareto measure --sweep' "
            "for one configuration."
        )
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
    ax = fig.add_subplot()
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


def _compression_figure(data: _Data, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows = data.rows
    x = _values(rows, lambda m: m.get("compression_ratio"))
    y = _values(rows, lambda m: m.get("speedup_p99"))
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        raise _Skip("Not drawn: no trial has a speedup (it needs the baseline timed in the same environment).")
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


def _si(value: float) -> str:
    """``80.5 G`` for 8.05e10: three significant digits and an SI prefix, ready for a unit."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


def _confidence(data: _Data) -> str:
    focus = data.focus or (data.rows[0] if data.rows else None)
    return f"{focus['metrics']['confidence']:.3g}" if focus else "0.99"


def _focus_words(data: _Data) -> str:
    if data.focus is None:
        return ""
    return f"; the {'pick' if data.pick else 'closest configuration'} is trial {data.focus['trial']}"


def _latency_method_short(m: dict[str, Any]) -> str:
    return str(m.get("method") or "—").partition(METHOD_SEPARATOR)[0]


# --- the page --------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


_CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d1d1f;
max-width:1180px;margin:0 auto;padding:24px;background:#fff}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin:0 0 16px}.grid{display:grid;grid-template-columns:1fr 1fr;gap:20px}
@media (max-width:900px){.grid{grid-template-columns:1fr}}
.card{border:1px solid #ddd;border-radius:6px;padding:12px 16px}.card h3{margin:0 0 8px;font-size:16px}
.pick{border-color:#1b9e77}.nopick{border-color:#d62728}
table{border-collapse:collapse;width:100%}th,td{text-align:left;vertical-align:top;padding:3px 8px}
.kv th{white-space:nowrap;color:#444;font-weight:600;width:1%}
.front th{background:#f3f3f3;border-bottom:1px solid #ccc;white-space:nowrap}.front td{border-bottom:1px solid #eee}
.front td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.front tr.picked td{background:#fdecec;font-weight:600}
.meets{color:#137a5c}.misses{color:#8a8a8a}.uncertain{color:#a87800}.warn{color:#a33}
figure{margin:12px 0 24px}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#444;font-size:14px;margin-top:6px}.skipped{color:#555;font-style:italic}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
.method li{margin-bottom:4px}footer{color:#777;font-size:13px;margin-top:32px}
"""

#: Counts the images that loaded once the page has: a check for tests and people, not needed to read it.
_IMAGES_LOADED_SCRIPT = (
    "<script>window.addEventListener('load',function(){var a=document.images,n=0;"
    "for(var i=0;i<a.length;i++){if(a[i].complete&&a[i].naturalWidth>0)n++;}"
    "document.body.setAttribute('data-images-loaded',n+'/'+a.length);});</script>"
)


def _page(data: _Data, figures: list[_Figure]) -> str:
    env = data.environment or {}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>pareto report: study {_e(data.study)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Study {_e(data.study)}</h1>",
        f'<p class="sub">task {_e(data.task)} · {len(data.rows):,} completed trials in this environment · '
        f"{len(data.front):,} on the frontier · written {_e(_now())} UTC by pareto {_e(_version())}</p>",
    ]
    if env.get("note"):
        parts.append(f'<p class="warn">{_e(env["note"])}</p>')
    parts.append('<div class="grid">')
    parts.append(_study_card(data))
    parts.append(_pick_card(data))
    parts.append("</div>")
    parts.append(_method_section(data))
    for f in figures:
        parts.append(f'<section id="{_e(f.key)}"><h2>{_e(f.title)}</h2>')
        if f.file:
            w, h = round(f.width / _ZOOM), round(f.height / _ZOOM)
            parts.append(
                f'<figure><img src="{_e(f.file)}" alt="{_e(f.alt)}" width="{w}" height="{h}">'
                f"<figcaption>{f.caption}</figcaption></figure>"
            )
        else:
            parts.append(f'<p class="skipped">{_e(f.skipped)}</p>')
        parts.append("</section>")
    parts.append(_frontier_table(data))
    parts.append(
        "<footer>Read from the database without changing it. Every latency is measured with the method above; "
        "P99 bounds are one-sided confidence bounds that cover the spread between rounds. Regenerate with "
        f"<code>pareto report --study {_e(shlex.quote(data.study))} -o DIR --force</code>.</footer>"
    )
    parts.append(_IMAGES_LOADED_SCRIPT)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column table; values are HTML already escaped by the caller."""
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _study_card(data: _Data) -> str:
    env = data.environment or {}
    device = env.get("device", "—")
    if env.get("device_name") and env.get("device_name") != env.get("cpu_model"):
        device = f"{device} ({env['device_name']})"
    rows = [
        ("study", _e(data.study)),
        ("task", _e(data.task)),
        ("objectives", _e(", ".join(data.objectives))),
        ("SLO", _e(data.constraints.describe())),
        ("device", _e(device)),
        ("CPU", _e(env.get("cpu_model", "—"))),
        ("threads", _e(env.get("threads", "—"))),
        ("torch", _e(env.get("torch_version", "—"))),
    ]
    if env.get("driver"):
        rows.append(("driver", _e(env["driver"])))
    rows.append(("host", _e(env.get("hostname", "—"))))
    rows.append(("environment", f"<code>{_e(env.get('key', '—'))}</code>"))
    return f'<div class="card"><h3>Study and environment</h3>{_kv(rows)}</div>'


def _pick_card(data: _Data) -> str:
    focus = data.focus
    if data.pick is None:
        head = f'<p class="warn">{_e(data.no_pick or "No configuration meets the SLOs.")}</p>'
        if focus is None:
            return f'<div class="card nopick"><h3>No pick</h3>{head}</div>'
        title, css = f"No pick; the closest is trial {focus['trial']}", "nopick"
    else:
        head, title, css = "", f"The pick: trial {focus['trial'] if focus else '?'}", "pick"
    assert focus is not None
    m, slo = focus["metrics"], focus.get("slo") or {}
    delta = m.get("accuracy_delta")
    accuracy = f"{m['accuracy']:.4f}" + ("" if delta is None else f" ({delta:+.4f} vs the baseline)")
    p99 = (
        f"{_e(format_ms(m['latency_p99_ms']))}; bounds {_e(format_ms(m.get('latency_p99_lower_ms')))} – "
        f"<b>{_e(format_ms(m.get('latency_p99_upper_ms')))}</b>, each {m['confidence']:.3g} one-sided, "
        f"{m.get('rounds') or 1} rounds"
    )
    verdict = slo.get("p99_verdict")
    rows = [
        ("configuration", _e(_describe(focus))),
        ("accuracy", _e(accuracy)),
        ("P99 and bound", p99),
        (
            "p50 / p90 / p99.9",
            _e(" / ".join(format_ms(m.get(k)) for k in ("latency_p50_ms", "latency_p90_ms", "latency_p999_ms"))),
        ),
        (
            "SLO",
            _e(f"{data.constraints.describe()}: {_judgement(slo, verdict)}"),
        ),
        (
            "speedup P99",
            _e(_times(m.get("speedup_p99")) + f" over the baseline, compression {_times(m.get('compression_ratio'))}"),
        ),
        ("throughput", _e(f"{m['throughput_per_s']:,.0f} samples/s at batch {m['batch_size']}")),
        ("memory", _e(format_bytes(m.get("memory_bytes") or m.get("params_bytes")))),
        ("confirmed", _e(_confirmation(focus.get("confirmation")))),
    ]
    return f'<div class="card {css}"><h3>{_e(title)}</h3>{head}{_kv(rows)}</div>'


def _judgement(slo: dict[str, Any], verdict: str | None) -> str:
    p99 = f"P99 {verdict}" if verdict else "no P99 SLO"
    if slo.get("feasible") is False:
        return f"{p99}; does not meet every limit (above)"
    return f"{p99}; meets every limit" if slo.get("feasible") else p99


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _describe(row: dict[str, Any]) -> str:
    config = row.get("config") or {}
    return describe_config(config) if "batch_size" in config else str(config)


def _confirmation(confirmation: dict[str, Any] | None) -> str:
    if not confirmation:
        return "no: measured once, during the search; 'pareto confirm' re-measures it with the baseline"
    when = str(confirmation.get("confirmed_at", ""))[:16].replace("T", " ")
    return (
        f"yes: {confirmation.get('rounds')} rounds interleaved with the baseline at {when} UTC, "
        f"{confirmation.get('discarded_rounds') or 0} discarded for contention"
    )


def _method_section(data: _Data) -> str:
    focus = data.focus or data.baseline or (data.rows[0] if data.rows else None)
    if focus is None:
        return '<h2>Measurement method</h2><p class="skipped">No trial was measured in this environment.</p>'
    m = focus["metrics"]
    terms = [t.strip() for t in str(m.get("method") or "").split(METHOD_SEPARATOR) if t.strip()]
    summary = (
        f"{m['samples']:,} timed calls kept in {m.get('rounds') or 1} rounds "
        f"({m.get('discarded_rounds') or 0} discarded for contention), {m.get('warmup', 0)} warm-up calls; "
        f"every latency bound is {m['confidence']:.3g} one-sided"
        + (f"; the P99 bound came from {m['p99_bound']}" if m.get("p99_bound") else "")
        + "."
    )
    items = "".join(f"<li>{_e(t)}</li>" for t in terms)
    return (
        f"<h2>Measurement method</h2><p>Of trial {focus['trial']} ({_e(_describe(focus))}): {_e(summary)} "
        "The other trials of the study were measured the same way (their own counts are in "
        f'<code>pareto frontier --json</code>).</p><ul class="method">{items}</ul>'
    )


def _frontier_table(data: _Data) -> str:
    if not data.front:
        return '<h2>Frontier</h2><p class="skipped">No trial has every objective measured: the frontier is empty.</p>'
    head = (
        "<tr><th>trial</th><th>configuration</th><th>accuracy</th><th>p50</th><th>p99</th><th>p99 ≤</th>"
        "<th>throughput/s</th><th>memory</th><th>compression</th><th>speedup p99</th><th>SLO</th></tr>"
    )
    picked = data.pick["trial"] if data.pick else None
    body = []
    for r in data.front:
        m, status = r["metrics"], _status(r)
        mark = {"meets": "meets", "misses": "misses", "uncertain": "uncertain", "unjudged": "—"}[status]
        if r.get("confirmation"):
            mark += " ✓"
        cls = ' class="picked"' if r["trial"] == picked else ""
        cells = [
            f'<td class="n">{r["trial"]}</td>',
            f"<td>{_e(_describe(r))}</td>",
            f'<td class="n">{m["accuracy"]:.4f}</td>',
            f'<td class="n">{_e(format_ms(m.get("latency_p50_ms")))}</td>',
            f'<td class="n">{_e(format_ms(m.get("latency_p99_ms")))}</td>',
            f'<td class="n">{_e(format_ms(m.get("latency_p99_upper_ms")))}</td>',
            f'<td class="n">{m["throughput_per_s"]:,.0f}</td>',
            f'<td class="n">{_e(format_bytes(m.get("memory_bytes") or m.get("params_bytes")))}</td>',
            f'<td class="n">{_e(_times(m.get("compression_ratio")))}</td>',
            f'<td class="n">{_e(_times(m.get("speedup_p99")))}</td>',
            f'<td class="{status}">{_e(mark)}</td>',
        ]
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    objectives = ", ".join(data.objectives)
    return (
        f"<h2>Frontier ({len(data.front):,} configurations; objectives {_e(objectives)})</h2>"
        f'<table class="front">{head}{"".join(body)}</table>'
        "<p>p99 ≤: the one-sided upper confidence bound the SLO verdict uses. ✓: confirmed in interleaved rounds "
        "with the baseline. Highlighted: the pick. Speedup: over the uncompressed model timed in the same run, at "
        "the same batch size.</p>"
    )


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pareto-slo")
    except PackageNotFoundError:
        return "(not installed)"
