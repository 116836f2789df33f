"""One measurement per configuration: the claim through the database, whatever the commit order, and the
verdict written whole (COMPLETE with its measurement). The same bodies run on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine

from pareto.store import trials
from pareto.store.engine import open_engine, session_scope, upgrade
from pareto.store.models import Measurement, Trial
from pareto.store.records import NewTrial
from pareto.store.storage import _trial_row
from pareto.study import claims
from pareto.study.claims import Claims
from tests.test_store import _MEASURED as _METRICS
from tests.test_store import study_and_environment


@pytest.fixture
def store(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Claims]]:
    monkeypatch.setattr(claims, "TWIN_POLL_S", 0.05)
    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        env, study = study_and_environment(session)
        ids = study.id, env.id
    yield engine, Claims(engine, *ids, slo_ms=None)
    engine.dispose()


def _row(claimer: Claims, number: int, key: str = "cfg") -> Any:
    def make(**fields: Any) -> NewTrial:
        return NewTrial(
            study_id=claimer.study_id,
            optuna_number=number,
            config={},
            config_key=key,
            description=key,
            is_baseline=False,
            batch_size=1,
            environment_id=claimer.env_id,
            **fields,
        )

    return make


def _measure(engine: Engine, claimer: Claims, row_id: int) -> bool:
    with session_scope(engine) as session:
        row = Measurement(trial_id=row_id, environment_id=claimer.env_id, kind="search", **_METRICS)
        return trials.complete_trial(session, row_id, row)


def _measurements(engine: Engine) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count(Measurement.id))) or 0)


def _interleave(target: Any, identifier: str, first: Any, second: Any, when: Any = None) -> None:
    """Run ``first`` in thread A until it reaches the ORM event ``identifier`` of ``target`` (inside its
    open transaction; ``when(*event_args)`` picks which), then ``second`` in thread B for half a second
    while A waits there; then both end."""
    reached, go = threading.Event(), threading.Event()

    def pause(*args: Any) -> None:
        if threading.current_thread().name == "A" and (when is None or when(*args)):
            reached.set()
            assert go.wait(30)

    event.listen(target, identifier, pause)
    try:
        a = threading.Thread(target=first, name="A")
        a.start()
        assert reached.wait(30)
        b = threading.Thread(target=second, name="B")
        b.start()
        b.join(0.5)
        go.set()
        a.join(60)
        b.join(60)
    finally:
        go.set()
        event.remove(target, identifier, pause)


def test_a_configuration_is_claimed_once_when_the_first_claim_commits_last(store: tuple[Engine, Claims]) -> None:
    # A's claim gets its id first and commits last (on PostgreSQL ids follow the sequence, not the commit
    # order); B claims meanwhile. One of them measures; the other is answered by its measurement.
    engine, claimer = store
    results: dict[str, Any] = {}
    tried = {"A": threading.Event(), "B": threading.Event()}

    def worker(name: str, number: int) -> None:
        row_id, twin = claimer.claim(_row(claimer, number), "cfg", waiting=tried[name].set)
        tried[name].set()
        if twin is None:  # measuring takes long: the other worker has tried to claim by the time it ends
            assert all(e.wait(30) for e in tried.values())
            _measure(engine, claimer, row_id)
        results[name] = twin

    # B tries to claim while A's claim is inserted and not committed
    _interleave(
        engine,
        "after_cursor_execute",
        lambda: worker("A", 0),
        lambda: worker("B", 1),
        when=lambda _conn, _cursor, statement, *_: statement.startswith("INSERT INTO pareto_trials"),
    )
    assert sorted(twin is None for twin in results.values()) == [False, True]
    assert _measurements(engine) == 1
    with session_scope(engine) as session:
        states = sorted(session.scalars(select(Trial.state)))
    assert states == ["COMPLETE", "DUPLICATE"]


def test_a_twin_waiting_between_complete_and_the_measurement_is_answered_by_it(store: tuple[Engine, Claims]) -> None:
    # A writes COMPLETE and is paused before its measurement; B asks meanwhile and must not measure again
    engine, claimer = store
    row_id, twin = claimer.claim(_row(claimer, 0), "cfg", waiting=lambda: None)
    assert twin is None
    answered: list[Any] = []
    _interleave(
        Measurement,
        "before_insert",
        lambda: _measure(engine, claimer, row_id),
        lambda: answered.append(claimer.claim(_row(claimer, 1), "cfg", waiting=lambda: None)),
    )
    [(_, twin_of_b)] = answered
    assert twin_of_b is not None and twin_of_b.number == 0 and twin_of_b.metrics["accuracy"] == 0.9
    assert _measurements(engine) == 1


def test_a_waiting_twin_claims_again_when_the_first_ends_without_a_verdict(store: tuple[Engine, Claims]) -> None:
    engine, claimer = store
    first, _ = claimer.claim(_row(claimer, 0), "cfg", waiting=lambda: None)
    polls: list[int] = []

    def interrupt_first() -> None:  # the first trial's worker is interrupted while the second waits
        polls.append(1)
        with session_scope(engine) as session:
            trials.finish_trial(session, first, "FAILED", "interrupted by the user")

    second, twin = claimer.claim(_row(claimer, 1), "cfg", waiting=interrupt_first)
    assert twin is None and second != first and polls == [1]
    assert _measure(engine, claimer, second)
    assert _measurements(engine) == 1


def test_a_worker_taken_for_dead_never_turns_failed_into_complete(store: tuple[Engine, Claims]) -> None:
    engine, claimer = store
    row_id, _ = claimer.claim(_row(claimer, 0), "cfg", waiting=lambda: None)
    with session_scope(engine) as session:  # what Optuna's heartbeat callback does to a silent worker
        trials.finish_trial(session, row_id, "FAILED", "its worker stopped (no heartbeat for 120 s)")
    assert not _measure(engine, claimer, row_id)
    with session_scope(engine) as session:
        assert session.get(Trial, row_id).state == "FAILED"
        assert trials.finish_trial(session, row_id, "PRUNED", "rejected") is None
    assert _measurements(engine) == 0


def test_waiting_past_the_limit_stores_the_trial_busy(
    store: tuple[Engine, Claims], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pareto.errors import MachineBusy

    engine, claimer = store
    claimer.claim(_row(claimer, 0), "cfg", waiting=lambda: None)
    monkeypatch.setattr(claims, "TWIN_WAIT_S", 0.0)
    with pytest.raises(MachineBusy, match="another worker"):
        claimer.claim(_row(claimer, 1), "cfg", waiting=lambda: None)
    with session_scope(engine) as session:
        assert sorted(session.scalars(select(Trial.state))) == ["BUSY", "RUNNING"]


def test_two_confirmations_stored_at_once_leave_one_preferred(store: tuple[Engine, Claims]) -> None:
    # `pareto confirm` racing a nightly: each demotes the preferred measurement it sees and stores its own;
    # the second waits for the first (the trial's row is locked), so it sees and demotes the first's
    engine, claimer = store
    row_id, _ = claimer.claim(_row(claimer, 0), "cfg", waiting=lambda: None)
    assert _measure(engine, claimer, row_id)
    errors: list[BaseException] = []

    def confirm() -> None:
        try:
            with session_scope(engine) as session:
                session.add(Measurement(trial_id=row_id, environment_id=claimer.env_id, kind="confirm", **_METRICS))
        except BaseException as exc:
            errors.append(exc)

    _interleave(Measurement, "after_insert", confirm, confirm)
    assert not errors, errors
    with session_scope(engine) as session:
        kinds = session.execute(select(Measurement.kind, Measurement.preferred).order_by(Measurement.id)).all()
    assert [tuple(k) for k in kinds] == [("search", False), ("confirm", False), ("confirm", True)]


def test_the_data_version_moves_once_with_every_transaction_that_writes(store: tuple[Engine, Claims]) -> None:
    from sqlalchemy.exc import IntegrityError

    from pareto.store.version import data_version

    engine, claimer = store
    start = data_version(engine)
    with session_scope(engine) as session:  # reads only
        session.scalars(select(Trial)).all()
    assert data_version(engine) == start
    claimer.claim(_row(claimer, 0), "cfg", waiting=lambda: None)
    assert data_version(engine) == start + 1
    with session_scope(engine) as session:  # a write, then a savepoint that rolls back: the write stays
        session.add(_trial_row(_row(claimer, 1, key="other")(state="BUSY")))
        session.flush()
        try:
            with session.begin_nested():
                session.add(_trial_row(_row(claimer, 1, key="again")(state="BUSY")))  # the same Optuna number
        except IntegrityError:
            pass
    assert data_version(engine) == start + 2


def test_a_claim_that_loses_leaves_the_data_version_where_it_was(store: tuple[Engine, Claims]) -> None:
    from pareto.store import storage
    from pareto.store.version import data_version

    engine, claimer = store
    first, _ = storage.claim(engine, _row(claimer, 0), "cfg", replacing=None, slo_ms=None, busy=None)
    assert first is not None
    before = data_version(engine)
    for number in range(1, 4):  # a waiting worker tries again every second: serve's kept answers stay good
        assert storage.claim(engine, _row(claimer, number), "cfg", replacing=None, slo_ms=None, busy=None) == (
            None,
            None,
        )
    assert data_version(engine) == before
    storage.claim(engine, _row(claimer, 9, key="other"), "other", replacing=None, slo_ms=None, busy=None)
    assert data_version(engine) == before + 1  # a claim that stores a row still moves it


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_claim_its_trial_left_behind_is_released(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna

    from pareto.store import storage
    from pareto.study import studies

    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        env, study = study_and_environment(session)
        study_id, name = study.id, study.name
        claimer = Claims(engine, study_id, env.id, slo_ms=None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna_study = optuna.create_study(study_name=name, storage=studies.optuna_storage(db_url, engine, study_id))
    trial = optuna_study.ask()
    row_id, _ = storage.claim(engine, _row(claimer, trial.number), "cfg", replacing=None, slo_ms=None, busy=None)
    assert row_id is not None
    optuna_study.tell(trial, state=optuna.trial.TrialState.FAIL)  # the trial ended; pareto's handler never ran
    assert studies.fail_orphaned_claims(engine, study_id, optuna_study) == []  # within the grace: left alone
    monkeypatch.setattr(studies, "ORPHAN_GRACE_S", -1.0)
    assert studies.fail_orphaned_claims(engine, study_id, optuna_study) == [trial.number]
    again, twin = storage.claim(engine, _row(claimer, 1), "cfg", replacing=None, slo_ms=None, busy=None)
    assert again is not None and twin is None  # claimed at once, not after TWIN_WAIT_S
    with session_scope(engine) as session:
        assert session.get(Trial, row_id).state == "FAILED"
    engine.dispose()


def test_a_worker_whose_trial_was_taken_over_goes_on_with_its_search(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a worker stopped (SIGSTOP) past its heartbeat's grace: another failed its trial; when it resumes, its
    # result is refused (nothing stored) and its search goes on with the next trial instead of ending
    from pareto.store import storage
    from pareto.study.search import run_search
    from tests.test_search import spec

    db = f"sqlite:///{tmp_path}/p.db"
    real = storage.complete_trial
    taken: list[int] = []

    def taken_over_once(engine: Engine, trial_id: int, **kwargs: Any) -> None:
        number, baseline = _number(engine, trial_id)
        if not taken and not baseline:  # a failed baseline stops a search by design: take over a compressed one
            taken.append(trial_id)
            storage.fail_stale_trial(engine, kwargs["study_id"], number, "taken for dead")
        real(engine, trial_id, **kwargs)

    monkeypatch.setattr(storage, "complete_trial", taken_over_once)
    result = run_search(spec(search={"n_trials": 3, "seed": 1, "confirm_top": 0}), db_url=db)
    assert taken and result.trials_run >= 3  # the search went on past the trial taken over
    with session_scope(open_engine(db)) as session:
        assert session.get(Trial, taken[0]).state == "FAILED"
        assert session.scalar(select(func.count(Trial.id)).where(Trial.state == "COMPLETE")) >= 2


def _number(engine: Engine, trial_id: int) -> tuple[int, bool]:
    with session_scope(engine) as session:
        row = session.get(Trial, trial_id)
        assert row is not None
        return row.optuna_number, row.is_baseline
