"""The samplers a search can use, the space as Optuna sees it, and the grid of a space.

``suggest`` draws a configuration in one of two parametrizations:

- **conditional**: a technique's parameters are suggested only when the technique is on. TPE
  (``multivariate=True, group=True``) models each set of parameters that occur together; random
  search and the grid need nothing more.
- **flat**: every parameter is suggested in every trial and ignored while its technique is off.
  The Gaussian-process, NSGA-II and QMC samplers model only the parameters that every trial has
  (Optuna's intersection search space) and draw the rest at random; in the conditional form that
  leaves them the on/off switches alone.

Optuna's GP, NSGA-II and TPE samplers read each trial's constraints (``Trial.set_constraint``);
random, QMC and the grid propose without looking at results, so constraints change nothing there.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any, cast, get_args

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from pareto.compress import Config, Technique, get_technique, registry
from pareto.compress.base import Pairs, conflict, runs_on
from pareto.limits import Constraints, constraint_names
from pareto.naming import Backend, SamplerName
from pareto.spec import Range, Search, StartPoint

SAMPLERS: tuple[str, ...] = get_args(SamplerName)
#: Samplers that read the trials' constraints; the others propose without looking at results.
USES_CONSTRAINTS = frozenset({"tpe", "gp", "nsga2"})
#: Samplers that see every parameter in every trial (see the module's docstring).
FLAT = frozenset({"gp", "nsga2", "qmc"})
#: Points of a range without a ``step`` in the grid: both ends and evenly between (geometric for ``log``).
DEFAULT_GRID_POINTS = Search.model_fields["grid_points"].default
#: TPE's random start: enough trials to cover the on/off switches before the model takes over (the
#: replay benchmark on the demo grid: 16 is ahead of 8, 12, 20 and 24 at 30 % of the grid).
TPE_STARTUP_TRIALS = 16

Techniques = dict[str, dict[str, Any]]


def make_sampler(
    name: str,
    *,
    seed: int | None,
    batch_sizes: Sequence[int] = (),
    techniques: Techniques | None = None,
    grid_points: int = DEFAULT_GRID_POINTS,
    backends: Sequence[Backend] = ("eager",),
    conflicts: Pairs = frozenset(),
) -> BaseSampler:
    """The Optuna sampler called ``name`` (one of ``SAMPLERS``); the grid needs the space (and the pairs
    of techniques this install cannot run together, which it skips)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            # multivariate + group: technique parameters exist only when their technique is on
            return optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,
                n_startup_trials=TPE_STARTUP_TRIALS,
            )
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "qmc":
            return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed)
        if name == "grid":
            return GridSampler(grid(batch_sizes, techniques or {}, grid_points, backends, conflicts), seed=seed)
    raise ValueError(f"unknown sampler {name!r}; known: {', '.join(SAMPLERS)}")


def suggest(
    trial: optuna.Trial,
    batch_sizes: Sequence[int],
    techniques: Techniques,
    *,
    flat: bool = False,
    backends: Sequence[Backend] = ("eager",),
    conflicts: Pairs = frozenset(),
) -> Config:
    """Draw one configuration (see the module's docstring for ``flat``).

    Unless ``backends`` is eager alone, the backend is drawn first (parameter ``backend``) and only the
    techniques that run on it are drawn (``flat``: all are drawn, those that do not run on it are
    left out of the configuration); a queued baseline (user attribute ``pareto_baseline``) is always
    the uncompressed model on eager. Two techniques that cannot share a configuration (``excludes``, or
    one of the ``conflicts`` of this install) are never drawn together.
    """
    batch_size = trial.suggest_categorical("batch_size", list(batch_sizes))
    if "pareto_baseline" in trial.user_attrs:
        backend: Backend = "eager"
    elif tuple(backends) != ("eager",):  # a parameter even when alone: the eager baseline is not this trial
        backend = cast("Backend", trial.suggest_categorical("backend", list(backends)))
    else:
        backend = "eager"
    chosen: list[Technique] = []
    for name, space in techniques.items():
        runs_here = runs_on(name, backend, conflicts)
        # one that cannot share a configuration with a technique already on is not drawn (conditional:
        # its switch exists only when it could be on), or drawn and ignored (flat)
        fits = conflict([t.name for t in chosen] + [name], conflicts) is None
        if not (
            (runs_here and fits) or flat
        ):  # flat: drawn all the same (and ignored): every trial has every parameter
            continue
        on = trial.suggest_categorical(name, [False, True])
        if not (on or flat):
            continue
        params = {pname: _suggest_param(trial, f"{name}.{pname}", pspace) for pname, pspace in space.items()}
        if on and runs_here and fits:
            chosen.append(get_technique(name, params))
    return Config(techniques=tuple(chosen), batch_size=batch_size, backend=backend)


