"""How ``coterie mcp-serve`` speaks: stdio, or streamable HTTP behind a bearer token.

stdio: stdout is the protocol. While it serves, the SDK points file
descriptor 1 at stderr, and the door opens only then — from the server's
lifespan — so neither our logs nor Ray's processes can write into the
protocol. stdio has no token: the client spawned the process.

Streamable HTTP on ``/mcp`` (127.0.0.1 by default; DNS-rebinding protection
on loopback). It is a front door, so every request needs ``Authorization:
Bearer <token>`` (:class:`BearerAuth`, else 401 with a JSON error shaped as
``coterie serve``'s): the token of ``--token-file``, else
``$COTERIE_MCP_TOKEN``, else the one kept in ``<home>/mcp-serve.token`` —
the rules of :mod:`runtime.serve.auth`, the same as ``coterie serve``'s.
Only a loopback binding may go without (``--no-auth``).

SIGTERM and Ctrl-C shut down cleanly: the server stops, then the door is
let go of (a runtime started for it is stopped, its audit log flushed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from coterie.runtime.errors import ServeError
from coterie.runtime.frontdoor import OpenedDoor
from coterie.runtime.serve.auth import (
    MCP_DOOR,
    DoorAuth,
    bearer_matches,
    door_auth,
    plain_http_warning,
    token_path,
)
from coterie.runtime.serve.mcp import ASK_TIMEOUT, DoorStarter, build_server

log = logging.getLogger("coterie.mcp_serve")

#: Where ``--http`` serves.
MCP_PATH = "/mcp"
#: Seconds a graceful HTTP shutdown waits for open MCP streams.
HTTP_SHUTDOWN_GRACE = 5.0
#: The environment variable that can give ``--http`` its bearer token.
TOKEN_ENV = "COTERIE_MCP_TOKEN"
#: Where a generated bearer token is kept, in the home (mode 0600).
TOKEN_FILE = token_path(Path(), MCP_DOOR).name


class BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer
    <token>`` (compared in constant time), else 401 with a JSON error, shaped
    as ``coterie serve``'s; the lifespan passes through.

    Not the SDK's own gate: in ``mcp`` 2.3 ``token_verifier=`` requires
    ``auth=AuthSettings(issuer_url=...)``, an OAuth authorization server that a
    pre-shared token does not have."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token

    def authorized(self, scope: Scope) -> bool:
        header = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"")
        return bearer_matches(bytes(header), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # the SDK serves none; refuse the handshake
            await send({"type": "websocket.close", "code": 1008})
            return
        error = {"type": "unauthorized", "message": "a valid bearer token is required"}
        body = json.dumps({"error": error}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def http_auth(
    home: Path,
    *,
    host: str,
    token_file: Path | None = None,
    no_auth: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> DoorAuth:
    """The authentication of ``--http`` on ``host`` (:func:`~runtime.serve.auth.door_auth`
    for this door): ``--no-auth`` (loopback only), else the token of
    ``token_file``, else ``$COTERIE_MCP_TOKEN``, else the one kept in
    ``<home>/mcp-serve.token``, else a new one for it. Raises before anything starts."""
    return door_auth(
        home,
        MCP_DOOR,
        env_var=TOKEN_ENV,
        host=host,
        token_file=token_file,
        no_auth=no_auth,
        environ=environ,
    )


def mcp_url(host: str, port: int) -> str:
    """The MCP endpoint's address."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


def announce(message: str) -> None:
    """Say ``message`` on stderr (stdout may be the protocol)."""
    print(message, file=sys.stderr, flush=True)


def _stop_on_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop`` on SIGTERM or SIGINT (from the running loop); returns the undo."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop)

    def undo() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return undo


async def serve_stdio(server: MCPServer[None], starter: DoorStarter) -> None:
    """Speak MCP on stdin/stdout until stdin closes or a signal comes."""
    serving = asyncio.ensure_future(server.run_stdio_async())
    stopped = asyncio.Event()
    undo = _stop_on_signals(stopped.set)
    waiter = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        undo()
        waiter.cancel()
    if serving.done():
        serving.result()  # stdin closed: the normal end; raises what failed
        return
    # A signal: the SDK reads stdin in a worker thread that cannot be
    # interrupted, so the transport cannot be unwound; the runtime is stopped
    # and the process leaves without waiting for that thread.
    announce("coterie mcp-serve: stopping")
    await starter.aclose()
    sys.stderr.flush()
    os._exit(0)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from None


async def serve_http(
    server: MCPServer[None], starter: DoorStarter, *, host: str, port: int, auth: DoorAuth
) -> None:
    """Serve streamable HTTP on ``host:port`` (path ``/mcp``), behind ``auth``, until a signal."""
    import uvicorn

    class Uvicorn(uvicorn.Server):
        """uvicorn without signal handlers of its own: this function's stop it,
        then the runtime is shut down (uvicorn's would re-raise the signal)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    warning = plain_http_warning("mcp-serve", host)
    if warning:
        log.warning("%s", warning)
    sock = _bind(host, port)
    auth = auth.publish()  # once the port is ours: a failed start writes no token
    app: ASGIApp = server.streamable_http_app(host=host)
    if auth.token is not None:
        app = BearerAuth(app, auth.token)
    config = uvicorn.Config(
        app,
        log_config=None,  # our logging: stderr
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(HTTP_SHUTDOWN_GRACE),
    )
    web = Uvicorn(config)

    def stop() -> None:
        web.should_exit = True

    undo = _stop_on_signals(stop)
    starter.start()
    url = mcp_url(host, sock.getsockname()[1])
    announce(f"coterie mcp-serve: MCP over streamable HTTP at {url} ({auth.source})")
    try:
        await web.serve(sockets=[sock])
    finally:
        undo()
    announce("coterie mcp-serve: stopping")


async def mcp_serve(
    opener: Callable[[], Awaitable[OpenedDoor]],
    *,
    auth: DoorAuth | None = None,
    host: str = "127.0.0.1",
    http_port: int | None = None,
    allow_recall: bool = False,
    ask_timeout: float = ASK_TIMEOUT,
) -> None:
    """Serve the personas behind the door ``opener`` opens over MCP: stdio
    unless ``http_port``; HTTP behind ``auth`` (required then)."""
    if http_port is not None and auth is None:
        raise ServeError("MCP over HTTP needs its authentication settled (http_auth)")
    starter = DoorStarter(opener, announce=announce)
    server = build_server(starter, allow_recall=allow_recall, ask_timeout=ask_timeout)
    try:
        if http_port is None:
            await serve_stdio(server, starter)
        else:
            assert auth is not None
            await serve_http(server, starter, host=host, port=http_port, auth=auth)
    finally:
        await starter.aclose()


__all__ = [
    "MCP_PATH",
    "TOKEN_ENV",
    "TOKEN_FILE",
    "BearerAuth",
    "announce",
    "http_auth",
    "mcp_serve",
    "mcp_url",
    "serve_http",
    "serve_stdio",
]
