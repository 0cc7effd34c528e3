"""A persona's side of the scheduler's fires (heartbeats, cron entries, reminders).

A fire reaches the persona as a posted :class:`~coterie.runtime.messages.MessageEnvelope`
whose ``schedule`` (a :class:`~coterie.runtime.messages.ScheduleTurn`) says which
fire it is. :class:`ScheduledTurns` does what the persona owes the scheduler:

- **admission**: the envelope is queued only once the scheduler's ledger lets
  this persona accept the fire (``SchedulerService.accept``, a compare-and-set
  that succeeds once). A second delivery — the scheduler restarted after
  dispatching, and sent again what it could not know was taken — is dropped
  and logged. A scheduler that does not answer (it is restarting) is asked
  again for up to ``accept_wait`` seconds; then the fire is dropped and
  stays claimed in the ledger, to be dispatched again;
- **the turn's model**: a heartbeat's cheaper ``model`` is built once per
  configuration (a few kept) and used for that turn only;
- **the end**: ``SchedulerService.finish`` with the turn's status; a
  heartbeat or cron turn that found nothing to do (it ended ``skipped``
  having called nothing but ``end_task``) is left out of the conversation's
  history — here, and by a ``turn_dropped`` event when the conversation is
  rebuilt from the audit log, which keeps every event of it.

An accept whose answer was lost (the scheduler died after recording it)
must not lose the fire: asked again, the ledger says "already accepted",
and since the persona holds every fire it is accepting (a second delivery
of one in this process meanwhile is dropped here, without asking), nobody
but this very call can have accepted it — so it runs.

Each of these is a ``schedule`` audit event (accepted, dropped, done or
failed) on the fire's conversation, joined to the scheduler's own (fired,
skipped, missed…) by the fire id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

from pydantic import TypeAdapter

from coterie.runtime.config import ModelConfig, Persona
from coterie.runtime.errors import CoterieError
from coterie.runtime.loop import TurnResult
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    MessageEnvelope,
    ScheduleEvent,
    ScheduleOutcome,
    ScheduleTurn,
    TurnDropped,
    TurnStatus,
)
from coterie.runtime.models import Model, build_model_or_unavailable
from coterie.runtime.services import Services

log = logging.getLogger("coterie.persona")

#: Heartbeat models kept built (one per distinct configuration; the oldest goes).
MODEL_CACHE = 4
#: Seconds an accept is tried again while the scheduler does not answer.
ACCEPT_WAIT = 30.0
#: Why a turn is left out of its conversation's history.
DROP_REASON = "a {kind} turn that found nothing to do (end_task skipped)"

_model_config: TypeAdapter[ModelConfig] = TypeAdapter(ModelConfig)


def schedule_of(envelopes: Sequence[MessageEnvelope]) -> ScheduleTurn | None:
    """The fire a turn answering ``envelopes`` runs for: the first one's."""
    for envelope in envelopes:
        if envelope.schedule is not None:
            return envelope.schedule
    return None


def light_system_prompt(persona: Persona) -> str:
    """A light heartbeat's system prompt: the persona's SOUL alone (no date,
    user model, skills or roster: the checklist is the whole job)."""
    return persona.soul.strip() or f"You are {persona.name}, a helpful assistant."


def found_nothing(schedule: ScheduleTurn | None, result: TurnResult) -> bool:
    """Whether the turn is one to leave out of its conversation: a heartbeat
    or cron turn that ended ``skipped`` and called nothing but ``end_task``
    (anything else — a memory written, a message sent — is activity, and
    the turn stays)."""
    if schedule is None or schedule.kind == "reminder" or result.interrupted:
        return False
    if result.status != "skipped":
        return False
    return all(
        call.name == "end_task"
        for message in result.new_messages
        if isinstance(message, AssistantMessage)
        for call in message.tool_calls
    )


