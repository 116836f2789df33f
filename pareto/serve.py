"""The read-only HTTP API of ``pareto serve``: the query side (studies, frontier, best) over HTTP.

Every answer is the JSON the matching ``--json`` command prints, byte for byte: the same
``pareto.api`` call, written with ``json.dumps(indent=2, default=str)`` and a final newline. The
app only reads (it calls the query functions, which open the database with ``create=False`` and
never write) and answers GET only: any other method on a known path is 405.

Errors carry ``{"detail": reason}``, the sentence the CLI prints: 404 for an unknown study and for
an SLO that nothing stored meets, 422 for a malformed value, 503 when the database does not
answer. With a token, every endpoint but ``/healthz`` (and the OpenAPI schema and its pages, which
hold no data) needs ``Authorization: Bearer <token>``. The database's error (which may name its
host, user or path) is told only to the token's holders: a 503's ``detail`` has it on a server with
a token, ``/healthz`` only for a request that carries the token; else the server logs it. A request
whose ``Host`` header names no allowed host is 400 (DNS rebinding: a web page whose name is made to
point at this machine).

Every route that reads the database is a plain function, which FastAPI runs in its thread pool: no
database call ever holds the event loop.

Imports FastAPI (``pip install 'pareto-slo[serve]'``); never torch.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

import pareto
from pareto import api
from pareto.errors import NoFeasibleConfiguration, NotFound, ParetoError, StoreError, UsageError, message_line
from pareto.store.engine import check_path, open_engine, read_engine, require_schema, resolve_url
from pareto.store.health import ping
from pareto.store.version import data_version
from pareto.store.writes import STUDY_NAME_LENGTH
from pareto.units import MAX_SIZE_BYTES

DESCRIPTION = """\
Read-only queries over a pareto database: the studies, a study's Pareto frontier, and the best
stored configuration for an SLO. Each answer is the JSON of the matching command
(`pareto studies --json`, `pareto frontier --json`, `pareto best --json`).

Latency figures are the stored measurements: each `metrics` object says its `method`, its
`samples` and the one-sided `confidence` of its bounds; SLO verdicts use the conservative P99 upper
bound (`latency_p99_upper_ms`).
"""


class JSONText(Response):
    """JSON written exactly as the CLI's ``--json`` writes it (indent 2, ``default=str``, newline)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return render(content)


def render(content: Any) -> bytes:
    """The bytes ``print_json`` writes for ``content``."""
    return (json.dumps(content, indent=2, default=str) + "\n").encode("utf-8")


