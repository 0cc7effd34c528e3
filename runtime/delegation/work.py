"""Pushed work a persona delegated, and the wakes that report it back.

A delegation tool (``spawn_subagent``, ``start_coding_agent``) starts a piece
of :class:`Work` and returns a :class:`~runtime.tool.Deferred` handle at once.
:class:`Delegations` — one per persona — watches each piece under its
timeout and, when it settles, reports back to the conversation that started
it as a *wake* (an envelope the persona sends itself).

Grouping: the calls of one assistant message form a batch. Work started by one
batch reports in **one grouped wake once all of it has settled** (never a
partial one); a batch is complete when the loop seals it after its last call
returned. Each result in the wake says how the work ended:

``ok`` (it finished), ``failed`` (it finished and said it could not do the
task), ``error`` (its model or agent failed), ``timeout`` (it ran past its
timeout and was stopped), ``crashed`` (its actor or process died),
``cancelled`` (``task_cancel``/``cancel_coding_agent``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from coterie.runtime.delegation.records import (
    CodingSetup,
    SubagentSetup,
    Work,
    WorkKind,
    WorkOutcome,
)
from coterie.runtime.errors import CoterieError, ToolError
from coterie.runtime.messages import DelegationEvent, MessageEnvelope
from coterie.runtime.services import AuditSink

log = logging.getLogger("coterie.delegation")

HANDLE_PREFIX: dict[WorkKind, str] = {"subagent": "sub_", "coding_agent": "acp_"}
#: The sender of completion wakes (the model reads ``[delegation] …``).
WAKE_SENDER = "delegation"
#: A result longer than this is cut in the wake (head kept); task_status has it all.
WAKE_RESULT_CAP = 8_000
#: Finished work kept for task_status, per persona (oldest forgotten first).
KEEP_FINISHED = 128


@dataclass
class _Entry:
    handle: str
    kind: WorkKind
    conversation_id: str
    turn_id: str
    group: tuple[str, str]
    work: Work
    timeout: float
    label: str
    started: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    outcome: WorkOutcome | None = None
    cancel_requested: bool = False
    ended: float | None = None

    def view(self) -> dict[str, Any]:
        end = self.ended if self.ended is not None else time.monotonic()
        body: dict[str, Any] = {
            "handle": self.handle,
            "kind": self.kind,
            "task": self.label,
            "status": self.outcome.status if self.outcome else "running",
            "elapsed_s": round(end - self.started, 2),
            "timeout_s": self.timeout,
        }
        if self.outcome is not None:
            body["result"] = self.outcome.text
            if self.outcome.error:
                body["error"] = self.outcome.error
            body.update(self.outcome.data)
        return body


@dataclass
class _Group:
    conversation_id: str
    handles: list[str] = field(default_factory=list)
    sealed: bool = False


def cut_report(text: str, handle: str, cap: int = WAKE_RESULT_CAP) -> str:
    """``text`` cut to ``cap`` characters, head kept, with a marker naming
    how much is missing and where the whole is."""
    if len(text) <= cap:
        return text
    return (
        text[:cap] + f"\n[report cut: {len(text)} characters in all, the first {cap} shown; "
        f"task_status {handle} shows the whole]"
    )


class _Reported(Protocol):
    handle: str
    kind: WorkKind
    label: str
    outcome: WorkOutcome | None


@dataclass
class _Lost:
    """Work a predecessor of this process started and never reported."""

    handle: str
    kind: WorkKind
    label: str
    outcome: WorkOutcome | None


#: Why work started before a restart reports ``crashed``.
LOST_ERROR = (
    "the persona's process stopped while this ran (a crash or a forced stop) and has "
    "restarted; the work was stopped with it and its result is lost — start it again if "
    "it is still needed"
)


def render_wake(entries: Sequence[_Reported]) -> str:
    """The text of one grouped completion wake."""
    n = len(entries)
    head = (
        "Your delegated task has finished."
        if n == 1
        else f"All {n} tasks you delegated together have finished."
    )
    parts = [head]
    for entry in entries:
        assert entry.outcome is not None
        outcome = entry.outcome
        title = f"## {entry.handle} ({entry.kind}) · {outcome.status}"
        facts = ", ".join(
            f"{k}: {v}" for k, v in outcome.data.items() if not isinstance(v, (dict, list)) or v
        )
        lines = [title, f"task: {entry.label}"]
        if facts:
            lines.append(facts)
        if outcome.error:
            lines.append(f"error: {outcome.error}")
        if outcome.text:
            lines.append(cut_report(outcome.text, entry.handle))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


class Delegations:
    """A persona's delegated work, by handle: watch, report, status, cancel.

    ``deliver`` queues an envelope on the persona itself (its
    ``PersonaRuntime.post``); ``max_running`` caps each kind of work running
    at once (``limit_reached`` beyond it).
    """

    def __init__(
        self,
        *,
        persona: str,
        deliver: Callable[[MessageEnvelope], None],
        audit: AuditSink,
        max_running: dict[WorkKind, int] | None = None,
    ) -> None:
        self.persona = persona
        self.deliver = deliver
        self.audit = audit
        self.max_running: dict[WorkKind, int] = max_running or {}
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._groups: dict[tuple[str, str], _Group] = {}
        self.closed = False
        self.wakes_sent = 0
        # What spawn_subagent / start_coding_agent need (set by the persona).
        self.subagents: SubagentSetup | None = None
        self.coding: CodingSetup | None = None

    # -- starting ----------------------------------------------------------

    def running(self, kind: WorkKind | None = None) -> int:
        return sum(
            1
            for e in self._entries.values()
            if e.outcome is None and (kind is None or e.kind == kind)
        )

    def running_in(self, conversation_id: str) -> int:
        return sum(
            1
            for e in self._entries.values()
            if e.outcome is None and e.conversation_id == conversation_id
        )

    def check_capacity(self, kind: WorkKind, setting: str) -> None:
        """Raise ``limit_reached`` when another ``kind`` would be one too many."""
        if self.closed:
            raise ToolError("unavailable", "the persona is shutting down")
        cap = self.max_running.get(kind)
        if cap is not None and self.running(kind) >= cap:
            raise ToolError(
                "limit_reached",
                f"{self.running(kind)} {kind.replace('_', ' ')}s are already running "
                f"({setting} is {cap}); wait for one to report back or cancel one",
            )

    def register(
        self,
        *,
        handle: str,
        kind: WorkKind,
        work: Work,
        conversation_id: str,
        turn_id: str,
        batch_id: str,
        timeout: float,
        label: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Watch ``work`` (already started) until it settles, then report it."""
        # Without a batch (a direct call outside the loop) the work is its own group.
        group_key = (conversation_id, batch_id or handle)
        entry = _Entry(
            handle=handle,
            kind=kind,
            conversation_id=conversation_id,
            turn_id=turn_id,
            group=group_key,
            work=work,
            timeout=timeout,
            label=label if len(label) <= 200 else label[:197] + "...",
        )
        self._entries[handle] = entry
        group = self._groups.setdefault(group_key, _Group(conversation_id))
        group.handles.append(handle)
        if not batch_id:
            group.sealed = True
        self._event(
            entry, "started", None, {"task": entry.label, "timeout_s": timeout, **(data or {})}
        )
        entry.task = asyncio.get_running_loop().create_task(
            self._watch(entry), name=f"delegation-{handle}"
        )

    def record(
        self,
        handle: str,
        phase: Literal["update", "permission"],
        data: dict[str, Any],
    ) -> None:
        """Log progress of ``handle`` into the parent's turn (ACP updates…)."""
        entry = self._entries.get(handle)
        if entry is not None:
            self._event(entry, phase, None, data)

    def _event(self, entry: _Entry, phase: Any, status: str | None, data: dict[str, Any]) -> None:
        self.audit.record(
            DelegationEvent(
                persona=self.persona,
                conversation_id=entry.conversation_id,
                turn_id=entry.turn_id,
                handle=entry.handle,
                work=entry.kind,
                phase=phase,
                child_conversation_id=entry.handle,
                status=status,
                data=data,
            )
        )

    # -- settling ----------------------------------------------------------

    async def _watch(self, entry: _Entry) -> None:
        waiter = asyncio.ensure_future(entry.work.result())
        try:
            done, _ = await asyncio.wait({waiter}, timeout=entry.timeout)
            if not done:
                waiter.cancel()
                waiter.add_done_callback(_consume)
                progress = await self._progress(entry)
                await self._cancel_work(entry)
                outcome = WorkOutcome(
                    status="timeout",
                    error=f"did not finish within {entry.timeout:g} s and was stopped",
                    data=progress,
                )
            elif waiter.cancelled():
                outcome = WorkOutcome(status="cancelled" if entry.cancel_requested else "crashed")
            elif (failure := waiter.exception()) is not None:
                if entry.cancel_requested:
                    outcome = WorkOutcome(status="cancelled", error="cancelled on request")
                else:
                    outcome = WorkOutcome(status="crashed", error=_describe(failure))
            else:
                outcome = waiter.result()
                if entry.cancel_requested and outcome.status == "ok":
                    outcome = outcome.model_copy(update={"status": "cancelled"})
        except asyncio.CancelledError:
            # The persona is closing: stop the work; logged, but no wake.
            waiter.cancel()
            waiter.add_done_callback(_consume)
            await self._discard(entry)
            self._settle(entry, WorkOutcome(status="cancelled", error="the persona shut down"))
            raise
        await self._discard(entry)
        self._settle(entry, outcome)

    async def _progress(self, entry: _Entry) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(entry.work.progress(), 5)
        except Exception:  # gone or wedged: the timeout report goes without it
            return {}

    async def _cancel_work(self, entry: _Entry) -> None:
        try:
            await asyncio.wait_for(entry.work.cancel(), 15)
        except Exception as exc:
            log.warning("cancelling %s failed: %s", entry.handle, _describe(exc))

    async def _discard(self, entry: _Entry) -> None:
        try:
            await asyncio.wait_for(entry.work.discard(), 15)
        except Exception as exc:
            log.warning("cleaning up %s failed: %s", entry.handle, _describe(exc))

    def _settle(self, entry: _Entry, outcome: WorkOutcome) -> None:
        entry.outcome = outcome
        entry.ended = time.monotonic()
        self._event(
            entry,
            "finished",
            outcome.status,
            {"error": outcome.error, "result": outcome.text, **outcome.data},
        )
        self._report(entry.group)
        self._forget_old()

    def seal(self, conversation_id: str, batch_id: str) -> None:
        group = self._groups.get((conversation_id, batch_id))
        if group is None:
            return
        group.sealed = True
        self._report((conversation_id, batch_id))

    def _report(self, key: tuple[str, str]) -> None:
        group = self._groups.get(key)
        if group is None or not group.sealed:
            return
        entries = [self._entries[h] for h in group.handles if h in self._entries]
        if any(e.outcome is None for e in entries):
            return
        del self._groups[key]
        if self.closed or not entries:
            return
        envelope = MessageEnvelope(
            sender=WAKE_SENDER,
            recipient=self.persona,
            conversation_id=group.conversation_id,
            text=render_wake(entries),
            source_kind="wake",
            reply_mode="none",
        )
        try:
            self.deliver(envelope)
            self.wakes_sent += 1
        except CoterieError as exc:  # the persona is closing
            log.warning("completion of %s not delivered: %s", group.handles, exc)

    def recover(self, started: Sequence[DelegationEvent]) -> int:
        """Report work that an earlier process of this persona started and
        never reported (``started`` events without a ``finished`` one, e.g.
        from the audit log after a crash): each is logged ``crashed`` and its
        conversation gets one wake per batch saying so. The number of wakes.
        """
        groups: dict[tuple[str, str], list[DelegationEvent]] = {}
        for event in started:
            if event.phase == "started" and event.handle not in self._entries:
                groups.setdefault((event.conversation_id, event.turn_id), []).append(event)
        sent = 0
        for (conversation_id, _), events in groups.items():
            lost = []
            for event in events:
                outcome = WorkOutcome(status="crashed", error=LOST_ERROR)
                label = str(event.data.get("task", ""))
                lost.append(_Lost(event.handle, event.work, label, outcome))
                self.audit.record(
                    event.model_copy(
                        update={
                            "ts": time.time(),
                            "phase": "finished",
                            "status": "crashed",
                            "data": {"error": LOST_ERROR, "result": "", "recovered": True},
                        }
                    )
                )
            log.warning(
                "%s: %d delegation(s) lost in a restart, reported to %s: %s",
                self.persona,
                len(lost),
                conversation_id,
                ", ".join(e.handle for e in lost),
            )
            if self.closed:
                continue
            envelope = MessageEnvelope(
                sender=WAKE_SENDER,
                recipient=self.persona,
                conversation_id=conversation_id,
                text=render_wake(lost),
                source_kind="wake",
                reply_mode="none",
            )
            try:
                self.deliver(envelope)
            except CoterieError as exc:  # the persona is closing
                log.warning("report of lost %s not delivered: %s", [e.handle for e in lost], exc)
                continue
            self.wakes_sent += 1
            sent += 1
        return sent

    def _forget_old(self) -> None:
        finished = [h for h, e in self._entries.items() if e.outcome is not None]
        for handle in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            entry = self._entries[handle]
            if entry.group not in self._groups:
                del self._entries[handle]

    # -- inspecting and cancelling ---------------------------------------

    def _entry(self, handle: str, kind: WorkKind | None = None) -> _Entry:
        entry = self._entries.get(handle)
        if entry is None or (kind is not None and entry.kind != kind):
            what = "coding agent task" if kind == "coding_agent" else "delegated task"
            raise ToolError("not_found", f"no {what} with handle {handle!r}")
        return entry

    def knows(self, handle: str) -> bool:
        return handle in self._entries

    async def status(self, handle: str) -> dict[str, Any]:
        """Where ``handle`` is: running (with its progress) or how it ended."""
        entry = self._entry(handle)
        view = entry.view()
        if entry.outcome is None:
            view["progress"] = await self._progress(entry)
        return view

    async def cancel(self, handle: str, kind: WorkKind | None = None) -> dict[str, Any]:
        """Stop ``handle``; its wake then reports ``cancelled``."""
        entry = self._entry(handle, kind)
        if entry.outcome is not None:
            raise ToolError("not_running", f"{handle} already finished ({entry.outcome.status})")
        entry.cancel_requested = True
        await self._cancel_work(entry)
        return {"cancelled": handle, "next": "its completion (cancelled) will be pushed"}

    def list(self) -> list[dict[str, Any]]:
        return [e.view() for e in self._entries.values()]

    async def aclose(self) -> None:
        """Stop every running delegation (no wakes: the persona is closing)."""
        self.closed = True
        tasks = [e.task for e in self._entries.values() if e.task is not None and not e.task.done()]
        for entry in self._entries.values():
            if entry.outcome is None:
                entry.cancel_requested = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.subagents is not None:
            self.subagents.launcher.close()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


__all__ = [
    "HANDLE_PREFIX",
    "KEEP_FINISHED",
    "WAKE_RESULT_CAP",
    "WAKE_SENDER",
    "Delegations",
    "cut_report",
    "render_wake",
]
