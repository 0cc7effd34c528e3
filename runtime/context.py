"""The turn context: what a tool sees of the turn that called it.

Tools reach other actors only through the services here — small protocols
defined in ``runtime`` and implemented by ``actors`` (faked in unit tests).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from runtime.config import AccessLevel, ThinkingMode, ToolFilter
from runtime.messages import (
    ChatMessage,
    MessageEnvelope,
    ReplyEnvelope,
    TurnContextKind,
    TurnEvent,
)
from runtime.processes import ProcessService

BACKGROUND_CONTEXTS: frozenset[str] = frozenset({"heartbeat", "cron"})


class AuditSink(Protocol):
    """Where turn events go; buffered by the implementation."""

    def record(self, event: TurnEvent) -> None: ...

    async def flush(self) -> None: ...


class Messenger(Protocol):
    """Delivery between personas (the router in a cluster, a hub in-process)."""

    async def ask(self, envelope: MessageEnvelope, *, timeout: float) -> ReplyEnvelope:
        """Deliver and wait for the reply.

        Raises ``TimeoutError`` after ``timeout`` seconds (the target's turn
        goes on), :class:`~runtime.errors.UnknownPersonaError`, or a
        :class:`~runtime.errors.DeliveryError` such as ``QueueFullError``.
        """
        ...

    async def post(self, envelope: MessageEnvelope) -> None:
        """Deliver without waiting for the turn; raises if it was not accepted."""
        ...


class MemoryService(Protocol):
    """Long-term memory of *one* persona (the runtime binds the persona).

    Rows cross actor boundaries as plain dicts. Input problems raise
    :class:`~runtime.errors.ToolError` (the model reads them).
    """

    async def write(self, *, category: str, content: str, importance: int) -> dict[str, Any]: ...

    async def update(
        self,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> dict[str, Any]: ...

    async def delete(self, memory_id: str) -> None: ...

    async def recall(
        self,
        *,
        query: str = "",
        source: str = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
    ) -> list[dict[str, Any]]: ...

    async def ingest(self, *, source: str, text: str) -> dict[str, Any]: ...

    async def write_user_model(
        self, *, dimension: str, content: str, confidence: int
    ) -> dict[str, Any]: ...

    async def user_model(self) -> list[dict[str, Any]]:
        """Every dimension of the persona's user model (cached by clients)."""
        ...


class NullAudit:
    """An audit sink that keeps events in a list (tests, in-process runs)."""

    def __init__(self) -> None:
        self.events: list[TurnEvent] = []

    def record(self, event: TurnEvent) -> None:
        self.events.append(event)

    async def flush(self) -> None:
        return None


class TodoItem(BaseModel):
    """One entry of a conversation's todo list."""

    content: str = Field(min_length=1, max_length=500)
    status: Literal["pending", "in_progress", "completed"] = "pending"
    priority: Literal["high", "medium", "low"] = "medium"


class EndTask(BaseModel):
    """What ``end_task`` recorded: the turn's classification."""

    status: Literal["ok", "skipped", "failed"]
    summary: str | None = None
    reason: str | None = None


@dataclass
class Conversation:
    """One conversation's state held by its persona."""

    id: str
    history: list[ChatMessage] = field(default_factory=list)
    todos: list[TodoItem] = field(default_factory=list)


@dataclass
class Services:
    """Handles to the rest of the runtime; each may be absent."""

    audit: AuditSink = field(default_factory=NullAudit)
    messenger: Messenger | None = None
    memory: MemoryService | None = None
    # Background shell processes (see runtime.processes when present).
    processes: ProcessService | None = None
    # Filled in by later capabilities (scheduler…).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnContext:
    """Everything a tool may read or change about the running turn."""

    persona: str
    conversation: Conversation
    turn_id: str
    context: TurnContextKind = "user"
    depth: int = 0
    tool_filter: ToolFilter = field(default_factory=ToolFilter)
    thinking_mode: ThinkingMode = "auto"
    force_thinking: bool = False
    end_task: EndTask | None = None
    think_reason: str | None = None
    services: Services = field(default_factory=Services)
    # Every persona on the runtime (name, description), this one included.
    roster: list[tuple[str, str]] = field(default_factory=list)
    # Personas waiting on this turn's messages, outermost first.
    ask_path: list[str] = field(default_factory=list)
    # Set when a new message arrives mid-turn: stop after the current tools.
    interrupted: Callable[[], bool] = field(default=lambda: False)
    spill_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "coterie-spill")
    workspace: Path | None = None
    # The persona's directory (<home>/personas/<name>) and the runtime home.
    persona_dir: Path | None = None
    home: Path | None = None
    access: AccessLevel = "workspace"

    @property
    def conversation_id(self) -> str:
        return self.conversation.id

    @property
    def thinking_on(self) -> bool:
        """Resolved thinking: escalation > persona setting > context default."""
        if self.force_thinking or self.thinking_mode == "on":
            return True
        if self.thinking_mode == "off":
            return False
        return self.context != "user"

    @property
    def audit(self) -> AuditSink:
        return self.services.audit


__all__ = [
    "BACKGROUND_CONTEXTS",
    "AuditSink",
    "Conversation",
    "EndTask",
    "MemoryService",
    "Messenger",
    "NullAudit",
    "Services",
    "TodoItem",
    "TurnContext",
]