class ScheduledTurns:
    """What one persona does with the scheduler's fires (see the module docstring)."""

    def __init__(
        self,
        persona: str,
        services: Services,
        *,
        model_cache: int = MODEL_CACHE,
        accept_wait: float = ACCEPT_WAIT,
    ) -> None:
        self.persona = persona
        self.services = services
        self.accept_wait = accept_wait
        self._model_cache = model_cache
        self._models: OrderedDict[str, Model] = OrderedDict()
        # Fires being accepted now (bounded by the deliveries in flight).
        self._accepting: set[str] = set()
        #: Fires accepted, and second deliveries (or unconfirmed ones) dropped.
        self.accepted = 0
        self.dropped = 0

    def _event(
        self,
        schedule: ScheduleTurn,
        outcome: ScheduleOutcome,
        *,
        conversation_id: str,
        turn_id: str = "",
        reason: str | None = None,
    ) -> None:
        self.services.audit.record(
            ScheduleEvent(
                persona=self.persona,
                conversation_id=conversation_id,
                turn_id=turn_id,
                entry_kind=schedule.kind,
                name=schedule.name,
                instant=schedule.instant,
                fire_id=schedule.fire_id,
                outcome=outcome,
                reason=reason,
            )
        )

    async def admit(self, envelope: MessageEnvelope) -> bool:
        """Whether ``envelope`` may be queued: yes unless it is a fire the
        scheduler does not let this persona accept (already accepted: a
        second delivery) or could not be asked about."""
        schedule = envelope.schedule
        scheduler = self.services.scheduler
        if schedule is None or scheduler is None:
            return True  # no ledger to ask: nothing to deduplicate against
        conversation = envelope.conversation_id
        if schedule.fire_id in self._accepting:
            reason = "a second delivery of a fire this persona is accepting now"
            log.info("%s: fire %s dropped: %s", self.persona, schedule.fire_id, reason)
            self.dropped += 1
            self._event(schedule, "dropped", conversation_id=conversation, reason=reason)
            return False
        self._accepting.add(schedule.fire_id)
        try:
            accepted = await self._accept(schedule.fire_id)
        except CoterieError as exc:
            # It stays claimed in the ledger: the scheduler sends it again.
            reason = f"the scheduler could not be asked ({exc}); it will send the fire again"
            log.warning("%s: fire %s not accepted: %s", self.persona, schedule.fire_id, reason)
            self.dropped += 1
            self._event(schedule, "dropped", conversation_id=conversation, reason=reason)
            return False
        finally:
            self._accepting.discard(schedule.fire_id)
        if not accepted:
            reason = "already accepted (or ended): a second delivery of the same fire"
            log.info("%s: fire %s dropped: %s", self.persona, schedule.fire_id, reason)
            self.dropped += 1
            self._event(schedule, "dropped", conversation_id=conversation, reason=reason)
            return False
        self.accepted += 1
        late = "dispatched late" if schedule.late else None
        self._event(schedule, "accepted", conversation_id=conversation, reason=late)
        return True

    async def _accept(self, fire_id: str) -> bool:
        """The scheduler's accept, asked again while it does not answer. After
        a call that failed, "already accepted" means that call got through
        (see the module docstring): True. Raises when it stays away."""
        scheduler = self.services.scheduler
        assert scheduler is not None
        deadline = time.monotonic() + self.accept_wait
        delay, failed = 0.1, False
        while True:
            try:
                accepted = await scheduler.accept(fire_id)
            except CoterieError:
                if time.monotonic() + delay > deadline:
                    raise
                failed = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if failed and not accepted:
                log.warning(
                    "%s: fire %s: its accept was recorded but the answer lost; it runs",
                    self.persona,
                    fire_id,
                )
            return accepted or failed

    def model(self, schedule: ScheduleTurn | None) -> Model | None:
        """The model of a fire's turn: its own (built once per
        configuration), or None for the persona's."""
        if schedule is None or schedule.model is None:
            return None
        key = json.dumps(schedule.model, sort_keys=True)
        model = self._models.get(key)
        if model is None:
            model = build_model_or_unavailable(_model_config.validate_python(schedule.model))
            self._models[key] = model
            while len(self._models) > self._model_cache:
                _, old = self._models.popitem(last=False)
                self.services.background.spawn(old.aclose(), name="coterie-model-close")
        else:
            self._models.move_to_end(key)
        return model

    def drop_turn(
        self,
        history: list[ChatMessage],
        mark: int,
        schedule: ScheduleTurn | None,
        result: TurnResult,
        *,
        conversation_id: str,
        turn_id: str,
    ) -> bool:
        """Leave a turn that found nothing to do (see :func:`found_nothing`)
        out of ``history`` (its messages from ``mark`` on) and record the
        ``turn_dropped`` event a rebuild follows; whether it was."""
        if not found_nothing(schedule, result):
            return False
        assert schedule is not None
        del history[mark:]
        self.services.audit.record(
            TurnDropped(
                persona=self.persona,
                conversation_id=conversation_id,
                turn_id=turn_id,
                reason=DROP_REASON.format(kind=schedule.kind),
            )
        )
        return True

    async def finish(
        self,
        envelopes: Sequence[MessageEnvelope],
        status: TurnStatus,
        *,
        turn_id: str,
        reason: str | None = None,
    ) -> None:
        """Tell the scheduler how the turn of each fire among ``envelopes``
        ended (a merged turn may answer several), and record it."""
        scheduler = self.services.scheduler
        for envelope in envelopes:
            schedule = envelope.schedule
            if schedule is None:
                continue
            outcome: ScheduleOutcome = "done" if status in ("ok", "skipped") else "failed"
            self._event(
                schedule,
                outcome,
                conversation_id=envelope.conversation_id,
                turn_id=turn_id,
                reason=reason or status,
            )
            if scheduler is None:
                continue
            try:
                await scheduler.finish(schedule.fire_id, status, reason=reason)
            except CoterieError as exc:
                # The fire stays accepted: it is not run again, only its end is unrecorded.
                log.warning(
                    "%s: the end of fire %s could not be recorded: %s",
                    self.persona,
                    schedule.fire_id,
                    exc,
                )

    async def aclose(self) -> None:
        """Close the models built for fires."""
        models, self._models = list(self._models.values()), OrderedDict()
        for model in models:
            await model.aclose()


__all__ = [
    "ACCEPT_WAIT",
    "DROP_REASON",
    "MODEL_CACHE",
    "ScheduledTurns",
    "found_nothing",
    "light_system_prompt",
    "schedule_of",
]
