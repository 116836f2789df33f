"""The budget goes to configurations that can run: a failure is known, a technique that breaks the model
alone leaves the space before the first trial, and a technique that changes nothing is dropped."""

from __future__ import annotations

from collections import Counter

import optuna
import pytest
from sqlalchemy import select

from pareto.spec import SearchSpec
from pareto.store.engine import open_engine, session_scope
from pareto.store.models import TechniqueCheck, Trial
from pareto.study import search as search_module
from pareto.study import space_checks
from pareto.study.search import run_search

QUICK = {"device": "cpu", "threads": 1, "samples": 40, "rounds": 4, "warmup": 2, "contention_limit": 50}


def spec(task: str, study: str, space: dict, **search: object) -> SearchSpec:
    return SearchSpec.model_validate(
        {
            "task": f"tests.tiny_task:{task}",
            "study": study,
            "slo": {"p99": "1s"},
            "search": {"n_trials": 10, "seed": 0, "confirm_top": 0, "keep": ["int8_dynamic"], **search},
            "measure": QUICK,
            "space": {"techniques": space},
        }
    )


class Notices(search_module.Quiet):
    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, message: str) -> None:
        self.notices.append(message)


WIDTHS = {"prune_structured": {"ratio": [0.25, 0.375, 0.5, 0.625]}, "int8_dynamic": {}}


@pytest.mark.parametrize("sampler", ["tpe", "gp", "nsga2", "random", "grid"])
def test_a_failed_configuration_is_built_once_and_the_sampler_is_told_it_is_infeasible(
    db_url: str, sampler: str
) -> None:
    # prune_structured at 0.375 and 0.625 leaves widths the model cannot take (4 of the 10 configurations);
    # enough trials to propose every configuration, the failures again and again
    s = spec("make_width_sensitive_task", "widths", WIDTHS, sampler=sampler, n_trials=12)
    result = run_search(s, db_url=db_url)
    assert result.exhausted  # the whole space tried, or the sampler keeps to what it measured
    with session_scope(open_engine(db_url)) as session:
        rows = session.scalars(select(Trial)).all()
    failed = [r for r in rows if r.state == "FAILED"]
    assert 1 <= len(failed) <= 4 and all(r.config_failed for r in failed)
    if sampler in ("random", "grid"):  # blind to results: they try the whole space
        assert len(failed) == 4 and "all 10 configurations" in result.exhausted
    assert all("0.375" in r.description or "0.625" in r.description for r in failed)
    # each one built once: a repeat is answered from the database with the stored reason
    assert max(Counter(r.config_key for r in failed).values()) == 1
    repeats = [r for r in rows if r.state == "DUPLICATE" and r.config_key in {f.config_key for f in failed}]
    study = optuna.load_study(study_name="widths", storage=db_url)
    by_number = {t.number: t for t in study.trials}
    for row in failed + repeats:
        told = by_number[row.optuna_number]
        # a complete trial (what the Gaussian process and NSGA-II learn from), every constraint violated
        assert told.state == optuna.trial.TrialState.COMPLETE and told.user_attrs["pareto_failed"]
        assert told.constraints and all(v > 0 for v in told.constraints.values())
    # told with the worst values seen before it: it dominates nothing
    complete = [t for t in study.trials if "pareto_failed" not in t.user_attrs and t.state.name == "COMPLETE"]
    for row in failed:
        before = [t.values[0] for t in complete if t.number < row.optuna_number]
        assert by_number[row.optuna_number].values[0] == min(before)


