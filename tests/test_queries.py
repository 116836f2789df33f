"""best and frontier answered by the database agree with the rules applied to every trial in Python.

The queries filter and sort in SQL over the measurement each trial uses (``preferred``, kept on
insert); the reference here loads every row and applies ``pareto.frontier``'s rules as the queries
did before, on random studies full of ties, confirmations, unbounded P99s, failed trials and two
environments, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import select

import pareto
from pareto.errors import NoFeasibleConfiguration
from pareto.front import Candidate, frontier, objective_metrics, select_best
from pareto.limits import Constraints
from pareto.metrics import FIELD_NAMES, Metrics
from pareto.store.engine import open_engine, session_scope, upgrade
from pareto.store.models import Environment, Measurement, Study, Trial


def _metrics(rng: random.Random) -> dict[str, Any]:
    upper = rng.choice([None, 2.0, 4.0, 6.0, 7.0, 9.0])
    values = {
        "accuracy": rng.choice([0.80, 0.85, 0.90, 0.95]),  # few values: ties between trials
        "batch_size": 8,
        "latency_mean_ms": 1.0,
        "latency_p50_ms": 1.0,
        "latency_p90_ms": 1.5,
        "latency_p99_ms": (upper or 8.0) * 0.9,
        "latency_p99_lower_ms": (upper or 8.0) * 0.8,
        "latency_p99_upper_ms": upper,
        "latency_p999_ms": 10.0,
        "p99_p50_ratio": 2.0,
        "samples": rng.choice([100, 662, 700]),
        "warmup": 5,
        "confidence": 0.99,
        "method": "test rows",
        "throughput_per_s": rng.choice([500.0, 1000.0, 2000.0]),
        "params_bytes": rng.choice([100, 200, 400]),
        "theoretical_bytes": 100,
        "compression_ratio": 1.0,
        "memory_bytes": rng.choice([None, 150, 300, 600]),
    }
    return {name: values.get(name) for name in FIELD_NAMES}


def _fill(db_url: str, seed: int, objectives: list[str]) -> None:
    rng = random.Random(seed)
    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        envs = []
        for key in ("env-a", "env-b"):
            env = Environment(
                key=key,
                device="cpu",
                device_name="cpu",
                torch_version="2",
                cpu_model="x",
                threads=2,
                hostname=key,
                details={},
            )
            session.add(env)
            envs.append(env)
        study = Study(name="s", task="demo", spec={"objectives": objectives})
        session.add(study)
        session.flush()
        for number in range(80):
            state = rng.choice(["COMPLETE"] * 6 + ["FAILED", "DUPLICATE"])
            trial = Trial(
                study_id=study.id,
                optuna_number=number,
                state=state,
                config={"n": number},
                config_key=str(number),
                description=f"config {number}",
                is_baseline=number == 0,
                batch_size=8,
            )
            session.add(trial)
            session.flush()
            if state != "COMPLETE":
                continue
            for env in rng.sample(envs, rng.choice([1, 1, 2])):
                kinds = ["search", *rng.choice([[], [], ["confirm"], ["confirm", "confirm"], ["remeasure"]])]
                for kind in kinds:
                    session.add(Measurement(trial_id=trial.id, environment_id=env.id, kind=kind, **_metrics(rng)))
                    session.flush()  # one row at a time, in order, as measurements arrive


def _reference(db_url: str, environment: str) -> list[Candidate]:
    """Every completed trial's metrics in one environment: its latest confirmation, else its first search row."""
    engine = open_engine(db_url, create=False)
    with session_scope(engine) as session:
        rows = session.execute(
            select(Measurement, Trial.optuna_number, Trial.description)
            .join(Trial)
            .join(Environment, Environment.id == Measurement.environment_id)
            .where(Trial.state == "COMPLETE", Environment.key == environment)
            .order_by(Measurement.id)
        ).all()
        chosen: dict[int, tuple[Measurement, int, str]] = {}
        for m, number, description in rows:
            if m.kind == "confirm" or (m.kind == "search" and number not in chosen):
                chosen[number] = (m, number, description)
        return [
            Candidate(
                "s",
                number,
                {},
                description,
                Metrics.from_row(m).to_dict(),
                {},
                confirmation=({"rounds": None} if m.kind == "confirm" else None),
            )
            for m, number, description in chosen.values()
        ]


CONSTRAINTS = [
    Constraints(p99_ms=7.0),
    Constraints(p99_ms=6.0, min_accuracy=0.85),
    Constraints(p99_ms=9.0, max_memory_bytes=300),
    Constraints(p99_ms=1.0),  # nothing meets it: the closest is named
    Constraints(min_accuracy=0.99),
    Constraints(),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("objectives", [["accuracy", "p99"], ["accuracy", "p99", "memory"]])
def test_best_and_frontier_agree_with_the_rules_applied_to_every_trial(
    db_url: str, seed: int, objectives: list[str]
) -> None:
    _fill(db_url, seed, objectives)
    for environment in ("env-a", "env-b"):
        reference = _reference(db_url, environment)
        for constraints in CONSTRAINTS:
            memory = constraints.max_memory_bytes
            kwargs = dict(
                study="s",
                slo_p99=constraints.p99_ms,
                min_accuracy=constraints.min_accuracy,
                max_memory=memory,
                environment=environment,
                db=db_url,
            )
            try:
                expected: int | str = select_best(reference, constraints, study="s").trial
            except NoFeasibleConfiguration as exc:
                expected = str(exc)
            try:
                got: int | str = pareto.best(**kwargs)["trial"]
            except NoFeasibleConfiguration as exc:
                got = str(exc)
            assert got == expected, (environment, constraints)
            front = [row["trial"] for row in pareto.frontier(**kwargs)]
            assert front == [c.trial for c in frontier(reference, objective_metrics(objectives))]
