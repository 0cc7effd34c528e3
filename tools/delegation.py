"""Delegation tools: spawn_subagent (and, with an ACP roster, the coding
agent tools).

Each starts pushed work and returns ``{"deferred": true, "kind", "handle"}``
at once; when every call of an assistant message did so, the turn ends, and
the results come back into this conversation as one grouped wake (see
:mod:`runtime.delegation`). Delegation tools are never offered to subagents.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from runtime.context import TurnContext
from runtime.delegation import Delegations, SpawnRequest, start_subagent
from runtime.errors import ToolError
from runtime.tool import Deferred, tool

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


DELEGATION_TOOLS = [spawn_subagent]

__all__ = ["DELEGATION_TOOLS", "SpawnSubagentArgs", "spawn_subagent"]
