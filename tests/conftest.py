"""Shared fixtures: every database test body runs on SQLite and, when configured, on PostgreSQL."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "PARETO_TEST_POSTGRES_URL"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # the demo model is trained once per test session, never into the user's home
    monkeypatch.setenv("PARETO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("PARETO_DB_URL", raising=False)


def _postgres_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text

    base = os.environ[POSTGRES_ENV]
    name = f"pareto_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = base.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A fresh, empty database URL of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/pareto.db"
        return
    if not os.environ.get(POSTGRES_ENV):
        pytest.skip(f"set {POSTGRES_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test) to run on PostgreSQL")
    yield from _postgres_database()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the heap of imports and collected tests: every measurement collects the garbage before it
    times (``pareto.measure.latency``), and without this each collection walks the whole suite's heap
    (about a tenth of a second a measurement, several minutes a run)."""
    gc.collect()
    gc.freeze()