def _suggest_param(trial: optuna.Trial, label: str, space: Any) -> Any:
    if isinstance(space, Range):
        return trial.suggest_float(label, space.low, space.high, step=space.step, log=space.log)
    return trial.suggest_categorical(label, space)


def range_points(space: Range, points: int = DEFAULT_GRID_POINTS) -> list[float]:
    """A range's grid: every step, or ``points`` values from low to high (geometric when ``log``)."""
    if space.step is not None:
        count = math.floor((space.high - space.low) / space.step + 1e-9) + 1
        return [round(space.low + k * space.step, 12) for k in range(count)]
    if space.log:
        ratio = space.high / space.low
        inner = [space.low * ratio ** (k / (points - 1)) for k in range(1, points - 1)]
    else:
        inner = [space.low + (space.high - space.low) * k / (points - 1) for k in range(1, points - 1)]
    return [space.low, *inner, space.high]  # the ends exactly: no rounding past a bound


def grid(
    batch_sizes: Sequence[int],
    techniques: Techniques,
    points: int = DEFAULT_GRID_POINTS,
    backends: Sequence[Backend] = ("eager",),
    conflicts: Pairs = frozenset(),
) -> list[dict[str, Any]]:
    """Every distinct configuration of the space's steps, as Optuna parameters (conditional form); none
    with two techniques that cannot share a configuration (``excludes``, or this install's ``conflicts``).

    A technique contributes "off" plus one entry per combination of its parameters' values; with
    several backends, each backend with the techniques that run on it.
    """
    result = []
    for backend in backends:
        per_technique: list[list[dict[str, Any]]] = []
        for name, space in _runs_on(techniques, backend, conflicts).items():
            names = list(space)
            values = [range_points(s, points) if isinstance(s, Range) else list(s) for s in space.values()]
            options: list[dict[str, Any]] = [{name: False}]
            for combo in itertools.product(*values):
                options.append({name: True, **{f"{name}.{p}": v for p, v in zip(names, combo, strict=True)}})
            per_technique.append(options)
        for batch_size in batch_sizes:
            for parts in itertools.product(*per_technique):
                switched_on = [name for part in parts for name, on in part.items() if "." not in name and on is True]
                if conflict(switched_on, conflicts) is not None:
                    continue  # two techniques that cannot share a configuration
                params: dict[str, Any] = {"batch_size": batch_size}
                if tuple(backends) != ("eager",):
                    params["backend"] = backend
                for part in parts:
                    params.update(part)
                result.append(params)
    return result


def space_size(
    batch_sizes: Sequence[int],
    techniques: Techniques,
    backends: Sequence[Backend] = ("eager",),
    conflicts: Pairs = frozenset(),
) -> int | None:
    """How many distinct configurations the space holds; None when a range has no step (unbounded).
    Combinations of techniques that cannot share a configuration are not counted."""
    if _has_conflicts(techniques, conflicts):
        bounded = all(
            s.step is not None for space in techniques.values() for s in space.values() if isinstance(s, Range)
        )
        return len(grid(batch_sizes, techniques, backends=backends, conflicts=conflicts)) if bounded else None
    overall = 0
    for backend in backends:
        total = len(batch_sizes)
        for space in _runs_on(techniques, backend, conflicts).values():
            combos = 1
            for pspace in space.values():
                if isinstance(pspace, Range):
                    if pspace.step is None:
                        return None
                    combos *= len(range_points(pspace))
                else:
                    combos *= len(pspace)
            total *= 1 + combos
        overall += total
    return overall


def _has_conflicts(techniques: Techniques, conflicts: Pairs = frozenset()) -> bool:
    names = list(techniques)
    if any(not runs_on(name, backend, conflicts) for name in names for backend in registry()[name].backends):
        return True  # a technique kept off one of its backends: counted on the grid
    return any(conflict([a, b], conflicts) is not None for i, a in enumerate(names) for b in names[i + 1 :])


def _runs_on(techniques: Techniques, backend: Backend, conflicts: Pairs = frozenset()) -> Techniques:
    """The techniques of a space that a configuration served on ``backend`` can use (``runs_on``)."""
    return {name: space for name, space in techniques.items() if runs_on(name, backend, conflicts)}


