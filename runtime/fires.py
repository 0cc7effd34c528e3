"""From a fire of the scheduler to a persona's turn, and from what happened
to a fire to the audit log: the Scheduler actor's dispatch as plain logic.

:class:`FireDispatcher` is what a :class:`~coterie.runtime.schedule.LocalScheduler`
is handed as its ``dispatch`` and ``report`` callbacks (in the Scheduler actor,
in tests, in-process):

- a fire becomes a posted :class:`~coterie.runtime.messages.MessageEnvelope`
  (:func:`fire_envelope`): context ``heartbeat`` or ``cron`` (a reminder's
  turn is a cron turn), from the runtime itself (``source_kind="wake"``,
  nobody waits for its reply), on the fire's conversation, its
  :class:`~coterie.runtime.messages.ScheduleTurn` saying which fire it is,
  and its delivery target (a cron entry's ``deliver``, a reminder's override
  or the origin it was asked from) as the envelope's ``origin`` — so
  ``reply_to_origin`` delivers there;
- before a fire that delivers through a connector is dispatched, the
  connectors running now are asked (the router's registry): one that is not
  running makes the fire fail with ``deliver_unavailable`` (an audit event
  and the entry's last outcome), and no persona is started for it — never a
  silent drop;
- each :class:`~coterie.runtime.schedule.FireReport` (fired, late, skipped,
  missed, failed) becomes a ``schedule`` audit event on the persona's
  schedule log (:func:`~coterie.runtime.messages.schedule_log_id`).

This module sits at the top of ``runtime/``, between the scheduler
(:mod:`~coterie.runtime.schedule`) and the messages personas take, so that
neither depends on the other.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime, tzinfo

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config import runtime_timezone
from coterie.runtime.connectors.base import ConnectorInfo
from coterie.runtime.errors import CoterieError
from coterie.runtime.messages import (
    API_ORIGIN,
    MessageEnvelope,
    Origin,
    ScheduleEvent,
    ScheduleTurn,
    schedule_log_id,
)
from coterie.runtime.schedule.records import Fire, FireReport
from coterie.runtime.schedule.service import SchedulerService
from coterie.runtime.services import AuditSink, Messenger
from coterie.runtime.tracing import Span, active
from coterie.runtime.tracing.spans import start_fire

log = logging.getLogger("coterie.schedule")

#: The sender of the scheduler's envelopes (the model reads ``[scheduler] …``).
SENDER = "scheduler"
#: Ids of undeliverable fires remembered until their report comes.
FAILED_KEPT = 1024
#: The running connectors, as the router's registry says (None: no registry here).
Connectors = Callable[[], Awaitable[list[ConnectorInfo]]]


def _when(instant: datetime, tz: tzinfo) -> str:
    return instant.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z").strip()


def _deliver_line(origin: Origin | None, *, asked: bool) -> str:
    if origin is None or origin.connector == API_ORIGIN:
        return ""
    where = f"{origin.connector} {origin.destination}" if origin.destination else origin.connector
    why = ", where it was asked for" if asked else ""
    return (
        f"\nDeliver exactly one final message with reply_to_origin (it goes to {where}{why}); "
        "then call end_task."
    )


def fire_text(fire: Fire, *, tz: tzinfo | None = None) -> str:
    """What the persona's model reads for ``fire``: what is due and when,
    the prompt (a heartbeat's checklist), and how to end the turn (with
    ``reply_to_origin`` first when it delivers somewhere)."""
    tz = tz or runtime_timezone()
    when = _when(fire.instant, tz)
    if fire.manual:
        when += ", run now by hand"
    elif fire.late:
        when += ", late: the runtime was down when it fell due"
    if fire.kind == "heartbeat":
        return (
            f"Heartbeat ({when}). Go through this checklist:\n\n{fire.prompt.strip()}\n\n"
            'If nothing in it needs doing now, call end_task with status "skipped". '
            "Otherwise do what is needed, then call end_task (ok or failed)."
            + _deliver_line(fire.reply_origin, asked=False)
        )
    if fire.kind == "cron":
        head = f'Scheduled job "{fire.label}" ({when}): {fire.prompt.strip()}'
        tail = _deliver_line(fire.reply_origin, asked=False)
    else:
        head = f'Reminder "{fire.label}" that you set, due {when}: {fire.prompt.strip()}'
        tail = _deliver_line(fire.reply_origin, asked=fire.deliver is None)
    if not tail:
        tail = '\nWhen done, call end_task (ok; "skipped" if there was nothing to do; failed).'
    return head + tail


def fire_envelope(fire: Fire, *, tz: tzinfo | None = None) -> MessageEnvelope:
    """The envelope that starts ``fire``'s turn (see the module docstring)."""
    deliver = fire.reply_origin
    return MessageEnvelope(
        sender=SENDER,
        recipient=fire.persona,
        conversation_id=fire.conversation_id,
        text=fire_text(fire, tz=tz),
        context="heartbeat" if fire.kind == "heartbeat" else "cron",
        origin=deliver or Origin(),
        source_kind="wake",
        reply_mode="none",
        schedule=ScheduleTurn(
            fire_id=fire.fire_id,
            kind=fire.kind,
            name=fire.label,
            instant=fire.instant,
            late=fire.late,
            light=fire.light,
            fresh=fire.conversation_id.endswith(fire.fire_id),
            model=fire.model.model_dump(mode="json") if fire.model is not None else None,
            deliver=deliver,
        ),
    )


