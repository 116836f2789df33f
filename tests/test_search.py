"""A short search on a tiny task, end to end, on every database."""

from __future__ import annotations

import optuna
import pytest
from sqlalchemy import select

import pareto
from pareto.errors import NoFeasibleConfiguration, UsageError
from pareto.search import run_search
from pareto.spec import SearchSpec
from pareto.store.engine import open_engine, session_scope
from pareto.store.models import Measurement, Trial

SPACE = {
    "techniques": {
        "int8_dynamic": {},
        "prune_structured": {"ratio": [0.25, 0.5]},
        "lowrank": {"rank_ratio": {"low": 0.1, "high": 0.5}},
    }
}


def spec(**changes: object) -> SearchSpec:
    data = {
        "task": "tests.tiny_task:make_task",
        "study": "tiny",
        "slo": {"p99": "1s"},
        "search": {"n_trials": 5, "seed": 1},
        "measure": {"device": "cpu", "threads": 1, "warmup": 5},
        "space": SPACE,
    }
    data.update(changes)
    return SearchSpec.model_validate(data)


def test_search_stores_trials_and_best_answers(db_url: str) -> None:
    result = run_search(spec(), db_url=db_url)
    assert result.trials_run == 5 and not result.interrupted
    engine = open_engine(db_url)
    with session_scope(engine) as session:
        trials = session.scalars(select(Trial).order_by(Trial.optuna_number)).all()
        assert len(trials) == 5
        assert trials[0].is_baseline and trials[0].state == "COMPLETE"  # the baseline is always first
        measurements = session.scalars(select(Measurement)).all()
        assert all(m.samples == 662 and m.latency_p99_upper_ms is not None for m in measurements)
        assert all(t.compress_s is not None for t in trials if t.state == "COMPLETE")
    pick = pareto.best(study="tiny", db=db_url)
    assert set(pick) == {"study", "trial", "config", "metrics", "slo", "environment"}
    for key in ("accuracy", "latency_p50_ms", "latency_p99_ms", "latency_p99_upper_ms", "samples",
                "params_bytes", "compression_ratio", "speedup_p99"):
        assert key in pick["metrics"]
    assert pick["metrics"]["latency_p99_upper_ms"] <= 1000
    assert pick["slo"]["p99_verdict"] == "met"
    front = pareto.frontier(study="tiny", db=db_url)
    assert front and all(set(f) == set(pick) for f in front)
    assert [s["study"] for s in pareto.studies(db=db_url)] == ["tiny"]


def test_second_run_continues_the_study(db_url: str) -> None:
    run_search(spec(search={"n_trials": 3, "seed": 1}), db_url=db_url)
    result = run_search(spec(search={"n_trials": 2, "seed": 1}), db_url=db_url)
    assert result.trials_run == 2
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="tiny", storage=db_url)
    assert len(study.trials) == 5
    engine = open_engine(db_url)
    with session_scope(engine) as session:
        numbers = session.scalars(select(Trial.optuna_number).order_by(Trial.optuna_number)).all()
        baselines = session.scalars(select(Trial).where(Trial.is_baseline, Trial.state == "COMPLETE")).all()
    assert numbers == [0, 1, 2, 3, 4]
    assert len(baselines) == 1  # not measured again in the same environment


def test_failing_technique_fails_the_trial_and_the_search_goes_on(db_url: str) -> None:
    s = spec(
        task="tests.tiny_task:make_fragile_task",
        study="fragile",
        search={"n_trials": 4, "seed": 0, "sampler": "random"},
        space={"techniques": {"int8_dynamic": {}}},
    )
    result = run_search(s, db_url=db_url)
    assert result.trials_run == 4
    with session_scope(open_engine(db_url)) as session:
        trials = session.scalars(select(Trial)).all()
    failed = [t for t in trials if t.state == "FAILED"]
    assert failed, "random sampling over on/off should hit the technique at least once in 4 trials"
    assert all("int8_dynamic" in t.error and "could not be measured" in t.error for t in failed)
    assert any(t.state == "COMPLETE" for t in trials)


def test_unavailable_technique_is_skipped_once_with_the_reason(db_url: str) -> None:
    notices: list[str] = []

    class Collect:
        def start(self, **_: object) -> None: ...
        def notice(self, message: str) -> None: notices.append(message)
        def trial_done(self, *_: object) -> None: ...

    s = spec(task="tests.tiny_task:make_single_layer_task", study="single", search={"n_trials": 2},
             space={"techniques": {"prune_structured": {"ratio": [0.5]}, "int8_dynamic": {}}})
    run_search(s, db_url=db_url, reporter=Collect())
    skipped = [n for n in notices if n.startswith("Skipping technique prune_structured")]
    assert len(skipped) == 1
    with session_scope(open_engine(db_url)) as session:
        assert all("prune_structured" not in t.description for t in session.scalars(select(Trial)).all())


def test_no_feasible_configuration_names_the_closest(db_url: str) -> None:
    run_search(spec(search={"n_trials": 2, "seed": 1}), db_url=db_url)
    with pytest.raises(NoFeasibleConfiguration, match="closest is trial"):
        pareto.best(study="tiny", slo_p99="1ns", db=db_url)


def test_unknown_study_and_bad_task(db_url: str) -> None:
    run_search(spec(search={"n_trials": 1}), db_url=db_url)
    with pytest.raises(UsageError, match="No study named 'nosuch'; known studies: tiny"):
        pareto.best(study="nosuch", db=db_url)
    with pytest.raises(UsageError, match="belongs to task"):
        run_search(spec(task="tests.tiny_task:make_single_layer_task"), db_url=db_url)


@pytest.mark.parametrize(
    ("task", "phrase"),
    [
        ("nosuchtask", "Unknown task 'nosuchtask'"),
        ("tests.nosuch_module:make", "could not be imported"),
        ("tests.tiny_task:nosuch", "has no callable 'nosuch'"),
        ("tests.tiny_task:make_broken_task", "failed: RuntimeError: weights file missing"),
        ("tests.tiny_task:make_mismatched_task", "does not accept example_input"),
    ],
)
def test_task_errors_are_one_sentence(tmp_path, task: str, phrase: str) -> None:
    with pytest.raises(UsageError, match=phrase) as info:
        run_search(spec(task=task), db_url=f"sqlite:///{tmp_path}/p.db")
    assert "\n" not in str(info.value)
