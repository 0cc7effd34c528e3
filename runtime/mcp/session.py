"""One contained client session to one MCP server, through the official ``mcp`` SDK.

:class:`McpSession` is plain asyncio (the Ray actor of ``actors.mcp`` is a
thin shell over it)::

    session = McpSession(launch, on_change=hub.mark_dirty)
    status = await session.start()          # never raises for a server problem
    result = await session.call_tool("get_current_time", {"timezone": "UTC"})
    await session.close()

**One owner task.** The SDK's ``ClientSession`` (and its transport) must be
entered and exited in the same task, or anyio refuses ("Attempted to exit
cancel scope in a different task"). So one owner task, started by
:meth:`McpSession.start`, holds the transport and the session for their whole
life; callers put a request in the owner's inbox and await a future, and the
owner runs each request as a child task of its own task group. Every request
has a deadline (the SDK has no default one); past it the caller gets
``ToolError("timeout")`` and the owner recycles the session.

**A life of connections.** The owner runs one connection after another: a
connection is spawn (stdio) or connect (streamable HTTP), ``initialize``,
``tools/list``, serving, teardown. A connection ends because of
:meth:`close`, because a request timed out (``recycle``: restart at once,
the stuck process is killed), or because the server died or dropped the
connection (``crashed``: restart after a backoff doubling from
``backoff[0]`` up to ``backoff[1]``). Requests still in flight when it ends
fail with a readable :class:`~runtime.errors.ToolError`; while no connection
is ready every call fails at once (``server_unavailable``) instead of
waiting. If the very first start fails, the session is ``failed`` and stays
so (the hub decides when to try again); a failed *restart* is retried.

**stdio** is our own small transport (:mod:`runtime.mcp._stdio`: exactly
``launch.env``, stderr to ``launch.stderr_log``, teardown of the whole process
group). **HTTP** is the SDK's ``streamable_http_client`` over an ``httpx2``
client carrying ``launch.headers``. The SDK's types become our records in
:mod:`runtime.mcp._convert`.

``notifications/tools/list_changed`` makes the session list the tools again
(no restart); whenever the list differs, ``tools_version`` grows and
``on_change`` is called. Logs go to ``coterie.mcp``: one warning per failed
start, crash or recycle; never an environment or header value (they hold
secrets), and URLs without their query string.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, assert_never, cast

import anyio
import anyio.abc
import httpx2
from mcp import ClientSession
from mcp import types as mt
from mcp.client import Transport
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from coterie.runtime.errors import ToolError
from coterie.runtime.mcp._convert import (
    call_result,
    connection_lost,
    exit_phrase,
    leaf,
    one_line,
    prompt_info,
    prompt_result,
    resource_contents,
    resource_info,
    safe_url,
    tool_info,
)
from coterie.runtime.mcp._stdio import (
    CLOSE_GRACE_S,
    KILL_GRACE_S,
    SpawnError,
    StdioChild,
    stderr_hint,
    stdio_transport,
)
from coterie.runtime.mcp.records import (
    McpCallResult,
    McpContent,
    McpLaunch,
    McpPromptInfo,
    McpPromptResult,
    McpResourceInfo,
    McpServerStatus,
    McpToolInfo,
    ServerState,
)

if TYPE_CHECKING:
    # The (read, write) pair a transport yields; only the protocol is public.
    from mcp.client._transport import TransportStreams
    from mcp.types import RequestParamsMeta

log = logging.getLogger("coterie.mcp")
# Both log every request at INFO with its full URL (query strings, session ids):
# a server's URL may carry a token, and secrets never reach the logs.
for _noisy in ("httpx2", "mcp.client.streamable_http"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)

T = TypeVar("T")
Item = TypeVar("Item")

#: Requests one session holds at once (queued or running); more fail at once.
MAX_IN_FLIGHT = 64
#: Pages of one ``*/list`` walk; a server that paginates forever cannot hang us.
MAX_LIST_PAGES = 100
#: Seconds the teardown of one connection may take (the HTTP DELETE, say).
TEARDOWN_S = 10.0

_CLIENT_INFO = mt.Implementation(name="coterie", version="0.1.0")

End = Literal["closed", "recycle", "crashed"]


@dataclass(eq=False)
class _Request:
    """One caller's request, waiting in the inbox or running in the owner."""

    what: str  # "call_tool 'echo'": for errors and logs
    run: Callable[[ClientSession], Awaitable[Any]]
    timeout: float
    future: asyncio.Future[Any]
    scope: anyio.CancelScope | None = None


