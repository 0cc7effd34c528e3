"""Schedules: ``remind``.

One tool for a persona's own time (the actions of
:class:`~coterie.runtime.schedule.RemindRequest`, its argument model):
recurring entries of its ``schedules.yaml`` (``list``, ``add``, ``update``,
``remove``, ``run_now``), reminders kept by the scheduler (``remind`` once
at ``at`` or ``in_seconds``, or every ``every_seconds`` until ``until``;
``cancel_reminder``) and its queues (``pause``/``resume`` heartbeat or
cron). Every action goes through ``ctx.services.scheduler``; the tool is
offered only where there is one, on a persona's own turns (not to
subagents).

The origin of the turn that sets a reminder is captured, so the reminder's
turn can ``reply_to_origin`` where the person asked (a web session, a chat).
A turn the scheduler started (heartbeat, cron, reminder) may create only a
few reminders or entries (``schedule.max_reminders_per_background_turn``),
so a schedule cannot multiply itself.
"""

from __future__ import annotations

from coterie.runtime.context import BACKGROUND_CONTEXTS, TurnContext
from coterie.runtime.errors import CoterieError, ToolError
from coterie.runtime.schedule.records import RemindRequest
from coterie.runtime.tool import tool


def _has_scheduler(ctx: TurnContext) -> bool:
    return ctx.services.scheduler is not None


@tool(
    name="remind",
    timeout=30,
    contexts=["user", "heartbeat", "cron"],
    available=_has_scheduler,
)
async def remind(args: RemindRequest, ctx: TurnContext) -> str:
    """Your schedule: recurring entries of your schedules.yaml and one-shot or
    repeating reminders. Use action "list" before answering questions about
    your schedules or reminders. "remind" sets a reminder (at: ISO 8601, or
    in_seconds; every_seconds to repeat, until to stop); when it fires you get
    a turn with its prompt, and reply_to_origin delivers to where this
    conversation came from (or to deliver_connector/deliver_to). "add",
    "update", "remove" edit recurring entries (type heartbeat with every, or
    cron with cron, prompt and optional tz, fresh, deliver_connector);
    "run_now" fires one now; "cancel_reminder" cancels a pending reminder by
    name; "pause"/"resume" hold or release a queue (heartbeat or cron)."""
    scheduler = ctx.services.scheduler
    if scheduler is None:
        raise ToolError("unavailable", "this runtime runs no scheduler")
    try:
        result = await scheduler.remind(
            ctx.persona,
            args,
            origin=ctx.origin,
            background=ctx.kind in BACKGROUND_CONTEXTS,
            turn_id=ctx.turn_id,
        )
    except ToolError:
        raise
    except CoterieError as exc:  # the scheduler is restarting, its store failed
        raise ToolError("unavailable", f"the scheduler could not do it: {exc}") from None
    return str(result)


SCHEDULE_TOOLS = [remind]

__all__ = ["SCHEDULE_TOOLS", "remind"]