def test_a_repeat_of_a_failure_in_a_later_run_is_not_built_again(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = spec("make_width_sensitive_task", "widths", {"prune_structured": {"ratio": [0.25, 0.375]}}, sampler="grid")
    run_search(s, db_url=db_url)
    with session_scope(open_engine(db_url)) as session:
        [failed] = session.scalars(select(Trial).where(Trial.state == "FAILED")).all()
    assert "0.375" in failed.description and "not a multiple of 16" in (failed.error or "")
    # the next run: the sampler proposes the failed configuration again; it is answered, not built
    real_suggest = search_module.suggest
    monkeypatch.setattr(
        search_module,
        "suggest",
        lambda trial, *a, **kw: real_suggest(trial, *a, **kw).model_copy(update={"techniques": failed_technique}),
    )
    failed_technique = tuple(search_module.Config.from_dict(failed.config).techniques)

    def never(*_: object, **__: object) -> None:
        raise AssertionError("a known failure was built again")

    monkeypatch.setattr(search_module, "assess", never)
    notices = Notices()
    outcomes: list[object] = []
    notices.trial_done = lambda outcome, best: outcomes.append(outcome)  # type: ignore[method-assign]
    result = run_search(s.model_copy(update={"search": s.search.model_copy(update={"sampler": "random"})}),
                        db_url=db_url, reporter=notices)  # fmt: skip
    assert result.trials_run == result.repeats >= 1
    [outcome] = outcomes[:1]
    assert outcome.state == "DUPLICATE"
    assert f"repeat of trial {failed.optuna_number}, which failed here" in outcome.error
    with session_scope(open_engine(db_url)) as session:
        states = session.scalars(select(Trial.state).where(Trial.config_key == failed.config_key)).all()
    assert states.count("FAILED") == 1


def test_a_technique_that_breaks_the_model_alone_leaves_the_space_before_the_first_trial(db_url: str) -> None:
    space = {"bf16": {}, "prune_structured": {"ratio": [0.25, 0.5]}, "int8_dynamic": {}}
    s = spec("make_cast_sensitive_task", "casts", space, keep=["bf16", "int8_dynamic"], n_trials=6)
    notices = Notices()
    result = run_search(s, db_url=db_url, reporter=notices)
    said = [n for n in notices.notices if n.startswith("Leaving out bf16")]
    assert len(said) == 1 and "on its own it failed on this model" in said[0] and "dtype" in said[0]
    with session_scope(open_engine(db_url)) as session:
        rows = session.scalars(select(Trial)).all()
        checks = session.scalars(select(TechniqueCheck).where(TechniqueCheck.kind == "runs")).all()
    assert not any("bf16" in r.description for r in rows)  # not one trial spent on it
    assert not any(r.state == "FAILED" for r in rows) and result.measured >= 4
    assert {c.technique: c.ok for c in checks} == {"bf16": False, "prune_structured": True, "int8_dynamic": True}


def test_the_checks_are_stored_and_read_by_the_next_run(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = spec("make_cast_sensitive_task", "casts", {"bf16": {}, "int8_dynamic": {}}, keep=["bf16", "int8_dynamic"])
    small = s.model_copy(update={"search": s.search.model_copy(update={"n_trials": 1})})
    run_search(small, db_url=db_url)
    taken: list[str] = []
    real = space_checks.runs_alone
    monkeypatch.setattr(
        space_checks,
        "runs_alone",
        lambda task, config, **kw: taken.append(config.describe()) or real(task, config, **kw),
    )
    notices = Notices()
    run_search(small, db_url=db_url, reporter=notices)
    assert taken == ["baseline @ batch 8"]  # the model itself runs (a cheap forward); the rest is stored
    assert any(n.startswith("Leaving out bf16") for n in notices.notices)


def test_a_technique_that_changes_nothing_is_dropped_and_the_trial_is_its_smaller_twin(db_url: str) -> None:
    # low-rank at 0.4 shrinks the 64-wide layers; after pruning 75 % of the units (16 left) its rank, 6,
    # is under min_rank 8 everywhere: together, the configuration is structured pruning alone
    space = {"prune_structured": {"ratio": [0.75]}, "lowrank": {"rank_ratio": [0.4]}}
    notices = Notices()
    s = spec("make_task", "noop", space, sampler="grid", n_trials=6)
    result = run_search(s, db_url=db_url, reporter=notices)
    assert result.exhausted and "all 4 configurations" in result.exhausted
    with session_scope(open_engine(db_url)) as session:
        rows = session.scalars(select(Trial)).all()
        same = session.scalars(select(TechniqueCheck).where(TechniqueCheck.kind == "same_as")).all()
    assert not any(r.state == "FAILED" for r in rows)
    # each row is what was measured: never both techniques
    assert not any("prune_structured" in r.description and "lowrank" in r.description for r in rows)
    assert result.measured == 3  # the baseline, pruning, low-rank; the pair was one of them
    [said] = [n for n in notices.notices if "no nn.Linear layer gets smaller" in n]
    assert said.startswith("Trial ") and ("measured as prune_structured" in said or "a repeat of trial" in said)
    assert [(c.technique, c.details["config"]["techniques"][0]["name"]) for c in same] == [
        ("lowrank", "prune_structured")
    ]


def test_a_technique_that_changes_nothing_anywhere_leaves_the_space(db_url: str) -> None:
    # at rank ratio 0.9 no 64-wide layer gets smaller: low-rank changes nothing on this model
    space = {"int8_dynamic": {}, "lowrank": {"rank_ratio": [0.9]}}
    notices = Notices()
    result = run_search(spec("make_task", "noop", space, n_trials=4), db_url=db_url, reporter=notices)
    [said] = [n for n in notices.notices if n.startswith("Leaving out lowrank")]
    assert "changes nothing on this model" in said
    assert result.exhausted and "all 2 configurations" in result.exhausted