def schedule_event(report: FireReport) -> ScheduleEvent:
    """The audit event of a scheduler's report, on the persona's schedule log."""
    return ScheduleEvent(
        persona=report.persona,
        conversation_id=schedule_log_id(report.persona),
        turn_id="",
        entry_kind=report.kind,
        name=report.name,
        instant=report.instant,
        fire_id=report.fire_id,
        outcome=report.outcome,
        reason=report.reason,
    )


def undeliverable(fire: Fire, running: list[ConnectorInfo]) -> str | None:
    """Why ``fire`` cannot deliver where it should (its connector is not
    among ``running``), or None (it can, or it delivers nowhere)."""
    target = fire.reply_origin
    if target is None or target.connector == API_ORIGIN:
        return None
    ids = sorted(c.id for c in running)
    if target.connector in ids:
        return None
    return (
        f"deliver_unavailable: connector {target.connector!r} is not running "
        f"(running: {', '.join(ids) or 'none'}; connectors run in `coterie serve`); "
        "the turn did not run"
    )


class SchedulerStats(BaseModel):
    """The scheduler's counters (``coterie status``, ``GET /v1/status``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Heartbeat and cron entries in force, pending reminders, files that do not load.
    entries: int
    reminders: int
    file_errors: int
    #: Personas with a paused queue.
    paused: int
    #: When it looks next (UTC; None: nothing scheduled).
    next_wake: datetime | None
    #: Passes of its loop since it started.
    ticks: int
    #: Fires posted to personas, and fires failed for want of their connector.
    dispatched: int
    undelivered: int
    #: What happened to fires since it started, by outcome (fired, skipped, missed…).
    outcomes: dict[str, int] = Field(default_factory=dict)


class FireDispatcher:
    """Dispatches fires to personas and records what happened to them.

    ``messenger`` posts envelopes (the router's directory on Ray);
    ``audit`` takes the ``schedule`` events; ``connectors`` lists the
    running connectors (None: none are checked — no registry in this
    process). :meth:`bind` hands it the scheduler it dispatches for (it
    fails the fires that cannot deliver).
    """

    def __init__(
        self,
        messenger: Messenger,
        audit: AuditSink,
        *,
        connectors: Connectors | None = None,
        tz: tzinfo | None = None,
    ) -> None:
        self.messenger = messenger
        self.audit = audit
        self.connectors = connectors
        self.tz = tz or runtime_timezone()
        self.scheduler: SchedulerService | None = None
        # Fires failed for want of their connector: their "fired" report is
        # not recorded (nothing was sent). Emptied as the reports come (a
        # fire sent again after a restart gets none: the oldest go).
        self._failed: OrderedDict[str, None] = OrderedDict()
        #: Fires posted, and fires failed because their connector was not running.
        self.dispatched = 0
        self.undelivered = 0
        #: The outcomes recorded, by outcome.
        self.outcomes: Counter[str] = Counter()

    def bind(self, scheduler: SchedulerService) -> None:
        self.scheduler = scheduler

    async def dispatch(self, fire: Fire) -> None:
        """Post ``fire``'s envelope to its persona, or fail it when its
        delivery connector is not running. Raises when the post failed (the
        fire stays claimed and the scheduler sends it again)."""
        span = start_fire(
            persona=fire.persona,
            kind=fire.kind,
            name=fire.label,
            fire_id=fire.fire_id,
            instant=fire.instant.isoformat(),
            late=fire.late,
            manual=fire.manual,
        )
        try:
            # The envelope carries the span's context: the fire's turn is its child.
            with active(span):
                await self._dispatch(fire, span)
        except BaseException as exc:
            span.fail(type(exc).__name__, str(exc))
            raise
        finally:
            span.end()

    async def _dispatch(self, fire: Fire, span: Span) -> None:
        target = fire.reply_origin
        if self.connectors is not None and target is not None and target.connector != API_ORIGIN:
            try:
                running = await self.connectors()
            except CoterieError as exc:
                raise CoterieError(f"the running connectors could not be listed: {exc}") from exc
            reason = undeliverable(fire, running)
            if reason is not None:
                span.fail("deliver_unavailable", reason)
                await self._fail(fire, reason)
                return
        await self.messenger.post(fire_envelope(fire, tz=self.tz))
        self.dispatched += 1

    async def _fail(self, fire: Fire, reason: str) -> None:
        log.warning("%s: %s (%s): %s", fire.persona, fire.label, fire.fire_id, reason)
        self.undelivered += 1
        self.outcomes["deliver_unavailable"] += 1
        self._failed[fire.fire_id] = None
        while len(self._failed) > FAILED_KEPT:
            self._failed.popitem(last=False)
        self.audit.record(
            ScheduleEvent(
                persona=fire.persona,
                conversation_id=schedule_log_id(fire.persona),
                turn_id="",
                entry_kind=fire.kind,
                name=fire.label,
                instant=fire.instant,
                fire_id=fire.fire_id,
                outcome="deliver_unavailable",
                reason=reason,
            )
        )
        if self.scheduler is not None:
            await self.scheduler.finish(fire.fire_id, "failed", reason=reason)

    def report(self, report: FireReport) -> None:
        """Record a scheduler's report (a fire that was not sent is not "fired")."""
        if report.outcome in ("fired", "late") and report.fire_id in self._failed:
            del self._failed[report.fire_id]
            return
        self.outcomes[report.outcome] += 1
        self.audit.record(schedule_event(report))


__all__ = [
    "FAILED_KEPT",
    "SENDER",
    "Connectors",
    "FireDispatcher",
    "SchedulerStats",
    "fire_envelope",
    "fire_text",
    "schedule_event",
    "undeliverable",
]
