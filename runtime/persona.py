"""A persona's conversations and turns, without Ray.

:class:`PersonaRuntime` is the plain logic inside ``PersonaActor``: it keeps
the conversations, runs one turn at a time per conversation, and folds
messages that arrive mid-turn into the next turn (every waiting caller gets
the merged turn's reply).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runtime.config import Persona
from runtime.context import AuditSink, Conversation, NullAudit, Services, TurnContext
from runtime.errors import CoterieError
from runtime.loop import TurnLoop
from runtime.messages import (
    ChatMessage,
    EnvelopeEvent,
    HistoryAppended,
    MessageEnvelope,
    ReplyEnvelope,
    TurnEnded,
    TurnStarted,
    TurnStatus,
    UserMessage,
    new_id,
)
from runtime.models.base import Model
from runtime.prompt import build_system_prompt
from runtime.runner import ToolRunner
from runtime.tool import ToolRegistry

log = logging.getLogger("coterie.persona")

HistoryLoader = Callable[[str], Awaitable[list[ChatMessage]]]


@dataclass
class _Pending:
    envelope: MessageEnvelope
    future: asyncio.Future[ReplyEnvelope]


@dataclass
class _ConversationSlot:
    conversation: Conversation
    queue: list[_Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None
    loaded: bool = False


class PersonaRuntime:
    """Conversations and turns of one persona."""

    def __init__(
        self,
        persona: Persona,
        *,
        model: Model,
        registry: ToolRegistry,
        audit: AuditSink | None = None,
        roster: Sequence[tuple[str, str]] = (),
        history_loader: HistoryLoader | None = None,
        spill_dir: Path | None = None,
    ) -> None:
        self.persona = persona
        self.model = model
        self.registry = registry
        self.audit: AuditSink = audit or NullAudit()
        self.roster = list(roster)
        self.history_loader = history_loader
        self.spill_dir = spill_dir or persona.path / ".spill"
        cfg = persona.config
        self.loop = TurnLoop(
            model=model,
            registry=registry,
            runner=ToolRunner(output_cap=cfg.output_cap, timeout=cfg.tool_timeout),
            max_steps=cfg.max_steps,
            max_tokens=cfg.model.max_tokens,
        )
        self._slots: dict[str, _ConversationSlot] = {}
        self.turns_run = 0

    @property
    def name(self) -> str:
        return self.persona.name

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation's state (created empty when new)."""
        return self._slot(conversation_id).conversation

    def busy(self) -> bool:
        return any(s.worker is not None and not s.worker.done() for s in self._slots.values())

    def _slot(self, conversation_id: str) -> _ConversationSlot:
        slot = self._slots.get(conversation_id)
        if slot is None:
            slot = _ConversationSlot(Conversation(conversation_id))
            self._slots[conversation_id] = slot
        return slot

    async def handle(self, envelope: MessageEnvelope) -> ReplyEnvelope:
        """Queue the message for its conversation and wait for the reply.

        A message arriving while that conversation is mid-turn waits and is
        answered, together with everything else queued, by the next turn.
        """
        self.audit.record(
            EnvelopeEvent(
                persona=self.name,
                conversation_id=envelope.conversation_id,
                turn_id="",
                envelope=envelope,
            )
        )
        slot = self._slot(envelope.conversation_id)
        future: asyncio.Future[ReplyEnvelope] = asyncio.get_running_loop().create_future()
        slot.queue.append(_Pending(envelope, future))
        if slot.worker is None or slot.worker.done():
            slot.worker = asyncio.create_task(self._drain(slot))
        return await future

    async def _drain(self, slot: _ConversationSlot) -> None:
        while slot.queue:
            batch, slot.queue = slot.queue, []
            try:
                replies = await self._turn(slot, [p.envelope for p in batch])
            except Exception as exc:  # a runtime failure: every caller hears of it
                log.exception("turn failed for %s/%s", self.name, slot.conversation.id)
                replies = [self._error_reply(p.envelope, exc) for p in batch]
            for pending, reply in zip(batch, replies, strict=True):
                if not pending.future.done():
                    pending.future.set_result(reply)

    def _error_reply(self, envelope: MessageEnvelope, exc: BaseException) -> ReplyEnvelope:
        kind = type(exc).__name__ if not isinstance(exc, CoterieError) else "error"
        return ReplyEnvelope(
            reply_to=envelope.id,
            sender=self.name,
            conversation_id=envelope.conversation_id,
            turn_id="",
            text="",
            status="error",
            error=f"{kind}: {exc}" if kind != "error" else str(exc),
        )

    async def _turn(
        self, slot: _ConversationSlot, envelopes: list[MessageEnvelope]
    ) -> list[ReplyEnvelope]:
        conversation = slot.conversation
        if not slot.loaded:
            slot.loaded = True
            if self.history_loader is not None and not conversation.history:
                conversation.history = await self.history_loader(conversation.id)
        turn_id = new_id("turn_")
        first = envelopes[0]
        ctx = TurnContext(
            persona=self.name,
            conversation=conversation,
            turn_id=turn_id,
            context=first.context,
            tool_filter=self.persona.config.tools,
            thinking_mode=self.persona.config.thinking,
            services=Services(audit=self.audit),
            spill_dir=self.spill_dir,
            workspace=self.persona.workspace,
        )
        started = time.perf_counter()
        self.audit.record(
            TurnStarted(
                persona=self.name,
                conversation_id=conversation.id,
                turn_id=turn_id,
                context=first.context,
                message_ids=[e.id for e in envelopes],
            )
        )
        for env in envelopes:
            message = UserMessage(text=env.text, source=env.sender)
            conversation.history.append(message)
            self.audit.record(
                HistoryAppended(
                    persona=self.name,
                    conversation_id=conversation.id,
                    turn_id=turn_id,
                    message=message,
                )
            )
        system = build_system_prompt(self.persona, roster=self.roster)
        try:
            result = await self.loop.run(ctx, system=system)
        except Exception as exc:
            self._record_end(ctx, started, "error", 0, f"{type(exc).__name__}: {exc}")
            raise
        self._record_end(ctx, started, result.status, result.steps, None)
        return [
            ReplyEnvelope(
                reply_to=env.id,
                sender=self.name,
                conversation_id=conversation.id,
                turn_id=turn_id,
                text=result.text,
                status=result.status,
                steps=result.steps,
            )
            for env in envelopes
        ]

    def _record_end(
        self, ctx: TurnContext, started: float, status: TurnStatus, steps: int, error: str | None
    ) -> None:
        self.turns_run += 1
        self.audit.record(
            TurnEnded(
                persona=self.name,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                status=status,
                steps=steps,
                duration_ms=(time.perf_counter() - started) * 1000,
                error=error,
            )
        )

    async def aclose(self) -> None:
        await self.audit.flush()
        await self.model.aclose()


__all__ = ["HistoryLoader", "PersonaRuntime"]
