"""Replay benchmark: how good is each sampler, measured against a grid measured once.

Step 1 (``measure``, about 15 minutes on 2 cores): every configuration of the demo space's grid is
measured by a real search (``--sampler grid``, the search's own measurement method: 662 calls in 20
rounds, contention guard, no early rejection so that every point has its accuracy), and the table is
written to ``benchmarks/data/demo-grid.csv``.

Step 2 (``replay``, no measuring): each sampler runs against the table over many seeds. A proposed
configuration is looked up at the nearest grid point of every continuous parameter; a repeat of a
configuration proposed before is handled as the search does (answered with its stored values, not
counted; ``pruned`` and ``counted`` variants are run beside for TPE and the Gaussian process). After every new configuration the hypervolume of the feasible front found so far (P99
upper bound within the SLO; objectives accuracy and P99 upper bound, reference point: the lowest
accuracy in the table and the SLO) is taken as a share of the full grid's.

    python benchmarks/replay.py measure          # writes benchmarks/data/demo-grid.csv
    python benchmarks/replay.py replay --samplers tpe,tpe-8,random,qmc,nsga2,grid,gp --seeds 10 \
        --fraction 0.5 --plot benchmarks/results/replay-demo.png --save benchmarks/results/replay-demo.json

Step 3 (``failures``, builds only): every grid configuration is built on the demo model with this code
(no timing); the samplers then replay the grid as the search did before issue 34 (a configuration that
fails is an Optuna FAIL, counted, and built again when proposed again) and as it does now (a technique
that changes nothing is dropped, a failure is told as infeasible and answered from then on), and the
share of the budget spent on configurations that fail is printed beside the front found.

    python benchmarks/replay.py failures --samplers tpe,gp,nsga2,random --seeds 10 --fraction 0.3
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from pareto.spec import Range, SearchSpec
from pareto.study.samplers import SAMPLERS, make_sampler, range_points, suggest

DATA = Path(__file__).parent / "data"
TABLE = DATA / "demo-grid.csv"
SLO_MS = 7.0
GRID_POINTS = 4
#: Repeats are also counted while the first this many configurations are measured (the main job's size).
EARLY = 30
STUDY = "demo-grid"
METRICS = (
    "accuracy",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_p99_lower_ms",
    "latency_p99_upper_ms",
    "samples",
    "compress_s",
    "latency_s",
    "accuracy_s",
)


#: The demo space the table was measured on (the default space before bf16 joined it as a CPU lever).
GRID_SPACE = {
    "int8_dynamic": {},
    "prune_unstructured": {"sparsity": {"low": 0.5, "high": 0.95}},
    "prune_structured": {"ratio": {"low": 0.2, "high": 0.9}},
    "lowrank": {"rank_ratio": {"low": 0.05, "high": 0.5}},
}


def spec() -> SearchSpec:
    """The demo search space and SLO (the README's main job), the grid at GRID_POINTS per range."""
    return SearchSpec.model_validate(
        {
            "task": "demo",
            "study": STUDY,
            "slo": {"p99": f"{SLO_MS}ms"},
            "search": {"sampler": "grid", "grid_points": GRID_POINTS, "confirm_top": 0, "early_reject": False},
            "space": {"techniques": GRID_SPACE},
        }
    )


# ---------------------------------------------------------------------------------------------- measure


def measure(db: str | None, out: Path) -> None:
    from rich.console import Console

    from pareto.api import search
    from pareto.report.tables import ProgressReporter
    from pareto.study.samplers import grid

    s = spec()
    size = len(grid(s.space.batch_size or [256], s.space.techniques, GRID_POINTS))
    s = s.model_copy(update={"search": s.search.model_copy(update={"n_trials": size})})
    url = db or f"sqlite:///{tempfile.mkdtemp(prefix='pareto-grid-')}/grid.db"
    print(f"Measuring {size} grid configurations into {url}", file=sys.stderr)
    started = time.time()
    measured = 0
    for _ in range(3):  # a configuration the contention guard gave up on is measured in the next pass
        with ProgressReporter(Console(stderr=True)) as reporter:
            result = search(s, db=url, reporter=reporter)
        measured += result.measured
        if result.exhausted:
            break
    print(f"{measured} measured in {time.time() - started:.0f} s", file=sys.stderr)
    export(url, out)


def export(url: str, out: Path) -> None:
    from sqlalchemy import select

    from pareto.metrics import Metrics
    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Measurement, Study, Trial

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    params = {t.number: t.params for t in optuna.load_study(study_name=STUDY, storage=url).trials}
    rows = []
    with session_scope(open_engine(url, create=False)) as session:
        study = session.scalars(select(Study).where(Study.name == STUDY)).one()
        for trial, row in session.execute(
            select(Trial, Measurement)
            .join(Measurement, Measurement.trial_id == Trial.id)
            .where(Trial.study_id == study.id, Trial.state == "COMPLETE", Measurement.kind == "search")
            .order_by(Trial.optuna_number)
        ).all():
            m = Metrics.from_row(row).to_dict()
            rows.append(
                {
                    "trial": trial.optuna_number,
                    "key": _key(params[trial.optuna_number]),
                    "description": trial.description,
                    **{k: m.get(k) for k in METRICS[:6]},
                    "compress_s": trial.compress_s,
                    "latency_s": trial.latency_s,
                    "accuracy_s": trial.accuracy_s,
                }
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows written to {out}", file=sys.stderr)


def _key(params: dict[str, Any]) -> str:
    """A grid point as text: the techniques that are on, with their parameters (batch size left out)."""
    on = sorted(k for k, v in params.items() if v is True)
    parts = []
    for name in on:
        sub = sorted((k, v) for k, v in params.items() if k.startswith(name + "."))
        parts.append(name + "".join(f"[{k.split('.', 1)[1]}={float(v):.6g}]" for k, v in sub))
    return "+".join(parts) or "baseline"


# ----------------------------------------------------------------------------------------------- replay


class Table:
    """The measured grid: a configuration's metrics by its nearest grid point."""

    def __init__(self, path: Path) -> None:
        with path.open() as f:
            self.rows = {r["key"]: r for r in csv.DictReader(f)}
        s = spec()
        self.techniques = s.space.techniques
        self.points = {
            f"{name}.{p}": range_points(space, GRID_POINTS)
            for name, params in self.techniques.items()
            for p, space in params.items()
            if isinstance(space, Range)
        }
        feasible = [(float(r["accuracy"]), _p99(r)) for r in self.rows.values() if _p99(r) <= SLO_MS]
        self.reference = (min(float(r["accuracy"]) for r in self.rows.values()), SLO_MS)
        self.full = hypervolume(feasible, self.reference)
        self.baseline = self.rows["baseline"]

    def lookup(self, params: dict[str, Any]) -> dict[str, str]:
        snapped = {k: self._snap(k, v) for k, v in params.items()}
        return self.rows[_key(snapped)]

    def _snap(self, name: str, value: Any) -> Any:
        grid = self.points.get(name)
        if grid is None or isinstance(value, bool):
            return value
        return min(grid, key=lambda g: abs(g - value))


def _p99(row: dict[str, str]) -> float:
    value = row["latency_p99_upper_ms"]
    return float(value) if value not in ("", "None") else math.inf


def hypervolume(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The area that (accuracy, P99) points dominate up to ``reference`` (lowest accuracy, P99 limit):
    accuracy is maximized, the P99 minimized."""
    acc_ref, p99_ref = reference
    pts = sorted((p, a) for a, p in points if p <= p99_ref and a > acc_ref)
    edges = [p for p, _ in pts] + [p99_ref]
    area, best = 0.0, acc_ref
    for i, (p, a) in enumerate(pts):
        best = max(best, a)
        area += (edges[i + 1] - p) * (best - acc_ref)
    return area


#: Settings tried beside the samplers as pareto builds them (label: (factory of a seed, flat form?)).
VARIANTS: dict[str, tuple[Any, ...]] = {
    "tpe-flat": (lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8), True),
    # the TPE default before the replay: 8 random trials, Optuna's prior weight
    "tpe-8": (
        lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=8),
        False,
    ),
    # a heavier prior: a little better on this grid, but `prior_weight` is deprecated since Optuna 4.9
    "tpe-prior-2": (
        lambda seed: optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, n_startup_trials=16, prior_weight=2.0
        ),
        False,
    ),
    "tpe-independent": (lambda seed: optuna.samplers.TPESampler(seed=seed, n_startup_trials=8), False),
    "gp-conditional": (lambda seed: optuna.samplers.GPSampler(seed=seed), False),
}


def replay_one(table: Table, sampler: str, seed: int, budget: int, *, repeats: str = "values") -> dict[str, Any]:
    """One sampler, one seed: the hypervolume share after each new configuration, and the repeats.

    ``repeats``: how a repeat is answered. "values": the stored values again (a complete trial with
    its constraints) and not counted, as the search does; "pruned": an Optuna PRUNED trial, not
    counted; "counted": the stored values, counted against the budget (the search before issue 11).
    """
    from pareto.study.samplers import FLAT

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start: Any = None
        if sampler in VARIANTS:
            build, flat, *rest = VARIANTS[sampler]
            chosen, start = build(seed), (rest[0] if rest else None)
        else:
            flat = sampler in FLAT
            chosen = make_sampler(
                sampler, seed=seed, batch_sizes=[256], techniques=table.techniques, grid_points=GRID_POINTS
            )
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=chosen)
    study.enqueue_trial({"batch_size": 256, **{name: False for name in table.techniques}})
    if start is not None:
        start(study, table.techniques)
    seen: dict[str, tuple[float, float]] = {}
    found: list[tuple[float, float]] = []
    curve: list[float] = []
    state = {"repeats": 0, "streak": 0, "counted": 0, "early": 0}

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        config = suggest(trial, [256], table.techniques, flat=flat)
        key = config.key()
        if key in seen:
            state["repeats"] += 1
            state["streak"] += 1
            if state["counted"] < EARLY:
                state["early"] += 1
            if repeats == "pruned":
                raise optuna.TrialPruned("repeat")
            if repeats == "counted":
                state["counted"] += 1
                curve.append(curve[-1] if curve else 0.0)
            acc, p99 = seen[key]
            trial.set_constraint("p99_ms", (p99 - SLO_MS) / SLO_MS if math.isfinite(p99) else 1e9)
            return acc, p99 if math.isfinite(p99) else 1e9
        state["streak"] = 0
        state["counted"] += 1
        row = table.lookup({k: v for k, v in trial.params.items() if k == "batch_size" or _on(k, trial.params)})
        acc, p99 = float(row["accuracy"]), _p99(row)
        seen[key] = (acc, p99)
        if p99 <= SLO_MS:
            found.append((acc, p99))
        curve.append(hypervolume(found, table.reference) / table.full)
        trial.set_constraint("p99_ms", (p99 - SLO_MS) / SLO_MS if math.isfinite(p99) else 1e9)
        return acc, p99 if math.isfinite(p99) else 1e9

    def stop(st: optuna.Study, _: Any) -> None:
        if state["counted"] >= budget or state["streak"] >= 50:
            st.stop()

    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, n_trials=None, callbacks=[stop])
    while len(curve) < budget:  # nothing new left: the front stays as found
        curve.append(curve[-1])
    return {
        "curve": curve[:budget],
        "repeats": state["repeats"],
        "early_repeats": state["early"],
        "seconds": time.perf_counter() - started,
    }


def _on(name: str, params: dict[str, Any]) -> bool:
    """A technique that is on, or a parameter of one."""
    return params.get(name.split(".", 1)[0]) is True


def replay(
    path: Path,
    samplers: list[str],
    seeds: int,
    fraction: float,
    plot: Path | None,
    save: Path | None,
    include: Path | None = None,
) -> None:
    import json

    table = Table(path)
    size = len(table.rows)
    budget = max(1, round(fraction * size))
    print(
        f"Replay of {path.name}: {size} configurations, SLO P99 <= {SLO_MS:g} ms, {seeds} seeds, "
        f"up to {budget} new configurations; full-grid hypervolume {table.full:.4g} "
        f"(reference: accuracy {table.reference[0]:.4f}, P99 {SLO_MS:g} ms)",
        file=sys.stderr,
    )
    marks = [round(f * size) for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6) if round(f * size) <= budget]
    runs: dict[str, list[dict[str, Any]]] = {}
    variants = [(s, "values") for s in samplers]
    # how repeats are answered: TPE three ways, the Gaussian process (the slowest) shown pruned repeats too
    variants += [
        (s, mode)
        for s, modes in (("tpe", ("pruned", "counted")), ("gp", ("pruned",)))
        if s in samplers
        for mode in modes
    ]
    for name, mode in variants:
        label = {"values": name, "pruned": f"{name} (repeats pruned)", "counted": f"{name} (repeats counted, old)"}[
            mode
        ]
        runs[label] = [replay_one(table, name, seed, budget, repeats=mode) for seed in range(seeds)]
        print(f"  {label}: {statistics.mean(r['seconds'] for r in runs[label]):.1f} s a run", file=sys.stderr)
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps({"size": size, "runs": runs}))
    if include is not None:  # e.g. the slow Gaussian process, replayed over fewer seeds
        for label, rs in json.loads(include.read_text())["runs"].items():
            runs.setdefault(label, rs)
        if save is not None:
            save.write_text(json.dumps({"size": size, "runs": runs}))
    render(runs, size, marks, budget, plot)


# ---------------------------------------------------------------------------------------------- failures


def builds(table: Table) -> dict[str, str | None]:
    """What building each grid configuration on the demo model (and one forward at batch 256) gives with
    this code: None (it runs), ``"noeffect:<smaller key>"`` (a technique changed nothing: the smaller
    twin's key) or ``"failed"``. Real builds, no timing (about 2 minutes on 2 cores)."""
    import torch

    from pareto.compress import Config, apply, get_technique
    from pareto.devices import as_args
    from pareto.errors import NoEffect, TechniqueError
    from pareto.task import load_task

    task = load_task("demo")
    out: dict[str, str | None] = {}
    for key in table.rows:
        techniques = _techniques_of(key)
        config = Config(techniques=tuple(get_technique(n, p) for n, p in techniques.items()), batch_size=256)
        try:
            model = apply(task.model, config, task).module
            with torch.inference_mode():
                model(*as_args(task.example_input(256)))
            out[key] = None
        except NoEffect as exc:
            out[key] = "noeffect:" + _key_of({n: p for n, p in techniques.items() if n != exc.technique})
        except TechniqueError:
            out[key] = "failed"
    return out


def _techniques_of(key: str) -> dict[str, dict[str, float]]:
    """A table key ("lowrank[rank_ratio=0.05]+prune_structured[ratio=0.9]") as techniques and parameters."""
    if key == "baseline":
        return {}
    found = {}
    for part in key.split("+"):
        name, _, rest = part.partition("[")
        params = dict(p.split("=") for p in rest.rstrip("]").split("][") if p) if rest else {}
        found[name] = {k: float(v) for k, v in params.items()}
    return found


def _key_of(techniques: dict[str, dict[str, float]]) -> str:
    params: dict[str, Any] = {name: True for name in techniques}
    params.update({f"{n}.{k}": v for n, p in techniques.items() for k, v in p.items()})
    return _key(params)


def replay_failures(
    table: Table, built: dict[str, str | None], sampler: str, seed: int, budget: int, *, known: bool
) -> dict[str, Any]:
    """One sampler, one seed, over the grid with the configurations that cannot be built as they are.

    ``known=False`` is the search before issue 34: a configuration that fails (low-rank that makes no
    layer smaller included) is told to Optuna as FAIL (which every sampler leaves out of its model),
    counts as a new configuration, and is built and counted again when proposed again. ``known=True``
    is the search now: the technique that changed nothing is dropped (the trial is its smaller twin,
    a repeat when that was measured), a failure is told as infeasible with the worst values seen, and a
    repeat of one is answered, not counted.
    """
    from pareto.study.samplers import FLAT

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chosen = make_sampler(
            sampler, seed=seed, batch_sizes=[256], techniques=table.techniques, grid_points=GRID_POINTS
        )
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=chosen)
    study.enqueue_trial({"batch_size": 256, **{name: False for name in table.techniques}})
    seen: dict[str, tuple[float, float] | None] = {}  # None: failed
    found: list[tuple[float, float]] = []
    state = {"counted": 0, "failed": 0, "streak": 0}

    def told(key: str, trial: optuna.Trial) -> tuple[float, float]:
        values = seen[key]
        if values is None:  # infeasible: the worst values so far, every constraint violated
            done = [t.values for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
            trial.set_constraint("p99_ms", 1.0)
            return min(v[0] for v in done), max(v[1] for v in done)
        acc, p99 = values
        trial.set_constraint("p99_ms", (p99 - SLO_MS) / SLO_MS if math.isfinite(p99) else 1e9)
        return acc, p99 if math.isfinite(p99) else 1e9

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        suggest(trial, [256], table.techniques, flat=sampler in FLAT)
        key = _key({k: table._snap(k, v) for k, v in trial.params.items() if k == "batch_size" or _on(k, trial.params)})
        outcome = built[key]
        if known and outcome is not None and outcome.startswith("noeffect:"):
            key, outcome = outcome.split(":", 1)[1], None
        if known and key in seen:
            state["streak"] += 1
            return told(key, trial)
        state["streak"] = 0
        state["counted"] += 1
        if outcome is not None:  # failed (or, before, a technique that changed nothing)
            state["failed"] += 1
            if not known:
                raise RuntimeError("failed")  # an Optuna FAIL: left out of every sampler's model
            seen[key] = None
            return told(key, trial)
        row = table.rows[key]
        acc, p99 = float(row["accuracy"]), _p99(row)
        seen[key] = (acc, p99)
        if p99 <= SLO_MS:
            found.append((acc, p99))
        return told(key, trial)

    def stop(st: optuna.Study, _: Any) -> None:
        if state["counted"] >= budget or state["streak"] >= 50:
            st.stop()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, n_trials=None, callbacks=[stop], catch=(RuntimeError,))
    return {
        "failed_share": state["failed"] / max(1, state["counted"]),
        "hypervolume": hypervolume(found, table.reference) / table.full,
        "counted": state["counted"],
    }


def failures(path: Path, samplers: list[str], seeds: int, fraction: float) -> None:
    table = Table(path)
    started = time.perf_counter()
    built = builds(table)
    broken = sum(v is not None for v in built.values())
    size = len(table.rows)
    budget = max(1, round(fraction * size))
    print(
        f"Replay of {path.name} with real builds ({time.perf_counter() - started:.0f} s): {broken} of {size} "
        f"configurations cannot be built as they are ({sum(v == 'failed' for v in built.values())} fail, "
        f"{sum((v or '').startswith('noeffect') for v in built.values())} have a technique that changes nothing); "
        f"{seeds} seeds, {budget} new configurations each",
        file=sys.stderr,
    )
    print("| sampler | budget on failed configurations, before | after | front's hypervolume, before | after |")
    print("|---|---:|---:|---:|---:|")
    for sampler in samplers:
        rows = {
            known: [replay_failures(table, built, sampler, seed, budget, known=known) for seed in range(seeds)]
            for known in (False, True)
        }

        def cell(runs: list[dict[str, Any]], field: str) -> str:
            values = [100 * r[field] for r in runs]
            return f"{statistics.mean(values):.1f} % ± {statistics.stdev(values) if len(values) > 1 else 0:.1f}"

        print(
            f"| {sampler} | {cell(rows[False], 'failed_share')} | {cell(rows[True], 'failed_share')} | "
            f"{cell(rows[False], 'hypervolume')} | {cell(rows[True], 'hypervolume')} |"
        )


def render(runs: dict[str, list[dict[str, Any]]], size: int, marks: list[int], budget: int, plot: Path | None) -> None:
    head = " | ".join(f"{m} ({m / size:.0%})" for m in marks)
    print(
        f"| sampler (mean ± sd over seeds) | seeds | {head} | new configs to 95 % | repeats in the first {EARLY} | repeats per run |"
    )
    print("|---|" + "---:|" * (len(marks) + 4))
    for label, rs in runs.items():
        cells = []
        for m in marks:
            values = [100 * r["curve"][m - 1] for r in rs]
            cells.append(f"{statistics.mean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0:.1f}")
        reach = [next((i + 1 for i, v in enumerate(r["curve"]) if v >= 0.95), None) for r in rs]
        got = [x for x in reach if x is not None]
        reached = (
            f"{statistics.median(got):.0f} (median; {len(got)}/{len(rs)} seeds)" if got else f"not within {budget}"
        )
        repeats = statistics.mean(r["repeats"] for r in rs)
        early = statistics.mean(r["early_repeats"] for r in rs)
        print(f"| {label} | {len(rs)} | {' | '.join(cells)} | {reached} | {early:.1f} | {repeats:.1f} |")
    if plot is not None:
        _plot(runs, size, plot)


def _plot(runs: dict[str, list[dict[str, Any]]], size: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for label, rs in runs.items():
        curves = np.array([r["curve"] for r in rs]) * 100
        x = np.arange(1, curves.shape[1] + 1)
        mean, std = curves.mean(axis=0), curves.std(axis=0)
        (line,) = ax.plot(x, mean, label=label, linestyle="--" if "old" in label else "-")
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.12)
    ax.axhline(95, color="grey", linewidth=0.8)
    ax.axvline(0.3 * size, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel(f"new configurations measured (grid: {size})")
    ax.set_ylabel("feasible front's hypervolume, % of the full grid's")
    ax.set_ylim(0, 101)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Replay on the measured demo grid: mean ± 1 sd over seeds")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot written to {out}", file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="measure the grid (about 15 min) and write the table")
    m.add_argument("--db", help="where the grid search is stored (default: a temporary SQLite file)")
    m.add_argument("--out", type=Path, default=TABLE)
    e = sub.add_parser("export", help="write the table from a grid search already stored")
    e.add_argument("--db", required=True)
    e.add_argument("--out", type=Path, default=TABLE)
    r = sub.add_parser("replay", help="run the samplers against the table (no measuring)")
    r.add_argument("--table", type=Path, default=TABLE)
    r.add_argument("--samplers", default=",".join(SAMPLERS))
    r.add_argument("--seeds", type=int, default=10)
    r.add_argument("--fraction", type=float, default=0.6, help="budget: this share of the grid")
    r.add_argument("--plot", type=Path)
    r.add_argument("--save", type=Path, help="keep every run's curve here (JSON)")
    r.add_argument("--include", type=Path, help="add the runs of an earlier --save (labels not run now)")
    f = sub.add_parser("failures", help="the share of the budget spent on configurations that fail, before and after")
    f.add_argument("--table", type=Path, default=TABLE)
    f.add_argument("--samplers", default="tpe,gp,nsga2,random")
    f.add_argument("--seeds", type=int, default=10)
    f.add_argument("--fraction", type=float, default=0.3, help="budget: this share of the grid")
    args = parser.parse_args()
    if args.command == "failures":
        failures(args.table, args.samplers.split(","), args.seeds, args.fraction)
    elif args.command == "measure":
        measure(args.db, args.out)
    elif args.command == "export":
        export(args.db, args.out)
    else:
        replay(args.table, args.samplers.split(","), args.seeds, args.fraction, args.plot, args.save, args.include)
