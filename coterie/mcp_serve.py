"""``coterie mcp-serve``: the home's personas as an MCP server.

Editors and other agents reach the personas over the Model Context Protocol
(the official ``mcp`` SDK, 2.x) through four tools:

- ``list_personas`` — name, description and activity of every persona;
- ``ask_persona`` — send a message and wait for the reply; a turn that
  fails, or an unknown persona, is a tool error (``isError``) saying why;
- ``send_to_persona`` — queue a message without waiting for the turn;
- ``recall`` — the persona's long-term memory hits; registered only with
  ``allow_recall`` (memories can be private): without it the tool does not
  exist.

Messages without a ``conversation_id`` go to ``<persona>:mcp``, so that an
editor's calls continue one conversation.

Where the personas run: :func:`open_backend` goes through the ``coterie
serve`` of the home when one answers (its HTTP API: :class:`ServerBackend`),
else starts the runtime in this process (:class:`RuntimeBackend`, shut down on
exit). The tools see only :class:`PersonaBackend`. The backend opens in the
background (:class:`BackendStarter`): the MCP handshake and ``tools/list``
answer at once; a tool call waits for the runtime.

Transports: stdio (stdout is the protocol; while it serves, the SDK points
file descriptor 1 at stderr, and the runtime starts only then — from the
server's lifespan — so neither our logs nor Ray's processes can write into
the protocol) or streamable HTTP on ``/mcp`` (127.0.0.1 by default;
DNS-rebinding protection on loopback). SIGTERM and Ctrl-C shut down cleanly.

HTTP is a front door, so every request needs ``Authorization: Bearer
<token>`` (:class:`BearerAuth`, else 401 with a JSON error): the token of
``--token-file`` (this user's only), else ``$COTERIE_MCP_TOKEN``, else a new
one written to ``<home>/mcp-serve.token`` (mode 0600; its path is announced,
never the token). Only a loopback binding may go without (``--no-auth``).
stdio has none: the client spawned the process.

The tools' arguments are their functions' annotated parameters: the SDK turns
those into one pydantic model, the only source of both the JSON schema and
the validation (the conventions' "one pydantic model", as the SDK spells it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from coterie.client import ServerClient, ServerError, find_server
from runtime.errors import CoterieError, DeliveryError
from runtime.memory.records import RecallHit
from runtime.messages import ReplyEnvelope, TurnStatus
from runtime.routing import PersonaInfo
from runtime.serve.app import RECALL_LIMIT, RECALL_MAX, RECALL_QUERY_CHARS
from runtime.serve.http import ID_PATTERN

if TYPE_CHECKING:
    from coterie.api import Runtime

log = logging.getLogger("coterie.mcp_serve")
T = TypeVar("T")

#: Where ``--http`` serves, and the hosts it binds without a warning.
MCP_PATH = "/mcp"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: Seconds a graceful HTTP shutdown waits for open MCP streams.
HTTP_SHUTDOWN_GRACE = 5.0
#: The environment variable that can give ``--http`` its bearer token.
TOKEN_ENV = "COTERIE_MCP_TOKEN"
#: Where a generated bearer token is written, in the home (mode 0600).
TOKEN_FILE = "mcp-serve.token"
#: The shortest token accepted from a file or the environment (as ``coterie serve``).
MIN_TOKEN_CHARS = 16


def default_conversation(persona: str) -> str:
    """The conversation of MCP callers that name none."""
    return f"{persona}:mcp"


# -- backends -------------------------------------------------------------------


class PersonaBackend(Protocol):
    """What the tools need of coterie; failures raise :class:`CoterieError`
    (an unknown persona: a message naming it and the known ones)."""

    #: Where the personas run, for the log.
    where: str

    async def personas(self) -> list[PersonaInfo]: ...

    async def ask(self, persona: str, text: str, *, conversation_id: str) -> ReplyEnvelope: ...

    async def send(self, persona: str, text: str, *, conversation_id: str) -> None: ...

    async def recall(self, persona: str, query: str, *, limit: int) -> list[RecallHit]: ...

    async def aclose(self) -> None: ...


class ServerBackend:
    """The personas of a running ``coterie serve``, over its HTTP API (the
    client is synchronous urllib: each call runs in a thread)."""

    def __init__(self, client: ServerClient) -> None:
        self.client = client
        self.where = f"coterie serve at {client.state.url}"

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except ServerError as exc:  # its message is the runtime's own
            raise CoterieError(str(exc)) from None
        except OSError as exc:
            raise DeliveryError(f"{self.where} did not answer: {exc}") from None

    @staticmethod
    def _persona_path(persona: str, tail: str) -> str:
        return f"/v1/personas/{quote(persona, safe='')}/{tail}"

    async def personas(self) -> list[PersonaInfo]:
        listed: list[PersonaInfo] = []
        while True:  # the API pages the roster
            page = await self._call(self.client.get, f"/v1/personas?offset={len(listed)}")
            listed += [PersonaInfo.model_validate(p) for p in page["personas"]]
            if not page["personas"] or len(listed) >= page["total"]:
                return listed

    async def ask(self, persona: str, text: str, *, conversation_id: str) -> ReplyEnvelope:
        body = {"text": text, "conversation_id": conversation_id}
        data = await self._call(self.client.post, self._persona_path(persona, "messages"), body)
        return ReplyEnvelope.model_validate(data["reply"])

    async def send(self, persona: str, text: str, *, conversation_id: str) -> None:
        body = {"text": text, "conversation_id": conversation_id, "wait": False}
        await self._call(self.client.post, self._persona_path(persona, "messages"), body)

    async def recall(self, persona: str, query: str, *, limit: int) -> list[RecallHit]:
        path = self._persona_path(persona, "recall?" + urlencode({"query": query, "limit": limit}))
        data = await self._call(self.client.get, path)
        return [RecallHit.model_validate(h) for h in data["hits"]]

    async def aclose(self) -> None:
        return None  # the server is not ours to stop


class RuntimeBackend:
    """A runtime started by this process (shut down by :meth:`aclose`)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.where = f"an in-process runtime for {runtime.home}"

    async def personas(self) -> list[PersonaInfo]:
        return await self.runtime.personas_async()

    async def ask(self, persona: str, text: str, *, conversation_id: str) -> ReplyEnvelope:
        return await self.runtime.ask_async(
            persona,
            text,
            conversation_id=conversation_id,
            timeout=self.runtime.settings.serve.ask_timeout,
        )

    async def send(self, persona: str, text: str, *, conversation_id: str) -> None:
        envelope = self.runtime.envelope(persona, text, conversation_id=conversation_id)
        envelope.reply_mode = "none"  # the reply stays in the conversation
        await self.runtime.post_async(envelope)

    async def recall(self, persona: str, query: str, *, limit: int) -> list[RecallHit]:
        return await self.runtime.recall_async(persona, query, limit=limit)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.runtime.shutdown)


