"""A persona's conversations: one queue each, one turn at a time on each.

- different conversations run their turns in parallel; within one, a turn
  runs only when the previous one has ended;
- a message that reaches a conversation mid-turn is queued and requests a
  *soft interrupt*: the running turn stops after its current tool calls, and
  everything queued (plus the interrupted turn's own messages) is answered by
  one merged turn — nothing said is dropped, and every waiting caller gets
  that turn's reply;
- a message whose deadline has passed before its turn starts (an ask whose
  sender stopped waiting) is not started as a turn; a caller still waiting
  gets an error reply saying it expired;
- messages from other personas are capped per conversation
  (``max_queue``); messages from people are never refused;
- at most ``max_conversations`` are held in memory: idle ones beyond it are
  dropped from the oldest, when the audit log can give them back (a dropped
  conversation is read back before its next turn);
- a conversation a scheduler's fire has to itself (``schedule.fresh``: a
  light heartbeat, a fresh cron entry) is forgotten once its turn has ended;
- once closing it refuses new messages with
  :class:`~runtime.errors.PersonaPassivatedError`, so callers resolve the
  persona again.

What a turn does is not this module's business: :class:`ConversationQueues`
hands each :class:`Batch` to the function it was given and resolves the
waiting callers with what that turn answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from coterie.runtime.context import Conversation
from coterie.runtime.errors import CoterieError, PersonaPassivatedError, QueueFullError
from coterie.runtime.loop import TurnResult
from coterie.runtime.messages import EnvelopeEvent, MessageEnvelope, ReplyEnvelope, StreamItem
from coterie.runtime.persona.history import rebuild
from coterie.runtime.persona.host import PersonaHost
from coterie.runtime.services import AuditSink

log = logging.getLogger("coterie.persona")


@dataclass(slots=True)
class Pending:
    """A queued message and who waits for the turn that answers it."""

    envelope: MessageEnvelope
    #: Resolved with the reply; None for posted messages nobody waits on.
    future: asyncio.Future[ReplyEnvelope] | None
    #: A streaming caller: hears the events of the turns that answer it.
    listener: Callable[[StreamItem], None] | None = None
    #: When it was queued (``time.monotonic``).
    queued_at: float = field(default_factory=time.monotonic)


def queue_wait_ms(pending: list[Pending]) -> float | None:
    """How long the longest-waiting of ``pending`` has been queued (ms); None for none."""
    if not pending:
        return None
    return (time.monotonic() - min(p.queued_at for p in pending)) * 1000


@dataclass(slots=True)
class Batch:
    """The messages one turn answers, on one conversation."""

    conversation: Conversation
    #: Messages not yet in the history: the turn appends them.
    new: list[Pending]
    #: Every message the turn answers: an interrupted turn's, then ``new``.
    answers: list[Pending]
    #: The history was just read back from the audit log.
    rebuilt: bool
    #: Whether a message arrived since the turn started (a soft interrupt).
    interrupted: Callable[[], bool]


#: Runs the turn for a batch: how it ended, and its id.
TurnFn = Callable[[Batch], Awaitable[tuple[TurnResult, str]]]
#: Called once a turn's replies are out (e.g. to mirror them to other personas).
AnsweredFn = Callable[[Batch, TurnResult], Awaitable[None]]


@dataclass(slots=True)
class _Slot:
    conversation: Conversation
    queue: list[Pending] = field(default_factory=list)
    # Messages of an interrupted turn: already in the history, answered next.
    carried: list[Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None
    in_turn: bool = False
    interrupt: bool = False
    loaded: bool = False
    # A fire's own conversation: forgotten once drained.
    once: bool = False

    def interrupted(self) -> bool:
        return self.interrupt

    def running(self) -> bool:
        return self.worker is not None and not self.worker.done()

    def persona_sourced_queued(self) -> int:
        return sum(p.envelope.source_kind == "persona" for p in self.queue)

    def settled(self) -> bool:
        """Nothing in a turn or waiting (its worker may still be ending)."""
        return not (self.in_turn or self.queue or self.carried)

    def idle(self) -> bool:
        """No turn running and nothing waiting: safe to drop from memory."""
        return not self.running() and self.settled()


class ConversationQueues:
    """The conversations of one persona, each with its queue of messages."""

    def __init__(
        self,
        persona: str,
        *,
        host: PersonaHost,
        audit: AuditSink,
        run_turn: TurnFn,
        answered: AnsweredFn,
    ) -> None:
        """``audit`` records each message as it arrives; ``run_turn`` runs the
        turn for a batch, and ``answered`` follows each turn whose replies went
        out."""
        self.persona = persona
        self.settings = host.settings
        self.history = host.history
        self.audit = audit
        self._run_turn = run_turn
        self._answered = answered
        self.closing = False
        #: When the last message came in or the last turn ended (monotonic).
        self.last_activity = time.monotonic()
        # Least recently used first: idle ones beyond max_conversations go.
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        # Messages in every slot's queue: kept as they come and go, because
        # the metrics read it at each turn's start and end, and summing the
        # queues of a persona holding 1,000 conversations cost ~11% of its
        # busy time (benchmarks/profile_persona.py).
        self._queued = 0
        # Conversations whose worker runs: at 0 the process is quiet, and the
        # host's heap trimmer gives back what the turns freed.
        self._draining = 0
        self._heap = host.heap

    def __len__(self) -> int:
        """How many conversations are held in memory."""
        return len(self._slots)

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation's state (created empty when new)."""
        return self._slot(conversation_id).conversation

    def busy(self) -> bool:
        """Whether any conversation has a turn running or messages waiting."""
        return any(s.running() for s in self._slots.values())

    def idle(self, conversation_id: str) -> bool:
        """Whether ``conversation_id`` has no turn running and nothing queued."""
        slot = self._slots.get(conversation_id)
        return slot is None or slot.idle()

    def turns_running(self) -> int:
        return sum(s.in_turn for s in self._slots.values())

    def queued(self) -> int:
        """Messages waiting in every conversation for a turn to take them."""
        return self._queued

    def accept(
        self,
        envelope: MessageEnvelope,
        *,
        wait: bool,
        listener: Callable[[StreamItem], None] | None = None,
    ) -> Pending:
        """Queue ``envelope`` in its conversation (starting its worker when
        none runs); the :class:`Pending` whose future the reply resolves.

        Raises :class:`PersonaPassivatedError` once closing, and
        :class:`QueueFullError` when a persona-sourced message finds its
        conversation's queue full. The message is recorded once accepted.
        """
        if self.closing:
            raise PersonaPassivatedError(f"persona {self.persona!r} is closing")
        slot = self._slot(envelope.conversation_id)
        if envelope.source_kind == "persona":
            queued = slot.persona_sourced_queued()
            if queued >= self.settings.max_queue:
                raise QueueFullError(envelope.conversation_id, queued, self.settings.max_queue)
        self.last_activity = time.monotonic()
        self.audit.record(
            EnvelopeEvent(
                persona=self.persona,
                conversation_id=envelope.conversation_id,
                turn_id="",
                envelope=envelope,
            )
        )
        future = asyncio.get_running_loop().create_future() if wait else None
        pending = Pending(envelope, future, listener)
        if envelope.schedule is not None and envelope.schedule.fresh:
            slot.once = True
        slot.queue.append(pending)
        self._queued += 1
        if slot.in_turn:
            slot.interrupt = True  # soft: the turn stops after its current tools
        if not slot.running():
            if self._heap is not None and self._draining == 0:
                self._heap.busy()
            self._draining += 1
            slot.worker = asyncio.create_task(self._drain(slot))
        return pending

    def _slot(self, conversation_id: str) -> _Slot:
        slot = self._slots.get(conversation_id)
        if slot is None:
            slot = _Slot(Conversation(conversation_id))
            self._slots[conversation_id] = slot
            self._evict_idle(keep=conversation_id)
        else:
            self._slots.move_to_end(conversation_id)
        return slot

    def _evict_idle(self, *, keep: str) -> None:
        """Drop the least recently used idle conversations beyond the cap.

        Only when they can come back: with a history loader (the audit log) a
        dropped conversation is rebuilt on its next message; without one,
        dropping it would forget it, so nothing is dropped.
        """
        excess = len(self._slots) - self.settings.max_conversations
        if excess <= 0 or self.history is None:
            return
        # From the oldest, only as far as needed: at the cap every new
        # conversation comes here, and copying the whole table first cost
        # ~0.1 ms per 1,000 conversations held.
        dropped: list[str] = []
        for conversation_id, slot in self._slots.items():
            if len(dropped) == excess:
                break
            if conversation_id != keep and slot.idle():
                dropped.append(conversation_id)
        for conversation_id in dropped:
            del self._slots[conversation_id]

    async def _load(self, slot: _Slot) -> bool:
        """Read the conversation back from the log before its first turn here;
        whether it was. Marked loaded only once the load worked: a failed load
        fails this turn, and the next one tries again instead of forgetting
        the past."""
        if slot.loaded:
            return False
        rebuilt = False
        if self.history is not None and not slot.conversation.history:
            await rebuild(slot.conversation, self.history, cap=self.settings.max_history_messages)
            rebuilt = True
        slot.loaded = True
        return rebuilt

    async def _drain(self, slot: _Slot) -> None:
        try:
            await self._take_turns(slot)
        finally:
            self._draining -= 1
            if self._heap is not None and self._draining == 0:
                self._heap.quiet()

    async def _take_turns(self, slot: _Slot) -> None:
        while slot.queue:
            taken, slot.queue = slot.queue, []
            self._queued -= len(taken)
            new = self._unexpired(taken)
            if not new and not slot.carried:
                continue
            answers, slot.carried = [*slot.carried, *new], []
            slot.interrupt = False
            slot.in_turn = True
            try:
                rebuilt = await self._load(slot)
                batch = Batch(slot.conversation, new, answers, rebuilt, slot.interrupted)
                result, turn_id = await self._run_turn(batch)
            except Exception as exc:  # a runtime failure: every caller hears of it
                log.exception("turn failed for %s/%s", self.persona, slot.conversation.id)
                self._resolve(answers, [self._error_reply(p.envelope, exc) for p in answers])
                continue
            finally:
                slot.in_turn = False
                self.last_activity = time.monotonic()
            if result.interrupted and slot.queue:
                slot.carried = answers
                continue
            self._resolve(answers, [self._reply(p.envelope, result, turn_id) for p in answers])
            await self._answered(batch, result)
        if slot.once and slot.settled() and self._slots.get(slot.conversation.id) is slot:
            del self._slots[slot.conversation.id]  # nothing will come to it again

    def _unexpired(self, queued: list[Pending]) -> list[Pending]:
        """``queued`` without the messages whose deadline has passed: nobody
        waits for their answer any more (an ask that timed out), so no turn
        starts on them. A caller still waiting hears why."""
        at = time.time()
        kept: list[Pending] = []
        for pending in queued:
            envelope = pending.envelope
            if not envelope.expired(at):
                kept.append(pending)
                continue
            assert envelope.deadline is not None
            late = at - envelope.deadline
            log.warning(
                "%s: message %s from %s on %s expired %.1f s before its turn; not started",
                self.persona,
                envelope.id,
                envelope.sender,
                envelope.conversation_id,
                late,
            )
            error = (
                f"the message expired before {self.persona} started a turn on it: its "
                f"deadline passed {late:.1f} s ago while it waited in {envelope.conversation_id}"
            )
            reply = ReplyEnvelope.failure(envelope, sender=self.persona, error=error)
            self._resolve([pending], [reply])
        return kept

    def _resolve(self, answers: list[Pending], replies: list[ReplyEnvelope]) -> None:
        for pending, reply in zip(answers, replies, strict=True):
            if pending.future is not None and not pending.future.done():
                pending.future.set_result(reply)

    def _reply(self, envelope: MessageEnvelope, result: TurnResult, turn_id: str) -> ReplyEnvelope:
        return ReplyEnvelope(
            reply_to=envelope.id,
            sender=self.persona,
            conversation_id=envelope.conversation_id,
            turn_id=turn_id,
            text=result.text,
            status=result.status,
            steps=result.steps,
            question=result.question,
        )

    def _error_reply(self, envelope: MessageEnvelope, exc: BaseException) -> ReplyEnvelope:
        detail = str(exc) if isinstance(exc, CoterieError) else f"{type(exc).__name__}: {exc}"
        return ReplyEnvelope.failure(envelope, sender=self.persona, error=detail)

    def close(self) -> None:
        """Refuse new messages from now on."""
        self.closing = True


__all__ = ["AnsweredFn", "Batch", "ConversationQueues", "Pending", "TurnFn"]
