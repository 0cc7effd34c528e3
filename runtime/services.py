"""The services a tool reaches the rest of the runtime through.

Small protocols, defined here and implemented elsewhere: in-process in
``runtime`` (a hub, a memory server, a local process table — for tests and
single-process use) and over Ray in ``actors``. A tool sees them on its turn
context (``ctx.services``, a :class:`Services`); it never imports an
implementation.

Results are typed (the records of :mod:`runtime.memory.records` and
:mod:`runtime.shell.records`): callers read fields, not dict keys. Input
problems the model should read raise :class:`~runtime.errors.ToolError`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from coterie.runtime.config import AccessLevel
from coterie.runtime.connectors.base import ConnectorInfo, OutboundMessage
from coterie.runtime.memory.records import IngestResult, MemoryRow, RecallHit, Source, UserModelRow
from coterie.runtime.messages import BudgetWarning, MessageEnvelope, ReplyEnvelope, TurnEvent
from coterie.runtime.shell.records import ProcessOutput, ProcessStatus, SignalResult, StartSpec

if TYPE_CHECKING:
    from coterie.runtime.mcp.hub import ServerView
    from coterie.runtime.mcp.records import (
        McpCallResult,
        McpContent,
        McpPromptInfo,
        McpPromptResult,
        McpResourceInfo,
    )
    from coterie.runtime.schedule.service import SchedulerService
    from coterie.runtime.shell.sandbox import Sandbox


class AuditSink(Protocol):
    """Where turn events go; buffered by the implementation."""

    def record(self, event: TurnEvent) -> None: ...

    async def flush(self) -> None: ...


class NullAudit:
    """An audit sink that keeps events in a list (tests, in-process runs)."""

    def __init__(self) -> None:
        self.events: list[TurnEvent] = []

    def record(self, event: TurnEvent) -> None:
        self.events.append(event)

    async def flush(self) -> None:
        return None


class DeliveryService(Protocol):
    """Messages out to people through the connectors ``coterie serve`` runs."""

    async def deliver(self, message: OutboundMessage) -> None:
        """Queue ``message`` for its connector; raises
        :class:`~runtime.errors.ConnectorError` when no connector of that id runs
        or its queue is full."""
        ...

    async def connectors(self) -> list[ConnectorInfo]:
        """The connectors running now."""
        ...


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
    """Long-term memory of *one* persona (the runtime binds the persona)."""

    async def write(self, *, category: str, content: str, importance: int) -> MemoryRow: ...

    async def update(
        self,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> MemoryRow: ...

    async def delete(self, memory_id: str) -> None: ...

    async def recall(
        self,
        *,
        query: str = "",
        source: Source = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
    ) -> list[RecallHit]: ...

    async def ingest(self, *, source: str, text: str) -> IngestResult: ...

    async def write_user_model(
        self, *, dimension: str, content: str, confidence: int
    ) -> UserModelRow: ...

    async def user_model(self) -> list[UserModelRow]:
        """Every dimension of the persona's user model, in prompt order."""
        ...


class ProcessService(Protocol):
    """A persona's shell processes, addressed by ``bg_<hex>`` ids.

    Unknown ids raise ``ToolError("not_found", …)``.
    """

    @property
    def sandboxed(self) -> bool:
        """Whether commands run inside bubblewrap."""
        ...

    def sandbox(
        self,
        workspace: Path,
        access: AccessLevel,
        persona_dir: Path | None,
        home: Path | None,
        *,
        network: bool = False,
    ) -> Sandbox:
        """How a command is confined; ``network``: whether it may use the
        network inside bubblewrap."""
        ...

    async def start(self, spec: StartSpec) -> str: ...

    async def wait(self, pid: str, timeout: float | None) -> bool: ...

    async def status(self, pid: str) -> ProcessStatus: ...

    async def read(self, pid: str, since: int | None = None) -> ProcessOutput: ...

    async def write(self, pid: str, data: bytes) -> int: ...

    async def signal(self, pid: str, name: str) -> SignalResult: ...

    async def list(self) -> list[ProcessStatus]: ...

    async def remove(self, pid: str) -> ProcessStatus: ...

    async def running(self) -> bool:
        """Whether any command is still running."""
        ...

    async def close(self) -> None:
        """Stop every process."""
        ...


@dataclass(frozen=True)
class Reservation:
    """A budget's answer to a model call's reservation: its ticket, to
    settle once the call is answered (None: no budget applies to the payer)."""

    ticket: str | None


