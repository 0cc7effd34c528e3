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
the protocol) or streamable HTTP on ``/mcp`` (DNS-rebinding protection on
loopback; no authentication, hence 127.0.0.1 by default). SIGTERM and Ctrl-C
shut down cleanly.

The tools' arguments are their functions' annotated parameters: the SDK turns
those into one pydantic model, the only source of both the JSON schema and
the validation (the conventions' "one pydantic model", as the SDK spells it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

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
    server: MCPServer[None], starter: BackendStarter, *, host: str, port: int
) -> None:
    """Serve streamable HTTP on ``host:port`` (path ``/mcp``) until a signal."""
    import uvicorn

    class Uvicorn(uvicorn.Server):
        """uvicorn without signal handlers of its own: this function's stop it,
        then the runtime is shut down (uvicorn's would re-raise the signal)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    if host not in LOOPBACK:
        log.warning("mcp-serve on %s: the MCP endpoint has no authentication", host)
    sock = _bind(host, port)
    app = server.streamable_http_app(host=host)
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
    _announce(
        f"coterie mcp-serve: MCP over streamable HTTP at {mcp_url(host, sock.getsockname()[1])}"
    )
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
) -> None:
    """Serve the personas of ``home`` over MCP: stdio unless ``http_port``."""
    starter = BackendStarter(lambda: open_backend(home, address=address), announce=_announce)
    server = build_server(starter, allow_recall=allow_recall)
    try:
        if http_port is None:
            await serve_stdio(server, starter)
        else:
            await serve_http(server, starter, host=host, port=http_port)
    finally:
        await starter.aclose()


def run_mcp_serve(
    home: Path,
    *,
    address: str | None,
    http_port: int | None,
    host: str,
    allow_recall: bool,
) -> int:
    """``coterie mcp-serve``: run until stdin closes (stdio) or a signal."""
    asyncio.run(
        mcp_serve(home, address=address, http_port=http_port, host=host, allow_recall=allow_recall)
    )
    return 0


__all__ = [
    "AskResult",
    "BackendStarter",
    "PersonaBackend",
    "PersonaList",
    "RecallResult",
    "RuntimeBackend",
    "SendResult",
    "ServerBackend",
    "build_server",
    "default_conversation",
    "mcp_serve",
    "mcp_url",
    "open_backend",
    "run_mcp_serve",
]
