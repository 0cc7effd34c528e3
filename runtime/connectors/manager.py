"""Runs the connectors of ``coterie serve``.

Outbound: a task per connector takes its messages from the runtime's outbox
(a long poll that also renews the connector's lease) and sends them; a
message that fails is logged and dropped — the persona's tool already
returned. Inbound: a task per connector reads what people send, delivers
each message to its persona on the conversation of that chat, and sends
the turn's reply back (a question with its buttons).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from coterie.runtime.connectors.base import (
    Connector,
    ConnectorInfo,
    InboundMessage,
    OutboundMessage,
    info,
)
from coterie.runtime.errors import CoterieError
from coterie.runtime.frontdoor import FrontDoor
from coterie.runtime.messages import MessageEnvelope, Origin, ReplyEnvelope

log = logging.getLogger("coterie.connectors")

#: Seconds one outbox take waits (well under the outbox's lease).
TAKE_WAIT = 10.0
#: Inbound messages being answered at once, per connector.
INBOUND_CONCURRENCY = 16


def connector_conversation(persona: str, connector: str, destination: str) -> str:
    """The conversation that holds one chat of one connector."""
    return f"{persona}:{connector}:{destination}"


def reply_message(reply: ReplyEnvelope, inbound: InboundMessage, connector: str) -> OutboundMessage:
    """The outbound message that carries a turn's reply back to its chat."""
    text = reply.text if reply.status != "error" else f"(error) {reply.error}"
    question = reply.question
    return OutboundMessage(
        connector=connector,
        destination=inbound.destination,
        text=text,
        persona=reply.sender,
        conversation_id=reply.conversation_id,
        question_id=question.id if question else None,
        buttons=list(question.buttons) if question else [],
        expires_at=question.expires_at if question else None,
    )


class ConnectorHost(FrontDoor, Protocol):
    """The runtime as the connectors need it: its front door, to deliver what
    people send, and the outbox of messages for them (the router holds it)."""

    async def connectors_register_async(self, infos: list[ConnectorInfo]) -> None:
        """Offer these connectors (again): their lease starts now."""
        ...

    async def connectors_unregister_async(self, ids: list[str]) -> None:
        """Stop offering these connectors (a clean server shutdown)."""
        ...

    async def connector_take_async(self, connector_id: str, wait: float) -> list[OutboundMessage]:
        """Everything waiting for ``connector_id``, waiting up to ``wait``
        seconds for the first; renews its lease."""
        ...


class ConnectorManager:
    """Connects each connector to the runtime (see the module docstring)."""

    def __init__(
        self,
        backend: ConnectorHost,
        connectors: list[Connector],
        *,
        default_persona: Callable[[str], str | None] = lambda _id: None,
        ask_timeout: float = 600.0,
    ) -> None:
        self.backend = backend
        self.connectors = {c.id: c for c in connectors}
        self.default_persona = default_persona
        self.ask_timeout = ask_timeout
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.backend.connectors_register_async([info(c) for c in self.connectors.values()])
        for connector in self.connectors.values():
            self._tasks.append(asyncio.create_task(self._outbound(connector)))
            self._tasks.append(asyncio.create_task(self._inbound(connector)))

    async def aclose(self) -> None:
        for connector in self.connectors.values():
            await connector.aclose()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.backend.connectors_unregister_async(list(self.connectors))
        except CoterieError as exc:
            log.warning("could not unregister the connectors: %s", exc)

    async def _outbound(self, connector: Connector) -> None:
        delay = 0.5
        while True:
            try:
                messages = await self.backend.connector_take_async(connector.id, TAKE_WAIT)
                delay = 0.5
            except CoterieError as exc:
                # The router restarted (and forgot the registration): register again.
                log.warning("outbox of %s unavailable (%s); registering again", connector.id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                try:
                    await self.backend.connectors_register_async([info(connector)])
                except CoterieError:
                    pass
                continue
            for message in messages:
                await self.send(connector, message)

    async def send(self, connector: Connector, message: OutboundMessage) -> None:
        try:
            await connector.send(message)
        except CoterieError as exc:
            log.warning("%s could not deliver %s: %s", connector.id, message.id, exc)

    async def _inbound(self, connector: Connector) -> None:
        gate = asyncio.Semaphore(INBOUND_CONCURRENCY)
        running: set[asyncio.Task[None]] = set()
        async for inbound in connector.receive():
            await gate.acquire()
            task = asyncio.create_task(self._answer(connector, inbound))
            running.add(task)
            task.add_done_callback(running.discard)
            task.add_done_callback(lambda _t: gate.release())

    async def _decide(self, connector: Connector, inbound: InboundMessage) -> None:
        """A press of an approval's button: answer it, and say how it went."""
        assert inbound.approval is not None and inbound.decision is not None
        try:
            decided = await self.backend.decide_approval_async(
                inbound.approval,
                inbound.decision,
                by=f"{connector.id}:{inbound.sender}",
                via=connector.id,
            )
            text = f"{decided.state}: {decided.summary}"
            persona, conversation = decided.persona, decided.conversation_id
        except CoterieError as exc:  # unknown, answered already, expired
            text = f"(not answered) {exc}"
            persona = inbound.persona or self.default_persona(connector.id) or ""
            conversation = ""
        await self.send(
            connector,
            OutboundMessage(
                connector=connector.id,
                destination=inbound.destination,
                text=text,
                persona=persona,
                conversation_id=conversation,
            ),
        )

    async def _answer(self, connector: Connector, inbound: InboundMessage) -> None:
        if inbound.approval is not None:
            await self._decide(connector, inbound)
            return
        persona = inbound.persona or self.default_persona(connector.id)
        if persona is None:
            log.warning("%s: no persona answers %s", connector.id, inbound.destination)
            return
        envelope = MessageEnvelope(
            sender=f"{connector.id}:{inbound.sender}",
            recipient=persona,
            conversation_id=connector_conversation(persona, connector.id, inbound.destination),
            text=inbound.text,
            origin=Origin(connector=connector.id, destination=inbound.destination),
        )
        try:
            reply = await self.backend.deliver_async(envelope, timeout=self.ask_timeout)
        except CoterieError as exc:
            reply = ReplyEnvelope.failure(envelope, sender=persona, error=str(exc))
        if reply.text or reply.status == "error":
            await self.send(connector, reply_message(reply, inbound, connector.id))


__all__ = ["ConnectorHost", "ConnectorManager", "connector_conversation", "reply_message"]
