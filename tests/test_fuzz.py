"""No traceback from any input: every command and every serve endpoint driven with generated values.

A seeded generator (``PARETO_FUZZ_SEED``, ``PARETO_FUZZ_CASES``; a few hundred cases by default, under a
minute) picks a command and one to four of its options, each given a value from a pool of what breaks
parsers: numbers at the extremes, NaN and infinity, units, markup, very long and non-ASCII strings,
paths that are files, folders or missing. A case fails on a traceback (an exception that is not
pareto's one-sentence error, or "Traceback" in the output); a read command (best, frontier, explain,
history, studies, report, hardware) also fails when a stored row changed. Commands that measure or
write (search, measure, confirm, load, nightly, export, calibrate, roofline, techniques, studies
create/delete, serve) are run up to the call that would start the work: their parsing and
validation is what a value can break, and a stub stands for the work. Each endpoint of ``pareto serve``
is called with generated query values and must not answer 500.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from pareto._cli.cli import cli, main, subcommands
from pareto.study.search import run_search
from tests.test_serve import STUDY
from tests.test_serve import _spec as serve_spec

CASES = int(os.environ.get("PARETO_FUZZ_CASES", "300"))
SEED = int(os.environ.get("PARETO_FUZZ_SEED", "0"))
#: Commands whose work is stubbed: (module, the name the command calls to start it).
STUBBED = {
    "search": [("pareto._cli.search", "run")],
    "confirm": [("pareto._cli.confirm", "run")],
    "load": [("pareto._cli.load", "run")],
    "measure": [("pareto._cli.measure", "run"), ("pareto._cli.measure", "remeasure")],
    "nightly": [("pareto._cli.nightly", "run")],
    "export": [("pareto._cli.export", "export")],
    "calibrate": [("pareto._cli.calibrate", "run")],
    "roofline": [("pareto._cli.roofline", "run")],
    "techniques": [("pareto._cli.techniques", "run")],
    "studies create": [("pareto._cli.studies", "create_study")],
    "studies delete": [("pareto._cli.studies", "delete_study")],
    "serve": [("uvicorn.Server", "run")],
}
READS = {"best", "frontier", "explain", "history", "studies", "report", "hardware"}


class Reached(Exception):
    """A stubbed command got as far as starting its work: every value it was given was accepted."""


def _values(folder: Path) -> list[str]:
    (folder / "a-file.txt").write_text("not yaml: [")
    (folder / "a-folder").mkdir(exist_ok=True)
    return [
        *("0", "-1", "1", "3", "0.5", "1e999", "-1e999", "nan", "inf", "-inf", "1e30", "1e19", "9" * 40, "-0"),
        *("", " ", "7ms", "0ms", "-5ms", "1e999ms", "nanms", "500us", "10min", "1e999s"),
        *("2GB", "1e30GB", "1e999GB", "0GB", "5", "500/s", "0/s", "1e400/s", "nan/s", "300", "-300/s"),
        *("abc", "a[/]", "[bold]x[/bold]", "[/]", "ü" * 300, "x" * 5000, "é\u202e漢", "%s%n", "{0}", "'; drop table"),
        *("latest", "all", "0123456789abcdef", STUDY, "demo", "nosuch:thing", "tests.nothing:make", "os:getcwd"),
        *("accuracy,p99", "p99,p99", ",", "capacity", "int8_dynamic", "prune_structured:ratio=2", "lowrank:x=1"),
        *("cpu", "cuda", "cuda:99", "meta", "eager", "onnxruntime", "tpe", "grid", "mobile", "request"),
        *(str(folder / "a-file.txt"), str(folder / "a-folder"), str(folder / "missing" / "x"), "/", "../..", "-"),
    ]


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(subcommands(group).items()):
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield prefix + name, command


def _dump(db: Path) -> str:
    """A digest of every row of every table (a read command must leave it as it was)."""
    digest = hashlib.sha256()
    with sqlite3.connect(db) as conn:
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY rowid'):
                digest.update(repr(row).encode())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database holding a short search of the tiny task."""
    path = tmp_path_factory.mktemp("fuzz") / "pareto.db"
    spec = serve_spec()  # the study the serve tests read: a short search of the tiny task, one confirmed
    run_search(spec, db_url=f"sqlite:///{path}")
    return path


