"""Nothing half-written, nothing leaked: atomic migrations, hidden passwords, one sentence for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, inspect, select
from sqlalchemy.engine import Engine

from pareto.errors import UsageError
from pareto.store.engine import current_revision, migrations_dir, open_engine, session_scope, upgrade

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-Pa55"

#: A child that upgrades the database in argv[1] and is killed (os._exit(9), as kill -9 would) inside
#: migration 0003: right after its first DDL ("create_table"), or after its tables were copied ("execute").
_CRASH = """
import os, sys
from alembic import op

point = sys.argv[2]
original = getattr(op, point)

def crash(*args, **kwargs):
    if point == "execute":
        os._exit(9)
    original(*args, **kwargs)
    os._exit(9)

setattr(op, point, crash)
from pareto.store.engine import open_engine, upgrade
upgrade(open_engine(sys.argv[1]))
"""

#: A child that waits for argv[2] to exist, then upgrades the database in argv[1].
_UPGRADE_ON_GO = """
import os, sys, time
while not os.path.exists(sys.argv[2]):
    time.sleep(0.005)
from pareto.store.engine import open_engine, upgrade
upgrade(open_engine(sys.argv[1]))
print("upgraded")
"""


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    assert head is not None
    return head


def _tables(db_url: str) -> set[str]:
    engine = create_engine(db_url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


# --- A. migrations are atomic --------------------------------------------------------------------


@pytest.mark.parametrize("point", ["create_table", "execute"])
def test_a_migration_killed_halfway_leaves_the_database_as_it_was(db_url: str, point: str) -> None:
    engine = open_engine(db_url)
    upgrade(engine, "0002")
    before = _tables(db_url)
    engine.dispose()
    proc = _child(_CRASH, db_url, point)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 9, stderr
    engine = open_engine(db_url)
    assert current_revision(engine) == "0002"
    after = _tables(db_url)
    assert after == before, f"left behind: {sorted(after - before)}"
    assert not any(name.startswith("_alembic_tmp") for name in after)
    assert "run_id" not in {c["name"] for c in inspect(engine).get_columns("pareto_measurements")}
    upgrade(engine)  # the rerun reaches the head
    assert current_revision(engine) == _head()
    if engine.dialect.name == "sqlite":  # off while the migration copied tables, on again for everything else
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_two_upgrades_at_once_from_an_empty_database_both_succeed(db_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [_child(_UPGRADE_ON_GO, db_url, str(go)) for _ in range(2)]
    time.sleep(1.5)  # both children imported and waiting
    go.touch()
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert "upgraded" in stdout
    engine = open_engine(db_url)
    assert current_revision(engine) == _head()
    engine.dispose()


# --- B. secrets stay secret ----------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``pareto ARGS`` in this process: its exit code, stdout and stderr (an escaping exception fails the test)."""
    from pareto._cli.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_sentence(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [["best"], ["studies"], ["studies", "--json"], ["db", "upgrade"], ["history"], ["studies", "delete", "s", "--yes"]],
)
@pytest.mark.parametrize("port", ["1", "notaport"])
def test_a_database_that_cannot_be_reached_never_shows_its_password(
    capsys: pytest.CaptureFixture[str], command: list[str], port: str
) -> None:
    code, out, err = _run(capsys, *command, "--db", f"postgresql://u:{SECRET}@127.0.0.1:{port}/x")
    line = _one_sentence(err)
    assert code != 0 and SECRET not in out + err, out + err
    assert "u:***@127.0.0.1" in line
    if port == "notaport":  # a port that is not a number is bad input: exit 2
        assert code == 2 and "Cannot read database URL" in line


def test_a_url_that_does_not_parse_never_shows_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "best", "--db", f"postgresql://u:{SECRET}@[::1/x")
    assert code == 2 and SECRET not in out + err and "u:***@" in _one_sentence(err), err


