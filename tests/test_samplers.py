"""The samplers, the grid of a space, and the two parametrizations, without measuring."""

from __future__ import annotations

import optuna
import pytest

from pareto.spec import Range
from pareto.study.samplers import SAMPLERS, grid, make_sampler, range_points, space_size, suggest

SPACE = {
    "int8_dynamic": {},
    "prune_structured": {"ratio": Range(low=0.2, high=0.9)},
    "lowrank": {"rank_ratio": [0.1, 0.25]},
}


def test_range_points_keep_the_ends_exactly() -> None:
    assert range_points(Range(low=0.2, high=0.9), 4) == pytest.approx([0.2, 0.4333333, 0.6666667, 0.9])
    ends = range_points(Range(low=0.2, high=0.9), 7)
    assert ends[0] == 0.2 and ends[-1] == 0.9  # never a rounding step past a bound
    assert range_points(Range(low=0.1, high=0.5, step=0.1)) == [0.1, 0.2, 0.3, 0.4, 0.5]
    log = range_points(Range(low=0.01, high=1.0, log=True), 3)
    assert log[0] == 0.01 and log[-1] == 1.0 and log[1] == pytest.approx(0.1)


def test_the_grid_holds_every_distinct_configuration_once() -> None:
    points = grid([64, 256], SPACE, 4)
    # per batch size: int8 on/off x (off + 4 ratios) x (off + 2 ranks)
    assert len(points) == 2 * 2 * 5 * 3
    keys = {tuple(sorted(p.items())) for p in points}
    assert len(keys) == len(points)
    assert {"batch_size": 64, "int8_dynamic": False, "prune_structured": False, "lowrank": False} in points
    # a technique that is off has no parameters (the conditional form)
    assert all("prune_structured.ratio" not in p for p in points if not p["prune_structured"])


def test_space_size_is_unbounded_without_steps() -> None:
    assert space_size([256], SPACE) is None
    stepped = {**SPACE, "prune_structured": {"ratio": Range(low=0.2, high=0.8, step=0.2)}}
    assert space_size([256], stepped) == 2 * 5 * 3


def _toy(trial: optuna.Trial, flat: bool) -> tuple[float, float]:
    config = suggest(trial, [256], SPACE, flat=flat)
    ratio = next((t.params()["ratio"] for t in config.techniques if t.name == "prune_structured"), 0.0)
    latency = 10 * (1 - ratio) * (0.6 if "int8_dynamic" in config.describe() else 1.0)
    accuracy = 1 - ratio**2
    trial.set_constraint("p99_ms", (latency - 7) / 7)
    return accuracy, latency


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_runs_a_constrained_two_objective_study(name: str) -> None:
    from pareto.study.samplers import FLAT

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=make_sampler(name, seed=0, batch_sizes=[256], techniques=SPACE, grid_points=3),
    )
    study.optimize(lambda t: _toy(t, name in FLAT), n_trials=14)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 14
    assert all("p99_ms" in t.constraints for t in done)
    if name in FLAT:  # every parameter in every trial, on or off
        assert all("prune_structured.ratio" in t.params for t in done)
    if name == "grid":  # no configuration twice
        keys = [tuple(sorted(t.params.items())) for t in done]
        assert len(set(keys)) == len(keys)


def test_the_grid_sampler_stops_when_every_point_is_taken() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    small = {"int8_dynamic": {}, "lowrank": {"rank_ratio": [0.1, 0.25]}}
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=make_sampler("grid", seed=3, batch_sizes=[8], techniques=small)
    )
    study.optimize(lambda t: (1.0, float(len(suggest(t, [8], small).techniques))), n_trials=20)
    keys = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(study.trials) == 7  # the 6 points, then one repeat while the study stops
    assert len(set(keys)) == 6


def test_an_unknown_sampler_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sampler 'cmaes'"):
        make_sampler("cmaes", seed=0)


@pytest.mark.parametrize("flat", [False, True])
def test_a_drawn_backend_gets_only_the_techniques_that_run_on_it(flat: bool) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = {"int8_dynamic": {}, "ort_int8_dynamic": {"per_channel": [False, True]}}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        config = suggest(trial, [8], space, flat=flat, backends=("eager", "onnxruntime"))
        names = {t.name for t in config.techniques}
        assert "ort_int8_dynamic" not in names or config.backend == "onnxruntime"
        assert "int8_dynamic" not in names or config.backend == "eager"
        # flat: every trial holds every parameter, whatever its backend (the GP models them all)
        assert ({"int8_dynamic", "ort_int8_dynamic"} <= set(trial.params)) == flat or config.backend == "eager"
        seen.add(config.backend)
        study.tell(trial, 0.0)
    assert seen == {"eager", "onnxruntime"}


