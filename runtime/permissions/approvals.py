"""Approvals: a tool call paused until a person answers it.

An ``ask`` decision becomes an :class:`~runtime.messages.ApprovalEvent`
(``requested``), recorded in the audit log through the turn's sink — durable
(the spool), queryable (the ``approvals`` view) and heard by whoever streams
the turn. The call then waits in :meth:`ApprovalDesk.wait` while the
persona's other conversations go on; :meth:`ApprovalDesk.decide` answers it
(``approve``, ``deny``, ``always``), a timer expires it. Every answer is a
``decided`` event naming who, through what and when.

Approvals a process did not live to see answered are *parked* when the
persona starts again (:meth:`ApprovalDesk.park`, from the audit log): an
answer to one of them resumes its turn through ``resume`` (see
:mod:`runtime.persona.runtime`).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from coterie.runtime.errors import ApprovalClosedError, UnknownApprovalError
from coterie.runtime.messages import ApprovalEvent, ApprovalState, new_id
from coterie.runtime.services import AuditSink

#: What a person may answer.
Answer = Literal["approve", "deny", "always"]
ANSWERS: tuple[str, ...] = ("approve", "deny", "always")

#: Ended approvals remembered (a later answer to one is told it ended).
_CLOSED_KEPT = 1024
_STATES: dict[str, ApprovalState] = {"approve": "approved", "always": "approved", "deny": "denied"}


def new_approval_id() -> str:
    return new_id("apr_")


@dataclass
class Verdict:
    """How an approval ended."""

    state: ApprovalState
    always: bool = False
    by: str | None = None
    via: str | None = None


@dataclass
class _Waiting:
    event: ApprovalEvent
    sink: AuditSink
    future: asyncio.Future[Verdict]


#: Resumes the turn of a parked approval once it is answered.
ResumeFn = Callable[[ApprovalEvent, Verdict], Awaitable[None]]


class ApprovalDesk:
    """The approvals of one persona: those a running turn waits on, and
    those parked from before a restart."""

    def __init__(
        self, persona: str, *, audit: AuditSink, clock: Callable[[], float] = time.time
    ) -> None:
        self.persona = persona
        self.audit = audit
        self.clock = clock
        self._waiting: dict[str, _Waiting] = {}
        self._parked: dict[str, ApprovalEvent] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._resuming: set[asyncio.Future[None]] = set()
        # How the latest approvals ended, so a second answer hears that.
        self._closed: OrderedDict[str, ApprovalState] = OrderedDict()
        #: Resumes a parked approval's turn (set by the persona).
        self.resume: ResumeFn | None = None
        # Clear while the parked approvals are being read (an answer that
        # comes first waits for them): see expect_parked.
        self._recovered = asyncio.Event()
        self._recovered.set()

    def expect_parked(self) -> None:
        """The persona is reading its parked approvals (:meth:`park` follows):
        answers to unknown ids wait for that first."""
        self._recovered.clear()

    def waiting(self) -> int:
        """Calls paused on an answer now (parked ones included)."""
        return len(self._waiting) + len(self._parked)

    def pending(self) -> list[ApprovalEvent]:
        """The requested events of every approval not answered yet."""
        return [w.event for w in self._waiting.values()] + list(self._parked.values())

    async def wait(self, event: ApprovalEvent, sink: AuditSink) -> Verdict:
        """Record ``event`` (requested) and wait for its answer or its
        expiry. A cancelled wait leaves the approval pending: a later
        process of the persona parks it."""
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiting[event.approval_id] = _Waiting(event, sink, future)
        sink.record(event)
        try:
            remaining = max(0.0, event.expires_at - self.clock())
            try:
                return await asyncio.wait_for(asyncio.shield(future), remaining)
            except TimeoutError:
                if future.done():
                    return future.result()
                verdict = Verdict("expired", by="timeout", via="timeout")
                self._record(event, sink, verdict)
                return verdict
        finally:
            self._waiting.pop(event.approval_id, None)

    def _record(self, event: ApprovalEvent, sink: AuditSink, verdict: Verdict) -> ApprovalEvent:
        decided = event.model_copy(
            update={
                "ts": self.clock(),
                "phase": "decided",
                "state": verdict.state,
                "decided_by": verdict.by,
                "via": verdict.via,
            }
        )
        sink.record(decided)
        self._closed[event.approval_id] = verdict.state
        while len(self._closed) > _CLOSED_KEPT:
            self._closed.popitem(last=False)
        return decided

    async def decide(
        self, approval_id: str, answer: Answer, *, by: str | None, via: str
    ) -> ApprovalEvent:
        """Answer an approval; its ``decided`` event. Raises
        :class:`UnknownApprovalError` for an id this persona does not hold,
        :class:`ApprovalClosedError` for one answered or expired already."""
        if answer not in ANSWERS:
            raise ValueError(f"answer must be one of {', '.join(ANSWERS)}, not {answer!r}")
        if approval_id not in self._waiting:
            try:  # a persona just started: its parked approvals first
                await asyncio.wait_for(self._recovered.wait(), 30)
            except TimeoutError:
                pass
        closed = self._closed.get(approval_id)
        if closed is not None:
            raise ApprovalClosedError(f"approval {approval_id} is {closed} already")
        verdict = Verdict(_STATES[answer], always=answer == "always", by=by, via=via)
        waiting = self._waiting.get(approval_id)
        if waiting is not None:
            if waiting.future.done():
                raise ApprovalClosedError(f"approval {approval_id} was answered already")
            if self.clock() >= waiting.event.expires_at:
                raise ApprovalClosedError(f"approval {approval_id} has expired")
            decided = self._record(waiting.event, waiting.sink, verdict)
            waiting.future.set_result(verdict)
            return decided
        parked = self._parked.get(approval_id)
        if parked is None:
            raise UnknownApprovalError(
                f"persona {self.persona!r} has no approval {approval_id!r} waiting"
            )
        if self.clock() >= parked.expires_at:
            self._expire(approval_id)
            raise ApprovalClosedError(f"approval {approval_id} has expired")
        return self._answer_parked(parked, verdict)

    def _answer_parked(self, parked: ApprovalEvent, verdict: Verdict) -> ApprovalEvent:
        self._parked.pop(parked.approval_id, None)
        timer = self._timers.pop(parked.approval_id, None)
        if timer is not None:
            timer.cancel()
        decided = self._record(parked, self.audit, verdict)
        if self.resume is not None:
            task = asyncio.ensure_future(self.resume(parked, verdict))
            self._resuming.add(task)
            task.add_done_callback(self._resuming.discard)
        return decided

    def park(self, requested: list[ApprovalEvent]) -> int:
        """Hold the approvals an earlier process of this persona asked for
        and never saw answered; each expires on time (resuming its turn with
        the denial). The number parked."""
        loop = asyncio.get_running_loop()
        for event in requested:
            if event.approval_id in self._waiting:
                continue
            self._parked[event.approval_id] = event
            delay = max(0.0, event.expires_at - self.clock())
            self._timers[event.approval_id] = loop.call_later(
                delay, self._expire, event.approval_id
            )
        self.recovered()
        return len(requested)

    def recovered(self) -> None:
        """The parked approvals are known (none, perhaps)."""
        self._recovered.set()

    def _expire(self, approval_id: str) -> None:
        parked = self._parked.get(approval_id)
        if parked is not None:
            self._answer_parked(parked, Verdict("expired", by="timeout", via="timeout"))

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


__all__ = ["ANSWERS", "Answer", "ApprovalDesk", "ResumeFn", "Verdict", "new_approval_id"]
