"""The figures that open the report of a study searched at a request rate: the front as accuracy against
capacity (the capacity a rate is judged by: load-run where load runs found one, else simulated), and the
request P99 against the arrival rate (the simulated curve, the load runs as points, the SLO and the rate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pareto.metrics import LOAD_RUN, served_capacity
from pareto.report.data import ReportData, escape
from pareto.report.figures import (
    _BASELINE_COLOR,
    _PICK_COLOR,
    Drawer,
    Skip,
    _axis_scale,
    _confidence,
    _legend,
    _mark,
    _scatter_by_status,
    _values,
)
from pareto.units import format_ms

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def traffic_drawers() -> list[Drawer]:
    """The opening figures of a study at a rate, in the page's order."""
    return [
        ("pareto", "Pareto front: accuracy against capacity at the SLO", _capacity_front),
        ("rate", "Request P99 against the arrival rate", _rate_figure),
    ]


def _capacity(m: dict[str, Any]) -> float | None:
    return served_capacity(m)[0] or None


def _capacity_front(data: ReportData, fig: Figure) -> tuple[str, str]:
    import numpy as np

    rows, rate = data.rows, data.constraints.qps or 0.0
    x = _values(rows, _capacity)
    y = np.array([float(r["metrics"]["accuracy"]) for r in rows])
    if not np.isfinite(x).any():
        raise Skip("Not drawn: no trial has a capacity within the SLO (its requests miss it even at the lowest rate).")
    ax = fig.add_subplot()
    drawn = _scatter_by_status(ax, rows, x, y)
    loaded = [i for i, r in enumerate(rows) if served_capacity(r["metrics"])[1] == LOAD_RUN and np.isfinite(x[i])]
    if loaded:
        ax.scatter(x[loaded], y[loaded], s=90, marker="s", facecolors="none", edgecolors="#1f78b4", linewidths=1.4,
                   zorder=4, label=f"capacity from load runs ({len(loaded)})")  # fmt: skip
    front = [r for r in data.front if _capacity(r["metrics"])]
    if front:
        fx = np.array([_capacity(r["metrics"]) for r in front], dtype=float)
        fy = np.array([r["metrics"]["accuracy"] for r in front])
        ax.scatter(fx, fy, s=60, facecolors="none", edgecolors="black", linewidths=1.2, zorder=3, label="frontier")
    ax.axvline(rate, color=_PICK_COLOR, linestyle="--", linewidth=1.2, label=f"the study's rate {rate:,.4g}/s")
    _axis_scale(ax, np.append(x, rate), "x")
    ax.set_xlabel(f"capacity at P99 ≤ {format_ms(data.constraints.p99_ms)} (requests/s)")
    ax.set_ylabel(data.score)
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    _mark(ax, data, lambda r: (_capacity(r["metrics"]), r["metrics"]["accuracy"]))
    caption = (
        f"Each point is one trial ({drawn:,} drawn) at the highest rate whose request P99 bound stays within the "
        f"SLO: found by load runs where they ran (squares), otherwise simulated on the served batch costs (not "
        f"load-run). Right of the dashed line a configuration holds the study's rate. Circled: the Pareto "
        f"frontier over the study's objectives ({escape(', '.join(data.objectives))}). "
        f"{len(rows) - drawn:,} trials with no capacity within the SLO are not drawn."
    )
    alt = f"Scatter of accuracy against capacity for {drawn:,} trials of study {data.study}, rate {rate:,.4g}/s marked."
    return alt, caption


def _rate_figure(data: ReportData, fig: Figure) -> tuple[str, str]:
    import numpy as np

    series = [(label, row, color) for label, row, color in (
        ("pick" if data.pick else "closest", data.focus, _PICK_COLOR), ("baseline", data.baseline, _BASELINE_COLOR)
    ) if row is not None and row["metrics"].get("traffic_curve")]  # fmt: skip
    if len(series) == 2 and series[0][1]["trial"] == series[1][1]["trial"]:
        series = [(f"{series[0][0]} = baseline", series[0][1], series[0][2])]
    if not series:
        raise Skip("Not drawn: neither the pick nor the baseline has a simulated traffic curve.")
    ax = fig.add_subplot()
    slo, rate = data.constraints.p99_ms or 0.0, data.constraints.qps or 0.0
    xs: list[float] = [rate]
    ys: list[float] = [slo]
    for label, row, color in series:
        curve = sorted(row["metrics"]["traffic_curve"], key=lambda p: p["qps"])
        points = [(p["qps"], p["p99_upper_ms"]) for p in curve if p.get("p99_upper_ms")]
        ax.plot([q for q, _ in points], [v for _, v in points], "-o", color=color, markersize=3, linewidth=1.2,
                label=f"{label} (trial {row['trial']}): simulated P99 bound")  # fmt: skip
        xs += [q for q, _ in points]
        ys += [v for _, v in points]
        load = row.get("load_run")
        if load and load.get("p99_upper_ms"):
            marker = "o" if load["valid"] else "x"
            ax.scatter([load["qps"]], [load["p99_upper_ms"]], s=70, marker=marker, color=color, zorder=4,
                       edgecolors="white" if marker == "o" else None,
                       label=f"{label}: load run ({'valid' if load['valid'] else 'not valid'})")  # fmt: skip
            xs.append(load["qps"])
            ys.append(load["p99_upper_ms"])
        capacity, source = served_capacity(row["metrics"])
        if capacity:
            ax.axvline(capacity, color=color, linestyle=":", linewidth=1.0, label=f"{label}: capacity ({source})")
    ax.axhline(slo, color="#7b3294", linestyle="--", linewidth=1.2, label=f"P99 SLO {format_ms(slo)}")
    ax.axvline(rate, color="#555555", linestyle="--", linewidth=1.0, label=f"the study's rate {rate:,.4g}/s")
    _axis_scale(ax, np.array(xs, dtype=float), "x")
    _axis_scale(ax, np.array(ys, dtype=float), "y")
    ax.set_xlabel("arrival rate (requests/s, Poisson)")
    ax.set_ylabel(f"request P99 upper bound (ms, {_confidence(data)})")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    caption = (
        "Every request's P99 upper bound at each arrival rate, behind the dynamic batcher the simulation chose "
        "there: the line is the simulated curve stored with the trial (drawn from the served batch costs), the "
        "markers the latest real load run (a cross: it did not count, e.g. over capacity), the dotted lines the "
        "capacity a rate is judged by. Dashed: the SLO and the study's rate."
    )
    names = " and ".join(f"{label} (trial {row['trial']})" for label, row, _ in series)
    return f"Request P99 bound against arrival rate for the {names}, with load runs and the SLO.", caption
