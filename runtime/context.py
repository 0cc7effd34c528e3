"""The turn context: what a tool reads about the turn that called it.

A tool is ``async def fn(args: ArgsModel, ctx: TurnContext)``. The context
is never part of the tool's schema, and it is read-only (frozen): a tool
changes the turn only through the objects it is handed.

``ctx`` itself holds the facts of the turn — whose turn it is, on which
conversation, what started it, how deep it runs, who waits on it — and
three objects beside them:

- ``ctx.settings`` (:class:`TurnSettings`): what the persona's tools are
  given — where the persona lives, its access level and network policy, the
  secrets no result may show, its tool filter, its skills, the runtime's settings;
  built once per persona and shared by its turns;
- ``ctx.services`` (:class:`~runtime.services.Services`): the handles a tool
  reaches the rest of the runtime through (the protocols of
  :mod:`runtime.services`: messenger, memory, processes, delegations, …);
- ``ctx.outputs`` (:class:`TurnOutputs`): what the turn's tools (and the
  loop) set while it runs — ``end_task``'s classification, the question
  ``ask_user`` asked, draft rounds, forced thinking, the running batch, the
  tools a loaded skill narrowed the turn to.

:mod:`runtime.testing.context` builds one outside a persona (tests, scripts).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
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
from coterie.runtime.services import AuditSink, Services
from coterie.runtime.skills import SkillSet

#: Turn kinds that run with nobody reading along (they end with ``end_task``).
BACKGROUND_CONTEXTS: frozenset[str] = frozenset({"heartbeat", "cron"})


class EndTask(BaseModel):
    """What ``end_task`` recorded: the turn's classification."""

    status: Literal["ok", "skipped", "failed"]
    summary: str | None = None
    reason: str | None = None


@dataclass
class Conversation:
    """One conversation's state held by its persona (it outlives each turn)."""

    id: str
    #: Every message the model sees, oldest first (trimmed to the newest ones).
    history: list[ChatMessage] = field(default_factory=list)
    #: The todo list ``todo_write`` keeps for this conversation.
    todos: list[TodoItem] = field(default_factory=list)
    #: What the persona asked the person (``ask_user``), until it is answered.
    question: Question | None = None
    #: Where the running turn's own messages start in ``history`` (set when a
    #: turn starts; moved by a compaction).
    turn_start: int = 0
    #: What the provider counted for this conversation's last request
    #: (a :class:`runtime.usage.tokens.Anchor`; None after a compaction).
    anchor: Any = None


