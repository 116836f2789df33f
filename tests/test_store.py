from __future__ import annotations

from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session

from pareto.errors import StoreError
from pareto.store import queries, trials
from pareto.store.engine import (
    VERSION_TABLE,
    alembic_config,
    current_revision,
    open_engine,
    require_schema,
    resolve_url,
    session_scope,
    upgrade,
)
from pareto.store.models import Environment, Measurement, Run, Study, Trial


def _revisions(engine) -> list[str]:
    script = ScriptDirectory.from_config(alembic_config(engine))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def test_upgrade_from_empty_creates_tables(db_url: str) -> None:
    engine = open_engine(db_url)
    assert current_revision(engine) is None
    upgrade(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"pareto_studies", "pareto_trials", "pareto_measurements", "pareto_environments", VERSION_TABLE} <= tables
    assert current_revision(engine) == _revisions(engine)[-1]
    upgrade(engine)  # idempotent
    assert current_revision(engine) == _revisions(engine)[-1]


def test_every_migration_upward_keeps_data(db_url: str) -> None:
    """Walk the history one revision at a time from the first, with a measured trial stored from the first on."""
    engine = open_engine(db_url)
    revisions = _revisions(engine)
    assert revisions[0] == "0001" and len(revisions) >= 2
    upgrade(engine, revisions[0])
    now = "CURRENT_TIMESTAMP"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO pareto_environments (id, key, device, device_name, torch_version, cpu_model, threads, "
                f"hostname, details, created_at) VALUES (1, 'k', 'cpu', 'x', '2.4', 'x', 2, 'h', '{{}}', {now})"
            )
        )
        conn.execute(
            text(
                "INSERT INTO pareto_studies (id, name, task, spec, created_at, updated_at) "
                f"VALUES (1, 'kept', 'demo', '{{}}', {now}, {now})"
            )
        )
        conn.execute(
            text(
                "INSERT INTO pareto_trials (id, study_id, optuna_number, state, config, config_key, description, "
                "is_baseline, batch_size, environment_id, started_at) VALUES "
                f"(1, 1, 0, 'COMPLETE', '{{}}', 'c', 'baseline @ batch 1', TRUE, 1, 1, {now})"
            )
        )
        for number, error in (
            (1, "int8_dynamic failed on this model: boom"),
            (2, "interrupted by the user"),
            (3, "OperationalError: database is locked"),
            (4, "lowrank(rank_ratio=0.1) ran out of memory on cuda:0 at batch 8 (OutOfMemoryError: ...)"),
        ):
            conn.execute(
                text(
                    "INSERT INTO pareto_trials (id, study_id, optuna_number, state, config, config_key, description, "
                    "is_baseline, batch_size, environment_id, started_at, error) VALUES "
                    f"({number + 1}, 1, {number}, 'FAILED', '{{}}', 'f{number}', 'x', FALSE, 1, 1, {now}, '{error}')"
                )
            )
        conn.execute(
            text(
                "INSERT INTO pareto_measurements (trial_id, environment_id, accuracy, batch_size, latency_mean_ms, "
                "latency_p50_ms, latency_p90_ms, latency_p99_ms, latency_p999_ms, p99_p50_ratio, samples, warmup, "
                "confidence, method, throughput_per_s, params_bytes, theoretical_bytes, compression_ratio, created_at) "
                f"VALUES (1, 1, 0.9, 1, 1.0, 1.0, 1.5, 2.0, 3.0, 2.0, 662, 50, 0.95, 'm', 1000, 10, 10, 1.0, {now})"
            )
        )
    for revision in revisions[1:]:
        upgrade(engine, revision)
        assert current_revision(engine) == revision
    with session_scope(engine) as session:
        assert session.scalars(select(Study.name)).all() == ["kept"]
        m = session.scalars(select(Measurement)).one()
        assert m.latency_p99_ms == 2.0 and m.trial.description == "baseline @ batch 1"
        # 0003: a two-sided 95 % interval's ends are one-sided 97.5 % bounds; the row is a search measurement
        assert m.confidence == pytest.approx(0.975) and m.kind == "search" and m.rounds is None
        # 0006: the row knows its study, and it is the one the queries use
        assert m.study_id == 1 and m.preferred is True
        # 0009: a configuration that broke is known from then on; an interrupted trial is not
        known = dict(session.execute(select(Trial.optuna_number, Trial.config_failed)).all())
        assert known == {0: False, 1: True, 2: False, 3: False, 4: False}
        session.add(
            Measurement(
                **{c.name: getattr(m, c.name) for c in Measurement.__table__.columns if c.name not in {"id", "kind"}},
                kind="confirm",
            )
        )  # several per trial now
    with session_scope(engine) as session:
        rows = session.scalars(select(Measurement).order_by(Measurement.id)).all()
        assert [(r.kind, r.preferred) for r in rows] == [("search", False), ("confirm", True)]  # a confirmation wins


