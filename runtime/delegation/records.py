"""The records delegation shares: work and its outcome, subagent requests.

Kept apart from the registry (:mod:`runtime.delegation.work`) and the
subagent runner (:mod:`runtime.delegation.subagent`) so that each can name
them without importing the other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime import tracing
from coterie.runtime.config import (
    ModelConfig,
    NetworkSettings,
    PermissionRule,
    PermissionSettings,
    PersonaConfig,
    RuntimeSettings,
    ThinkingMode,
)
from coterie.runtime.delegation.acp.records import AgentPermission
from coterie.runtime.delegation.acp.roster import AgentSpec, RosterFile
from coterie.runtime.messages import Origin
from coterie.runtime.tool import ToolRegistry

WorkKind = Literal["subagent", "coding_agent"]
WorkStatus = Literal["ok", "failed", "error", "timeout", "crashed", "cancelled"]


class WorkOutcome(BaseModel):
    """How one piece of delegated work ended."""

    status: WorkStatus
    # The delegate's final message (a subagent's report, an agent's last reply).
    text: str = ""
    error: str | None = None
    # Kind-specific facts: steps, stop_reason, files_changed…
    data: dict[str, Any] = Field(default_factory=dict)


class Work(Protocol):
    """One running piece of delegated work (a subagent, an ACP session)."""

    async def result(self) -> WorkOutcome:
        """Wait until it ends. Raising means it crashed (its actor died…)."""
        ...

    async def progress(self) -> dict[str, Any]:
        """What it has done so far (for ``task_status``)."""
        ...

    async def cancel(self) -> None:
        """Ask it to stop; :meth:`result` then returns or raises promptly."""
        ...

    async def discard(self) -> None:
        """Free what it holds (its actor, its process group). Called once, last."""
        ...


class SubagentRequest(BaseModel):
    """Everything a subagent needs to run, wherever it runs (it crosses to a
    Subagent actor). Holds secret values in ``hidden`` (to redact them from
    results): never log it."""

    model_config = ConfigDict(extra="forbid")

    handle: str
    persona: str
    #: The persona its model calls count against (None: ``persona``).
    payer: str | None = None
    task: str
    model: ModelConfig
    tools: list[str]
    tool_deny: list[str] = Field(default_factory=list)
    workspace: str | None = None
    home: str | None = None
    spill_dir: str
    hidden: dict[str, str] = Field(default_factory=dict)
    #: The trace context of the tool call that spawned it: its run is a child span.
    trace: dict[str, str] | None = Field(default_factory=tracing.carrier)
    settings: RuntimeSettings = Field(default_factory=RuntimeSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    cluster_addresses: list[str] = Field(default_factory=list)
    thinking: ThinkingMode = "auto"
    max_steps: int = 12
    max_tokens: int = 4096
    output_cap: int = 16_000
    tool_timeout: float | None = None
    #: Its parent's permission rules, (where written, rules) in order, and
    #: their settings: a subagent runs under them, and nobody reads along, so
    #: an ``ask`` follows ``unattended`` (None: no rules).
    permissions: list[tuple[str, list[PermissionRule]]] = Field(default_factory=list)
    permission_settings: PermissionSettings | None = None


class SubagentLauncher(Protocol):
    """Starts subagents somewhere: in this process, or one Ray actor each."""

    async def launch(self, request: SubagentRequest) -> Work: ...

    def close(self) -> None:
        """Free what is kept for later launches (spare actors)."""
        ...


@dataclass
class SubagentSetup:
    """What a persona's ``spawn_subagent`` needs: where subagents run, the
    tools they choose from and the persona's settings."""

    launcher: SubagentLauncher
    registry: ToolRegistry
    config: PersonaConfig


class CodingRequest(BaseModel):
    """What a CodingAgent needs to run one task. ``env`` and ``hidden`` hold
    secret values: never log it."""

    model_config = ConfigDict(extra="forbid")

    handle: str
    persona: str
    #: The persona the agent's reported cost counts against (None: ``persona``).
    payer: str | None = None
    agent: str
    spec: AgentSpec
    task: str
    cwd: str
    env: dict[str, str] = Field(default_factory=dict)
    log_path: str
    parent_conversation_id: str
    parent_turn_id: str
    #: Where the delegating turn's message came from: an approval the agent
    #: needs (``permissions: ask``) is shown there.
    origin: Origin = Field(default_factory=Origin)
    hidden: dict[str, str] = Field(default_factory=dict)
    # What the client terminals' sandbox hides, and whether it has network.
    persona_dir: str | None = None
    home: str | None = None
    network: bool = False
    #: The trace context of the ``start_coding_agent`` call: the agent's span is its child.
    trace: dict[str, str] | None = Field(default_factory=tracing.carrier)


class AgentAsk(BaseModel):
    """A coding agent's permission request on its way to the persona that
    delegated the task (roster ``permissions: ask``)."""

    model_config = ConfigDict(extra="forbid")

    handle: str
    conversation_id: str
    turn_id: str
    origin: Origin = Field(default_factory=Origin)
    question: AgentPermission

    @classmethod
    def of(cls, request: CodingRequest, question: AgentPermission) -> AgentAsk:
        """The request of ``request``'s agent, with the delegation's secrets
        redacted (it is shown to a person and kept in the audit log)."""

        def clean(text: str | None) -> str | None:
            if text is None:
                return None
            for name, value in sorted(request.hidden.items(), key=lambda kv: -len(kv[1])):
                if value:
                    text = text.replace(value, f"[redacted:{name}]")
            return text

        shown = question.model_copy(
            update={
                "title": clean(question.title),
                "command": clean(question.command),
                "paths": [clean(p) or "" for p in question.paths],
            }
        )
        return cls(
            handle=request.handle,
            conversation_id=request.parent_conversation_id,
            turn_id=request.parent_turn_id,
            origin=request.origin,
            question=shown,
        )


class CodingAgentLauncher(Protocol):
    """Starts coding agents somewhere: in this process, or one actor each.

    :meth:`launch` returns once the session exists, or raises the
    ``AcpError`` that stopped it (nothing left running)."""

    async def launch(self, request: CodingRequest) -> Work: ...


@dataclass
class CodingSetup:
    """What a persona's ``start_coding_agent`` needs."""

    launcher: CodingAgentLauncher
    roster: RosterFile
    logs: Path
    # Where ${env:NAME} in acp.json is read from (the runtime's environment).
    environ: Callable[[], dict[str, str]] = field(default=lambda: dict(os.environ))


__all__ = [
    "CodingAgentLauncher",
    "CodingRequest",
    "CodingSetup",
    "SubagentLauncher",
    "SubagentRequest",
    "SubagentSetup",
    "Work",
    "WorkKind",
    "WorkOutcome",
    "WorkStatus",
]
