"""Inputs that once ended in a traceback or leaked a secret, each answered in one sentence now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pareto._cli.cli import main
from pareto.errors import UsageError, redact
from pareto.store.engine import display_url
from pareto.units import parse_size_bytes


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?password=s3cret&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
        ("postgresql+psycopg://u@h/db?sslpassword=x", "postgresql+psycopg://u@h/db?sslpassword=***"),
        ("sqlite:///p.db", "sqlite:///p.db"),
    ],
)
def test_a_url_is_printed_without_its_secrets(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_a_command_line_is_stored_without_its_secrets() -> None:
    line = "pareto search --db postgresql://u:pw@h:5432/db?sslpassword=k --study x api_token=abc"
    assert redact(line) == "pareto search --db postgresql://u:***@h:5432/db?sslpassword=*** --study x api_token=***"


def test_the_timing_lock_note_holds_no_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto import locks

    monkeypatch.setattr("sys.argv", ["pareto", "search", "--db", "postgresql://u:hunter2@h/db"])
    note = tmp_path / "cpu.lock.holder"
    locks._write_holder(note, None)
    assert "hunter2" not in note.read_text() and "u:***@h" in json.loads(note.read_text())["what"]


@pytest.mark.parametrize("size", ["1e999GB", "1e30GB", "9.3e18B"])
def test_a_size_no_database_column_holds_is_refused(size: str) -> None:
    with pytest.raises(UsageError, match="over the 8 EiB a database stores"):
        parse_size_bytes(size)


def test_the_heartbeat_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.study.studies import heartbeat_interval_s

    monkeypatch.setenv("PARETO_HEARTBEAT_S", "abc")
    with pytest.raises(UsageError, match="PARETO_HEARTBEAT_S is 'abc'; give whole seconds"):
        heartbeat_interval_s()
    monkeypatch.setenv("PARETO_HEARTBEAT_S", "5")
    assert heartbeat_interval_s() == 5


def test_a_deeply_nested_config_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 5000)
    assert main(["search", "--config", str(deep), "--db", f"sqlite:///{tmp_path}/p.db"]) != 0
    assert "nests deeper than a YAML search spec can" in capsys.readouterr().err


def test_a_study_name_with_markup_prints_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path}/p.db"
    assert main(["studies", "create", "--study", "a[/]", "--db", db]) == 0
    assert "Study 'a[/]' is ready" in capsys.readouterr().out
    assert main(["studies", "delete", "a[/]", "--yes", "--db", db]) == 0
    assert "Deleted study 'a[/]'" in capsys.readouterr().out


def test_a_nightly_summary_folder_it_cannot_write_is_refused_before_the_night(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    config = tmp_path / "nightly.yaml"
    config.write_text(f"task: tests.tiny_task:make_task\nnightly:\n  summary_dir: {blocked / 'reports'}\n")
    code = main(["nightly", "--config", str(config), "--db", f"sqlite:///{tmp_path}/p.db"])
    err = capsys.readouterr().err
    assert code != 0 and "Cannot write the nightly summary to" in err and "Traceback" not in err


def test_best_asks_again_when_a_confirmation_lands_between_its_two_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from unittest import mock

    from pareto.errors import StoreError
    from pareto.limits import Constraints
    from pareto.store import queries

    session, study = mock.Mock(), mock.Mock()
    session.scalar.return_value = 7  # the pick's measurement id, read first
    study.name = "s"
    answers = iter([[], ["the new pick"]])  # its row, read second: gone once (no longer preferred), then found
    monkeypatch.setattr(queries, "candidates", lambda *a, **k: next(answers))
    monkeypatch.setattr(queries, "_preferred", lambda *a: [])
    monkeypatch.setattr(queries, "_feasible", lambda *a: [])
    assert queries.best_candidate(session, study, mock.Mock(), Constraints()) == "the new pick"
    monkeypatch.setattr(queries, "candidates", lambda *a, **k: [])
    with pytest.raises(StoreError, match="changed under 5 reads in a row"):
        queries.best_candidate(session, study, mock.Mock(), Constraints())


def test_a_host_name_no_dns_label_holds_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvicorn")
    db = f"sqlite:///{tmp_path}/p.db"
    assert main(["db", "upgrade", "--db", db]) == 0
    assert main(["serve", "--host", "x" * 300, "--db", db]) != 0
    err = capsys.readouterr().err
    assert "not a host name; pass --host with an address" in err and "Traceback" not in err


def test_serve_refuses_names_no_study_or_environment_can_have(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pareto.serve import create_app

    db = f"sqlite:///{tmp_path}/p.db"
    assert main(["db", "upgrade", "--db", db]) == 0
    client = TestClient(create_app(db), base_url="http://localhost")
    assert client.get(f"/studies/{'x' * 300}/best").status_code == 422  # longer than a study name is stored
    assert client.get("/studies/s/frontier", params={"environment": "e" * 65}).status_code == 422
    assert client.get("/studies/s/best", params={"max_memory_bytes": str(2**63)}).status_code == 422
    assert client.get("/studies/s/best").status_code == 404
