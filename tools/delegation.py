"""Delegation tools: spawn_subagent (and, with an ACP roster, the coding
agent tools).

Each starts pushed work and returns ``{"deferred": true, "kind", "handle"}``
at once; when every call of an assistant message did so, the turn ends, and
the results come back into this conversation as one grouped wake (see
:mod:`runtime.delegation`). Delegation tools are never offered to subagents.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.delegation import Delegations, SpawnRequest, start_subagent
from coterie.runtime.delegation.acp import AcpRosterError
from coterie.runtime.delegation.coding import StartRequest, start_coding_agent
from coterie.runtime.errors import ToolError
from coterie.runtime.tool import Deferred, ToolSpec, tool
from coterie.tools._effects import agent_effect
from coterie.tools._paths import locate

TOP_CONTEXTS = ("user", "heartbeat", "cron")


def _delegations(ctx: TurnContext) -> Delegations | None:
    found = ctx.services.delegations
    return found if isinstance(found, Delegations) else None


def _can_spawn(ctx: TurnContext) -> bool:
    found = _delegations(ctx)
    return found is not None and found.subagents is not None


class SpawnSubagentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        min_length=1,
        max_length=20_000,
        description="a self-contained brief: the subagent sees nothing else of this "
        "conversation (goal, where to look, what to report)",
    )
    allowed_tools: list[str] | None = Field(
        default=None,
        max_length=64,
        description="tool names (or * patterns) it may use; default: every tool a "
        "subagent can have",
    )
    model: str | None = Field(
        default=None, description="one of the subagent models named in persona.yaml"
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="stop it after this many seconds (default 300)"
    )


@tool(
    name="spawn_subagent",
    timeout=60,
    delegation=True,
    contexts=TOP_CONTEXTS,
    available=_can_spawn,
)
async def spawn_subagent(args: SpawnSubagentArgs, ctx: TurnContext) -> Deferred:
    """Start an isolated subagent on a self-contained task and return a sub_
    handle at once. It has a fresh context (none of this conversation), reads
    your workspace without changing it, and cannot delegate further. Its
    report is pushed back to this conversation; several spawns in one message
    report together in one message once all have finished."""
    delegations = _delegations(ctx)
    if delegations is None or delegations.subagents is None:
        raise ToolError("unavailable", "this runtime cannot start subagents")
    request = SpawnRequest(
        task=args.task,
        allowed_tools=args.allowed_tools,
        model=args.model,
        timeout_s=args.timeout_s,
    )
    return await start_subagent(ctx, delegations, delegations.subagents, request)


def _has_coding_agents(ctx: TurnContext) -> bool:
    """Shown when ``<home>/acp.json`` names agents (or is wrong, so that a call
    says what is wrong), to personas that may write and have a workspace."""
    found = _delegations(ctx)
    if found is None or found.coding is None:
        return False
    if ctx.settings.access == "readonly" or ctx.settings.workspace is None:
        return False
    return found.coding.roster.offered()


def _list_agents(spec: ToolSpec, ctx: TurnContext) -> ToolSpec:
    """The description names the roster's agents, so the model can choose."""
    found = _delegations(ctx)
    if found is None or found.coding is None:
        return spec
    try:
        roster = found.coding.roster.get()
    except AcpRosterError:
        return spec
    default = roster.default_name()
    lines = []
    for name in roster.names():
        agent = roster.agents[name]
        label = f"- {name}{' (default)' if name == default else ''}"
        lines.append(f"{label}: {agent.description}" if agent.description else label)
    if not lines:
        return spec
    return dataclasses.replace(
        spec, description=f"{spec.description}\nAgents:\n" + "\n".join(lines)
    )


def _default_agent(ctx: TurnContext) -> str | None:
    """The roster's default agent (what a call naming none starts)."""
    found = _delegations(ctx)
    if found is None or found.coding is None:
        return None
    try:
        return found.coding.roster.get().default_name()
    except AcpRosterError:
        return None


class StartCodingAgentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        min_length=1,
        max_length=50_000,
        description="a self-contained brief: goal, relevant files, constraints, how to "
        "verify (the agent sees nothing of this conversation)",
    )
    agent: str | None = Field(default=None, description="a roster name; default: the default")
    cwd: str | None = Field(
        default=None,
        description="the project directory; default and usual: your workspace",
    )


@tool(
    name="start_coding_agent",
    # Start-up may take up to the roster's startup_timeout (at most 600 s).
    timeout=630,
    delegation=True,
    contexts=TOP_CONTEXTS,
    available=_has_coding_agents,
    customize=_list_agents,
    effect=agent_effect(_default_agent),
)
async def start_coding_agent_tool(args: StartCodingAgentArgs, ctx: TurnContext) -> Deferred:
    """Hand a complex coding task to an external coding agent (Claude Code,
    Codex, … over ACP) working in your workspace. Waits until its session is
    up (cold agents take up to a minute), then returns an acp_ handle; its
    result (stop reason, final message, files changed) is pushed back to this
    conversation. Write the task as a complete brief. Keep trivial edits
    in-house."""
    delegations = _delegations(ctx)
    if delegations is None or delegations.coding is None:
        raise ToolError("unavailable", "this runtime cannot start coding agents")
    cwd = None
    if args.cwd is not None:
        target = locate(ctx, args.cwd, write=True)
        if not target.path.is_dir():
            raise ToolError("not_a_directory", f"cwd {args.cwd!r} is not a directory")
        cwd = target.path
    request = StartRequest(task=args.task, agent=args.agent, cwd=cwd)
    return await start_coding_agent(ctx, delegations, delegations.coding, request)


class CancelCodingAgentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    handle: str = Field(min_length=1, max_length=64, description="the acp_ handle")


@tool(
    name="cancel_coding_agent",
    timeout=30,
    delegation=True,
    contexts=TOP_CONTEXTS,
    available=_has_coding_agents,
)
async def cancel_coding_agent(args: CancelCodingAgentArgs, ctx: TurnContext) -> Any:
    """Cancel a coding agent task started with start_coding_agent: sends
    session/cancel, then stops the agent's whole process group. Its completion
    (stop_reason cancelled) is still pushed here."""
    delegations = _delegations(ctx)
    if delegations is None:
        raise ToolError("not_found", f"no coding agent task with handle {args.handle!r}")
    return await delegations.cancel(args.handle, kind="coding_agent")


DELEGATION_TOOLS = [spawn_subagent, start_coding_agent_tool, cancel_coding_agent]

__all__ = [
    "DELEGATION_TOOLS",
    "CancelCodingAgentArgs",
    "SpawnSubagentArgs",
    "StartCodingAgentArgs",
    "cancel_coding_agent",
    "spawn_subagent",
    "start_coding_agent_tool",
]