def _no_spill_dir() -> Path:
    return Path(tempfile.gettempdir()) / "coterie-spill"


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """What a persona's tools are given: where they may work and what they
    may do. Fixed for a persona (its turns share one); only ``secrets`` and
    ``skills`` are replaced when the persona's ``.env`` or skills change."""

    #: The persona's workspace, where file and shell tools work (None: no file tools).
    workspace: Path | None = None
    #: The persona's directory, ``<home>/personas/<name>`` (readable by its tools).
    persona_dir: Path | None = None
    #: The runtime's home (other personas' directories under it are refused).
    home: Path | None = None
    #: Where over-long tool results are spilled, one folder per turn.
    spill_dir: Path = field(default_factory=_no_spill_dir)
    #: ``full``, ``workspace`` (writes only inside the workspace) or ``readonly``.
    access: AccessLevel = "workspace"
    #: What the tools may reach on the network (persona.yaml ``network``).
    network: NetworkSettings = field(default_factory=NetworkSettings)
    #: The Ray cluster's own node addresses: refused unless ``network`` allows them.
    cluster_addresses: frozenset[str] = frozenset()
    #: Values no tool result may show (the persona's ``.env``, provider keys), by name.
    secrets: Mapping[str, str] = field(default_factory=dict)
    #: The persona's allow/deny patterns of tool names.
    tool_filter: ToolFilter = field(default_factory=ToolFilter)
    #: Whom the persona may message (persona.yaml ``team``: names or patterns;
    #: None: every persona).
    team: tuple[str, ...] | None = None
    #: The persona's thinking setting (``on``, ``off``, ``auto``).
    thinking_mode: ThinkingMode = "auto"
    #: The runtime's settings (web search, shell sandbox policy, limits…).
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: The skills the persona sees on this turn (``load_skill`` reads them; the
    #: folders of its global ones are readable, never writable, by file tools).
    skills: SkillSet = field(default_factory=SkillSet)

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by ``[redacted:NAME]``."""
        for name, value in sorted(self.secrets.items(), key=lambda kv: -len(kv[1])):
            if value in text:
                text = text.replace(value, f"[redacted:{name}]")
        return text


@dataclass(slots=True)
class TurnOutputs:
    """What a turn's tools, and its loop, set while it runs; the loop reads
    them to decide how the turn ends. One per turn."""

    #: ``end_task``'s classification (also set by a successful ``ask_user``): the turn ends.
    end_task: EndTask | None = None
    #: The question ``ask_user`` ended the turn on.
    question: Question | None = None
    #: ``draft`` calls made on this turn (bounded).
    drafts: int = 0
    #: Thinking forced on for the rest of the turn (``think_harder``, the repeat guard).
    force_thinking: bool = False
    #: ``think_harder``'s short label (telemetry only).
    think_reason: str | None = None
    #: ``reply_to_origin`` was used on this turn (it may be, once).
    replied_to_origin: bool = False
    #: The batch of calls running now (set by the loop before each batch): the
    #: pushed work one batch starts reports back together.
    batch_id: str = ""
    #: Tool-name patterns of the skills loaded on this turn that narrow it
    #: (``allowed-tools``): from the next model call on, a tool is offered only
    #: if it matches every one of these lists (and the persona's own filter).
    tool_limits: list[tuple[str, ...]] = field(default_factory=list)
    #: The tools the catalogue keeps out of this model call's definitions
    #: (name -> spec), set by the loop before each call; ``find_tools`` searches them.
    catalogue: Mapping[str, Any] = field(default_factory=dict)
    #: Tools ``find_tools`` found on this turn: offered in full from the next call on.
    revealed: set[str] = field(default_factory=set)
    #: Refusals by permission rules or people on this turn, by call (tool and
    #: arguments): the third of one call ends the turn.
    denials: dict[str, int] = field(default_factory=dict)
    #: Call ids a person already approved (a turn resumed after a restart).
    granted: set[str] = field(default_factory=set)


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class TurnContext:
    """What a tool reads about the turn that called it (read-only), with the
    settings, services and outputs it is handed."""

    #: The persona whose turn it is.
    persona: str
    #: The conversation the turn runs on; the loop appends to its history.
    conversation: Conversation
    #: The turn's id (``turn_<hex>``): its audit events and spill folder carry it.
    turn_id: str
    #: What started the turn: ``user``, ``heartbeat``, ``cron``, ``subagent``, ``eval``.
    kind: TurnContextKind = "user"
    #: 0 for a persona's own turn, 1 inside a subagent (no delegation below the top).
    depth: int = 0
    #: The personas it may message, (name, description), this one included
    #: (every persona on the runtime unless persona.yaml names a ``team``).
    roster: Sequence[tuple[str, str]] = ()
    #: Personas waiting on this turn's messages, outermost first (ask cycles).
    ask_path: Sequence[str] = ()
    #: Where the turn's (first) message came from: ``reply_to_origin`` answers there.
    origin: Origin = field(default_factory=Origin)
    #: What the tools are given: paths, access, network, secrets, filters.
    settings: TurnSettings = field(default_factory=TurnSettings)
    #: Handles to the rest of the runtime, and what the persona owns for its tools.
    services: Services = field(default_factory=Services)
    #: What the tools set on this turn.
    outputs: TurnOutputs = field(default_factory=TurnOutputs)
    #: Whether a message arrived mid-turn: the loop stops after the current tools.
    interrupted: Callable[[], bool] = _never
    #: The turn's own audit sink while someone listens (it forwards every event
    #: to the listeners too); else None and events go to ``services.audit``.
    sink: AuditSink | None = None
    #: Streaming callers of this turn: they hear its events and text deltas.
    on_event: Callable[[StreamItem], None] | None = None

    @property
    def conversation_id(self) -> str:
        return self.conversation.id

    @property
    def billed_to(self) -> str:
        """The persona whose budget this turn's model calls count against:
        the first persona of the ``ask_persona`` chain it answers, else its
        own (a subagent's context is its parent's name)."""
        return self.ask_path[0] if self.ask_path else self.persona

    @property
    def audit(self) -> AuditSink:
        """Where this turn's events go."""
        return self.sink or self.services.audit

    @property
    def thinking_on(self) -> bool:
        """Resolved thinking: escalation > persona setting > turn kind default."""
        if self.outputs.force_thinking or self.settings.thinking_mode == "on":
            return True
        if self.settings.thinking_mode == "off":
            return False
        return self.kind != "user"


__all__ = [
    "BACKGROUND_CONTEXTS",
    "Conversation",
    "EndTask",
    "TurnContext",
    "TurnOutputs",
    "TurnSettings",
]