async def open_backend(home: Path, *, address: str | None = None) -> PersonaBackend:
    """The ``coterie serve`` of ``home`` if one answers (unless ``address``
    names a cluster to join), else a runtime started here."""
    if not address:
        client = await asyncio.to_thread(find_server, home)
        if client is not None:
            return ServerBackend(client)
    from coterie.api import Runtime  # imports Ray: only when no server runs

    return RuntimeBackend(await asyncio.to_thread(Runtime.start, home=home, address=address))


class BackendStarter:
    """Opens the backend once, in the background, on the first :meth:`start`;
    the tools :meth:`get` it (waiting while it starts)."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[PersonaBackend]],
        *,
        announce: Callable[[str], None] = log.info,
    ) -> None:
        self._opener = opener
        self._announce = announce
        self._task: asyncio.Task[PersonaBackend] | None = None

    async def _open(self) -> PersonaBackend:
        try:
            backend = await self._opener()
        except Exception as exc:  # reported by every tool call, and once here
            self._announce(f"coterie mcp-serve: the runtime could not start: {exc}")
            raise
        self._announce(f"coterie mcp-serve: personas served by {backend.where}")
        return backend

    def start(self) -> None:
        """Begin opening the backend (once; later calls do nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._open())

    async def get(self) -> PersonaBackend:
        """The backend; a tool error (:class:`McpToolError`) when it could not be opened."""
        self.start()
        assert self._task is not None
        try:
            # Shielded: a cancelled tool call must not cancel the start itself.
            return await asyncio.shield(self._task)
        except Exception as exc:
            raise McpToolError(f"the coterie runtime could not start: {exc}") from exc

    async def aclose(self) -> None:
        """Close the backend; a start under way is waited for first (Ray
        cannot be stopped half-started)."""
        if self._task is None:
            return
        try:
            backend = await self._task
        except Exception:  # nothing was opened; the failure was announced
            return
        await backend.aclose()


# -- results ----------------------------------------------------------------------


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PersonaList(_Result):
    """What ``list_personas`` returns."""

    personas: list[PersonaInfo]