def describe_invalid(errors: Sequence[Any]) -> str:
    """FastAPI's list of validation errors as one sentence: which value, what is wrong, what was given."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if part not in {"query", "path"}) or "the request"
        message = str(error.get("msg", "is invalid"))
        message = message[:1].lower() + message[1:]
        given = f" (got {error['input']!r})" if "input" in error and error["input"] is not None else ""
        parts.append(f"{where}: {message}{given}")
    return f"Bad value: {'; '.join(parts)}."


def status_of(exc: ParetoError) -> int:
    """The HTTP status of a pareto error: what the caller can fix is 4xx, the database down is 503."""
    if isinstance(exc, StoreError):  # before UsageError: a missing database file is both
        return 503
    if isinstance(exc, (NotFound, NoFeasibleConfiguration)):
        return 404
    if isinstance(exc, UsageError):
        return 422
    return 500


class _Health:
    """Whether the database answers: its SQLite file is there, a query runs, pareto's tables exist.

    One engine is kept between checks (a health check every few seconds should not open a pool each
    time); it is made again after a failure to open it.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def problem(self) -> str | None:
        """None when the database answers, else the reason it does not (one sentence)."""
        try:
            check_path(self.url, create=False)  # sqlite would create a missing file on connect
            engine = self._get()
            ping(engine)
            require_schema(engine)
        except StoreError as exc:
            return str(exc)
        except SQLAlchemyError as exc:
            return f"The database does not answer: {_driver_message(exc)}."
        return None

    def _get(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = open_engine(self.url, create=False)
            return self._engine


class _Answers:
    """The answers to repeated queries, kept while the database holds the same data.

    Before each ``best`` or ``frontier`` answer, one statement reads the store's data version
    (``pareto.store.version.data_version``), a counter that every transaction of pareto's store that
    writes anything bumps: a measurement or confirmation stored, a night's measurements withdrawn
    (``preferred`` flags flipped, no row added), a study created, continued or deleted. A kept answer
    is returned only while the counter has not moved, so it is still the answer, and a query that
    costs a database scan runs once per change, not once per request.
    """

    def __init__(self, url: str, reveal: bool, size: int = 512) -> None:
        self.url, self.reveal, self.size = url, reveal, size
        self._kept: OrderedDict[tuple[Any, ...], tuple[int, int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def answer(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Response:
        """``compute()``'s JSON (or its pareto error, as the handler would write it), kept by ``key``.

        Blocks on the database (the version read, then ``compute`` when nothing current is kept):
        call it from a route that is a plain function, which FastAPI runs in its thread pool.
        """
        version = self._version()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] == version:
                self._kept.move_to_end(key)
                return Response(kept[2], status_code=kept[1], media_type="application/json")
        status, rendered = self._compute(compute)
        if status >= 500:  # the database failed this once: the next request asks it again
            return Response(rendered, status_code=status, media_type="application/json")
        with self._lock:
            self._kept[key] = (version, status, rendered)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return Response(rendered, status_code=status, media_type="application/json")

    def _version(self) -> int:
        return data_version(read_engine(self.url))

    def _compute(self, compute: Callable[[], Any]) -> tuple[int, bytes]:
        try:
            return 200, render(compute())
        except ParetoError as exc:
            status = status_of(exc)
            return status, render({"detail": shown(status, str(exc), self.reveal)})


_LOG = logging.getLogger(__name__)

#: What a server without a token says of a database that does not answer (the reason goes to its log).
DATABASE_DOWN = "The database does not answer; the server's log says why."


def shown(status: int, detail: str, reveal: bool) -> str:
    """The ``detail`` of an error answer: a 503's reason (the driver's error, naming the database's host,
    user or path) only where ``reveal`` (a server with a token: only its holders reach the data), else
    ``DATABASE_DOWN``, the reason logged."""
    if status != 503 or reveal:
        return detail
    _LOG.warning("%s", detail)
    return DATABASE_DOWN


#: The longest environment selector: a key is 16 characters; ``latest`` and ``all`` are shorter.
ENVIRONMENT_KEY_MAX = 64

SloP99 = Annotated[
    float | None,
    Query(gt=0, allow_inf_nan=False, description="P99 bound in milliseconds [default: the study's SLO]."),
]
Qps = Annotated[
    float | None,
    Query(
        gt=0,
        allow_inf_nan=False,
        description="Requests per second arriving: the P99 is every request's at that rate, judged by the capacity "
        "of a study searched with --qps [default: the study's rate, if it has one].",
    ),
]
MinAccuracy = Annotated[
    float | None, Query(allow_inf_nan=False, description="Accuracy floor (the task's metric) [default: the study's].")
]
MaxMemory = Annotated[
    int | None,
    Query(
        gt=0,
        lt=MAX_SIZE_BYTES,  # what a 64-bit column holds: a larger one is a 422, never an overflow in the driver
        description="Memory budget in bytes: params + activations + KV cache [default: the study's].",
    ),
]
EnvironmentKey = Annotated[
    str | None,
    Query(
        max_length=ENVIRONMENT_KEY_MAX,  # a longer one names no environment, and would only grow the kept answers
        description="`latest` (default: where the study was last measured), an environment key or a unique prefix "
        "of one; the frontier also takes `all`.",
    ),
]
StudyName = Annotated[str, Path(max_length=STUDY_NAME_LENGTH, description="The study's name.")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such study, or no stored configuration meets the SLO; `detail` says which."},
    422: {"description": "A malformed or out-of-range value; `detail` says which."},
    503: {"description": "The database does not answer; on a server with a token, `detail` says why."},
}


def create_app(db_url: str, token: str | None = None, allowed_hosts: Iterable[str] = ()) -> FastAPI:
    """The FastAPI app answering queries on ``db_url``; with ``token``, the data endpoints need it.

    ``db_url`` is resolved as ``--db`` is (a bare path means SQLite). Nothing is opened here: each
    request reads through ``pareto.api``, and ``pareto serve`` checks the database before it starts.
    A request's ``Host`` header must name ``LOCAL_HOSTS`` or one of ``allowed_hosts`` (``*``: any).
    """
    if token is not None and not token.strip():
        raise UsageError("An empty token would let every request through; give a token or none.")
    url = resolve_url(db_url)
    app = FastAPI(
        title="pareto",
        version=pareto.__version__,
        description=DESCRIPTION,
        default_response_class=JSONText,
    )
    app.add_middleware(_TrustedHosts, hosts=[*LOCAL_HOSTS, *allowed_hosts])
    _add_error_handlers(app, reveal=token is not None)
    _add_health_route(app, _Health(url), token)
    app.include_router(_query_router(url, token, _Answers(url, reveal=token is not None)))
    return app


#: The names this machine answers to from itself; ``pareto serve`` adds ``--host`` and ``--allowed-host``.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


class _TrustedHosts:
    """400 to a request whose ``Host`` header names none of ``hosts`` (``*`` allows any).

    DNS rebinding: a web page at evil.example whose name is then made to point at 127.0.0.1 reads a
    loopback server with the visitor's browser, but the browser still sends ``Host: evil.example``.
    ``/healthz`` is exempt (it says up or down, and a load balancer's probe names the address).
    """

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(host.strip("[]").rstrip(".").lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.hosts or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("host")
        if _host_name(header) in self.hosts:
            await self.app(scope, receive, send)
            return
        detail = (
            f"Host {header!r} is not one this server answers to; start pareto serve with --allowed-host NAME "
            "for each name clients use to reach it."
        )
        await JSONText({"detail": detail}, status_code=400)(scope, receive, send)


def _host_name(header: str | None) -> str | None:
    """The host a ``Host`` header names, lower case, without port, brackets or trailing dot (None if malformed)."""
    try:
        name = urlsplit(f"//{header}").hostname if header else None
    except ValueError:  # a malformed IPv6 literal or port
        return None
    return name.rstrip(".") if name else None


def _add_error_handlers(app: FastAPI, reveal: bool) -> None:
    """Each error as ``{"detail": reason}``: a pareto error at its status, a bad value 422, the database gone 503
    (its reason only where ``reveal``: see ``shown``)."""

    async def pareto_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ParetoError)
        status = status_of(exc)
        return JSONText({"detail": shown(status, str(exc), reveal)}, status_code=status)

    async def database_error(_request: Request, exc: Exception) -> Response:
        detail = shown(503, f"The database did not answer: {_driver_message(exc)}.", reveal)
        return JSONText({"detail": detail}, status_code=503)

    async def bad_value(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return JSONText({"detail": describe_invalid(exc.errors())}, status_code=422)

    app.add_exception_handler(ParetoError, pareto_error)
    app.add_exception_handler(RequestValidationError, bad_value)  # one sentence, as every other error
    app.add_exception_handler(OperationalError, database_error)  # a database that went away while serving


def _add_health_route(app: FastAPI, health: _Health, token: str | None) -> None:
    """``GET /healthz``, which needs no token; the reason the database is down only with the token."""

    @app.get(
        "/healthz",
        summary="Whether the database answers",
        response_model=None,
        responses={503: {"description": "The database does not answer; with the server's token, `detail` says why."}},
        tags=["health"],
    )
    def healthz(request: Request) -> Response:
        """200 `{"status": "ok"}` when the database answers and holds pareto's tables, else 503
        `{"status": "unavailable"}`. Needs no token; the 503 says why (`detail`: the driver's error,
        which may name the database's host, user or path) only to a request with the server's token."""
        problem = health.problem()
        if problem is None:
            return JSONText({"status": "ok", "version": pareto.__version__})
        down: dict[str, str] = {"status": "unavailable"}
        if token is not None and _has_token(request.headers.get("authorization"), token):
            down["detail"] = problem
        return JSONText(down, status_code=503)


def _query_router(url: str, token: str | None, answers: _Answers) -> APIRouter:
    """The data endpoints (``/studies``, a study's ``frontier`` and ``best``), behind the token when there is one."""
    responses = dict(_ERRORS)
    if token is not None:
        responses[401] = {"description": "No bearer token, or not the server's."}
    router = APIRouter(dependencies=[Depends(_bearer(token))] if token is not None else [], responses=responses)

    @router.get("/studies", summary="The studies in the database", response_model=None, tags=["queries"])
    def studies() -> Response:
        """Every study with its task, trial counts by state, SLO, objectives, environments and last
        nightly: the JSON of `pareto studies --json`."""
        return JSONText(api.studies(db=url))

    _add_limit_routes(router, url, answers)
    return router


def _add_limit_routes(router: APIRouter, url: str, answers: _Answers) -> None:
    """A study's ``frontier`` and ``best`` under the limits in the query string, kept by ``answers``."""

    @router.get("/studies/{name}/frontier", summary="A study's Pareto frontier", response_model=None, tags=["queries"])
    def frontier(
        name: StudyName,
        slo_p99_ms: SloP99 = None,
        qps: Qps = None,
        min_accuracy: MinAccuracy = None,
        max_memory_bytes: MaxMemory = None,
        environment: EnvironmentKey = None,
    ) -> Response:
        """The non-dominated configurations on the study's objectives, fastest first, each judged
        against the SLO: the JSON of `pareto frontier --json`."""
        return answers.answer(
            ("frontier", name, slo_p99_ms, qps, min_accuracy, max_memory_bytes, environment),
            lambda: api.frontier(
                study=name,
                slo_p99=slo_p99_ms,
                qps=qps,
                min_accuracy=min_accuracy,
                max_memory=max_memory_bytes,
                environment=environment,
                db=url,
            ),
        )

    @router.get(
        "/studies/{name}/best",
        summary="The best stored configuration for an SLO",
        response_model=None,
        tags=["queries"],
    )
    def best(
        name: StudyName,
        slo_p99_ms: SloP99 = None,
        qps: Qps = None,
        min_accuracy: MinAccuracy = None,
        max_memory_bytes: MaxMemory = None,
        environment: EnvironmentKey = None,
    ) -> Response:
        """The configuration with the highest accuracy whose conservative bounds meet every limit
        (confirmed measurements first): the JSON of `pareto best --json`. 404 with the closest
        configuration named when nothing stored meets the SLO."""
        return answers.answer(
            ("best", name, slo_p99_ms, qps, min_accuracy, max_memory_bytes, environment),
            lambda: api.best(
                study=name,
                slo_p99=slo_p99_ms,
                qps=qps,
                min_accuracy=min_accuracy,
                max_memory=max_memory_bytes,
                environment=environment,
                db=url,
            ),
        )


#: The bearer scheme of ``--token-file`` (module level: the dependency's annotation must resolve here).
_BEARER = HTTPBearer(auto_error=False, description="The token in the file given to `pareto serve --token-file`.")


def _bearer(token: str) -> Callable[..., None]:
    """A dependency that lets a request through only with ``Authorization: Bearer <token>``."""

    def require(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        if not _matches(credentials.credentials if credentials is not None else "", token):
            raise HTTPException(
                status_code=401,
                detail="Send the server's token as 'Authorization: Bearer <token>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return require


def _has_token(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header is ``Bearer <token>``."""
    scheme, given = get_authorization_scheme_param(authorization)
    return scheme.lower() == "bearer" and _matches(given, token)


def _matches(given: str, token: str) -> bool:
    """``given == token`` in constant time."""
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


def _driver_message(exc: BaseException) -> str:
    """The first line of the database driver's message under a SQLAlchemy error (its type when it has none)."""
    orig = getattr(exc, "orig", None) or exc
    return message_line(orig, empty=type(orig).__name__)
