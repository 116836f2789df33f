"""`pareto serve` over real HTTP: a server process on a short search of the tiny task, queried with httpx
and compared with the CLI's JSON, on every database. The CLI runs in this process (``main``), the
server in its own."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

import pareto
from pareto._cli.cli import main
from pareto.spec import SearchSpec
from pareto.study.search import run_search
from tests.conftest import POSTGRES_ENV, _postgres_database

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[1]
STUDY = "tiny"


DATABASE_DOWN = "The database does not answer; the server's log says why."


def local_client(db_url: str, **options: Any) -> TestClient:
    """A test client of ``create_app(db_url, **options)`` that calls the server ``localhost``, as a local
    client does (the test client's own name, ``testserver``, is not an allowed host)."""
    from fastapi.testclient import TestClient

    from pareto.serve import create_app

    return TestClient(create_app(db_url, **options), base_url="http://localhost")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PARETO_DB_URL", None)
    return env


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def pareto_cli(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """``pareto ARGS`` through the CLI's entry point, in this process."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def one_sentence(proc: Ran) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_server(db_url: str, cwd: Path, *extra: str) -> Server:
    """``pareto serve`` on a free port, once its /healthz answers 200."""
    for attempt in range(3):  # another process may take the free port before the server binds it
        port, log = free_port(), cwd / f"serve-{time.monotonic_ns()}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pareto", "serve", "--db", db_url, "--port", str(port), *extra],
                cwd=cwd,
                env=_env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        server = Server(proc, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{server.base}/healthz", timeout=2).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        server.stop()
        text = log.read_text()
        if "is in use" not in text or attempt == 2:
            pytest.fail(f"pareto serve did not answer /healthz:\n{text}")
    raise AssertionError("unreachable")


def _spec() -> SearchSpec:
    return SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_task",
            "study": STUDY,
            "slo": {"p99": "1s"},
            "search": {"n_trials": 3, "seed": 1, "confirm_top": 1},
            "measure": {"device": "cpu", "threads": 1, "warmup": 5, "contention_limit": 50},
            "space": {"techniques": {"int8_dynamic": {}, "prune_structured": {"ratio": [0.25, 0.5]}}},
        }
    )


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite database holding a short search (3 trials, one confirmed) of the tiny task."""
    url = f"sqlite:///{tmp_path_factory.mktemp('serve')}/pareto.db"
    run_search(_spec(), db_url=url)
    return url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def study_db(request: pytest.FixtureRequest) -> Iterator[str]:
    """The same study in a database of each kind."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_db")
        return
    if not os.environ.get(POSTGRES_ENV):
        pytest.skip(f"set {POSTGRES_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test) to run on PostgreSQL")
    for url in _postgres_database():
        run_search(_spec(), db_url=url)
        yield url


@pytest.fixture(scope="module")
def served(study_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(database URL, server base URL, a working folder) with `pareto serve` running on the study."""
    cwd = tmp_path_factory.mktemp("served")
    server = start_server(study_db, cwd)
    try:
        yield study_db, server.base, cwd
    finally:
        server.stop()


def test_healthz_and_studies(served: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    db, base, _ = served
    health = httpx.get(f"{base}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    studies = httpx.get(f"{base}/studies")
    assert studies.status_code == 200 and studies.headers["content-type"] == "application/json"
    assert [s["study"] for s in studies.json()] == [STUDY]
    cli = pareto_cli(capsys, "studies", "--db", db, "--json")
    assert cli.returncode == 0, cli.stderr
    assert studies.text == cli.stdout


@pytest.mark.parametrize(
    ("query", "flags"),
    [
        ({}, []),
        ({"slo_p99_ms": "1000"}, ["--slo-p99", "1s"]),
        (
            {"slo_p99_ms": "250.5", "min_accuracy": "0.1", "max_memory_bytes": "5000000", "environment": "latest"},
            ["--slo-p99", "250.5ms", "--min-accuracy", "0.1", "--max-memory", "5MB", "--environment", "latest"],
        ),
    ],
)
@pytest.mark.parametrize("what", ["best", "frontier"])
def test_best_and_frontier_answer_the_cli_json(
    served: tuple[str, str, Path],
    capsys: pytest.CaptureFixture[str],
    what: str,
    query: dict[str, str],
    flags: list[str],
) -> None:
    db, base, _ = served
    response = httpx.get(f"{base}/studies/{STUDY}/{what}", params=query)
    assert response.status_code == 200, response.text
    cli = pareto_cli(capsys, what, "--db", db, "--study", STUDY, *flags, "--json")
    assert cli.returncode == 0, cli.stderr
    assert response.text == cli.stdout  # the same bytes, not only the same data
    data = response.json()
    rows = [data] if what == "best" else data
    assert rows and all(r["study"] == STUDY and "method" in r["metrics"] for r in rows)
    if "slo_p99_ms" in query:
        assert all(r["slo"]["p99_ms"] == float(query["slo_p99_ms"]) for r in rows)


def test_best_prefers_the_confirmed_measurement(served: tuple[str, str, Path]) -> None:
    _, base, _ = served
    pick = httpx.get(f"{base}/studies/{STUDY}/best", params={"slo_p99_ms": 1000}).json()
    assert pick["confirmation"] is not None and pick["slo"]["feasible"] is True


def test_unknown_study_is_404(served: tuple[str, str, Path]) -> None:
    _, base, _ = served
    for what in ("best", "frontier"):
        response = httpx.get(f"{base}/studies/nosuch/{what}")
        assert response.status_code == 404
        assert response.json() == {"detail": f"No study named 'nosuch'; known studies: {STUDY}."}


def test_nothing_meets_the_slo_is_404_naming_the_closest(
    served: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    db, base, _ = served
    response = httpx.get(f"{base}/studies/{STUDY}/best", params={"slo_p99_ms": 0.000001})
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "No stored configuration of study 'tiny' meets" in detail and "the closest is trial" in detail
    cli = pareto_cli(capsys, "best", "--db", db, "--study", STUDY, "--slo-p99", "1ns")
    assert cli.returncode == 1 and one_sentence(cli) == f"Error: {detail}"


@pytest.mark.parametrize(
    ("query", "phrase"),
    [
        ({"slo_p99_ms": "-1"}, "greater than 0"),
        ({"slo_p99_ms": "0"}, "greater than 0"),
        ({"slo_p99_ms": "abc"}, "valid number"),
        ({"slo_p99_ms": "nan"}, "finite"),
        ({"slo_p99_ms": "inf"}, "finite"),
        ({"min_accuracy": "inf"}, "finite"),
        ({"min_accuracy": "x"}, "valid number"),
        ({"max_memory_bytes": "0"}, "greater than 0"),
        ({"max_memory_bytes": "1.5"}, "valid integer"),
        ({"max_memory_bytes": "2GB"}, "valid integer"),
        ({"environment": "nosuch"}, "matches none of study 'tiny'"),
        ({"environment": "all"}, "within one environment"),
    ],
)
def test_bad_values_are_422(served: tuple[str, str, Path], query: dict[str, str], phrase: str) -> None:
    _, base, _ = served
    response = httpx.get(f"{base}/studies/{STUDY}/best", params=query)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and detail.endswith(".") and phrase in detail  # one sentence, as the CLI


def test_frontier_takes_every_environment(served: tuple[str, str, Path]) -> None:
    _, base, _ = served
    response = httpx.get(f"{base}/studies/{STUDY}/frontier", params={"environment": "all"})
    assert response.status_code == 200 and response.json()


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ["/studies", f"/studies/{STUDY}/best", f"/studies/{STUDY}/frontier", "/healthz"])
def test_only_get(served: tuple[str, str, Path], method: str, path: str) -> None:
    _, base, _ = served
    response = httpx.request(method, f"{base}{path}", json={"name": "x"})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"


def test_openapi_describes_the_read_only_api(served: tuple[str, str, Path]) -> None:
    _, base, _ = served
    schema = httpx.get(f"{base}/openapi.json").json()
    assert schema["info"]["title"] == "pareto" and schema["info"]["version"] == pareto.__version__
    assert schema["info"]["description"]
    assert set(schema["paths"]) == {"/healthz", "/studies", "/studies/{name}/frontier", "/studies/{name}/best"}
    for path, operations in schema["paths"].items():
        assert set(operations) == {"get"}, path
        assert operations["get"]["description"], path
    best = schema["paths"]["/studies/{name}/best"]["get"]
    assert {p["name"] for p in best["parameters"]} == {
        "name",
        "slo_p99_ms",
        "qps",
        "min_accuracy",
        "max_memory_bytes",
        "environment",
    }
    assert {"404", "422"} <= set(best["responses"])
    assert "securitySchemes" not in schema.get("components", {})  # no token: no security scheme
    docs = httpx.get(f"{base}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_healthz_is_503_when_the_database_goes(sqlite_db: str, tmp_path: Path) -> None:
    db = tmp_path / "moved.db"
    with sqlite3.connect(sqlite_db.removeprefix("sqlite:///")) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
    client = local_client(f"sqlite:///{db}", token="s3cret")
    assert client.get("/healthz").status_code == 200
    db.rename(tmp_path / "elsewhere.db")
    health = client.get("/healthz", headers={"Authorization": "Bearer s3cret"})
    assert health.status_code == 503
    assert health.json()["detail"].startswith(f"No database at {db}")
    assert client.get("/studies", headers={"Authorization": "Bearer s3cret"}).status_code == 503
    assert not db.exists()  # the server looked and created nothing


@pytest.mark.parametrize(
    "db_url",
    ["postgresql+psycopg://alice@127.0.0.1:1/secret_db", "sqlite:////nonexistent/alice/secret_db.db"],
    ids=["postgresql", "sqlite"],
)
def test_healthz_says_why_only_to_the_token(db_url: str) -> None:
    """A database that does not answer: without the server's token /healthz says down and nothing of the
    driver's error (the database's host, user, path)."""
    for client, headers in (
        (local_client(db_url), {}),
        (local_client(db_url, token="s3cret"), {}),
        (local_client(db_url, token="s3cret"), {"Authorization": "Bearer wrong"}),
    ):
        health = client.get("/healthz", headers=headers)
        assert health.status_code == 503 and health.json() == {"status": "unavailable"}, health.text
        assert not {"alice", "secret_db", "127.0.0.1", "nonexistent"} & set(health.text.replace("/", " ").split())
    told = local_client(db_url, token="s3cret").get("/healthz", headers={"Authorization": "Bearer s3cret"})
    assert told.status_code == 503 and told.json()["status"] == "unavailable"
    assert "alice" in told.json()["detail"] or "127.0.0.1" in told.json()["detail"]
    for path in ("/studies", f"/studies/{STUDY}/best", f"/studies/{STUDY}/frontier"):  # nor do the data endpoints
        down = local_client(db_url).get(path)
        assert down.status_code == 503 and down.json() == {"detail": DATABASE_DOWN}, down.text


def test_a_failed_answer_is_not_kept(sqlite_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that failed one query is asked again by the next request, not answered 503 from memory."""
    from pareto import api
    from pareto.errors import StoreError

    answer, calls = api.best, []

    def fails_once(**kwargs: Any) -> Any:
        calls.append(kwargs)
        if len(calls) == 1:
            raise StoreError("The database does not answer: a network blip.")
        return answer(**kwargs)

    monkeypatch.setattr(api, "best", fails_once)
    client = local_client(sqlite_db)
    assert client.get(f"/studies/{STUDY}/best").status_code == 503
    assert client.get(f"/studies/{STUDY}/best").status_code == 200


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_a_host_that_is_not_allowed_is_400(sqlite_db: str, token: str | None) -> None:
    """DNS rebinding: a page at evil.example whose name now points at 127.0.0.1 sends ``Host: evil.example``."""
    client = local_client(sqlite_db, token=token, allowed_hosts=["pareto.internal"])
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    path = f"/studies/{STUDY}/best"
    for host in ("evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "[::2]:80", "x:y"):
        refused = client.get(path, headers={"Host": host, **auth})
        assert refused.status_code == 400, host
        assert "--allowed-host" in refused.json()["detail"]
    for host in ("localhost", "LOCALHOST:8080", "127.0.0.1:8080", "[::1]:8080", "pareto.internal", "localhost."):
        assert client.get(path, headers={"Host": host, **auth}).status_code == 200, host
    assert client.get("/healthz", headers={"Host": "10.0.0.7:8080"}).status_code == 200  # a load balancer's probe
    anyone = local_client(sqlite_db, allowed_hosts=["*"])
    assert anyone.get(path, headers={"Host": "evil.example"}).status_code == 200


def test_no_database_call_runs_on_the_event_loop(sqlite_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each route that reads the database does so in the thread pool: a query on the event loop would hold
    every other request until it returns."""
    import pareto.serve
    from pareto import api

    on_loop: dict[str, bool] = {}

    def recorded(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                on_loop[name] = True
            except RuntimeError:  # no event loop runs in this thread
                on_loop.setdefault(name, False)
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(pareto.serve, "data_version", recorded("data_version", pareto.serve.data_version))
    for name in ("best", "frontier", "studies"):
        monkeypatch.setattr(api, name, recorded(name, getattr(api, name)))
    client = local_client(sqlite_db)
    for path in ("/studies", f"/studies/{STUDY}/best", f"/studies/{STUDY}/frontier", f"/studies/{STUDY}/best"):
        assert client.get(path).status_code == 200, path
    assert on_loop == {"data_version": False, "best": False, "frontier": False, "studies": False}


def test_token(sqlite_db: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  s3cret-token\n")
    server = start_server(sqlite_db, tmp_path, "--token-file", str(token_file), "--allowed-host", "pareto.internal")
    try:
        url = f"{server.base}/studies/{STUDY}/best"
        assert httpx.get(f"{server.base}/healthz").status_code == 200  # health needs no token
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0LXRva2Vu"}):
            response = httpx.get(url, headers=headers)
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{server.base}/studies").status_code == 401
        good = {"Authorization": "Bearer s3cret-token"}  # the file's whitespace is not part of the token
        assert httpx.get(url, headers=good).status_code == 200
        assert httpx.get(f"{server.base}/studies", headers=good).status_code == 200
        assert httpx.get(f"{server.base}/studies/nosuch/best", headers=good).status_code == 404
        assert "HTTPBearer" in httpx.get(f"{server.base}/openapi.json").json()["components"]["securitySchemes"]
        # the Host check stays with a token: --host and --allowed-host name the hosts beside localhost
        assert httpx.get(url, headers={**good, "Host": "pareto.internal:80"}).status_code == 200
        assert httpx.get(url, headers={**good, "Host": "evil.example"}).status_code == 400
        # Ctrl-C stops the server cleanly
        assert server.stop(signal.SIGINT) == 0
        log = server.log.read_text()
        assert "Traceback" not in log and "bearer token required" in log
    finally:
        server.stop()


def test_port_in_use_is_one_sentence(sqlite_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = pareto_cli(capsys, "serve", "--db", sqlite_db, "--port", str(port))
    assert proc.returncode == 2
    assert one_sentence(proc) == f"Error: Port {port} on 127.0.0.1 is in use; stop what holds it or pass --port."


def test_a_host_that_is_not_loopback_is_warned_about(sqlite_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as holder:  # the port is taken: the command warns, then stops before serving anything
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = pareto_cli(capsys, "serve", "--db", sqlite_db, "--host", "0.0.0.0", "--port", str(port))
    assert proc.returncode == 2
    warning, error = proc.stderr.strip().splitlines()
    assert warning.startswith("Warning: listening on 0.0.0.0") and "--token-file" in warning
    assert "--allowed-host" in warning  # other machines call it by a name of its own: the Host check refuses it
    assert "is in use" in error


@pytest.mark.parametrize(
    ("content", "phrase"), [(None, "Cannot read token file"), ("", "is empty"), (" \n\t\n", "is empty")]
)
def test_a_token_file_that_is_missing_or_empty_is_one_sentence(
    sqlite_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, phrase: str
) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    port = str(free_port())
    proc = pareto_cli(capsys, "serve", "--db", sqlite_db, "--port", port, "--token-file", str(token_file))
    assert proc.returncode == 2
    assert phrase in one_sentence(proc)


def test_a_missing_database_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = pareto_cli(capsys, "serve", "--db", f"sqlite:///{tmp_path}/none.db", "--port", str(free_port()))
    assert proc.returncode == 2
    assert "No database at" in one_sentence(proc)
    assert not (tmp_path / "none.db").exists()


def test_without_fastapi_the_command_says_what_to_install(
    sqlite_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "pareto.serve", raising=False)
    proc = pareto_cli(capsys, "serve", "--db", sqlite_db, "--port", str(free_port()))
    assert proc.returncode == 1
    assert one_sentence(proc) == (
        "Error: pareto serve needs FastAPI and uvicorn (fastapi is missing): pip install 'pareto-slo[serve]'."
    )


def test_the_app_does_not_import_torch(sqlite_db: str, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from pareto.serve import create_app\n"
        f"client = TestClient(create_app({sqlite_db!r}), base_url='http://localhost')\n"
        f"assert client.get('/studies/{STUDY}/best').status_code == 200\n"
        "heavy = {'torch', 'optuna', 'numpy', 'scipy'} & set(sys.modules)\n"
        "assert not heavy, f'the server imported {heavy}'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_a_kept_answer_changes_when_the_database_does(sqlite_db: str, tmp_path: Path) -> None:
    """Repeated queries are answered from memory, but a new measurement or a deleted study shows at once."""
    from sqlalchemy import select

    from pareto.metrics import FIELD_NAMES
    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Measurement, Study, Trial

    db = tmp_path / "copy.db"
    with sqlite3.connect(sqlite_db.removeprefix("sqlite:///")) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
    url = f"sqlite:///{db}"
    client = local_client(url)
    path = f"/studies/{STUDY}/best?slo_p99_ms=1000"
    first = client.get(path).json()
    assert client.get(path).json() == first  # kept
    with session_scope(open_engine(url, create=False)) as session:  # a better configuration is measured
        study = session.scalars(select(Study).where(Study.name == STUDY)).one()
        stored = session.scalars(
            select(Measurement).where(Measurement.study_id == study.id, Measurement.preferred.is_(True))
        ).first()
        assert stored is not None
        trial = Trial(
            study_id=study.id,
            optuna_number=999,
            state="COMPLETE",
            config={},
            config_key="better",
            description="a better one",
            batch_size=stored.batch_size,
        )
        session.add(trial)
        session.flush()
        values = {name: getattr(stored, name) for name in FIELD_NAMES}
        values.update(accuracy=1.0, latency_p99_upper_ms=0.001)
        session.add(Measurement(trial_id=trial.id, environment_id=stored.environment_id, kind="search", **values))
    assert client.get(path).json()["trial"] == 999
    pareto.delete_study(STUDY, db=url)
    gone = client.get(path)
    assert gone.status_code == 404 and "No study named" in gone.json()["detail"]


def _move_preferred(db_url: str, trial_number: int, to_kind: str) -> None:
    """Trial ``trial_number``'s preferred measurement becomes its ``to_kind`` one, as a nightly's promotion
    flips the flags (``pareto.store.trials.promote``): no row is added or removed."""
    from sqlalchemy import select

    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Measurement, Study, Trial

    engine = open_engine(db_url, create=False)
    try:
        with session_scope(engine) as session:
            study = session.scalars(select(Study).where(Study.name == STUDY)).one()
            trial = session.scalars(
                select(Trial).where(Trial.study_id == study.id, Trial.optuna_number == trial_number)
            ).one()
            rows = session.scalars(select(Measurement).where(Measurement.trial_id == trial.id)).all()
            current = next(row for row in rows if row.preferred)
            target = next(r for r in rows if r.kind == to_kind and r.environment_id == current.environment_id)
            current.preferred = False
            session.flush()  # one preferred row per trial and environment, at every statement
            target.preferred = True
    finally:
        engine.dispose()


def test_a_kept_answer_changes_when_only_flags_flip(study_db: str) -> None:
    """A nightly withdrawn as noisy flips ``preferred`` flags and adds no row: the next answer is the new one,
    as a server started afresh gives it, not the one kept."""
    client = local_client(study_db)
    path = f"/studies/{STUDY}/best?slo_p99_ms=1000"
    first = client.get(path)
    assert first.status_code == 200 and first.json()["confirmation"] is not None
    assert client.get(path).text == first.text  # kept
    trial = first.json()["trial"]
    _move_preferred(study_db, trial, "search")  # the confirmation withdrawn
    try:
        again = client.get(path)
        fresh = local_client(study_db).get(path)
        assert fresh.text != first.text  # the flip changed the answer
        assert again.text == fresh.text
    finally:
        _move_preferred(study_db, trial, "confirm")  # the module's other tests read this study
    assert client.get(path).text == first.text
