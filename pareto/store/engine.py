"""Database URLs, engines (SQLite in WAL mode with a busy timeout) and schema upgrades."""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from pareto.errors import DatabasePathError, StoreError, UsageError, message_line, redact
from pareto.locks import advisory_key
from pareto.store.version import ParetoSession  # bumps the data version when it writes

T = TypeVar("T")

DEFAULT_URL = "sqlite:///pareto.db"
#: Our own Alembic history lives beside Optuna's (which uses ``alembic_version``) without colliding.
VERSION_TABLE = "pareto_alembic_version"
SQLITE_BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
#: The revision this code reads and writes: the head of ``migrations/versions`` (a test keeps them equal).
HEAD_REVISION = "0013"


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
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise UsageError(
            f"Cannot read database URL {display_url(url)!r} ({message_line(exc)}); use e.g. sqlite:///pareto.db "
            "or postgresql://user@host:5432/db."
        ) from exc
    return url


def display_url(url: str | URL) -> str:
    """A database URL as pareto prints it: the password, and query values named like secrets
    (``?password=…``, ``sslpassword``), replaced by ``***``, even in a URL that does not parse. Every URL
    pareto prints (errors, ``pareto db``, ``pareto serve``) goes through here."""
    if isinstance(url, URL):
        return redact(url.render_as_string(hide_password=True))
    try:
        return redact(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        # greedy up to the last "@": a password may hold an unescaped "@"
        return redact(re.sub(r"^([^:/]*://[^:/@]*:).*@", r"\1***@", url))


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
            f"Cannot open database {display_url(url)}: its driver is not installed ({exc.name or exc}); "
            "for PostgreSQL: pip install 'pareto-slo[postgres]'."
        ) from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"Cannot open database {display_url(url)}: {_first_line(exc)}.") from exc
    if is_sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        raise StoreError(f"Cannot open database {display_url(url)}: {_first_line(exc)}.") from exc
    return engine


def check_path(url: str, *, create: bool = True) -> None:
    """Fail early, and without creating anything, when a SQLite path cannot be used.

    Raises:
        DatabasePathError: a query's database file is missing, the folder for a new one is not there, or
            a writer's file or folder cannot be written.
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
    if create and path.exists() and not os.access(path, os.W_OK):
        raise DatabasePathError(f"Cannot write database {path}: the file is read-only.")


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


#: The name of the lock two processes migrating one PostgreSQL database take in turn.
MIGRATION_LOCK = "pareto-migrations"


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring pareto's tables up to ``revision`` (Optuna migrates its own tables itself).

    All of it or nothing: the whole upgrade, every revision it crosses and the version row, is one
    transaction (``migration_connection``), so a process killed halfway leaves the database at the
    revision it had. Two processes upgrading one database at once take turns; the second finds it done.

    Raises:
        StoreError: the migration failed (nothing of it stays), or the database was written by a newer
            pareto than this one.
    """
    from alembic import command
    from alembic.util.exc import CommandError

    cfg = alembic_config(engine)
    try:
        with migration_connection(engine) as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)
    except CommandError as exc:
        stored = current_revision(engine)
        if stored is not None and stored not in known_revisions():
            raise StoreError(newer_schema_message(engine, stored)) from exc
        raise StoreError(f"Cannot migrate database {display_url(engine.url)}: {message_line(exc)}.") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"Cannot migrate database {display_url(engine.url)}: {_first_line(exc)}.") from exc


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in one transaction that holds the database's migration lock, for ``upgrade``.

    PostgreSQL runs DDL in transactions: the lock is ``pg_advisory_xact_lock``, released with the
    transaction. SQLite does too, but Python's driver in its default (legacy) mode commits each DDL
    statement on its own: the migration gets an engine of its own with SQLAlchemy's recipe (the
    driver's transaction handling off, ``BEGIN IMMEDIATE`` emitted, which takes the write lock first)
    and foreign keys off while tables are copied (``batch_alter_table`` drops and renames them; SQLite's
    procedure for schema changes), checked before the commit instead.
    """
    if engine.dialect.name != "sqlite":
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                key = advisory_key(MIGRATION_LOCK)
                connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            yield connection
        return
    url = engine.url.render_as_string(hide_password=False)
    migrating = create_engine(url, **engine_kwargs(url))
    event.listen(migrating, "connect", _migration_pragmas)
    event.listen(migrating, "begin", lambda connection: connection.exec_driver_sql("BEGIN IMMEDIATE"))
    try:
        with migrating.begin() as connection:
            yield connection
            _check_foreign_keys(connection, engine)
    finally:
        migrating.dispose()


def _migration_pragmas(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # BEGIN and COMMIT are ours: DDL no longer commits by itself
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    # a table copied by batch mode is dropped: with foreign keys on, its rows' children would go too
    cursor.execute("PRAGMA foreign_keys=OFF")
    cursor.close()


def _check_foreign_keys(connection: Connection, engine: Engine) -> None:
    """Raises StoreError (so the migration's transaction rolls back) when a pareto row lost its parent."""
    broken = {row[0] for row in connection.exec_driver_sql("PRAGMA foreign_key_check") if row[0].startswith("pareto_")}
    if broken:
        raise StoreError(
            f"Cannot migrate database {display_url(engine.url)}: rows of {', '.join(sorted(broken))} would refer "
            "to rows that do not exist; nothing was changed."
        )


def known_revisions() -> set[str]:
    """Every revision in ``migrations/versions``: the ones this code can read or migrate from."""
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory(str(migrations_dir())).walk_revisions()}


def newer_schema_message(engine: Engine, stored: str) -> str:
    return (
        f"Database {display_url(engine.url)} was written by a newer pareto than this one (schema revision "
        f"{stored}; this pareto knows up to {HEAD_REVISION}); upgrade pareto to use it."
    )


def current_revision(engine: Engine) -> str | None:
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
        raise StoreError(f"Database {display_url(engine.url)} has no pareto studies yet; run 'pareto search' first.")
    revision = current_revision(engine)
    if revision is not None and revision != HEAD_REVISION and revision not in known_revisions():
        raise StoreError(newer_schema_message(engine, revision))
    if revision != HEAD_REVISION:
        raise StoreError(
            f"Database {display_url(engine.url)} is at schema revision {revision or 'none'} and this pareto reads "
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
    factory = sessionmaker(engine, class_=ParetoSession, expire_on_commit=False)
    session = factory()
    try:
        yield session
        session.commit()
    except OperationalError as exc:
        session.rollback()
        if "readonly database" in str(exc.orig):  # SQLite's file (or its folder) cannot be written
            raise StoreError(
                f"Cannot write database {display_url(engine.url)}: it is read-only; nothing was changed."
            ) from exc
        raise
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def get_or_create(session: Session, find_or_add: Callable[[Session], T]) -> T:
    """``find_or_add(session)`` (a select, and an insert when it found nothing), safe when another process
    inserts the same row between the two: that insert loses on the unique key, the transaction rolls
    back and the select runs again, finding the other's row. Call it first in its session: the
    rollback takes what the session did before it."""
    try:
        return find_or_add(session)
    except IntegrityError:
        session.rollback()
        return find_or_add(session)


def _first_line(exc: BaseException) -> str:
    """A database error's first line: the driver's own error (``orig``) when SQLAlchemy wraps one."""
    orig = getattr(exc, "orig", None) or exc
    return message_line(orig, empty=type(orig).__name__)
