"""Database URLs, engines (SQLite in WAL mode with a busy timeout) and schema upgrades."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from pareto.errors import DatabasePathError, StoreError, UsageError, message_line

DEFAULT_URL = "sqlite:///pareto.db"
#: Our own Alembic history lives beside Optuna's (which uses ``alembic_version``) without colliding.
VERSION_TABLE = "pareto_alembic_version"
SQLITE_BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
#: The revision this code reads and writes: the head of ``migrations/versions`` (a test keeps them equal).
HEAD_REVISION = "0009"


def resolve_url(db: str | None = None) -> str:
    """``--db`` first, then ``PARETO_DB_URL``, then ``sqlite:///pareto.db``; a bare path means SQLite."""
    url = db or os.environ.get("PARETO_DB_URL") or DEFAULT_URL
    if "://" not in url:
        url = f"sqlite:///{url}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        # psycopg 3 is the driver we install; SQLAlchemy's bare scheme means psycopg2
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    try:
        make_url(url)
    except ArgumentError as exc:
        raise UsageError(f"Cannot read database URL {url!r}; use e.g. sqlite:///pareto.db.") from exc
    return url


def engine_kwargs(url: str) -> dict[str, Any]:
    """Keyword arguments for ``create_engine`` shared with Optuna's RDB storage.

    A server that accepts the connection and never answers would hang a worker or ``pareto serve``'s
    health check: connecting gives up after ``CONNECT_TIMEOUT_S`` unless the URL sets its own
    ``connect_timeout``.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
    if "connect_timeout" in parsed.query:
        return {"pool_pre_ping": True}
    return {"pool_pre_ping": True, "connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}


def open_engine(url: str, *, create: bool = True) -> Engine:
    """An engine for ``url``; with ``create=False`` a missing SQLite file is an error, not a new file.

    Raises:
        StoreError: the database cannot be reached or the SQLite path cannot be written.
    """
    check_path(url, create=create)
    is_sqlite = make_url(url).get_backend_name() == "sqlite"
    try:
        engine = create_engine(url, **engine_kwargs(url))
    except ImportError as exc:
        raise StoreError(
            f"Cannot open database {_safe(url)}: its driver is not installed ({exc.name or exc}); "
            "for PostgreSQL: pip install 'pareto-slo[postgres]'."
        ) from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"Cannot open database {_safe(url)}: {_first_line(exc)}.") from exc
    if is_sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        raise StoreError(f"Cannot open database {_safe(url)}: {_first_line(exc)}.") from exc
    return engine


def check_path(url: str, *, create: bool = True) -> None:
    """Fail early, and without creating anything, when a SQLite path cannot be used.

    Raises:
        DatabasePathError: a query's database file is missing, or the folder for a new one is not there.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    path = Path(parsed.database)
    if not create and not path.exists():
        raise DatabasePathError(f"No database at {path}; run 'pareto search' first or pass --db.")
    if create and not path.parent.exists():
        raise DatabasePathError(f"Cannot create database {path}: folder {path.parent} does not exist.")
    if create and not os.access(path.parent, os.W_OK):
        raise DatabasePathError(f"Cannot write database {path}: folder {path.parent} is not writable.")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers (pareto best) run while a search writes; the busy timeout waits out writers
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def immediate_transactions(engine: Engine) -> None:
    """On SQLite, every transaction of ``engine`` takes the write lock when it begins (``BEGIN IMMEDIATE``).

    Python's driver begins a transaction only at the first write, so a read-then-write (Optuna taking a
    queued trial: read it WAITING, write RUNNING; optuna/optuna#4002) reads outside any lock, and two
    workers can both take one trial. With the lock taken first, the second waits (up to the busy timeout)
    and then reads RUNNING. SQLAlchemy's recipe for the driver: its own transaction handling off, BEGIN
    emitted by the engine. PostgreSQL needs none of this (Optuna reads there with SELECT ... FOR UPDATE).
    """
    if engine.dialect.name != "sqlite":
        return
    event.listen(engine, "connect", _driver_transactions_off)
    event.listen(engine, "begin", lambda connection: connection.exec_driver_sql("BEGIN IMMEDIATE"))
    engine.dispose()  # a connection pooled before the listeners came would still begin the driver's way


def _driver_transactions_off(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None


def migrations_dir() -> Path:
    return Path(str(resources.files("pareto._migrations")))


def alembic_config(engine: Engine) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser reads "%" as interpolation: a URL-encoded password ("p%40ss") must be escaped
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring pareto's tables up to ``revision`` (Optuna migrates its own tables itself)."""
    from alembic import command

    cfg = alembic_config(engine)
    try:
        with engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)
    except SQLAlchemyError as exc:
        raise StoreError(f"Cannot migrate database {_safe(str(engine.url))}: {_first_line(exc)}.") from exc


def current_revision(engine: Engine) -> str | None:
    from sqlalchemy import text

    if not inspect(engine).has_table(VERSION_TABLE):
        return None
    with engine.connect() as connection:
        return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def require_schema(engine: Engine) -> None:
    """Queries read an existing schema and never create or migrate one.

    Raises:
        StoreError: the database has no pareto tables yet, or they are at another revision.
    """
    if not inspect(engine).has_table("pareto_studies"):
        raise StoreError(f"Database {_safe(str(engine.url))} has no pareto studies yet; run 'pareto search' first.")
    revision = current_revision(engine)
    if revision != HEAD_REVISION:
        raise StoreError(
            f"Database {_safe(str(engine.url))} is at schema revision {revision or 'none'} and this pareto reads "
            f"{HEAD_REVISION}; migrate it with 'pareto db upgrade --db URL' (any 'pareto search' does it too)."
        )


def existing_engine(url: str) -> Engine:
    """A new engine on an existing pareto database at this code's revision (never creates one).

    Raises:
        DatabasePathError: no SQLite file there. StoreError: unreachable, no pareto tables, or
            another schema revision.
    """
    engine = open_engine(url, create=False)
    require_schema(engine)
    return engine


#: Engines of the databases this process reads, kept open across queries (``pareto serve``, loops);
#: the least recently used is closed beyond ``ENGINE_CACHE`` of them.
_ENGINES: OrderedDict[str, Engine] = OrderedDict()
_ENGINES_LOCK = threading.Lock()
ENGINE_CACHE = 8


def read_engine(db: str | None) -> Engine:
    """An engine on an existing pareto database (never creates one), reused across calls: the read
    side's one engine cache (``db`` as ``--db`` takes it; None for $PARETO_DB or the default)."""
    url = resolve_url(db)
    check_path(url, create=False)  # one stat: a SQLite file moved away is an error, never a new empty file
    with _ENGINES_LOCK:
        engine = _ENGINES.get(url)
        if engine is not None:
            _ENGINES.move_to_end(url)
            return engine
    engine = existing_engine(url)
    with _ENGINES_LOCK:
        _ENGINES[url] = engine
        while len(_ENGINES) > ENGINE_CACHE:
            _, old = _ENGINES.popitem(last=False)
            old.dispose()
    return engine


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    factory = sessionmaker(engine, expire_on_commit=False)
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _first_line(exc: BaseException) -> str:
    """A database error's first line: the driver's own error (``orig``) when SQLAlchemy wraps one."""
    orig = getattr(exc, "orig", None) or exc
    return message_line(orig, empty=type(orig).__name__)
