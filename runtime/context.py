"""The turn context: what a tool sees of the turn that called it.

Tools reach other actors only through :class:`Services` — the small protocols
of :mod:`runtime.services`, implemented in-process or by ``actors`` (faked in
unit tests) — and read the runtime's settings from ``ctx.settings``.
"""

from __future__ import annotations

import asyncio
import tempfile
import weakref
from collections.abc import Callable, Coroutine, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from coterie.runtime.config import (
    AccessLevel,
    NetworkSettings,
    RuntimeSettings,
    ThinkingMode,
    ToolFilter,
)
from coterie.runtime.messages import (
    ChatMessage,
    Origin,
    Question,
    StreamItem,
    TodoItem,
    TurnContextKind,
)
from coterie.runtime.services import (
    AuditSink,
    DelegationService,
    DeliveryService,
    McpService,
    MemoryService,
    Messenger,
    NullAudit,
    ProcessService,
)

BACKGROUND_CONTEXTS: frozenset[str] = frozenset({"heartbeat", "cron"})


class BackgroundTasks:
    """Tasks a tool leaves running after its call (e.g. a completion watcher).

    Owned by the persona: :meth:`aclose` cancels whatever is still running, so
    nothing outlives the persona that started it.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class KeyedLocks:
    """One asyncio lock per key, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[Hashable, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def __call__(self, key: Hashable) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    def __len__(self) -> int:
        return len(self._locks)


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
    # What the persona asked the person (ask_user), until it is answered.
    question: Question | None = None


@dataclass
class Services:
    """Handles to the rest of the runtime (each may be absent), and what the
    persona owns for its tools: background tasks and per-file locks."""

    audit: AuditSink = field(default_factory=NullAudit)
    messenger: Messenger | None = None
    memory: MemoryService | None = None
    processes: ProcessService | None = None
    delegations: DelegationService | None = None
    deliveries: DeliveryService | None = None
    # The persona's MCP servers (runtime.mcp.McpHub), when it has any.
    mcp: McpService | None = None
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    file_locks: KeyedLocks = field(default_factory=KeyedLocks)


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
    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    # What the persona's tools may reach, and the Ray cluster's own node
    # addresses (refused unless allowed there).
    network: NetworkSettings = field(default_factory=NetworkSettings)
    cluster_addresses: frozenset[str] = frozenset()
    # Values no tool result may show (the persona's .env, provider keys), by name.
    hidden: Mapping[str, str] = field(default_factory=dict)
    # The assistant message whose calls are running (set by the loop): pushed
    # work started by one batch reports back together.
    batch_id: str = ""
    # draft calls made on this turn (bounded).
    drafts: int = 0
    # Where the turn's (first) message came from: reply_to_origin answers there.
    origin: Origin = field(default_factory=Origin)
    # reply_to_origin was used on this turn (it may be, once).
    replied_to_origin: bool = False
    # The question ask_user ended the turn on.
    question: Question | None = None
    # The turn's own audit sink when someone listens to it (it forwards every
    # event to the listeners too); else the persona's.
    sink: AuditSink | None = None
    # Streaming callers of this turn: they hear its events and text deltas.
    on_event: Callable[[StreamItem], None] | None = None

    def redact(self, text: str) -> str:
        """``text`` with every hidden value replaced by ``[redacted:NAME]``."""
        for name, value in sorted(self.hidden.items(), key=lambda kv: -len(kv[1])):
            if value in text:
                text = text.replace(value, f"[redacted:{name}]")
        return text

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
        return self.sink or self.services.audit


__all__ = [
    "BACKGROUND_CONTEXTS",
    "BackgroundTasks",
    "Conversation",
    "EndTask",
    "KeyedLocks",
    "Services",
    "TodoItem",
    "TurnContext",
]