class BudgetService(Protocol):
    """The runtime's budgets (:class:`runtime.usage.budget.BudgetLedger`):
    a model call reserves its worst-case cost before it is sent, and settles
    the real one after."""

    async def reserve(
        self,
        payer: str,
        amount: float | None,
        *,
        model: str,
        persona: str,
        conversation_id: str,
    ) -> Reservation:
        """Hold ``amount`` dollars for ``payer``'s call; raises
        :class:`~runtime.errors.BudgetExceededError` past a limit."""
        ...

    async def settle(self, ticket: str, cost: float | None) -> list[BudgetWarning]:
        """Replace the hold by the real cost; the warnings now due."""
        ...

    async def charge(
        self, payer: str, cost: float, *, persona: str, conversation_id: str
    ) -> list[BudgetWarning]:
        """Count ``cost``, spent where nothing could be reserved first (a
        coding agent's own model calls, as it reported them), against
        ``payer``; the warnings now due. Never refuses: it was spent."""
        ...


class DelegationService(Protocol):
    """Pushed work a persona delegated (subagents, coding agents), by handle.

    Implemented by :class:`runtime.delegation.Delegations`; the tools of
    :mod:`tools.delegation` and :mod:`tools.tasks` call it.
    """

    def seal(self, conversation_id: str, batch_id: str) -> None:
        """The assistant message ``batch_id`` has run all its calls: the work it
        started reports back (one wake) once all of it is done."""
        ...

    def running(self) -> int:
        """How many delegations are still running."""
        ...


class McpService(Protocol):
    """A persona's MCP servers (:class:`runtime.mcp.hub.McpHub`).

    Calls raise :class:`~runtime.errors.ToolError`: ``not_found`` for an
    unknown server, ``server_unavailable`` for one that is down, ``timeout``,
    ``server_crashed``, ``mcp_error`` from the session.
    """

    gateway: bool

    def servers(self) -> list[ServerView]: ...

    def has_resources(self) -> bool: ...

    def has_prompts(self) -> bool: ...

    async def call(self, server: str, tool: str, arguments: dict[str, Any]) -> McpCallResult: ...

    async def list_resources(self, server: str) -> list[McpResourceInfo]: ...

    async def read_resource(self, server: str, uri: str) -> list[McpContent]: ...

    async def list_prompts(self, server: str) -> list[McpPromptInfo]: ...

    async def get_prompt(
        self, server: str, name: str, arguments: dict[str, str]
    ) -> McpPromptResult: ...


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


class PermissionService(Protocol):
    """The permission check before each tool call
    (:class:`runtime.permissions.gate.PermissionGate`)."""

    async def check(self, spec: Any, args: Any, call: Any, ctx: Any) -> str | None:
        """None when the call may run, else the error result the model reads
        (it may wait for a person's approval first)."""
        ...


@dataclass
class Services:
    """The services a persona's tools are handed (``ctx.services``).

    The first seven are handles to the rest of the runtime, given to the
    persona (each may be absent: its tools then hide); the rest the persona
    owns and stops when it closes: its delegated work, its MCP servers, the
    tasks tools leave running and the per-file locks of its file tools.
    """

    #: Where turn events go (the audit log's buffer).
    audit: AuditSink = field(default_factory=NullAudit)
    #: Delivery between personas (send_to_persona, ask_persona, mirrored replies).
    messenger: Messenger | None = None
    #: The persona's long-term memory (memory, recall, the user model).
    memory: MemoryService | None = None
    #: The persona's shell processes (shell_exec, process).
    processes: ProcessService | None = None
    #: Messages out to people through the running connectors.
    deliveries: DeliveryService | None = None
    #: The runtime's scheduler (runtime.schedule.SchedulerService): fires are
    #: accepted and finished through it, and the ``remind`` tool uses it.
    scheduler: SchedulerService | None = None
    #: The runtime's budgets (none: model calls are never held up).
    budget: BudgetService | None = None
    #: Pushed work the persona delegated (subagents, coding agents).
    delegations: DelegationService | None = None
    #: The persona's MCP servers (runtime.mcp.McpHub), when it has any.
    mcp: McpService | None = None
    #: Its permission rules and approvals (none: every call runs).
    permissions: PermissionService | None = None
    #: Tasks tools leave running after their call.
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    #: One lock per file path, so two edits of one file never interleave.
    file_locks: KeyedLocks = field(default_factory=KeyedLocks)


__all__ = [
    "AuditSink",
    "BackgroundTasks",
    "BudgetService",
    "DelegationService",
    "DeliveryService",
    "KeyedLocks",
    "McpService",
    "MemoryService",
    "Messenger",
    "NullAudit",
    "PermissionService",
    "ProcessService",
    "Reservation",
    "Services",
]