class AskResult(_Result):
    """What ``ask_persona`` returns (``choices``: a question's buttons)."""

    persona: str
    conversation_id: str
    text: str
    status: TurnStatus
    choices: list[str] = Field(default_factory=list)


class SendResult(_Result):
    """What ``send_to_persona`` returns."""

    persona: str
    conversation_id: str
    queued: bool = True


class RecallResult(_Result):
    """What ``recall`` returns."""

    persona: str
    query: str
    hits: list[RecallHit]


def _result(text: str, data: BaseModel) -> CallToolResult:
    """``data`` as structured content, with ``text`` for the reader: a
    readable block rather than the JSON again, since an editor shows it and a
    model reads it (a client that wants the data has ``structuredContent``)."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=data.model_dump(mode="json"),
    )


async def _guard(call: Awaitable[T]) -> T:
    """``call``, its runtime errors as tool errors (``isError`` with the message)."""
    try:
        return await call
    except CoterieError as exc:
        raise McpToolError(str(exc)) from exc


def _reply_failure(persona: str, reply: ReplyEnvelope) -> str | None:
    """Why the turn failed, or None when it answered."""
    if reply.status == "error":
        return f"{persona}'s turn failed: {reply.error or 'no reason given'}"
    if reply.status == "failed":  # the persona ended the task as failed
        return f"{persona} could not do it: {reply.text or 'no reason given'}"
    return None


def _hit_line(hit: RecallHit) -> str:
    content = " ".join(hit.content.split())
    meta = [hit.category, f"importance {hit.importance}" if hit.importance else None, hit.day]
    detail = ", ".join(m for m in meta if m)
    return f"{hit.tag} ({detail}) {content}" if detail else f"{hit.tag} {content}"


# -- the server ---------------------------------------------------------------------

PersonaArg = Annotated[str, Field(description="the persona's name (list_personas names them)")]
TextArg = Annotated[str, Field(min_length=1, description="the message, as a person would write it")]
ConversationArg = Annotated[
    Annotated[str, Field(pattern=ID_PATTERN)] | None,
    Field(
        description="the conversation to continue (letters, digits and _.:@-); "
        "default <persona>:mcp, one conversation for every MCP caller"
    ),
]

INSTRUCTIONS = (
    "The personas of a coterie home: each is an assistant with its own soul, tools and memory. "
    "list_personas names them; ask_persona talks to one and waits for its reply; "
    "send_to_persona leaves it a message without waiting. Calls without a conversation_id "
    "continue the conversation <persona>:mcp."
)


def build_server(starter: BackendStarter, *, allow_recall: bool = False) -> MCPServer[None]:
    """The MCP server and its tools over ``starter``'s backend; its lifespan
    starts the backend (in stdio mode, once the SDK has claimed stdout)."""

    @contextlib.asynccontextmanager
    async def lifespan(_server: MCPServer[None]) -> AsyncIterator[None]:
        starter.start()  # idempotent: streamable HTTP enters this per session
        yield None

    server: MCPServer[None] = MCPServer("coterie", instructions=INSTRUCTIONS, lifespan=lifespan)
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=reading)
    async def list_personas() -> Annotated[CallToolResult, PersonaList]:
        """List every persona of the home: its name, its description and whether
        it is active (its actor is up) right now."""
        backend = await starter.get()
        personas = await _guard(backend.personas())
        lines = [
            f"{p.name}{' (active)' if p.active else ''}: {p.description or 'no description'}"
            for p in personas
        ]
        return _result(
            "\n".join(lines) or "This home has no personas.", PersonaList(personas=personas)
        )

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True))
    async def ask_persona(
        persona: PersonaArg, text: TextArg, conversation_id: ConversationArg = None
    ) -> Annotated[CallToolResult, AskResult]:
        """Send a message to a persona and wait for its reply. The persona may use
        its tools on the way; a reply that is a question lists its choices.
        Without conversation_id the conversation <persona>:mcp continues."""
        backend = await starter.get()
        conversation = conversation_id or default_conversation(persona)
        reply = await _guard(backend.ask(persona, text, conversation_id=conversation))
        failure = _reply_failure(persona, reply)
        if failure is not None:
            raise McpToolError(failure)
        choices = list(reply.question.buttons) if reply.question else []
        shown = reply.text + (f"\n\nChoices: {', '.join(choices)}" if choices else "")
        result = AskResult(
            persona=persona,
            conversation_id=reply.conversation_id,
            text=reply.text,
            status=reply.status,
            choices=choices,
        )
        return _result(shown, result)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True))
    async def send_to_persona(
        persona: PersonaArg, text: TextArg, conversation_id: ConversationArg = None
    ) -> Annotated[CallToolResult, SendResult]:
        """Leave a message for a persona without waiting: its turn runs in the
        background and the reply stays in the conversation (a later ask_persona
        on the same conversation sees it). Returns the conversation id."""
        backend = await starter.get()
        conversation = conversation_id or default_conversation(persona)
        await _guard(backend.send(persona, text, conversation_id=conversation))
        text_out = f"Queued for {persona} on conversation {conversation} (not waiting for a reply)."
        return _result(text_out, SendResult(persona=persona, conversation_id=conversation))

    if allow_recall:

        @server.tool(annotations=reading)
        async def recall(
            persona: PersonaArg,
            query: Annotated[
                str,
                Field(
                    max_length=RECALL_QUERY_CHARS,
                    description="what to look for; empty: its most important and recent memories",
                ),
            ] = "",
            limit: Annotated[int, Field(ge=1, le=RECALL_MAX)] = RECALL_LIMIT,
        ) -> Annotated[CallToolResult, RecallResult]:
            """Search a persona's long-term memory (what it wrote down and the
            documents it ingested), best matches first."""
            backend = await starter.get()
            hits = await _guard(backend.recall(persona, query, limit=limit))
            text_out = "\n".join(_hit_line(h) for h in hits) or "Nothing found."
            return _result(text_out, RecallResult(persona=persona, query=query, hits=hits))

    return server


# -- authentication (HTTP) --------------------------------------------------------------


class BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer
    <token>`` (compared in constant time), else 401 with a JSON error, shaped
    as ``coterie serve``'s; the lifespan passes through.

    Not the SDK's own gate: in ``mcp`` 2.3 ``token_verifier=`` requires
    ``auth=AuthSettings(issuer_url=...)``, an OAuth authorization server that a
    pre-shared token does not have."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    def authorized(self, scope: Scope) -> bool:
        header = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"")
        scheme, _, given = header.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("latin-1"), self._token
        )

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


@dataclass(frozen=True)
class HttpAuth:
    """How ``--http`` checks its callers (see :func:`http_auth`)."""

    #: The bearer token; None: no authentication (``--no-auth``, loopback only).
    token: str | None = field(repr=False)
    #: Where the token is, for the announcement: never the token itself.
    source: str
    #: Where to write the token (generated here) once the port is bound.
    write_to: Path | None = None

    def publish(self) -> None:
        """Write a generated token to its file: atomically, this user's only."""
        if self.write_to is None or self.token is None:
            return
        tmp = self.write_to.with_name(self.write_to.name + ".tmp")
        try:
            tmp.unlink(missing_ok=True)  # O_CREAT keeps an old file's mode
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(self.token + "\n")
            os.replace(tmp, self.write_to)
        except OSError as exc:
            raise CoterieError(f"cannot write the bearer token to {self.write_to}: {exc}") from None

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` behind :class:`BearerAuth`, unless there is no token."""
        return app if self.token is None else BearerAuth(app, self.token)


def _checked_token(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise CoterieError(
            f"{where} does not hold a usable token "
            f"({MIN_TOKEN_CHARS} characters or more, without spaces)"
        )
    return token


def read_token_file(path: Path) -> str:
    """The token in ``path``, which only its owner may read or write."""
    where = f"--token-file {path}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise CoterieError(f"{where}: cannot open it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:  # checked on the open file: no swap in between
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            raise CoterieError(
                f"{where} is open to other users (mode {mode:04o}); "
                f"make it yours alone: chmod 600 {path}"
            )
        data = handle.read(4096)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CoterieError(f"{where} is not a text file") from None
    return _checked_token(text, where)


def http_auth(
    home: Path,
    *,
    host: str,
    token_file: Path | None = None,
    no_auth: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> HttpAuth:
    """The authentication of ``--http`` on ``host``: ``--no-auth`` (loopback
    only), else the token of ``token_file``, else ``$COTERIE_MCP_TOKEN``, else
    a new one for ``<home>/mcp-serve.token``. Raises :class:`CoterieError`
    before anything starts."""
    if no_auth:
        if token_file is not None:
            raise CoterieError("--no-auth and --token-file contradict each other: choose one")
        if host not in LOOPBACK:
            raise CoterieError(
                f"--no-auth is refused on --host {host}: anyone who reaches the port could "
                "talk to the personas and, through them, use their tools. It is only for a "
                f"loopback host ({', '.join(sorted(LOOPBACK))}); elsewhere keep the bearer token"
            )
        return HttpAuth(token=None, source="no authentication (--no-auth)")
    if token_file is not None:
        return HttpAuth(
            token=read_token_file(token_file), source=f"bearer token from --token-file {token_file}"
        )
    if environ.get(TOKEN_ENV, "").strip():
        token = _checked_token(environ[TOKEN_ENV], f"${TOKEN_ENV}")
        return HttpAuth(token=token, source=f"bearer token from ${TOKEN_ENV}")
    path = home / TOKEN_FILE
    return HttpAuth(
        token=secrets.token_urlsafe(32), source=f"bearer token in {path}", write_to=path
    )


# -- running it -----------------------------------------------------------------------


def mcp_url(host: str, port: int) -> str:
    """The MCP endpoint's address."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


def _announce(message: str) -> None:
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


async def serve_stdio(server: MCPServer[None], starter: BackendStarter) -> None:
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
    _announce("coterie mcp-serve: stopping")
    await starter.aclose()
    sys.stderr.flush()
    os._exit(0)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise CoterieError(f"cannot listen on {host}:{port}: {exc}") from None


async def serve_http(
    server: MCPServer[None], starter: BackendStarter, *, host: str, port: int, auth: HttpAuth
) -> None:
    """Serve streamable HTTP on ``host:port`` (path ``/mcp``), behind ``auth``, until a signal."""
    import uvicorn

    class Uvicorn(uvicorn.Server):
        """uvicorn without signal handlers of its own: this function's stop it,
        then the runtime is shut down (uvicorn's would re-raise the signal)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    if host not in LOOPBACK:
        log.warning(
            "mcp-serve on %s: plain HTTP, the bearer token travels unencrypted "
            "(a TLS proxy in front, or a trusted network)",
            host,
        )
    sock = _bind(host, port)
    auth.publish()  # once the port is ours: a failed start leaves the old token file
    app = auth.wrap(server.streamable_http_app(host=host))
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
    _announce(f"coterie mcp-serve: MCP over streamable HTTP at {url} ({auth.source})")
    try:
        await web.serve(sockets=[sock])
    finally:
        undo()
    _announce("coterie mcp-serve: stopping")


async def mcp_serve(
    home: Path,
    *,
    address: str | None = None,
    http_port: int | None = None,
    host: str = "127.0.0.1",
    allow_recall: bool = False,
    auth: HttpAuth | None = None,
) -> None:
    """Serve the personas of ``home`` over MCP: stdio unless ``http_port``;
    HTTP behind ``auth`` (default: :func:`http_auth`'s, a token required)."""
    if http_port is not None and auth is None:
        auth = http_auth(home, host=host)
    starter = BackendStarter(lambda: open_backend(home, address=address), announce=_announce)
    server = build_server(starter, allow_recall=allow_recall)
    try:
        if http_port is None:
            await serve_stdio(server, starter)
        else:
            assert auth is not None
            await serve_http(server, starter, host=host, port=http_port, auth=auth)
    finally:
        await starter.aclose()


def run_mcp_serve(
    home: Path,
    *,
    address: str | None,
    http_port: int | None,
    host: str,
    allow_recall: bool,
    token_file: str | Path | None = None,
    no_auth: bool = False,
) -> int:
    """``coterie mcp-serve``: run until stdin closes (stdio) or a signal. The
    HTTP authentication is settled first: a refused one starts nothing."""
    auth = None
    token_path = Path(token_file).expanduser() if token_file is not None else None
    if http_port is not None:
        auth = http_auth(home, host=host, token_file=token_path, no_auth=no_auth)
    elif token_file is not None or no_auth:
        flag = "--token-file" if token_file is not None else "--no-auth"
        raise CoterieError(f"{flag} needs --http PORT (stdio has no front door to lock)")
    asyncio.run(
        mcp_serve(
            home,
            address=address,
            http_port=http_port,
            host=host,
            allow_recall=allow_recall,
            auth=auth,
        )
    )
    return 0


__all__ = [
    "TOKEN_ENV",
    "TOKEN_FILE",
    "AskResult",
    "BackendStarter",
    "BearerAuth",
    "HttpAuth",
    "PersonaBackend",
    "PersonaList",
    "RecallResult",
    "RuntimeBackend",
    "SendResult",
    "ServerBackend",
    "build_server",
    "default_conversation",
    "http_auth",
    "mcp_serve",
    "mcp_url",
    "open_backend",
    "read_token_file",
    "run_mcp_serve",
]