@dataclass(eq=False)
class _Connection:
    """One spawn/connect of the server, from start to teardown."""

    inbox: asyncio.Queue[_Request] = field(default_factory=asyncio.Queue)
    in_flight: set[_Request] = field(default_factory=set)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    relist_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    scope: anyio.CancelScope | None = None
    session: ClientSession | None = None
    ready: bool = False
    ready_at: float = 0.0
    # Why it ended (the first reason wins) and a sentence saying so.
    end: End | None = None
    detail: str | None = None
    # What went wrong while starting (a sentence), whether it ran out of
    # startup_timeout, the exception that ended it.
    start_error: str | None = None
    start_timed_out: bool = False
    error: BaseException | None = None
    # stdio: the process, whether its stdout ended, its status when it ended
    # (left empty over HTTP).
    stdio: StdioChild = field(default_factory=StdioChild)
    warned_unreadable: bool = False


class McpSession:
    """A supervised client session to one MCP server (see the module docstring).

    ``on_change`` is called (in the event loop, must not block) whenever the
    tool list changed after :meth:`start`: a ``list_changed`` notification or
    a restart that found other tools. ``backoff`` is the first and the longest
    pause before restarting a crashed server.
    """

    def __init__(
        self,
        launch: McpLaunch,
        *,
        on_change: Callable[[], None] | None = None,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self._launch = launch
        self._name = launch.name
        self._on_change = on_change
        self._backoff = backoff
        self._state: ServerState = "starting"
        self._error: str | None = None
        self._tools: list[McpToolInfo] = []
        self._tools_version = 0
        self._restarts = 0
        self._has_resources = False
        self._has_prompts = False
        self._server_info: str | None = None
        self._owner: asyncio.Task[None] | None = None
        self._conn: _Connection | None = None
        self._has_run = False
        self._closing = False
        self._wake = asyncio.Event()
        # Futures resolved when the next start settles (ready or failed).
        self._settle_waiters: list[asyncio.Future[None]] = []
        # Timed-out requests, answered once the recycled session settled.
        self._after_restart: list[tuple[_Request, str]] = []

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> McpServerStatus:
        """Start the session and wait until it is ready or failed.

        Bounded by ``launch.startup_timeout``; never raises for anything the
        server does (the status says ``failed`` and why). Calling it again
        while running just returns the status; after a failed start it tries
        once more.
        """
        if self._closing:
            return self.status()
        if self._owner is None or self._owner.done():
            self._state, self._error = "starting", None
            waiter = self._settle_waiter()
            self._owner = asyncio.create_task(self._own(), name=f"mcp-session-{self._name}")
        elif self._state == "starting":
            waiter = self._settle_waiter()
        else:
            return self.status()
        bound = self._launch.startup_timeout + TEARDOWN_S + KILL_GRACE_S * 2
        await asyncio.wait({waiter}, timeout=bound)
        if not waiter.done():
            waiter.cancel()
        return self.status()

    def status(self) -> McpServerStatus:
        """How the session stands right now."""
        return McpServerStatus(
            name=self._name,
            state=self._state,
            error=self._error,
            tools_version=self._tools_version,
            restarts=self._restarts,
            has_resources=self._has_resources,
            has_prompts=self._has_prompts,
            server_info=self._server_info,
        )

    async def close(self) -> None:
        """Stop the session, the process and its whole group; idempotent."""
        self._closing = True
        self._state, self._error = "closed", None
        self._wake.set()
        conn = self._conn
        if conn is not None:
            self._stop(conn, "closed", f"server {self._name!r} was closed")
        owner = self._owner
        if owner is not None and not owner.done():
            await asyncio.wait({owner}, timeout=TEARDOWN_S + CLOSE_GRACE_S + KILL_GRACE_S * 3)
            if not owner.done():
                log.warning("MCP server %r: the session did not stop in time", self._name)
                owner.cancel()
                await asyncio.wait({owner}, timeout=KILL_GRACE_S * 2)
        self._answer_after_restart(None)
        self._settle()
        self._tools = []

    # -- what callers use --------------------------------------------------------

    async def tools(self) -> list[McpToolInfo]:
        """The server's tools as last listed (empty unless it runs or restarts)."""
        if self._state in ("ready", "restarting"):
            return list(self._tools)
        return []

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> McpCallResult:
        """Call a tool; ``timeout`` defaults to ``launch.call_timeout``;
        ``trace`` (W3C fields) goes in the request's ``_meta``.

        An ``isError`` result is returned (``is_error``), not raised. Raises
        :class:`~runtime.errors.ToolError`: ``timeout`` (the session is
        recycled), ``server_crashed``, ``server_unavailable``, ``mcp_error``
        (a JSON-RPC error or an unreadable answer).
        """
        seconds = self._launch.call_timeout if timeout is None else timeout

        async def run(session: ClientSession) -> McpCallResult:
            meta = cast("RequestParamsMeta", dict(trace)) if trace else None
            result = await session.call_tool(
                name, arguments, read_timeout_seconds=seconds, meta=meta
            )
            return call_result(result)

        return await self._request(f"call_tool {name!r}", run, seconds)

    async def list_resources(self) -> list[McpResourceInfo]:
        """The server's resources (``not_found`` when it has none to offer)."""
        self._require("resources")

        async def run(session: ClientSession) -> list[McpResourceInfo]:
            pages = _pages(session.list_resources, lambda page: page.resources)
            return [resource_info(r) async for r in pages]

        return await self._request("list_resources", run, self._launch.call_timeout)

    async def read_resource(self, uri: str) -> list[McpContent]:
        """The contents of one resource, as ``resource`` content blocks."""
        self._require("resources")

        async def run(session: ClientSession) -> list[McpContent]:
            result = await session.read_resource(uri)
            return [resource_contents(c) for c in result.contents]

        return await self._request(f"read_resource {uri!r}", run, self._launch.call_timeout)

    async def list_prompts(self) -> list[McpPromptInfo]:
        """The server's prompts (``not_found`` when it has none to offer)."""
        self._require("prompts")

        async def run(session: ClientSession) -> list[McpPromptInfo]:
            pages = _pages(session.list_prompts, lambda page: page.prompts)
            return [prompt_info(p) async for p in pages]

        return await self._request("list_prompts", run, self._launch.call_timeout)

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> McpPromptResult:
        """One prompt filled in with ``arguments``."""
        self._require("prompts")

        async def run(session: ClientSession) -> McpPromptResult:
            return prompt_result(await session.get_prompt(name, arguments))

        return await self._request(f"get_prompt {name!r}", run, self._launch.call_timeout)

    # -- handing requests to the owner -----------------------------------------

    def _unavailable(self) -> ToolError:
        name = self._name
        match self._state:
            case "closed":
                return ToolError("server_unavailable", f"server {name!r} is closed")
            case "starting":
                return ToolError("server_unavailable", f"server {name!r} is still starting")
            case "failed":
                return ToolError(
                    "server_unavailable", f"server {name!r} is not running: {self._error}"
                )
            case "restarting" | "ready":
                last = f" (last error: {self._error})" if self._error else ""
                return ToolError("server_unavailable", f"server {name!r} is restarting{last}")
            case _:
                assert_never(self._state)

    def _require(self, capability: Literal["resources", "prompts"]) -> None:
        if self._state != "ready":
            raise self._unavailable()
        has = self._has_resources if capability == "resources" else self._has_prompts
        if not has:
            raise ToolError("not_found", f"server {self._name!r} has no {capability}")

    async def _request(
        self, what: str, run: Callable[[ClientSession], Awaitable[T]], timeout: float
    ) -> T:
        conn = self._conn
        if self._state != "ready" or conn is None or not conn.ready or conn.end is not None:
            raise self._unavailable()
        if len(conn.in_flight) >= MAX_IN_FLIGHT:
            raise ToolError(
                "limit_reached",
                f"server {self._name!r} already has {MAX_IN_FLIGHT} requests in flight",
            )
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        request = _Request(what=what, run=run, timeout=timeout, future=future)
        conn.in_flight.add(request)
        conn.inbox.put_nowait(request)
        # The owner answers within the timeout, or after a recycle (bounded by
        # the startup timeout); this outer bound only guards against a bug.
        bound = timeout + self._launch.startup_timeout + TEARDOWN_S + KILL_GRACE_S * 3
        try:
            return await asyncio.wait_for(asyncio.shield(future), bound)
        except TimeoutError:
            raise ToolError(
                "timeout", f"server {self._name!r} did not answer {what} within {bound:g} s"
            ) from None
        except asyncio.CancelledError:
            if request.scope is not None:
                request.scope.cancel()
            raise
        finally:
            if not future.done():
                future.cancel()

    # -- the owner ---------------------------------------------------------------

    async def _own(self) -> None:
        """Run connections until closed: start, serve, restart after an end."""
        delay = self._backoff[0]
        try:
            while not self._closing:
                conn = _Connection()
                self._conn = conn
                await self._run_connection(conn)
                self._conn = None
                if self._closing:
                    self._fail_requests(conn, "")
                    break
                if not conn.ready:
                    error = await self._start_error(conn)
                    log.warning("MCP %s", error)
                    self._error = error
                    if not self._has_run:
                        self._state = "failed"
                        self._settle()
                        return
                    self._state = "restarting"
                    self._answer_after_restart(error)
                    self._settle()
                else:
                    self._has_run = True
                    detail = await self._end_detail(conn)
                    self._state, self._error = "restarting", detail
                    self._fail_requests(conn, detail)
                    if conn.end == "recycle":
                        log.warning("MCP %s; restarting the session", detail)
                        self._restarts += 1
                        continue
                    if time.monotonic() - conn.ready_at >= self._backoff[1]:
                        delay = self._backoff[0]  # it ran a good while: a fresh crash
                    log.warning("MCP %s; restarting it in %g s", detail, delay)
                await self._pause(delay)
                delay = min(delay * 2, self._backoff[1])
                if not self._closing:
                    self._restarts += 1
        except Exception as exc:  # boundary: a bug here must not leave callers waiting
            log.exception("MCP server %s: the session owner failed", self._name)
            self._state = "failed"
            self._error = f"server {self._name!r}: internal error: {type(exc).__name__}: {exc}"
        finally:
            if self._conn is not None:  # cancelled or failed mid-connection
                self._fail_requests(self._conn, self._error or f"server {self._name!r} stopped")
            self._conn = None
            if self._closing:
                self._state, self._error = "closed", None
            self._answer_after_restart(self._error)
            self._settle()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _run_connection(self, conn: _Connection) -> None:
        """Start, serve until the connection ends, tear down; never raises."""
        launch = self._launch
        # One scope bounds the start (startup_timeout), then nothing while
        # serving, then the teardown (TEARDOWN_S; the stdio teardown shields
        # itself and is bounded on its own).
        with anyio.CancelScope(deadline=anyio.current_time() + launch.startup_timeout) as scope:
            conn.scope = scope
            try:
                async with self._transport(conn) as (read, write):

                    async def on_message(message: IncomingMessage) -> None:
                        await self._on_message(conn, message)

                    async with ClientSession(
                        read,
                        write,
                        # Every request has a bound; ours (below) are tighter.
                        read_timeout_seconds=max(launch.call_timeout, launch.startup_timeout),
                        message_handler=on_message,
                        client_info=_CLIENT_INFO,
                    ) as session:
                        conn.session = session
                        try:
                            await self._serve_connection(conn, session, scope)
                        finally:
                            scope.deadline = min(scope.deadline, anyio.current_time() + TEARDOWN_S)
            except SpawnError as exc:
                conn.start_error = str(exc)
            except Exception as exc:  # boundary: the error becomes the status or a call's error
                conn.error = exc
        conn.start_timed_out = scope.cancelled_caught and not conn.ready and conn.end is None

    async def _serve_connection(
        self, conn: _Connection, session: ClientSession, scope: anyio.CancelScope
    ) -> None:
        init = await session.initialize()
        async with conn.relist_lock:
            listed = await _list_tools(session) if init.capabilities.tools is not None else []
        self._ready(conn, init, listed)
        scope.deadline = math.inf
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve_inbox, conn, tg)
            await conn.stopped.wait()
            tg.cancel_scope.cancel()

    def _ready(
        self, conn: _Connection, init: mt.InitializeResult, listed: list[McpToolInfo]
    ) -> None:
        capabilities = init.capabilities
        self._has_resources = capabilities.resources is not None
        self._has_prompts = capabilities.prompts is not None
        info = init.server_info
        self._server_info = f"{info.name} {info.version}".strip()
        self._apply_tools(listed, notify=self._has_run)
        conn.ready, conn.ready_at = True, time.monotonic()
        self._has_run = True
        if self._closing:
            return
        self._state, self._error = "ready", None
        log.info(
            "MCP server %s ready: %s, %d tools", self._name, self._server_info, len(self._tools)
        )
        self._answer_after_restart(None, restarted=True)
        self._settle()

    async def _serve_inbox(self, conn: _Connection, tg: anyio.abc.TaskGroup) -> None:
        while True:
            request = await conn.inbox.get()
            tg.start_soon(self._serve, conn, request)

    async def _serve(self, conn: _Connection, request: _Request) -> None:
        """Run one request; a timeout recycles, a lost connection ends the connection."""
        assert conn.session is not None
        future = request.future
        timed_out = False
        with anyio.CancelScope() as scope:
            request.scope = scope
            if future.done():  # the caller gave up while it waited in the inbox
                conn.in_flight.discard(request)
                return
            with anyio.move_on_after(request.timeout) as deadline:
                try:
                    value = await request.run(conn.session)
                except MCPError as exc:
                    if exc.code == mt.REQUEST_TIMEOUT:
                        timed_out = True
                    elif connection_lost(exc):
                        self._stop(conn, "crashed", self._lost_detail(exc))
                        return  # answered by the owner once it knows more
                    else:
                        _answer(
                            request,
                            ToolError(
                                "mcp_error",
                                f"server {self._name!r} answered {request.what} with an "
                                f"error: {exc.message}",
                            ),
                        )
                except ToolError as exc:
                    _answer(request, exc)
                except (ValidationError, RuntimeError) as exc:
                    # an off-schema result, structured content that misses its
                    # output schema, an input-required result we cannot answer
                    _answer(
                        request,
                        ToolError(
                            "mcp_error",
                            f"server {self._name!r} answered {request.what} unreadably: "
                            f"{one_line(exc)}",
                        ),
                    )
                else:
                    _answer(request, value=value)
            timed_out = timed_out or deadline.cancelled_caught
        if timed_out and not future.done():
            conn.in_flight.discard(request)
            detail = (
                f"server {self._name!r} did not answer {request.what} within {request.timeout:g} s"
            )
            self._after_restart.append((request, detail))
            self._stop(conn, "recycle", detail)
        if future.done():
            conn.in_flight.discard(request)

    def _stop(self, conn: _Connection, end: End, detail: str) -> None:
        """End ``conn`` (the first reason wins); new calls fail at once from now on."""
        if conn.end is not None:
            return
        conn.end, conn.detail = end, detail
        conn.stopped.set()
        if not conn.ready and conn.scope is not None:
            conn.scope.cancel()
        if end != "closed" and not self._closing and conn.ready:
            self._state, self._error = "restarting", detail

    def _fail_requests(self, conn: _Connection, detail: str) -> None:
        """Answer every request the ended connection still holds."""
        name = self._name
        pending = list(conn.in_flight)
        while not conn.inbox.empty():
            pending.append(conn.inbox.get_nowait())
        conn.in_flight.clear()
        for request in pending:
            if self._closing or conn.end == "closed":
                error = ToolError(
                    "server_unavailable", f"server {name!r} was closed during {request.what}"
                )
            elif conn.end == "recycle":
                error = ToolError(
                    "server_crashed",
                    f"server {name!r} was restarted during {request.what} ({conn.detail})",
                )
            else:
                error = ToolError(
                    "server_crashed", f"{detail} during {request.what}; restarting it"
                )
            _answer(request, error)

    def _answer_after_restart(self, error: str | None, *, restarted: bool = False) -> None:
        """Answer the timed-out requests: the recycled session is ready, failed or closed."""
        waiting, self._after_restart = self._after_restart, []
        for request, detail in waiting:
            if restarted:
                tail = "the session was restarted"
            elif self._closing:
                tail = "the session was closed"
            else:
                tail = f"restarting the session failed: {error}"
            _answer(request, ToolError("timeout", f"{detail}; {tail}"))

    def _settle_waiter(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settle_waiters.append(waiter)
        return waiter

    def _settle(self) -> None:
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- the tool list -----------------------------------------------------------

    def _apply_tools(self, listed: list[McpToolInfo], *, notify: bool) -> None:
        if listed == self._tools and self._tools_version > 0:
            return
        self._tools = listed
        self._tools_version += 1
        if notify and self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # boundary: the caller's hook must not break the session
                log.exception("MCP server %s: on_change failed", self._name)

    async def _on_message(self, conn: _Connection, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            if not conn.warned_unreadable:
                conn.warned_unreadable = True
                log.warning(
                    "MCP server %s sent something unreadable (ignored): %s",
                    self._name,
                    one_line(message),
                )
            return
        if isinstance(message, mt.ToolListChangedNotification):
            await self._relist(conn)

    async def _relist(self, conn: _Connection) -> None:
        session = conn.session
        if session is None or conn.end is not None:
            return
        async with conn.relist_lock:
            listed: list[McpToolInfo] | None = None
            with anyio.move_on_after(self._launch.call_timeout):
                try:
                    listed = await _list_tools(session)
                except MCPError as exc:
                    if connection_lost(exc):
                        self._stop(conn, "crashed", self._lost_detail(exc))
                        return
                    log.warning("MCP server %s: tools/list failed: %s", self._name, one_line(exc))
                except (ValidationError, RuntimeError) as exc:
                    log.warning(
                        "MCP server %s: unreadable tools/list: %s", self._name, one_line(exc)
                    )
            if listed is None:
                return
            if conn.end is None:
                self._apply_tools(listed, notify=conn.ready)

    # -- transports --------------------------------------------------------------

    def _transport(self, conn: _Connection) -> Transport:
        match self._launch.transport:
            case "stdio":
                return stdio_transport(
                    self._launch,
                    conn.stdio,
                    on_lost=lambda detail: self._stop(conn, "crashed", detail),
                    closed=lambda: conn.end == "closed",
                )
            case "http":
                return self._http()
            case _:
                assert_never(self._launch.transport)

    @contextlib.asynccontextmanager
    async def _http(self) -> AsyncIterator[TransportStreams]:
        launch = self._launch
        # No read timeout: the GET stream may idle for hours, and the SDK gives
        # it up after two read timeouts; every request has our own deadline.
        timeout = httpx2.Timeout(min(launch.startup_timeout, 30.0), read=None)
        async with (
            httpx2.AsyncClient(headers=dict(launch.headers), timeout=timeout) as client,
            streamable_http_client(launch.url, http_client=client) as streams,
        ):
            yield streams

    # -- readable errors ---------------------------------------------------------

    async def _start_error(self, conn: _Connection) -> str:
        """One line saying why ``conn`` never got ready."""
        name, launch, child = self._name, self._launch, conn.stdio
        if conn.start_error is not None:
            return conn.start_error
        if conn.start_timed_out:
            return (
                f"server {name!r} did not initialize within {launch.startup_timeout:g} s"
                f"{await stderr_hint(launch, child.stderr_offset)}"
            )
        if child.proc is not None and (child.stdout_closed or child.exit_status is not None):
            how = "closed its stdout"
            if child.exit_status is not None:
                how = exit_phrase(child.exit_status)
            hint = await stderr_hint(launch, child.stderr_offset)
            return f"server {name!r} {how} before it initialized{hint}"
        exc = leaf(conn.error)
        if isinstance(exc, httpx2.HTTPError):
            return f"server {name!r}: cannot reach {safe_url(launch.url)}: {one_line(exc)}"
        if isinstance(exc, MCPError):
            if connection_lost(exc):
                return f"server {name!r} closed the connection before it initialized: {exc.message}"
            return f"server {name!r} refused to initialize: {exc.message}"
        if exc is not None:
            return f"server {name!r} failed to start: {one_line(exc)}"
        return f"server {name!r} failed to start"

    async def _end_detail(self, conn: _Connection) -> str:
        """One line saying why a ready ``conn`` ended."""
        name, child = self._name, conn.stdio
        if conn.end == "recycle" and conn.detail:
            return conn.detail
        if child.proc is not None and child.exit_status is not None:
            return f"server {name!r} {exit_phrase(child.exit_status)}"
        if conn.detail:
            return conn.detail
        exc = leaf(conn.error)
        if isinstance(exc, httpx2.HTTPError):
            url = safe_url(self._launch.url)
            return f"server {name!r} is unreachable at {url}: {one_line(exc)}"
        if exc is not None:
            return f"server {name!r} failed: {one_line(exc)}"
        return f"server {name!r} stopped"

    def _lost_detail(self, exc: MCPError) -> str:
        if self._launch.transport == "http":
            return f"server {self._name!r} dropped the connection ({exc.message})"
        return f"server {self._name!r} closed the connection"


# -- helpers ---------------------------------------------------------------------


def _answer(request: _Request, error: BaseException | None = None, *, value: Any = None) -> None:
    future = request.future
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _page(cursor: str | None) -> mt.PaginatedRequestParams | None:
    return mt.PaginatedRequestParams(cursor=cursor) if cursor is not None else None


async def _pages(
    list_page: Callable[..., Awaitable[Any]], items: Callable[[Any], Sequence[Item]]
) -> AsyncIterator[Item]:
    """Every item of a paginated ``list_*`` request, following its cursor
    (at most :data:`MAX_LIST_PAGES` pages)."""
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await list_page(params=_page(cursor))
        for item in items(page):
            yield item
        if (cursor := page.next_cursor) is None:
            return


async def _list_tools(session: ClientSession) -> list[McpToolInfo]:
    return [tool_info(t) async for t in _pages(session.list_tools, lambda page: page.tools)]


__all__ = ["McpSession"]