def _case(rng: random.Random, commands: list[tuple[str, click.Command]], values: list[str]) -> tuple[str, list[str]]:
    name, command = rng.choice(commands)
    options = [p for p in command.params if isinstance(p, click.Option) and p.name not in {"db", "spec_json"}]
    args = name.split()
    for option in rng.sample(options, min(len(options), rng.randint(1, 4))):
        flag = max(option.opts, key=len)
        args += [flag] if option.is_flag else [flag, rng.choice(values)]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    args += [rng.choice(values) for _ in arguments]
    return name, args


def test_no_command_answers_a_value_with_a_traceback(
    study_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def reached(*_args: Any, **_kwargs: Any) -> Any:
        raise Reached

    for patches in STUBBED.values():
        for module, attr in patches:
            monkeypatch.setattr(f"{module}.{attr}", reached)
    monkeypatch.chdir(tmp_path)  # report -o and export -o write relative paths here
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a confirmation prompt reads end of input: "no"
    values, rng = _values(tmp_path), random.Random(SEED)
    commands = list(_commands(cli))
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    before = _dump(study_db)
    for _ in range(CASES):
        name, args = _case(rng, commands, values)
        try:
            code = main([*args, "--db", f"sqlite:///{study_db}"] if "--db" in _flags(name) else args)
        except Reached:
            outcomes["reached the work"] += 1
            continue
        except SystemExit as exc:  # click's --help and the like exit on their own
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # a traceback: what this test is for
            failures.append(f"{' '.join(args)[:300]!r}: {type(exc).__name__}: {exc}")
            continue
        captured = capsys.readouterr()
        if "Traceback" in captured.out + captured.err:
            failures.append(f"{' '.join(args)[:300]!r}: a traceback in the output")
        outcomes["exit 0" if code == 0 else "one-sentence error"] += 1
        if name.split()[0] in READS and _dump(study_db) != before:
            failures.append(f"{' '.join(args)[:300]!r}: a read command changed a stored row")
            before = _dump(study_db)
    print(f"fuzz seed {SEED}: {CASES} cases, {dict(outcomes)}, {len(failures)} failures")
    assert not failures, "\n".join(failures[:20])
    assert outcomes["one-sentence error"] > CASES // 10 and outcomes["exit 0"] + outcomes["reached the work"] > 0


def _flags(name: str) -> set[str]:
    command: Any = cli
    for part in name.split():
        command = subcommands(command)[part]
    return {opt for p in command.params for opt in getattr(p, "opts", [])}


def _routes() -> list[tuple[str, list[str]]]:
    """Every GET endpoint and its query parameters, from the server's own OpenAPI schema."""
    pytest.importorskip("fastapi")
    from pareto.serve import create_app

    paths = create_app("sqlite:///unused.db").openapi()["paths"]
    return [
        (path, [p["name"] for p in item["get"].get("parameters", []) if p["in"] == "query"])
        for path, item in paths.items()
        if "get" in item
    ]


def test_no_endpoint_answers_a_value_with_a_500(study_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pareto.serve import create_app

    values, rng = _values(tmp_path), random.Random(SEED + 1)
    routes = _routes()
    before = _dump(study_db)
    client = TestClient(create_app(f"sqlite:///{study_db}"), base_url="http://localhost", raise_server_exceptions=False)
    statuses: Counter[int] = Counter()
    failures = []
    for _ in range(max(CASES // 2, 50)):
        path, params = rng.choice(routes)
        name = rng.choice([STUDY, STUDY, *values[:60]]).replace("/", "%2F").replace("?", "%3F").replace("#", "%23")
        url = path.replace("{name}", name or STUDY)
        query = {p: rng.choice(values) for p in rng.sample(params, min(len(params), rng.randint(0, 3)))}
        response = client.get(url, params=query)
        statuses[response.status_code] += 1
        if response.status_code >= 500 and response.status_code != 503:
            failures.append(f"GET {url} {query}: {response.status_code} {response.text[:200]}")
    print(f"serve fuzz seed {SEED}: {len(routes)} endpoints, {dict(statuses)}")
    assert {path for path, _ in routes} >= {"/studies", "/studies/{name}/best", "/studies/{name}/frontier"}
    assert not failures, "\n".join(failures[:20])
    assert _dump(study_db) == before
