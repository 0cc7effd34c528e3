"""A persona's conversations and turns, without Ray.

:class:`PersonaRuntime` is the plain logic inside ``PersonaActor``:

- one turn at a time per conversation; different conversations run in
  parallel;
- a message that reaches a conversation mid-turn is queued and requests a
  *soft interrupt*: the running turn stops after its current tool calls, and
  everything queued (plus the interrupted turn's own messages) is answered by
  one merged turn — nothing said is dropped, and every waiting caller gets
  that turn's reply;
- messages from other personas are capped per conversation
  (``max_queue``); messages from people are never refused;
- a ``send_to_persona`` message (``reply_mode="mirror"``) has its reply
  posted back into the sender's inbox conversation, unless the turn ended
  with ``end_task(status="skipped")``;
- work it delegated (subagents, coding agents) reports back into the
  conversation that started it as one grouped wake per assistant message
  (:mod:`runtime.delegation`); a persona with delegations running is not
  idle;
- once closing (passivation, shutdown) it refuses new messages with
  :class:`~runtime.errors.PersonaPassivatedError`, so callers resolve the
  persona again; :meth:`PersonaRuntime.close_if_idle` closes it only if
  nothing is running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coterie.runtime.config import Persona, RuntimeSettings, runtime_timezone
from coterie.runtime.context import Conversation, Services, TurnContext
from coterie.runtime.delegation import Delegations, LocalSubagents, SubagentLauncher, SubagentSetup
from coterie.runtime.delegation.acp.roster import RosterFile
from coterie.runtime.delegation.coding import LocalCodingAgents
from coterie.runtime.delegation.records import CodingAgentLauncher, CodingSetup
from coterie.runtime.errors import CoterieError, PersonaPassivatedError, QueueFullError
from coterie.runtime.loop import TurnLoop, TurnResult
from coterie.runtime.mcp.hub import ClientFactory, McpHub, local_clients
from coterie.runtime.mcp.source import McpToolSource
from coterie.runtime.memory.records import UserModelRow
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ConversationRecord,
    DelegationEvent,
    EnvelopeEvent,
    HistoryAppended,
    MessageEnvelope,
    PersonaStats,
    Question,
    QuestionSet,
    ReplyEnvelope,
    StreamItem,
    ToolResultMessage,
    TurnEnded,
    TurnEvent,
    TurnStarted,
    TurnStatus,
    UserMessage,
    inbox_id,
    new_id,
)
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.models.base import Model
from coterie.runtime.prompt import build_system_prompt
from coterie.runtime.runner import ToolRunner, error_result, remove_old_spills
from coterie.runtime.services import AuditSink, MemoryService, Messenger, NullAudit, ProcessService
from coterie.runtime.shell.env import secrets_to_hide
from coterie.runtime.shell.table import LocalProcesses
from coterie.runtime.tool import ToolRegistry

log = logging.getLogger("coterie.persona")

#: Seconds between two sweeps of old spill files.
SPILL_SWEEP_INTERVAL = 3600.0

#: Rebuilds a conversation (messages and todo list) after a restart or passivation.
HistoryLoader = Callable[[str], Awaitable[ConversationRecord]]


@dataclass
class _Pending:
    envelope: MessageEnvelope
    # None for posted messages nobody waits on.
    future: asyncio.Future[ReplyEnvelope] | None
    # A streaming caller: hears the events of the turns that answer it.
    listener: Callable[[StreamItem], None] | None = None


class _TeeSink:
    """A turn's audit sink while someone listens: every event is recorded
    as usual and also handed to the listeners."""

    def __init__(self, audit: AuditSink, emit: Callable[[StreamItem], None]) -> None:
        self.audit = audit
        self.emit = emit

    def record(self, event: TurnEvent) -> None:
        self.audit.record(event)
        self.emit(event)

    async def flush(self) -> None:
        await self.audit.flush()


def _fan_out(listeners: list[Callable[[StreamItem], None]]) -> Callable[[StreamItem], None]:
    def emit(item: StreamItem) -> None:
        for listener in listeners:
            listener(item)

    return emit


@dataclass
class _ConversationSlot:
    conversation: Conversation
    queue: list[_Pending] = field(default_factory=list)
    # Messages of an interrupted turn: already in the history, answered next.
    carried: list[_Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None
    in_turn: bool = False
    interrupt: bool = False
    loaded: bool = False

    def persona_sourced_queued(self) -> int:
        return sum(p.envelope.source_kind == "persona" for p in self.queue)

    def idle(self) -> bool:
        """No turn running and nothing waiting: safe to drop from memory."""
        running = self.worker is not None and not self.worker.done()
        return not (running or self.in_turn or self.queue or self.carried)


def trim_history(history: Sequence[ChatMessage], cap: int) -> list[ChatMessage]:
    """The newest messages of ``history``, at most ``cap``, starting at a user
    message (so no tool result is kept without the call it answers).

    What is dropped stays in the audit log; only the model stops seeing it.
    """
    if len(history) <= cap:
        return list(history)
    starts = [i for i, m in enumerate(history) if isinstance(m, UserMessage)]
    inside = [i for i in starts if i >= len(history) - cap]
    # No user message in the window (one very long turn): keep that whole turn.
    start = inside[0] if inside else max((i for i in starts), default=0)
    return list(history[start:])


def unanswered_calls(history: Sequence[ChatMessage]) -> list[ToolResultMessage]:
    """Results for the tool calls of the last assistant message that have none.

    A rebuilt conversation can end in calls whose results were never recorded:
    the persona's process died while they ran. Each gets an ``interrupted``
    result (the call may or may not have taken effect).
    """
    answered: set[str] = set()
    for message in reversed(history):
        if isinstance(message, ToolResultMessage):
            answered.add(message.call_id)
            continue
        if isinstance(message, AssistantMessage):
            return [
                ToolResultMessage(
                    call_id=call.id,
                    name=call.name,
                    content=error_result(
                        "interrupted",
                        "the persona stopped before this call finished and has restarted; "
                        "the call may or may not have taken effect",
                    ),
                    error_kind="interrupted",
                )
                for call in message.tool_calls
                if call.id not in answered
            ]
        return []
    return []


def render_input(envelope: MessageEnvelope) -> str:
    """The text a turn's model sees for an incoming envelope."""
    if envelope.source_kind == "persona":
        return f"[message from persona {envelope.sender}] {envelope.text}"
    if envelope.source_kind == "wake":
        return f"[{envelope.sender}] {envelope.text}"
    return envelope.text