class GridSampler(BaseSampler):
    """Every configuration of a grid once, in a random order fixed by the seed.

    Optuna's own ``GridSampler`` takes the product of every parameter's values, which for a conditional
    space holds each configuration many times over (the parameters of a technique that is off still
    vary). This one walks the distinct configurations; each trial takes the first one that no trial
    of the study holds yet (any state but failed), so several workers share one grid. When none is
    left the study is stopped; the trial gets a configuration already measured (a repeat).
    """

    _ATTR = "pareto:grid_index"

    def __init__(self, points: list[dict[str, Any]], *, seed: int | None = None) -> None:
        import numpy as np

        self.points = points
        self.order = [int(i) for i in np.random.default_rng(seed).permutation(len(points))]

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs:  # an enqueued trial (a baseline) has its own parameters
            return
        taken = {
            _params_key(t.params)
            for t in study._get_trials(deepcopy=False, use_cache=False)
            if t.state != TrialState.FAIL and t.number != trial.number
        }
        free = next((i for i in self.order if _params_key(self.points[i]) not in taken), None)
        if free is None:
            study.stop()
            free = self.order[0]
        study._storage.set_trial_system_attr(trial._trial_id, self._ATTR, free)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        index = trial.system_attrs.get(self._ATTR)
        point = self.points[index] if index is not None else self.points[self.order[0]]
        if param_name in point:
            return point[param_name]
        # a parameter outside the grid (a technique's when it is off under the flat form): its low end
        return _low_end(param_distribution)


def _params_key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A configuration's Optuna parameters that matter: those of the techniques that are on."""
    on = {name for name, value in params.items() if value is True and "." not in name}
    return tuple(sorted((k, v) for k, v in params.items() if "." not in k or k.split(".", 1)[0] in on))


def _low_end(distribution: BaseDistribution) -> Any:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return distribution.choices[0]
    return distribution.low  # type: ignore[attr-defined]


def start_trial(
    point: StartPoint,
    batch_sizes: Sequence[int],
    techniques: Techniques,
    backends: Sequence[Backend],
    conflicts: Pairs = frozenset(),
) -> tuple[Config, dict[str, Any]] | None:
    """A start point (``search.start_with``) as its configuration and the parameters ``suggest`` draws
    for it (for ``optuna.Study.enqueue_trial``); None when one of its techniques, its backend or its
    batch size is not in this search (cannot run here, or narrowed on the command line), or two of its
    techniques cannot run together on this install."""
    batch_size = point.batch_size or batch_sizes[0]
    if point.backend not in backends or not set(point.techniques) <= set(techniques) or batch_size not in batch_sizes:
        return None
    if conflict(list(point.techniques), conflicts) is not None:
        return None
    if not all(runs_on(name, point.backend, conflicts) for name in point.techniques):
        return None
    params: dict[str, Any] = {"batch_size": batch_size}
    if tuple(backends) != ("eager",):
        params["backend"] = point.backend
    for name in techniques:
        on = name in point.techniques
        params[name] = on
        params.update({f"{name}.{pname}": value for pname, value in point.techniques.get(name, {}).items()})
    chosen = tuple(get_technique(name, values) for name, values in point.techniques.items())
    return Config(techniques=chosen, batch_size=batch_size, backend=point.backend), params


def failed_values(study: optuna.Study, n_objectives: int) -> tuple[float, ...] | None:
    """The values a configuration that cannot run is told to the sampler with: on each objective the worst
    any complete trial of the study holds (the lowest of a maximized one, the highest of a minimized
    one), so that it dominates nothing; None when no trial is complete yet. The worst seen, not an
    extreme, so that a Gaussian process's scaling of the values is left as it was."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    if not done:
        return None
    worst = []
    for k, direction in enumerate(study.directions[:n_objectives]):
        values = [t.values[k] for t in done if not math.isnan(t.values[k])]
        if not values:
            return None
        worst.append(min(values) if direction == optuna.study.StudyDirection.MAXIMIZE else max(values))
    return tuple(worst)


def failure_gaps(study: optuna.Study, constraints: Constraints) -> dict[str, float]:
    """The constraints of a configuration that cannot run: each limit the study has, violated by twice the
    largest finite gap any complete trial of the study shows on it, and by its whole size at least (a
    relative gap of 1), so that TPE and NSGA-II, which rank infeasible trials by their summed violation,
    rank it below every measured one. Every complete trial carries the same names (the Gaussian process
    needs that); a study without limits tells a failure by its worst values alone."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    gaps = {}
    for name in constraint_names(constraints):
        seen = [t.constraints.get(name, 0.0) for t in done]
        gaps[name] = max([1.0, *(2 * g for g in seen if math.isfinite(g))])
    return gaps