def test_a_start_point_outside_this_search_is_left_out_and_one_inside_is_one_configuration() -> None:
    from pareto.spec import StartPoint
    from pareto.study.samplers import start_trial

    techniques = {"int8_dynamic": {}, "prune_structured": {"ratio": [0.25, 0.5]}}
    point = StartPoint(techniques={"prune_structured": {"ratio": 0.5}})
    config, params = start_trial(point, [8], techniques, ("eager",))  # type: ignore[misc]
    assert config.batch_size == 8 and [t.name for t in config.techniques] == ["prune_structured"]
    assert params == {"batch_size": 8, "int8_dynamic": False, "prune_structured": True, "prune_structured.ratio": 0.5}
    # the task's batch size is 8 here, the point asks 32; a backend or technique this search left out
    assert start_trial(point.model_copy(update={"batch_size": 32}), [8], techniques, ("eager",)) is None
    assert start_trial(point.model_copy(update={"backend": "compile"}), [8], techniques, ("eager",)) is None
    assert start_trial(StartPoint(techniques={"lowrank": {}}), [8], techniques, ("eager",)) is None


def test_a_null_choice_is_drawn_as_the_parameter_left_at_its_default() -> None:
    """``width_ratio: [null, 0.25]``: null prunes the feed-forward width alone, 0.25 the residual stream too."""
    from pareto.spec import Space

    space = Space.model_validate(
        {"techniques": {"prune_structured": {"ratio": [0.5], "width_ratio": [None, 0.25]}}}
    ).techniques
    points = grid([32], space)
    assert {p.get("prune_structured.width_ratio") for p in points if p["prune_structured"]} == {None, 0.25}
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    drawn = []
    for point in points[1:]:  # each "on" point, queued as the grid sampler queues it
        study.enqueue_trial(point)
        trial = study.ask()
        drawn.append(suggest(trial, [32], space))
        study.tell(trial, 0.0)
    assert {c.describe() for c in drawn} == {
        "prune_structured(ratio=0.5) @ batch 32",
        "prune_structured(ratio=0.5,width_ratio=0.25) @ batch 32",
    }


def test_pairs_this_install_cannot_run_are_never_drawn_and_the_grid_skips_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pareto.compress import quantize
    from pareto.compress.base import install_conflicts

    space = {"bf16": {}, "int8_dynamic": {}, "lowrank": {"rank_ratio": [0.25]}}
    # torchao takes a cast model: the pair runs, unless the space pins torch.ao's eager kernels
    assert install_conflicts(space, "cpu") == []
    pinned = {**space, "int8_dynamic": {"kernels": ["torch.ao"]}}
    [(a, b, why)] = install_conflicts(pinned, "cpu")
    assert {a, b} == {"bf16", "int8_dynamic"} and "needs float32 linear layers" in why
    # without torchao, every choice is torch.ao's
    monkeypatch.setattr(quantize, "_torchao_reason", lambda name: "needs torchao")
    [(a, b, why)] = install_conflicts(space, "cpu")
    assert {a, b} == {"bf16", "int8_dynamic"} and "torchao" in why
    pairs = frozenset({frozenset((a, b))})
    points = grid([8], space, conflicts=pairs)
    assert not any(p["bf16"] and p["int8_dynamic"] for p in points)
    assert len(points) == len(grid([8], space)) - 2  # bf16 + int8, with and without low-rank
    assert space_size([8], space, conflicts=pairs) == len(points)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(60):
        trial = study.ask()
        names = {t.name for t in suggest(trial, [8], space, conflicts=pairs).techniques}
        assert not {"bf16", "int8_dynamic"} <= names
        study.tell(trial, 0.0)
    from pareto.spec import StartPoint
    from pareto.study.samplers import start_trial

    both = StartPoint(techniques={"bf16": {}, "int8_dynamic": {}})
    assert start_trial(both, [8], space, ("eager",), pairs) is None