class PersonaRuntime:
    """Conversations and turns of one persona."""

    def __init__(
        self,
        persona: Persona,
        *,
        model: Model,
        registry: ToolRegistry,
        audit: AuditSink | None = None,
        messenger: Messenger | None = None,
        memory: MemoryService | None = None,
        processes: ProcessService | None = None,
        roster: Sequence[tuple[str, str]] = (),
        history_loader: HistoryLoader | None = None,
        spill_dir: Path | None = None,
        settings: RuntimeSettings | None = None,
        cluster_addresses: frozenset[str] = frozenset(),
        subagents: SubagentLauncher | None = None,
        coding_agents: CodingAgentLauncher | None = None,
        mcp_clients: ClientFactory | None = None,
    ) -> None:
        self.persona = persona
        self.model = model
        self.registry = registry
        self.settings = settings or RuntimeSettings()
        # One Services for every turn: background tasks and file locks are the
        # persona's, not a turn's.
        self.services = Services(
            audit=audit or NullAudit(), messenger=messenger, memory=memory, processes=processes
        )
        cfg = persona.config
        self.delegations = Delegations(
            persona=persona.name,
            deliver=self.post,
            audit=self.services.audit,
            max_running={
                "subagent": cfg.subagents.max_running,
                "coding_agent": cfg.coding_agents.max_running,
            },
        )
        self.services.delegations = self.delegations
        if subagents is None:
            # In this process, each with its own process table when this
            # persona has one (their commands die with them).
            subagents = LocalSubagents(
                registry=registry,
                model_factory=build_model_or_unavailable,
                audit=self.services.audit,
                processes=(
                    (lambda: LocalProcesses(max_processes=self.settings.max_background_processes))
                    if processes is not None
                    else None
                ),
            )
        self.delegations.subagents = SubagentSetup(
            launcher=subagents, registry=registry, config=cfg
        )
        home = persona.path.parent.parent
        self.delegations.coding = CodingSetup(
            launcher=coding_agents or LocalCodingAgents(audit=self.services.audit),
            roster=RosterFile(home),
            # Outside every persona's directory: agents' stderr stays unreadable to tools.
            logs=home / "logs" / "acp" / persona.name,
        )
        # MCP servers (mcp.json): sessions start on the first turn, in this
        # process unless ``mcp_clients`` puts them elsewhere (their own actors).
        self.mcp = McpHub(
            persona=persona.name,
            home=home,
            persona_dir=persona.path,
            workspace=persona.workspace,
            factory=mcp_clients or local_clients,
            gateway=cfg.mcp_gateway,
            logs=home / "logs" / "mcp",
        )
        self.services.mcp = self.mcp
        self.roster = list(roster)
        self.history_loader = history_loader
        self.cluster_addresses = cluster_addresses
        self.spill_dir = spill_dir or persona.path / ".spill"
        self.max_queue = self.settings.max_queue
        self.closing = False
        # The workspace is where the file and shell tools work: it exists.
        persona.workspace.mkdir(parents=True, exist_ok=True)
        self._spills_swept = 0.0
        self._sweep_spills()
        self.loop = TurnLoop(
            model=model,
            registry=registry,
            runner=ToolRunner(output_cap=cfg.output_cap, timeout=cfg.tool_timeout),
            max_steps=cfg.max_steps,
            max_tokens=cfg.model.max_tokens,
            sources=[McpToolSource(self.mcp)],
        )
        # Least recently used first: idle ones beyond max_conversations go.
        self._slots: OrderedDict[str, _ConversationSlot] = OrderedDict()
        self.turns_run = 0
        self.last_activity = time.monotonic()

    @property
    def name(self) -> str:
        return self.persona.name

    @property
    def audit(self) -> AuditSink:
        return self.services.audit

    @property
    def messenger(self) -> Messenger | None:
        return self.services.messenger

    @messenger.setter
    def messenger(self, value: Messenger | None) -> None:
        self.services.messenger = value

    @property
    def memory(self) -> MemoryService | None:
        return self.services.memory

    @property
    def processes(self) -> ProcessService | None:
        return self.services.processes

    @processes.setter
    def processes(self, value: ProcessService | None) -> None:
        self.services.processes = value

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation's state (created empty when new)."""
        return self._slot(conversation_id).conversation

    def busy(self) -> bool:
        """Whether any conversation has a turn running or messages waiting."""
        return any(s.worker is not None and not s.worker.done() for s in self._slots.values())

    def idle_for(self) -> float:
        """Seconds since the last message or turn end (0 while busy or while
        delegated work runs)."""
        if self.busy() or self.delegations.running():
            return 0.0
        return time.monotonic() - self.last_activity

    def settled(self, conversation_id: str) -> bool:
        """Whether ``conversation_id`` has nothing in flight: no turn running
        or queued, no delegated work still to report back."""
        slot = self._slots.get(conversation_id)
        if slot is not None and not slot.idle():
            return False
        return self.delegations.running_in(conversation_id) == 0

    def recover_delegations(self, started: Sequence[DelegationEvent]) -> int:
        """Report work an earlier process of this persona delegated and never
        reported (its ``started`` events; see :meth:`Delegations.recover`): one
        ``crashed`` wake per batch. The number of wakes queued."""
        return self.delegations.recover(started)

    def _slot(self, conversation_id: str) -> _ConversationSlot:
        slot = self._slots.get(conversation_id)
        if slot is None:
            slot = _ConversationSlot(Conversation(conversation_id))
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
        if excess <= 0 or self.history_loader is None:
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

    def conversations(self) -> int:
        """How many conversations are held in memory."""
        return len(self._slots)

    def stats(self) -> PersonaStats:
        """What runs in this persona now (for ``coterie status``)."""
        slots = self._slots.values()
        return PersonaStats(
            name=self.name,
            conversations=len(self._slots),
            turns_running=sum(s.in_turn for s in slots),
            queued=sum(len(s.queue) for s in slots),
            delegations_running=self.delegations.running(),
            turns_run=self.turns_run,
            idle_seconds=round(self.idle_for(), 1),
        )

    # -- accepting messages ----------------------------------------------

    def _accept(
        self,
        envelope: MessageEnvelope,
        *,
        wait: bool,
        listener: Callable[[StreamItem], None] | None = None,
    ) -> _Pending:
        if self.closing:
            raise PersonaPassivatedError(f"persona {self.name!r} is closing")
        slot = self._slot(envelope.conversation_id)
        if envelope.source_kind == "persona":
            queued = slot.persona_sourced_queued()
            if queued >= self.max_queue:
                raise QueueFullError(envelope.conversation_id, queued, self.max_queue)
        self.last_activity = time.monotonic()
        self.audit.record(
            EnvelopeEvent(
                persona=self.name,
                conversation_id=envelope.conversation_id,
                turn_id="",
                envelope=envelope,
            )
        )
        future = asyncio.get_running_loop().create_future() if wait else None
        pending = _Pending(envelope, future, listener)
        slot.queue.append(pending)
        if slot.in_turn:
            slot.interrupt = True  # soft: the turn stops after its current tools
        if slot.worker is None or slot.worker.done():
            slot.worker = asyncio.create_task(self._drain(slot))
        return pending

    async def handle(self, envelope: MessageEnvelope) -> ReplyEnvelope:
        """Queue the message and wait for the reply of the turn that answers it.

        Raises :class:`QueueFullError` when a persona-sourced message finds
        its conversation's queue full.
        """
        pending = self._accept(envelope, wait=True)
        assert pending.future is not None
        return await pending.future

    def post(self, envelope: MessageEnvelope) -> None:
        """Queue the message without waiting for its turn (fire and forget)."""
        self._accept(envelope, wait=False)

    async def stream(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]:
        """Queue the message, then yield the events of the turn(s) that answer
        it as they happen — text deltas, model and tool calls, the turn's end —
        and last its :class:`ReplyEnvelope`.

        The turn does not depend on the listener: a caller that stops reading
        stops hearing, and the turn goes on.
        """
        events: asyncio.Queue[StreamItem] = asyncio.Queue()
        pending = self._accept(envelope, wait=True, listener=events.put_nowait)
        future = pending.future
        assert future is not None
        try:
            while True:
                getter: asyncio.Future[StreamItem] = asyncio.ensure_future(events.get())
                waiting: set[asyncio.Future[Any]] = {getter, future}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not events.empty():
                    yield events.get_nowait()
                yield future.result()
                return
        finally:
            pending.listener = None

    # -- turns -----------------------------------------------------------

    async def _drain(self, slot: _ConversationSlot) -> None:
        while slot.queue:
            new, slot.queue = slot.queue, []
            batch, slot.carried = [*slot.carried, *new], []
            slot.interrupt = False
            slot.in_turn = True
            try:
                result, turn_id = await self._turn(slot, new, batch)
            except Exception as exc:  # a runtime failure: every caller hears of it
                log.exception("turn failed for %s/%s", self.name, slot.conversation.id)
                self._resolve(batch, [self._error_reply(p.envelope, exc) for p in batch])
                continue
            finally:
                slot.in_turn = False
                self.last_activity = time.monotonic()
            if result.interrupted and slot.queue:
                slot.carried = batch
                continue
            self._resolve(batch, [self._reply(p.envelope, result, turn_id) for p in batch])
            await self._mirror(batch, result)

    def _resolve(self, batch: list[_Pending], replies: list[ReplyEnvelope]) -> None:
        for pending, reply in zip(batch, replies, strict=True):
            if pending.future is not None and not pending.future.done():
                pending.future.set_result(reply)

    def _reply(self, envelope: MessageEnvelope, result: TurnResult, turn_id: str) -> ReplyEnvelope:
        return ReplyEnvelope(
            reply_to=envelope.id,
            sender=self.name,
            conversation_id=envelope.conversation_id,
            turn_id=turn_id,
            text=result.text,
            status=result.status,
            steps=result.steps,
            question=result.question,
        )

    def _error_reply(self, envelope: MessageEnvelope, exc: BaseException) -> ReplyEnvelope:
        detail = str(exc) if isinstance(exc, CoterieError) else f"{type(exc).__name__}: {exc}"
        return ReplyEnvelope.failure(envelope, sender=self.name, error=detail)

    async def _mirror(self, batch: list[_Pending], result: TurnResult) -> None:
        """Post the turn's reply back to each persona that sent with ``mirror``."""
        if result.status in ("skipped", "error") or not result.text or self.messenger is None:
            return
        senders = dict.fromkeys(
            p.envelope.sender for p in batch if p.envelope.reply_mode == "mirror"
        )
        for sender in senders:
            envelope = MessageEnvelope(
                sender=self.name,
                recipient=sender,
                conversation_id=inbox_id(sender, self.name),
                text=result.text,
                source_kind="persona",
                reply_mode="none",
            )
            try:
                await self.messenger.post(envelope)
            except CoterieError as exc:
                log.warning("could not mirror %s's reply to %s: %s", self.name, sender, exc)

    async def _turn(
        self, slot: _ConversationSlot, new: list[_Pending], batch: list[_Pending]
    ) -> tuple[TurnResult, str]:
        conversation = slot.conversation
        rebuilt = False
        if not slot.loaded:
            # Marked loaded only once the load worked: a failed load fails this
            # turn, and the next one tries again instead of forgetting the past.
            if self.history_loader is not None and not conversation.history:
                record = await self.history_loader(conversation.id)
                conversation.history = trim_history(
                    record.messages, self.settings.max_history_messages
                )
                conversation.todos = list(record.todos)
                conversation.question = record.question
                rebuilt = True
            slot.loaded = True
        turn_id = new_id("turn_")
        envelopes = [p.envelope for p in batch]
        ask_path = list(dict.fromkeys(name for e in envelopes for name in e.ask_path))
        listeners = [p.listener for p in batch if p.listener is not None]
        on_event = _fan_out(listeners) if listeners else None
        ctx = TurnContext(
            persona=self.name,
            conversation=conversation,
            turn_id=turn_id,
            context=envelopes[0].context,
            tool_filter=self.persona.config.tools,
            thinking_mode=self.persona.config.thinking,
            services=self.services,
            roster=self.roster,
            ask_path=ask_path,
            interrupted=lambda: slot.interrupt,
            spill_dir=self.spill_dir,
            workspace=self.persona.workspace,
            persona_dir=self.persona.path,
            home=self.persona.path.parent.parent,
            access=self.persona.config.access,
            settings=self.settings,
            network=self.persona.config.network,
            cluster_addresses=self.cluster_addresses,
            hidden=self._hidden(),
            origin=envelopes[0].origin,
            sink=_TeeSink(self.services.audit, on_event) if on_event else None,
            on_event=on_event,
        )
        started = time.perf_counter()
        ctx.audit.record(
            TurnStarted(
                persona=self.name,
                conversation_id=conversation.id,
                turn_id=turn_id,
                context=ctx.context,
                message_ids=[e.id for e in envelopes],
            )
        )
        if rebuilt:
            for missing in unanswered_calls(conversation.history):
                # The persona died mid-tool-call: its calls get a result, or no
                # provider would accept the conversation again.
                self._append(ctx, missing)
        for pending in new:
            env = pending.envelope
            text = render_input(env)
            if conversation.question is not None and env.source_kind == "user":
                text = self._answering(ctx, env.text)
            self._append(ctx, UserMessage(text=text, source=env.sender))
        try:
            system = build_system_prompt(
                self.persona,
                roster=self.roster,
                user_model=await self._user_model(),
                tz=runtime_timezone(),
            )
            result = await self.loop.run(ctx, system=system)
        except Exception as exc:
            # Every started turn ends in the log, however it failed.
            self._record_end(ctx, started, "error", 0, f"{type(exc).__name__}: {exc}", False)
            raise
        self._record_end(ctx, started, result.status, result.steps, None, result.interrupted)
        if result.question is not None:
            self._set_question(ctx, result.question)
        conversation.history = trim_history(
            conversation.history, self.settings.max_history_messages
        )
        self._sweep_spills()
        return result, turn_id

    def _append(self, ctx: TurnContext, message: ChatMessage) -> None:
        """Add a message to the conversation and to the audit log (which rebuilds it)."""
        ctx.conversation.history.append(message)
        ctx.audit.record(
            HistoryAppended(
                persona=self.name,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                message=message,
            )
        )

    def _set_question(self, ctx: TurnContext, question: Question | None) -> None:
        """Set (or clear) the conversation's pending question, and record it so
        that it comes back with the conversation after a restart."""
        ctx.conversation.question = question
        ctx.audit.record(
            QuestionSet(
                persona=self.name,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                question=question,
            )
        )

    def _answering(self, ctx: TurnContext, text: str) -> str:
        """The model's view of a person's message that answers the pending
        question (which it clears): the question is named, and whether it had
        expired when the answer came."""
        question = ctx.conversation.question
        assert question is not None
        self._set_question(ctx, None)
        if question.expired():
            return f'[reply after your question "{question.text}" expired] {text}'
        return f'[answer to your question "{question.text}"] {text}'

    def _sweep_spills(self) -> None:
        """Delete cut tool results older than ``spill_retention_days`` (at most
        once an hour)."""
        now = time.time()
        if now - self._spills_swept < SPILL_SWEEP_INTERVAL:
            return
        self._spills_swept = now
        remove_old_spills(self.spill_dir, older_than=self.settings.spill_retention_days * 86_400)

    def _hidden(self) -> dict[str, str]:
        """What no tool result of this turn may show: every value of the
        persona's ``.env`` (read again each turn, so edits apply) and the
        runtime's provider keys."""
        key_vars = [self.settings.memory.openai_api_key_env]
        model_key = getattr(self.persona.config.model, "api_key_env", None)
        if model_key:
            key_vars.append(model_key)
        return secrets_to_hide(self.persona.path, key_vars=key_vars)

    async def _user_model(self) -> list[UserModelRow]:
        """The user model for the prompt; without it when memory is unreachable.

        A turn should not fail because the memory store is restarting: it goes
        on without the user model (logged), and the next turn asks again.
        """
        if self.memory is None:
            return []
        try:
            return await self.memory.user_model()
        except CoterieError as exc:
            log.warning("%s: user model unavailable for this turn: %s", self.name, exc)
            return []

    def _record_end(
        self,
        ctx: TurnContext,
        started: float,
        status: TurnStatus,
        steps: int,
        error: str | None,
        interrupted: bool,
    ) -> None:
        self.turns_run += 1
        ctx.audit.record(
            TurnEnded(
                persona=self.name,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                status=status,
                steps=steps,
                duration_ms=(time.perf_counter() - started) * 1000,
                error=error,
                interrupted=interrupted,
            )
        )

    async def close_if_idle(self, idle_timeout: float) -> bool:
        """Close (see :meth:`aclose`) if no turn ran for ``idle_timeout`` seconds
        and no background command is running; whether it closed."""
        if self.closing:
            return True
        if self.busy() or self.delegations.running() or self.idle_for() < idle_timeout:
            return False
        if self.processes is not None and await self.processes.running():
            return False  # background commands still running: not idle
        await self.aclose()
        return True

    async def aclose(self) -> None:
        """Refuse new messages, stop what tools left running (delegated work,
        background tasks, shell processes), flush the audit sink and close the model."""
        self.closing = True
        await self.delegations.aclose()
        await self.mcp.aclose()
        await self.services.background.aclose()
        if self.processes is not None:
            await self.processes.close()
        await self.audit.flush()
        await self.model.aclose()


__all__ = [
    "HistoryLoader",
    "PersonaRuntime",
    "render_input",
    "trim_history",
    "unanswered_calls",
]
