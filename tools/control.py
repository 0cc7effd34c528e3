"""Control tools: clock, end_task, think_harder, todo_write, todo_read, draft."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config import runtime_timezone
from coterie.runtime.context import EndTask, TurnContext
from coterie.runtime.messages import TodoItem, TodosSet, render_todos
from coterie.runtime.tool import tool

THINK_REASON_MAX = 80
TODO_MAX_ITEMS = 100
#: draft rounds per turn; after these the tool tells the model to finish.
DRAFT_ROUNDS = 3


class ClockArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["iso8601", "time_only", "full"] = Field(
        default="iso8601",
        description="iso8601: 2026-11-29T14:30:00+00:00; time_only: 14:30:00; "
        "full: weekday, date, time and timezone",
    )


@tool(name="clock", timeout=30, allow_repeat=True)
async def clock(args: ClockArgs, ctx: TurnContext) -> str:
    """Current wall-clock time in the runtime's timezone. Today's date is already
    in the system prompt; use this when the exact time matters."""
    tz = runtime_timezone()
    now = datetime.now(tz).replace(microsecond=0)
    if args.format == "time_only":
        return now.strftime("%H:%M:%S")
    if args.format == "full":
        return now.strftime(f"%A %Y-%m-%d %H:%M:%S in {tz.key}")
    return now.isoformat()


class EndTaskArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "skipped", "failed"] = Field(
        description="ok: the task is done; skipped: nothing to do (in an inbox thread "
        "this ends it without a reply); failed: the task could not be completed"
    )
    summary: str | None = Field(default=None, max_length=2000, description="what was done")
    reason: str | None = Field(default=None, max_length=500, description="why, if not ok")


@tool(name="end_task", timeout=30, terminal=True)
async def end_task(args: EndTaskArgs, ctx: TurnContext) -> str:
    """End the current turn now with a status. Nothing runs after it in this
    turn. Use skipped when there was nothing to do, failed when the task could
    not be completed."""
    ctx.outputs.end_task = EndTask(status=args.status, summary=args.summary, reason=args.reason)
    return f"turn ended: {args.status}"


class ThinkHarderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(
        default=None,
        description="a short label for why (at most a few words); not a place to think",
    )


def _thinking_off(ctx: TurnContext) -> bool:
    return not ctx.thinking_on


@tool(name="think_harder", timeout=30, contexts=["user"], available=_thinking_off)
async def think_harder(args: ThinkHarderArgs, ctx: TurnContext) -> str:
    """Turn on extended thinking for the rest of this turn. Call it once,
    before answering, when the problem needs careful reasoning."""
    ctx.outputs.force_thinking = True
    # The reason is telemetry only: clipped, and never echoed back.
    ctx.outputs.think_reason = (args.reason or "")[:THINK_REASON_MAX] or None
    return "Extended thinking is on for the rest of this turn."


class TodoWriteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    todos: list[TodoItem] = Field(
        max_length=TODO_MAX_ITEMS,
        description="the whole list; it replaces the previous one",
    )


@tool(name="todo_write", timeout=30)
async def todo_write(args: TodoWriteArgs, ctx: TurnContext) -> str:
    """Replace this conversation's todo list (content, status pending /
    in_progress / completed, priority high / medium / low)."""
    ctx.conversation.todos = list(args.todos)
    # Recorded, so that the list comes back with the conversation after a restart.
    ctx.audit.record(
        TodosSet(
            persona=ctx.persona,
            conversation_id=ctx.conversation_id,
            turn_id=ctx.turn_id,
            todos=ctx.conversation.todos,
        )
    )
    return render_todos(ctx.conversation.todos)


class TodoReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


@tool(name="todo_read", timeout=30, allow_repeat=True)
async def todo_read(args: TodoReadArgs, ctx: TurnContext) -> str:
    """Read this conversation's todo list."""
    return render_todos(ctx.conversation.todos)


class DraftArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=100_000, description="the complete draft answer")


DRAFT_REVIEW = """\
Draft {n} of {rounds} for this turn received (the user has not seen it). Review it \
as a demanding reviewer would, point by point:
1. Claims: name every factual claim in it and where it came from (a tool result in \
this conversation, the user, your memory). Check the ones without a source with your \
tools now, or take them out.
2. The question: does it answer what was asked, directly and first? Cut what was \
not asked for.
3. Gaps: what will the reader need that is missing (steps, figures, caveats, \
the next action)?
4. Mistakes: redo every calculation; reread code, commands and names.
5. Form: plain words, no filler, no longer than its content needs.
Then either call draft again with the revised text or write your final answer."""

DRAFT_DONE = (
    "That was draft {n}; the limit is {rounds} per turn. Do not call draft again: "
    "write your final answer now."
)


def _draft_opted_in(ctx: TurnContext) -> bool:
    # Opt-in: offered only when persona.yaml names it in tools.allow (a
    # wildcard does not count).
    return "draft" in ctx.settings.tool_filter.allow


@tool(name="draft", timeout=30, available=_draft_opted_in)
async def draft(args: DraftArgs, ctx: TurnContext) -> str:
    """Submit a draft answer for self-review; returns a checklist that critiques
    the draft."""
    ctx.outputs.drafts += 1
    if ctx.outputs.drafts > DRAFT_ROUNDS:
        return DRAFT_DONE.format(n=ctx.outputs.drafts, rounds=DRAFT_ROUNDS)
    return DRAFT_REVIEW.format(n=ctx.outputs.drafts, rounds=DRAFT_ROUNDS)


CONTROL_TOOLS = [clock, end_task, think_harder, todo_write, todo_read, draft]

__all__ = [
    "CONTROL_TOOLS",
    "DRAFT_ROUNDS",
    "clock",
    "draft",
    "end_task",
    "think_harder",
    "todo_read",
    "todo_write",
]
