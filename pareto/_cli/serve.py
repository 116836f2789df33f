"""`pareto serve`: the read-only HTTP API (``pareto.serve``) under uvicorn."""

from __future__ import annotations

import errno
import ipaddress
import socket
from pathlib import Path
from typing import Any

import click

from pareto._cli.options import db_option, err
from pareto.errors import ParetoError, UsageError
from pareto.store.engine import display_url, open_engine, require_schema, resolve_url


@click.command("serve")
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(min=1, max=65535), default=8080, show_default=True, help="TCP port.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="File holding a token; every endpoint but /healthz then needs 'Authorization: Bearer <token>'.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name clients reach the server by, beside localhost, 127.0.0.1, ::1 and --host (repeatable; '*': any). "
    "Requests naming another in their Host header are refused (DNS rebinding).",
)
def command(db: str | None, host: str, port: int, token_file: str | None, allowed_hosts: tuple[str, ...]) -> int:
    """Answer studies, frontier and best over HTTP (read-only; OpenAPI at /docs); Ctrl-C stops."""
    try:  # deferred: FastAPI and uvicorn are the optional "serve" extra
        import uvicorn

        from pareto.serve import create_app
    except ImportError as exc:
        raise ParetoError(
            f"pareto serve needs FastAPI and uvicorn ({exc.name or exc} is missing): pip install 'pareto-slo[serve]'."
        ) from exc

    url = resolve_url(db)
    engine = open_engine(url, create=False)  # a missing SQLite file or a database that does not answer: refuse now
    try:
        require_schema(engine)
    finally:
        engine.dispose()
    token = read_token(token_file) if token_file else None
    app = create_app(url, token=token, allowed_hosts=[host, *allowed_hosts])
    where = resolve(host, port)
    if not is_loopback(where[3]):
        err.print(
            f"Warning: listening on {host}, reachable from other machines; "
            + (
                "anyone who can reach it can read every study: pass --token-file."
                if token is None
                else "the token travels unencrypted unless a TLS proxy is in front."
            )
            + (
                ""
                if allowed_hosts
                else " Requests that call it by another name than --host are refused: pass --allowed-host NAME."
            ),
            markup=False,
        )
    sock = bind(host, port, where)
    shown = f"[{host}]" if ":" in host else host
    safe = display_url(engine.url)
    err.print(
        f"Serving {safe} read-only at http://{shown}:{port} (OpenAPI at /docs"
        + (", bearer token required" if token else "")
        + "); Ctrl-C stops.",
        markup=False,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", access_log=True))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raises the Ctrl-C again once it has shut down
        return 0
    finally:
        sock.close()
    if not server.started:
        raise ParetoError(f"The server on {host}:{port} did not start; its log above says why.")
    return 0


def read_token(path: str) -> str:
    """The token in ``path``, surrounding whitespace removed.

    Raises:
        UsageError: the file cannot be read or holds only whitespace.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise UsageError(f"Cannot read token file {path}: {reason}; write a token into it first.") from exc
    if not token:
        raise UsageError(f"Token file {path} is empty; write a token into it (e.g. 'openssl rand -hex 32 > {path}').")
    return token


def resolve(host: str, port: int) -> tuple[int, int, int, tuple[Any, ...]]:
    """(family, type, protocol, socket address) to listen on at ``host:port``, as ``getaddrinfo`` gives first.

    Raises:
        UsageError: the host does not resolve.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except UnicodeError as exc:  # a name no DNS label can hold (too long, empty): Python's IDNA codec refuses it
        raise UsageError(f"Cannot listen on {host[:80]!r}: not a host name; pass --host with an address.") from exc
    except OSError as exc:
        raise UsageError(f"Cannot listen on {host}: {exc.strerror or exc}; pass --host with an address.") from exc
    return family, kind, proto, address


def is_loopback(address: tuple[Any, ...]) -> bool:
    """Whether a socket address is a loopback one (127.0.0.0/8, ::1)."""
    return ipaddress.ip_address(str(address[0]).split("%")[0]).is_loopback


def bind(host: str, port: int, where: tuple[int, int, int, tuple[Any, ...]]) -> socket.socket:
    """A socket bound to ``where`` (from ``resolve``) for uvicorn to listen on: a port in use is found
    here, before the server starts, and nothing else can take the port in between.

    Raises:
        UsageError: the port is in use, or the address is not one of this machine's.
    """
    family, kind, proto, address = where
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart past TIME_WAIT
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"Port {port} on {host} is in use; stop what holds it or pass --port.") from exc
        raise UsageError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from exc
    return sock