def test_pareto_prints_no_password_of_a_database_it_uses(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy.engine import make_url

    from pareto.api import create_study
    from pareto.spec import load_spec

    if make_url(db_url).get_backend_name() == "sqlite":
        pytest.skip("a SQLite URL holds no password")
    url = make_url(db_url).set(password=SECRET).render_as_string(hide_password=False)  # trust auth ignores it
    create_study(load_spec(None, {"task": "demo", "study": "s"}), db=url)
    shown = ""
    for command in (["db", "upgrade"], ["studies"], ["studies", "--json"], ["history", "--study", "s", "--json"]):
        code, out, err = _run(capsys, *command, "--db", url)
        assert code == 0, err
        shown += out + err
    assert "postgres:***@" in shown and SECRET not in shown, shown
    code, out, err = _run(capsys, "studies", "delete", "s", "--yes", "--db", url)
    assert code == 0 and SECRET not in out + err, err


# --- C. one sentence for bad input -----------------------------------------------------------------


def test_a_newer_paretos_database_is_refused_in_one_sentence(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy import text

    from pareto.store.engine import HEAD_REVISION, VERSION_TABLE

    engine = open_engine(db_url)
    upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    for command in (["best"], ["studies"], ["db", "upgrade"]):
        code, _, err = _run(capsys, *command, "--db", db_url)
        line = _one_sentence(err)
        assert code != 0 and "newer pareto" in line and "9999" in line and HEAD_REVISION in line, line
        assert "db upgrade" not in line, line  # an upgrade cannot help


@pytest.mark.parametrize("name", ["", "   ", "x" * 300])
def test_a_study_name_the_database_cannot_hold_is_refused_up_front(
    db_url: str, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from pareto.api import create_study
    from pareto.spec import load_spec

    code, _, err = _run(capsys, "studies", "create", "--task", "demo", "--study", name, "--db", db_url)
    assert code == 2 and "study name" in _one_sentence(err), err
    for command in (["best"], ["search", "--task", "demo"]):
        code, _, err = _run(capsys, *command, "--study", name, "--db", db_url)
        assert code == 2 and "study name" in _one_sentence(err), err
    with pytest.raises(UsageError, match="study name"):  # a config's study: or the Python API
        create_study(load_spec(None, {"task": "demo", "study": name}), db=db_url)
    engine = open_engine(db_url)
    assert "pareto_studies" not in inspect(engine).get_table_names() or not _study_names(engine)
    engine.dispose()


def test_the_study_name_limits_agree() -> None:
    from pareto._cli.options import MAX_STUDY_NAME
    from pareto.study.studies import MAX_STUDY_NAME as COLUMN_SIZE

    assert MAX_STUDY_NAME == COLUMN_SIZE


def _study_names(engine: Engine) -> list[str]:
    from pareto.store.models import Study

    with session_scope(engine) as session:
        return list(session.scalars(select(Study.name)))


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Makes a file read-only for this process: chmod 444, or for root (whom chmod does not stop) the
    immutable attribute; skips where neither is possible. Undone after the test."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o444)
        elif subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a file system without chattr +i: no way to make a file read-only")
        made.append(path)
        if os.access(path, os.W_OK):
            pytest.skip(f"{path} is still writable for this process")

    yield make
    for path in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        path.chmod(0o644)


def test_writing_a_read_only_sqlite_file_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], read_only: Callable[[Path], None]
) -> None:
    from pareto.api import create_study
    from pareto.spec import load_spec

    path = tmp_path / "pareto.db"
    db = f"sqlite:///{path}"
    create_study(load_spec(None, {"task": "demo", "study": "s"}), db=db)
    read_only(path)
    for command in (["studies", "create", "--task", "demo", "--study", "t"], ["db", "upgrade"]):
        code, _, err = _run(capsys, *command, "--db", db)
        assert code != 0 and "read-only" in _one_sentence(err), err
    code, _, err = _run(capsys, "studies", "delete", "s", "--yes", "--db", db)  # a reader's open, then a write
    assert code != 0 and "read-only" in _one_sentence(err), err
    code, out, err = _run(capsys, "studies", "--json", "--db", db)  # reading still works
    assert code == 0 and '"s"' in out, err


def test_two_first_runs_at_once_store_one_environment(db_url: str) -> None:
    # the second process's select found no row, the first's insert came before the second's: the
    # second's insert loses on the unique key and it takes the first's row
    from pareto.measure.environment import fingerprint
    from pareto.store.models import Environment
    from pareto.study.bench import _stored_environment

    fp = fingerprint("cpu", 1)
    other = open_engine(db_url)
    upgrade(other)
    ids: list[int] = []

    def first_run_inserts_meanwhile(_mapper: Any, _connection: Any, target: Environment) -> None:
        with session_scope(other) as session:
            row = Environment(**{c.key: getattr(target, c.key) for c in Environment.__table__.columns if c.key != "id"})
            session.add(row)
            session.flush()
            ids.append(row.id)

    event.listen(Environment, "before_insert", first_run_inserts_meanwhile, once=True)
    try:
        engine, env_id, *_ = _stored_environment(db_url, fp, read_only=False)
    finally:
        if event.contains(Environment, "before_insert", first_run_inserts_meanwhile):
            event.remove(Environment, "before_insert", first_run_inserts_meanwhile)
    assert engine is not None and ids and env_id == ids[0]
    with session_scope(other) as session:
        assert list(session.scalars(select(Environment.id))) == ids
    engine.dispose()
    other.dispose()


def test_deleting_a_study_that_fails_halfway_leaves_both_tables(db_url: str) -> None:
    import optuna

    from pareto import api
    from pareto.spec import load_spec

    api.create_study(load_spec(None, {"task": "demo", "study": "s"}), db=db_url)

    def fail_on_optunas_delete(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM STUDIES"):
            raise RuntimeError("the database went away")

    event.listen(Engine, "before_cursor_execute", fail_on_optunas_delete)
    try:
        with pytest.raises(Exception, match="went away"):
            api.delete_study("s", db=db_url)
    finally:
        event.remove(Engine, "before_cursor_execute", fail_on_optunas_delete)
    assert [r["study"] for r in api.studies(db=db_url)] == ["s"]
    assert optuna.get_all_study_names(storage=db_url) == ["s"]
    removed = api.delete_study("s", db=db_url)  # and without the failure, both go
    assert removed["optuna"] == "deleted" and api.studies(db=db_url) == []
    assert optuna.get_all_study_names(storage=db_url) == []