def test_the_models_match_the_migrations(db_url: str) -> None:
    """The metric columns come from ``pareto.metrics.Metrics``: a field without a migration fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from pareto.store.models import Base

    engine = open_engine(db_url)
    upgrade(engine)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
    assert [d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)] == []


def test_our_history_and_optunas_share_one_database(db_url: str) -> None:
    import optuna

    engine = open_engine(db_url)
    upgrade(engine)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(db_url)
    optuna.create_study(study_name="s", storage=storage)
    tables = set(inspect(engine).get_table_names())
    assert "alembic_version" in tables and VERSION_TABLE in tables  # two separate histories
    assert current_revision(engine) == _revisions(engine)[-1]
    storage.remove_session()
    storage.engine.dispose()


#: the columns a measurement row must have
_MEASURED = {
    "accuracy": 0.9,
    "batch_size": 1,
    "latency_mean_ms": 1,
    "latency_p50_ms": 1,
    "latency_p90_ms": 1,
    "latency_p99_ms": 2,
    "latency_p99_upper_ms": 2.5,
    "latency_p999_ms": 3,
    "p99_p50_ratio": 2,
    "samples": 662,
    "warmup": 10,
    "confidence": 0.95,
    "method": "m",
    "throughput_per_s": 1000,
    "params_bytes": 4 * 10**9,
    "theoretical_bytes": 10,
    "compression_ratio": 1.0,
}


def test_rows_round_trip(db_url: str) -> None:
    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        env = Environment(
            key="k",
            device="cpu",
            device_name="x",
            torch_version="2",
            cpu_model="x",
            threads=2,
            hostname="h",
            details={"a": 1},
        )
        study = Study(name="s", task="demo", spec={"slo": {"p99": 7.0}})
        session.add_all([env, study])
        session.flush()
        trial = Trial(
            study_id=study.id,
            optuna_number=0,
            config={"batch_size": 1, "techniques": []},
            config_key="c",
            description="baseline @ batch 1",
            is_baseline=True,
            batch_size=1,
            environment_id=env.id,
            state="COMPLETE",
        )
        session.add(trial)
        session.flush()
        session.add(Measurement(trial_id=trial.id, environment_id=env.id, **_MEASURED))
    with session_scope(engine) as session:
        m = session.scalars(select(Measurement)).one()
        assert m.params_bytes == 4 * 10**9  # BigInteger: past 2 GiB
        assert m.trial.study.spec == {"slo": {"p99": 7.0}}


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path}/w.db")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() > 0


def test_unwritable_path_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_engine(f"sqlite:///{tmp_path}/missing/dir/p.db")


def test_queries_never_create_a_database(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(StoreError, match="No database"):
        open_engine(f"sqlite:///{path}", create=False)
    assert not path.exists()
    engine = open_engine(f"sqlite:///{tmp_path}/empty.db")
    with pytest.raises(StoreError, match="no pareto studies"):
        require_schema(engine)


def test_resolve_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARETO_DB_URL", raising=False)
    assert resolve_url(None) == "sqlite:///pareto.db"
    assert resolve_url("x.db") == "sqlite:///x.db"
    assert resolve_url("postgresql://u@h/d") == "postgresql+psycopg://u@h/d"
    monkeypatch.setenv("PARETO_DB_URL", "sqlite:///env.db")
    assert resolve_url(None) == "sqlite:///env.db"
    with pytest.raises(StoreError, match="Cannot open database"):
        open_engine(resolve_url("nonsense://x/y"))


def test_the_probe_quiet_time_is_the_median_of_recent_runs(db_url: str) -> None:
    from pareto.store.models import Run
    from pareto.store.queries import QUIET_RUNS, probe_quiet_ms

    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        assert probe_quiet_ms(session, "k") is None
        env = Environment(key="k", device="cpu", device_name="x", torch_version="2", cpu_model="x", threads=2,
                          hostname="h", details={})  # fmt: skip
        session.add(env)
        session.flush()
        # an old lucky low, then recent references (one taken on a busy machine)
        for ref in [0.1] + [2.0, 2.2, 1.9, 9.0] * 3:
            session.add(Run(kind="search", environment_id=env.id, hostname="h", pid=1, probe_reference_ms=ref,
                            details={}))  # fmt: skip
    with session_scope(engine) as session:
        assert QUIET_RUNS == 10
        assert probe_quiet_ms(session, "k") == pytest.approx(
            2.1
        )  # the lucky low has aged out; the busy one is outvoted


def test_a_percent_sign_in_the_url_reaches_alembic_unchanged() -> None:
    from sqlalchemy import create_engine

    from pareto.store.engine import alembic_config

    # a URL-encoded password ("p%40ss") is not ConfigParser interpolation
    url = "postgresql+psycopg://u:p%40ss@127.0.0.1:1/x"
    config = alembic_config(create_engine(url))
    assert config.get_main_option("sqlalchemy.url") == url


def test_queries_refuse_a_schema_at_another_revision(db_url: str) -> None:
    """A database an older pareto wrote is not read with columns it lacks: one sentence says how to migrate."""
    from pareto.store.engine import HEAD_REVISION

    engine = open_engine(db_url)
    revisions = _revisions(engine)
    assert revisions[-1] == HEAD_REVISION  # the code's revision is the migrations' head
    upgrade(engine, revisions[-2])
    with pytest.raises(StoreError, match=f"at schema revision {revisions[-2]} and this pareto reads {HEAD_REVISION}"):
        require_schema(engine)
    upgrade(engine)
    require_schema(engine)


def test_a_server_database_connection_gives_up_after_a_timeout_unless_the_url_sets_one(tmp_path: Path) -> None:
    """A PostgreSQL server that accepts and never answers must not hang a worker or a health check."""
    import socket
    import time

    from pareto.store.engine import CONNECT_TIMEOUT_S, engine_kwargs

    assert engine_kwargs("postgresql+psycopg://u@h/db")["connect_args"] == {"connect_timeout": CONNECT_TIMEOUT_S}
    assert "connect_args" not in engine_kwargs("postgresql+psycopg://u@h/db?connect_timeout=3")  # the URL's own
    pytest.importorskip("psycopg")
    with socket.socket() as silent:  # listens, never speaks: connecting waits for the server's first message
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreError, match="Cannot open database"):
            open_engine(f"postgresql+psycopg://u@127.0.0.1:{port}/db?connect_timeout=1")
        assert time.monotonic() - started < 30


def study_and_environment(session: Session) -> tuple[Environment, Study]:
    """A study "s" and an environment "k", stored (ids assigned) in ``session``."""
    env = Environment(
        key="k", device="cpu", device_name="x", torch_version="2", cpu_model="x", threads=1, hostname="h", details={}
    )
    study = Study(name="s", task="demo", spec={})
    session.add_all([env, study])
    session.flush()
    return env, study


def test_two_noisy_nights_in_a_row_leave_the_answer_where_it_was(db_url: str) -> None:
    # a night's confirmations are stored held and promoted only when it ends with a verdict: two noisy (or
    # interrupted) nights in a row leave the search's measurement preferred; a night with a verdict
    # promotes its latest confirmation, and only one measurement per trial and environment is preferred
    engine = open_engine(db_url)
    upgrade(engine)
    with session_scope(engine) as session:
        env, study = study_and_environment(session)
        trial = Trial(
            study_id=study.id,
            optuna_number=0,
            config={},
            config_key="c",
            description="d",
            is_baseline=True,
            batch_size=1,
            environment_id=env.id,
            state="COMPLETE",
        )
        session.add(trial)
        session.flush()

        def measure(kind: str, p99: float, held: bool = False) -> tuple[int, int]:
            run = Run(study_id=study.id, kind=kind, environment_id=env.id, hostname="h", pid=1)
            session.add(run)
            session.flush()
            fields = {**_MEASURED, "latency_p99_ms": p99}
            row = Measurement(trial_id=trial.id, environment_id=env.id, run_id=run.id, kind=kind, **fields)
            row.held = held
            session.add(row)
            session.flush()
            return run.id, row.id

        def preferred() -> list[int]:
            return list(
                session.scalars(select(Measurement.id).where(Measurement.trial_id == trial.id, Measurement.preferred))
            )

        def answered() -> tuple[int | None, int]:
            """What a repeat of the configuration is answered with, and the baseline speedups divide by."""
            twin = trials.measured_twin(session, study.id, env.id, "c", exclude_id=-1)
            _, latest = queries._baselines(session, study, env)
            return (twin.id if twin is not None else None), latest[(env.id, 1)].id

        _, searched = measure("search", 2.0)
        for night in range(2):  # noisy: nothing promoted, nothing answered from what it held
            run, _ = measure("confirm", 13.0 + night, held=True)
            assert preferred() == [searched]
            assert trials.held_count(session, [run]) == 1
            assert answered() == (searched, searched)
        night_runs = [measure("confirm", 3.0, held=True)[0], measure("confirm", 2.5, held=True)[0]]
        assert preferred() == [searched]
        assert trials.promote(session, night_runs) == 1
        latest = session.scalars(select(Measurement.id).where(Measurement.run_id == night_runs[1])).one()
        assert preferred() == [latest]
        assert answered() == (latest, latest)
