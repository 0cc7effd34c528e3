"""task_status and task_cancel: pushed long-running work, by handle.

One pair of tools for every kind of handle a persona holds: ``bg_…``
(background shell commands), ``sub_…`` (subagents) and ``acp_…`` (coding
agents). Completion of pushed work arrives by itself as a wake; these are for
when the user asks.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.delegation import Delegations
from coterie.runtime.errors import ToolError
from coterie.runtime.tool import tool
from coterie.tools.shell import NOTIFY_TAIL, shell_available

PREFIXES = ("bg_", "sub_", "acp_")


def _delegations(ctx: TurnContext) -> Delegations | None:
    found = ctx.services.delegations
    return found if isinstance(found, Delegations) else None


def tasks_available(ctx: TurnContext) -> bool:
    return shell_available(ctx) or _delegations(ctx) is not None


class TaskHandleArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    handle: str = Field(
        min_length=1, max_length=64, description="a bg_, sub_ or acp_ handle you were given"
    )


def _kind_of(handle: str) -> str:
    for prefix in PREFIXES:
        if handle.startswith(prefix):
            return prefix
    raise ToolError(
        "not_found",
        f"{handle!r} is not a task handle (they start with {', '.join(PREFIXES)})",
    )


def _delegations_or_missing(ctx: TurnContext, handle: str) -> Delegations:
    found = _delegations(ctx)
    if found is None or not found.knows(handle):
        raise ToolError("not_found", f"no delegated task with handle {handle!r}")
    return found


def _processes(ctx: TurnContext, handle: str) -> Any:
    service = ctx.services.processes
    if service is None:
        raise ToolError("not_found", f"no background process with handle {handle!r}")
    return service


TASK_CONTEXTS = ("user", "heartbeat", "cron")


@tool(
    name="task_status",
    timeout=10,
    allow_repeat=True,
    contexts=TASK_CONTEXTS,
    available=tasks_available,
)
async def task_status(args: TaskHandleArgs, ctx: TurnContext) -> Any:
    """Check a pushed task handle when the user asks: a background command
    (bg_: running or exit code, its last output), a subagent (sub_) or a
    coding agent (acp_): running with its progress, or how it ended and its
    result."""
    if _kind_of(args.handle) == "bg_":
        result = await _processes(ctx, args.handle).read(args.handle, None)
        return {
            "handle": args.handle,
            **result.model_dump(exclude={"chunk"}),
            "output_tail": result.chunk[-NOTIFY_TAIL:],
        }
    return await _delegations_or_missing(ctx, args.handle).status(args.handle)


@tool(name="task_cancel", timeout=30, contexts=TASK_CONTEXTS, available=tasks_available)
async def task_cancel(args: TaskHandleArgs, ctx: TurnContext) -> Any:
    """Cancel a pushed task handle: a background command (bg_: its whole
    process group is stopped and the handle removed), a subagent (sub_) or a
    coding agent (acp_: session/cancel, then its process group is stopped);
    their completion then reports cancelled."""
    if _kind_of(args.handle) == "bg_":
        status = await _processes(ctx, args.handle).remove(args.handle)
        return {"cancelled": args.handle, "exit_code": status.exit_code}
    return await _delegations_or_missing(ctx, args.handle).cancel(args.handle)


TASK_TOOLS = [task_status, task_cancel]

__all__ = ["TASK_TOOLS", "TaskHandleArgs", "task_cancel", "task_status"]
