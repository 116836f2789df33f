"""Which configurations confirmation re-measures, and the extra pass when it changes the pick."""

from __future__ import annotations

import pytest

from pareto.front import Candidate
from pareto.limits import Constraints
from pareto.study import confirmation
from pareto.study.confirmation import ConfirmedItem, ConfirmResult, choose, confirm_pick


def cand(trial: int, acc: float, upper: float | None, *, memory: int = 100) -> Candidate:
    metrics = {
        "accuracy": acc,
        "latency_p99_ms": (upper or 9.0) * 0.8,
        "latency_p99_lower_ms": 0.1,
        "latency_p99_upper_ms": upper,
        "samples": 680,
        "params_bytes": memory,
        "memory_bytes": memory,
    }
    return Candidate("s", trial, {"batch_size": 1, "techniques": []}, f"config {trial}", metrics, {})


def test_choose_takes_the_near_feasible_in_pick_order_dominated_or_not() -> None:
    cands = [
        cand(1, 0.95, 5.0),
        cand(2, 0.94, 6.0),
        cand(3, 0.99, 20.0),
        cand(4, 0.97, 10.0),
        cand(5, 0.98, 6.5, memory=10**9),
        cand(6, 0.96, None),
    ]
    limits = Constraints(p99_ms=7.0, max_memory_bytes=10**6)
    # 3 is too far (20 > 1.5 x 7), 5 breaks the memory budget, 6 has no bound; 2 is dominated by 1 but kept
    assert [c.trial for c in choose(cands, limits, ["accuracy", "p99"], top=5, margin=1.5)] == [4, 1, 2]
    assert [c.trial for c in choose(cands, limits, ["accuracy", "p99"], top=2, margin=1.5)] == [4, 1]


def test_a_pick_changed_by_confirmation_is_confirmed_in_another_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    store = {1: cand(1, 0.95, 5.0), 2: cand(2, 0.94, 6.0)}
    widened = {1: 8.0, 2: 6.5}  # confirmed bounds: 1 no longer meets 7 ms, 2 still does
    calls: list[list[int]] = []

    def fake_confirm(
        bench: object,
        study_id: int,
        picks: list[Candidate],
        limits: Constraints,
        *,
        seed: int | None = None,
        held: bool = False,
    ) -> ConfirmResult:
        calls.append([p.trial for p in picks])
        for p in picks:
            store[p.trial].metrics["latency_p99_upper_ms"] = widened[p.trial]
            store[p.trial].confirmation = {"rounds": 20}
        items = [ConfirmedItem(p.trial, p.description, False, {}, {}, "met", None) for p in picks]
        return ConfirmResult("s", run=len(calls), environment="k", runs=[len(calls)], items=items)

    monkeypatch.setattr(confirmation, "confirm", fake_confirm)
    result = confirm_pick(
        None,
        1,
        lambda: list(store.values()),
        Constraints(p99_ms=7.0),  # type: ignore[arg-type]
        ["accuracy", "p99"],
        top=1,
        margin=1.5,
    )
    assert calls == [[1], [2]]  # 2 was dominated by 1 until 1's confirmed bound missed the SLO
    assert [item.trial for item in result.items] == [1, 2] and result.runs == [1, 2]


def test_confirming_another_machines_configuration_drops_its_machine_fields(db_url: str) -> None:
    from sqlalchemy import select

    import pareto
    from pareto.spec import SearchSpec
    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Environment, Measurement
    from pareto.study.search import run_search

    spec = SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_task",
            "study": "elsewhere",
            "slo": {"p99": "1s"},
            "search": {"n_trials": 2, "seed": 1, "confirm_top": 0},
            "measure": {"device": "cpu", "threads": 1, "warmup": 5, "throughput_sweep": True, "contention_limit": 50},
            "space": {"techniques": {"int8_dynamic": {}}},
        }
    )
    run_search(spec, db_url=db_url)
    engine = open_engine(db_url)
    with session_scope(engine) as session:  # the study was measured on another machine
        env = session.scalars(select(Environment)).one()
        env.key, env.hostname = "0" * 16, "other-host"
    pareto.confirm(study="elsewhere", environment="0000", top=1, db=db_url, threads=1)
    with session_scope(engine) as session:
        rows = session.scalars(select(Measurement).order_by(Measurement.id)).all()
        there = [m for m in rows if m.environment.key == "0" * 16]
        here = [m for m in rows if m.environment.key != "0" * 16]
        assert there and all(m.throughput_curve for m in there if m.kind == "search")
        assert here and all(m.kind == "confirm" and m.throughput_curve is None for m in here)
