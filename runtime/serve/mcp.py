"""The MCP server of ``coterie mcp-serve``: the home's personas as tools.

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

The tools reach the personas through a :class:`~runtime.frontdoor.FrontDoor`
— a running ``coterie serve`` (:class:`~runtime.serve.client.ServedDoor`) or a
runtime started for the server (``coterie``'s wiring decides which). The door
opens in the background (:class:`DoorStarter`): the MCP handshake and
``tools/list`` answer at once; a tool call waits for the runtime. The
transports (stdio, streamable HTTP behind a bearer token) are
:mod:`runtime.serve.mcp_transport`.

The tools' arguments are their functions' annotated parameters: the SDK turns
those into one pydantic model, the only source of both the JSON schema and
the validation (the conventions' "one pydantic model", as the SDK spells it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config import ServeSettings
from coterie.runtime.errors import CoterieError
from coterie.runtime.frontdoor import FrontDoor, OpenedDoor, PersonaInfo, message
from coterie.runtime.memory.records import RecallHit
from coterie.runtime.messages import ReplyEnvelope, TurnStatus
from coterie.runtime.serve.app import RECALL_LIMIT, RECALL_MAX, RECALL_QUERY_CHARS
from coterie.runtime.serve.http import ID_PATTERN

log = logging.getLogger("coterie.mcp_serve")
T = TypeVar("T")

#: Seconds ``ask_persona`` waits for a reply unless told (``serve.ask_timeout``).
ASK_TIMEOUT = ServeSettings().ask_timeout


def default_conversation(persona: str) -> str:
    """The conversation of MCP callers that name none."""
    return f"{persona}:mcp"


class DoorStarter:
    """Opens the front door once, in the background, on the first :meth:`start`;
    the tools :meth:`get` it (waiting while it opens)."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[OpenedDoor]],
        *,
        announce: Callable[[str], None] = log.info,
    ) -> None:
        self._opener = opener
        self._announce = announce
        self._task: asyncio.Task[OpenedDoor] | None = None

    async def _open(self) -> OpenedDoor:
        try:
            opened = await self._opener()
        except Exception as exc:  # reported by every tool call, and once here
            self._announce(f"coterie mcp-serve: the runtime could not start: {exc}")
            raise
        self._announce(f"coterie mcp-serve: personas served by {opened.where}")
        return opened

    def start(self) -> None:
        """Begin opening the door (once; later calls do nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._open())

    async def get(self) -> FrontDoor:
        """The door; a tool error (:class:`McpToolError`) when it could not be opened."""
        self.start()
        assert self._task is not None
        try:
            # Shielded: a cancelled tool call must not cancel the start itself.
            return (await asyncio.shield(self._task)).door
        except Exception as exc:
            raise McpToolError(f"the coterie runtime could not start: {exc}") from exc

    async def aclose(self) -> None:
        """Let go of the door; a start under way is waited for first (Ray
        cannot be stopped half-started)."""
        if self._task is None:
            return
        try:
            opened = await self._task
        except Exception:  # nothing was opened; the failure was announced
            return
        await opened.close()


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


def build_server(
    starter: DoorStarter, *, allow_recall: bool = False, ask_timeout: float = ASK_TIMEOUT
) -> MCPServer[None]:
    """The MCP server and its tools over ``starter``'s door; its lifespan
    opens the door (in stdio mode, once the SDK has claimed stdout).
    ``ask_persona`` waits up to ``ask_timeout`` seconds for a reply."""

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
        door = await starter.get()
        personas = await _guard(door.personas_async())
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
        door = await starter.get()
        conversation = conversation_id or default_conversation(persona)
        envelope = message(persona, text, conversation_id=conversation)
        reply = await _guard(door.deliver_async(envelope, timeout=ask_timeout))
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
        door = await starter.get()
        conversation = conversation_id or default_conversation(persona)
        await _guard(
            door.post_async(message(persona, text, conversation_id=conversation, wait=False))
        )
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
            door = await starter.get()
            hits = await _guard(door.recall_async(persona, query, limit=limit))
            text_out = "\n".join(_hit_line(h) for h in hits) or "Nothing found."
            return _result(text_out, RecallResult(persona=persona, query=query, hits=hits))

    return server


__all__ = [
    "ASK_TIMEOUT",
    "AskResult",
    "DoorStarter",
    "PersonaList",
    "RecallResult",
    "SendResult",
    "build_server",
    "default_conversation",
]
