"""Connectors whose people read through the front door itself: ``web`` (the
chat page) and ``cli`` (``coterie chat``).

Their destination is a session id the client chose. What personas send
there waits in a bounded mailbox per session until the client takes it
(``GET /v1/connectors/<id>/messages``); their inbound messages come through
the HTTP API's message routes, so :meth:`MailboxConnector.receive` yields
nothing of its own.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator

from coterie.runtime.connectors.base import Capability, InboundMessage, OutboundMessage

#: Messages kept per session (the oldest go first) and sessions kept.
MAILBOX_SIZE = 200
SESSIONS = 1000


class MailboxConnector:
    """A :class:`~runtime.connectors.base.Connector` with one mailbox per session."""

    def __init__(
        self,
        connector_id: str,
        capabilities: frozenset[Capability],
        *,
        size: int = MAILBOX_SIZE,
        sessions: int = SESSIONS,
    ) -> None:
        self.id = connector_id
        self.capabilities = capabilities
        self.size = size
        self.sessions = sessions
        self._boxes: OrderedDict[str, deque[OutboundMessage]] = OrderedDict()
        self._changed = asyncio.Condition()
        self._closed = asyncio.Event()

    async def send(self, message: OutboundMessage) -> str:
        box = self._boxes.get(message.destination)
        if box is None:
            box = self._boxes[message.destination] = deque(maxlen=self.size)
            while len(self._boxes) > self.sessions:
                self._boxes.popitem(last=False)
        else:
            self._boxes.move_to_end(message.destination)
        box.append(message)
        async with self._changed:
            self._changed.notify_all()
        return message.id

    async def take(self, destination: str, wait: float) -> list[OutboundMessage]:
        """What waits for ``destination``, waiting up to ``wait`` s for the first."""

        def ready() -> bool:
            return bool(self._boxes.get(destination)) or self._closed.is_set()

        if not ready() and wait > 0:
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(ready), wait)
                except TimeoutError:
                    return []
        box = self._boxes.get(destination)
        if not box:
            return []
        taken = list(box)
        box.clear()
        return taken

    async def receive(self) -> AsyncIterator[InboundMessage]:
        await self._closed.wait()
        return
        yield  # an async generator that ends when the connector closes

    async def aclose(self) -> None:
        self._closed.set()
        async with self._changed:
            self._changed.notify_all()


def web_connector() -> MailboxConnector:
    """The chat page's connector: text, buttons and markdown."""
    return MailboxConnector("web", frozenset({"text", "buttons", "markdown"}))


def cli_connector() -> MailboxConnector:
    """``coterie chat``'s connector: text (choices shown as a numbered list)."""
    return MailboxConnector("cli", frozenset({"text"}))


__all__ = ["MailboxConnector", "cli_connector", "web_connector"]
