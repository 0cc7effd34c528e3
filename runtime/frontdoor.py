"""The front door: a running runtime as every door to it sees it.

:class:`FrontDoor` is the one facade for listing, asking, streaming to and
recalling personas. The HTTP API and its OpenAI-compatible route
(:mod:`runtime.serve`), the MCP server (:mod:`runtime.serve.mcp`) and the chat
connectors (:mod:`runtime.connectors`) all talk to a runtime through it, and
never know which one is behind it:

- ``coterie``'s :class:`~coterie.api.Runtime`, the Python API, over Ray;
- :class:`~runtime.serve.client.ServedDoor`, a running ``coterie serve`` over
  its HTTP API (no Ray in the caller's process);
- whatever a test passes.

Everything is async: a door never blocks its loop on the runtime. Failures
raise :class:`~runtime.errors.CoterieError` (an unknown persona: a message
naming it and the known ones); a turn that fails is a reply with
``status == "error"``, not an exception.

This module sits at the top of ``runtime/`` rather than inside one of the
doors' folders, so that the doors depend on it and not on each other.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from coterie.runtime.audit.query import QueryResult
from coterie.runtime.memory.records import RecallHit
from coterie.runtime.messages import (
    ApprovalState,
    ChatMessage,
    MessageEnvelope,
    ReplyEnvelope,
    StreamItem,
)

if TYPE_CHECKING:  # the scheduler's package loads croniter: only for the type
    from coterie.runtime.schedule.records import ScheduleListing


class PersonaInfo(BaseModel):
    """One persona of the home, as a front door lists it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    active: bool


class ApprovalInfo(BaseModel):
    """One approval as the ``approvals`` view of the audit log holds it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    persona: str
    conversation_id: str
    turn_id: str
    tool: str
    call_id: str
    summary: str
    rule: str | None = None
    requested: datetime
    expires: datetime
    state: ApprovalState
    decided_by: str | None = None
    via: str | None = None
    decided: datetime | None = None


#: The columns of the ``approvals`` view, as :class:`ApprovalInfo` names them.
_APPROVAL_COLUMNS = tuple(ApprovalInfo.model_fields)
_APPROVAL_ID = re.compile(r"^apr_[0-9a-f]{1,64}$")


def approvals_sql(
    persona: str | None = None, state: str | None = None, approval_id: str | None = None
) -> str:
    """The query of the ``approvals`` view for these filters (values checked
    or quoted: they come from a request)."""
    where: list[str] = []
    for column, value in (("persona", persona), ("state", state), ("id", approval_id)):
        if value is not None:
            where.append(f"{column} = '{value.replace(chr(39), chr(39) * 2)}'")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {', '.join(_APPROVAL_COLUMNS)} FROM approvals{clause} ORDER BY requested"


def approvals_of(result: QueryResult) -> list[ApprovalInfo]:
    """The rows of an :func:`approvals_sql` query."""
    return [ApprovalInfo(**dict(zip(result.columns, row, strict=True))) for row in result.rows]


def valid_approval_id(approval_id: str) -> bool:
    return bool(_APPROVAL_ID.match(approval_id))


class FrontDoor(Protocol):
    """A running runtime: its personas, their conversations and its audit log."""

    async def personas_async(self, offset: int = 0, limit: int | None = None) -> list[PersonaInfo]:
        """The personas of the home by name: all, or the page ``offset``/``limit``."""
        ...

    async def persona_count_async(self) -> int:
        """How many personas the home holds."""
        ...

    async def deliver_async(self, envelope: MessageEnvelope, *, timeout: float) -> ReplyEnvelope:
        """Deliver ``envelope`` and wait (up to ``timeout`` seconds) for its reply."""
        ...

    async def post_async(self, envelope: MessageEnvelope) -> None:
        """Deliver ``envelope`` without waiting for its turn
        (``envelope.reply_mode`` decides who hears the reply)."""
        ...

    def stream_async(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]:
        """Deliver ``envelope`` and yield its turn's events as they happen, then
        its :class:`ReplyEnvelope`."""
        ...

    async def recall_async(
        self, persona: str, query: str = "", *, limit: int = 8
    ) -> list[RecallHit]:
        """The persona's long-term memory hits for ``query``, best first."""
        ...

    async def history_async(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """A conversation's messages, oldest first (none: an empty list)."""
        ...

    async def query_async(self, sql: str) -> QueryResult:
        """A read-only SQL query on the audit log."""
        ...

    async def status_async(self) -> dict[str, Any]:
        """What runs: personas, connectors, the audit log, memory, the
        scheduler, the cluster, the plugins."""
        ...

    async def plugins_async(self) -> dict[str, Any]:
        """The runtime's plugins (a :class:`~runtime.plugins.PluginSet` as
        JSON, without its runtime environment): what each provides, what
        failed to load."""
        ...

    async def schedules_async(self, persona: str | None = None) -> ScheduleListing:
        """Every heartbeat, cron entry and pending reminder (of one persona,
        which must exist): next fires in their zones, last outcomes and
        reasons, paused queues, schedule files that do not load."""
        ...

    async def approvals_async(
        self, persona: str | None = None, state: str | None = "pending"
    ) -> list[ApprovalInfo]:
        """The approvals permission rules asked for (of one persona, in one
        state; ``None``: all), oldest first."""
        ...

    async def decide_approval_async(
        self, approval_id: str, answer: str, *, by: str | None = None, via: str = "http"
    ) -> ApprovalInfo:
        """Answer an approval (``approve``, ``deny``, ``always``): the call it
        paused runs or is refused, and the turn goes on. Raises
        :class:`~runtime.errors.UnknownApprovalError` or
        :class:`~runtime.errors.ApprovalClosedError`."""
        ...


@dataclass(frozen=True)
class OpenedDoor:
    """A front door that a server opened for itself, and how to let go of it."""

    door: FrontDoor
    #: Where the personas run, for the server's log ("coterie serve at …").
    where: str
    #: Let go of it: stop a runtime started for the door; nothing for a borrowed one.
    close: Callable[[], Awaitable[None]]


def message(persona: str, text: str, *, conversation_id: str, wait: bool = True) -> MessageEnvelope:
    """A person's message to ``persona``; ``wait=False``: its reply is heard by
    nobody and stays in the conversation (what "send without waiting" means
    at every door)."""
    envelope = MessageEnvelope(recipient=persona, conversation_id=conversation_id, text=text)
    if not wait:
        envelope.reply_mode = "none"
    return envelope


__all__ = [
    "ApprovalInfo",
    "FrontDoor",
    "OpenedDoor",
    "PersonaInfo",
    "approvals_of",
    "approvals_sql",
    "message",
    "valid_approval_id",
]
