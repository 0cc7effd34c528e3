"""A persona's conversations and turns, without Ray.

:class:`PersonaRuntime` is the plain logic inside ``PersonaActor``, put
together from parts that each do one job:

- :class:`~runtime.persona.queues.ConversationQueues`: one queue per
  conversation, one turn at a time on each, soft interrupts, queue caps and
  the cap on conversations held;
- :class:`~runtime.persona.turns.TurnBuilder`: each turn's context, input,
  system prompt and audit events around the tool loop;
- :class:`~runtime.persona.wiring.PersonaWiring`: the services the persona
  owns (delegations, MCP servers) and closing what its tools left running.

What stays here is what a caller sees: messages in (:meth:`~PersonaRuntime.handle`,
:meth:`~PersonaRuntime.post`, :meth:`~PersonaRuntime.stream`), replies mirrored
to the personas that asked for it (``send_to_persona``, unless the turn ended
with ``end_task(status="skipped")``), work it delegated reported back into
the conversation that started it (:mod:`runtime.delegation`; a persona with
delegations running is not idle), and passivation: once closing it refuses
new messages with :class:`~runtime.errors.PersonaPassivatedError`, so callers
resolve the persona again; :meth:`PersonaRuntime.close_if_idle` closes it
only if nothing is running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from coterie.runtime.config import Persona, merged_compaction
from coterie.runtime.context import Conversation
from coterie.runtime.delegation import Delegations
from coterie.runtime.delegation.acp.records import AgentPermission, AskPermission
from coterie.runtime.delegation.records import AgentAsk, CodingRequest
from coterie.runtime.errors import CoterieError, PersonaPassivatedError
from coterie.runtime.loop import TurnLoop, TurnResult
from coterie.runtime.mcp.hub import McpHub
from coterie.runtime.mcp_source import McpToolSource
from coterie.runtime.messages import (
    ApprovalEvent,
    DelegationEvent,
    MessageEnvelope,
    PersonaStats,
    ReplyEnvelope,
    ResumeCall,
    StreamItem,
    inbox_id,
)
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.models.base import Model
from coterie.runtime.permissions.approvals import Answer, ApprovalDesk, Verdict
from coterie.runtime.permissions.gate import (
    PermissionGate,
    agent_permission,
    merged_settings,
    persona_gate,
)
from coterie.runtime.persona.host import Launchers, PersonaHost
from coterie.runtime.persona.queues import Batch, ConversationQueues
from coterie.runtime.persona.turns import TurnBuilder
from coterie.runtime.persona.wiring import PersonaWiring
from coterie.runtime.runner import ToolRunner
from coterie.runtime.services import Services
from coterie.runtime.tool import ToolRegistry
from coterie.runtime.usage.prices import PriceTable

log = logging.getLogger("coterie.persona")


class PersonaRuntime:
    """Conversations and turns of one persona."""

    def __init__(
        self,
        persona: Persona,
        *,
        model: Model,
        registry: ToolRegistry,
        services: Services | None = None,
        launchers: Launchers | None = None,
        host: PersonaHost | None = None,
    ) -> None:
        """``services``: the handles its tools reach the runtime through (the
        persona adds the ones it owns: delegations, MCP); ``launchers``: where
        its delegated work and MCP sessions run (default: this process);
        ``host``: the runtime's settings, roster, cluster addresses and
        history loader."""
        self.persona = persona
        self.model = model
        self.host = host or PersonaHost()
        # One Services for every turn: background tasks and file locks are the
        # persona's, not a turn's.
        self.services = services or Services()
        self.wiring = PersonaWiring(
            persona,
            registry=registry,
            services=self.services,
            launchers=launchers or Launchers(),
            settings=self.host.settings,
            deliver=self.post,
            agent_ask=self._agent_asker,
        )
        cfg = persona.config
        settings = self.host.settings
        compaction = merged_compaction(settings.compaction, cfg.compaction)
        # A cheaper model for summaries, when one is named (built once).
        self.summarizer = (
            build_model_or_unavailable(compaction.model) if compaction.model is not None else None
        )
        self.loop = TurnLoop(
            model=model,
            registry=registry,
            runner=ToolRunner(output_cap=cfg.output_cap, timeout=cfg.tool_timeout),
            max_steps=cfg.max_steps,
            max_tokens=cfg.model.max_tokens,
            sources=[McpToolSource(self.wiring.mcp)],
            prices=PriceTable.from_settings(settings.prices),
            compaction=compaction,
            summarizer=self.summarizer,
        )
        # Permission rules (persona.yaml, runtime.yaml, approved.yaml) and the
        # approvals its calls wait on; a rule naming no tool stops it here.
        self.approvals = ApprovalDesk(persona.name, audit=self.services.audit)
        self.approvals.resume = self._resume
        self.services.permissions = persona_gate(
            persona,
            settings.permissions,
            known_tools=registry.names(),
            desk=self.approvals,
        )
        self.turns = TurnBuilder(persona, loop=self.loop, services=self.services, host=self.host)
        # Fires being accepted from the scheduler right now (see receive).
        self._admitting = 0
        self.queues = ConversationQueues(
            persona.name,
            host=self.host,
            audit=self.services.audit,
            run_turn=self.turns.run,
            answered=self._mirror,
        )

    @property
    def name(self) -> str:
        return self.persona.name

    @property
    def delegations(self) -> Delegations:
        """The work this persona delegated (subagents, coding agents)."""
        return self.wiring.delegations

    @property
    def mcp(self) -> McpHub:
        """This persona's MCP servers."""
        return self.wiring.mcp

    @property
    def closing(self) -> bool:
        """Whether it refuses new messages (passivating or shut down)."""
        return self.queues.closing

    @property
    def turns_run(self) -> int:
        return self.turns.turns_run

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation's state (created empty when new)."""
        return self.queues.conversation(conversation_id)

    def conversations(self) -> int:
        """How many conversations are held in memory."""
        return len(self.queues)

    def busy(self) -> bool:
        """Whether any conversation has a turn running or messages waiting
        (or a fire is being accepted)."""
        return self._admitting > 0 or self.queues.busy()

    def idle_for(self) -> float:
        """Seconds since the last message or turn end (0 while busy, while
        delegated work runs or while an approval waits)."""
        if self.busy() or self.wiring.running() or self.approvals.waiting():
            return 0.0
        return time.monotonic() - self.queues.last_activity

    def settled(self, conversation_id: str) -> bool:
        """Whether ``conversation_id`` has nothing in flight: no turn running
        or queued, no delegated work still to report back."""
        if not self.queues.idle(conversation_id):
            return False
        return self.delegations.running_in(conversation_id) == 0

    def recover_delegations(self, started: Sequence[DelegationEvent]) -> int:
        """Report work an earlier process of this persona delegated and never
        reported (its ``started`` events; see :meth:`Delegations.recover`): one
        ``crashed`` wake per batch. The number of wakes queued."""
        return self.delegations.recover(started)

    def stats(self) -> PersonaStats:
        """What runs in this persona now (for ``coterie status``)."""
        return PersonaStats(
            name=self.name,
            conversations=len(self.queues),
            turns_running=self.queues.turns_running(),
            queued=self.queues.queued(),
            delegations_running=self.wiring.running(),
            turns_run=self.turns_run,
            idle_seconds=round(self.idle_for(), 1),
            waiting_approval=self.approvals.waiting(),
        )

    # -- approvals ---------------------------------------------------------

    async def decide_approval(
        self, approval_id: str, answer: Answer, *, by: str | None, via: str
    ) -> ApprovalEvent:
        """Answer one of this persona's approvals (``approve``, ``deny``,
        ``always``); its ``decided`` event. See :class:`ApprovalDesk.decide`."""
        return await self.approvals.decide(approval_id, answer, by=by, via=via)

    def park_approvals(self, requested: Sequence[ApprovalEvent]) -> int:
        """Hold approvals an earlier process asked for and never saw answered
        (their ``requested`` events): answering one resumes its turn."""
        return self.approvals.park(list(requested))

    async def agent_permission(self, ask: AgentAsk) -> tuple[bool, str]:
        """A coding agent's permission request (``permissions: ask``): this
        persona's rules, else a person; whether it is allowed, and why."""
        gate = self.services.permissions
        gate = gate if isinstance(gate, PermissionGate) else None
        return await agent_permission(
            gate,
            self.approvals,
            persona=self.name,
            settings=gate.settings
            if gate is not None
            else merged_settings(self.persona.config.permissions, self.host.settings.permissions),
            ask=ask,
            audit=self.services.audit,
            deliveries=self.services.deliveries,
        )

    def _agent_asker(self, request: CodingRequest) -> AskPermission:
        """Where one delegation's permission requests go (in this process)."""

        async def ask(question: AgentPermission) -> tuple[bool, str]:
            return await self.agent_permission(AgentAsk.of(request, question))

        return ask

    async def _resume(self, requested: ApprovalEvent, verdict: Verdict) -> None:
        """A parked approval was answered: its turn goes on from the call."""
        self.post(
            MessageEnvelope(
                sender="approvals",
                recipient=self.name,
                conversation_id=requested.conversation_id,
                text=f"approval {requested.approval_id}: {verdict.state}",
                source_kind="wake",
                reply_mode="none",
                origin=requested.origin,
                resume=ResumeCall(
                    approval_id=requested.approval_id,
                    call_id=requested.call_id,
                    tool=requested.tool,
                    state=verdict.state,
                    always=verdict.always,
                    decided_by=verdict.by,
                    via=verdict.via,
                ),
            )
        )

    # -- messages in -------------------------------------------------------

    async def handle(self, envelope: MessageEnvelope) -> ReplyEnvelope:
        """Queue the message and wait for the reply of the turn that answers it.

        Raises :class:`QueueFullError` when a persona-sourced message finds
        its conversation's queue full.
        """
        pending = self.queues.accept(envelope, wait=True)
        assert pending.future is not None
        return await pending.future

    def post(self, envelope: MessageEnvelope) -> None:
        """Queue the message without waiting for its turn (fire and forget)."""
        self.queues.accept(envelope, wait=False)

    async def receive(self, envelope: MessageEnvelope) -> bool:
        """:meth:`post`, for a message from outside the persona: a fire of
        the scheduler is queued only once the scheduler lets this persona
        accept it (see :mod:`~coterie.runtime.persona.scheduled`); whether
        it was queued.

        While the scheduler is asked the persona counts as busy, so that it
        is not passivated between accepting a fire and queuing it (an
        accepted fire is never sent again).
        """
        if envelope.schedule is None:
            self.post(envelope)
            return True
        if self.closing:
            raise PersonaPassivatedError(f"persona {self.name!r} is closing")
        self._admitting += 1
        try:
            if not await self.turns.scheduled.admit(envelope):
                return False
            self.queues.accept(envelope, wait=False)
            return True
        finally:
            self._admitting -= 1

    async def stream(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]:
        """Queue the message, then yield the events of the turn(s) that answer
        it as they happen — text deltas, model and tool calls, the turn's end —
        and last its :class:`ReplyEnvelope`.

        The turn does not depend on the listener: a caller that stops reading
        stops hearing, and the turn goes on.
        """
        events: asyncio.Queue[StreamItem] = asyncio.Queue()
        pending = self.queues.accept(envelope, wait=True, listener=events.put_nowait)
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

    async def _mirror(self, batch: Batch, result: TurnResult) -> None:
        """Post the turn's reply back to each persona that sent with ``mirror``."""
        messenger = self.services.messenger
        if result.status in ("skipped", "error") or not result.text or messenger is None:
            return
        senders = dict.fromkeys(
            p.envelope.sender for p in batch.answers if p.envelope.reply_mode == "mirror"
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
                await messenger.post(envelope)
            except CoterieError as exc:
                log.warning("could not mirror %s's reply to %s: %s", self.name, sender, exc)

    # -- passivation -------------------------------------------------------

    async def close_if_idle(self, idle_timeout: float) -> bool:
        """Close (see :meth:`aclose`) if no turn ran for ``idle_timeout`` seconds
        and no background command is running; whether it closed."""
        if self.closing:
            return True
        if self.busy() or self.wiring.running() or self.idle_for() < idle_timeout:
            return False
        processes = self.services.processes
        if processes is not None and await processes.running():
            return False  # background commands still running: not idle
        if self.busy():
            return False  # a message (or a fire) came in meanwhile
        await self.aclose()
        return True

    async def aclose(self) -> None:
        """Refuse new messages, stop what tools left running (delegated work,
        background tasks, shell processes), flush the audit sink and close the model."""
        self.queues.close()
        await self.wiring.aclose()
        await self.turns.scheduled.aclose()
        self.approvals.close()
        await self.model.aclose()
        if self.summarizer is not None:
            await self.summarizer.aclose()


__all__ = ["PersonaRuntime"]
