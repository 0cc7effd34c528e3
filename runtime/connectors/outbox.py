"""The outbox: outbound messages waiting for the connector they name.

Personas' tools (``send_message``, ``reply_to_origin``) run in persona
processes; the connectors run in ``coterie serve``. The outbox sits between
them — in the router actor on Ray, in the server's process otherwise. The
server registers its connectors and takes their messages with a long poll;
each take renews the connector's lease, so a server that stopped (killed,
not shut down) stops being offered after ``lease`` seconds instead of
swallowing messages forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from coterie.runtime.connectors.base import ConnectorInfo, OutboundMessage
from coterie.runtime.errors import ConnectorError, UnknownConnectorError

#: Seconds a registered connector stays offered without a take.
LEASE_SECONDS = 60.0
#: Messages waiting per connector before deliveries to it are refused.
MAX_QUEUED = 1000


class _Slot:
    def __init__(self, info: ConnectorInfo, expires: float) -> None:
        self.info = info
        self.expires = expires
        self.queue: deque[OutboundMessage] = deque()
        self.ready = asyncio.Event()


class Outbox:
    """Registered connectors and the messages waiting for each."""

    def __init__(
        self,
        *,
        lease: float = LEASE_SECONDS,
        max_queued: int = MAX_QUEUED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self.max_queued = max_queued
        self._clock = clock
        self._slots: dict[str, _Slot] = {}

    def register(self, infos: list[ConnectorInfo]) -> None:
        """Offer these connectors (again): their lease starts now."""
        expires = self._clock() + self.lease
        for info in infos:
            slot = self._slots.get(info.id)
            if slot is None:
                self._slots[info.id] = _Slot(info, expires)
            else:
                slot.info, slot.expires = info, expires

    def unregister(self, ids: list[str]) -> None:
        """Stop offering these connectors (a clean server shutdown)."""
        for connector_id in ids:
            slot = self._slots.pop(connector_id, None)
            if slot is not None:
                slot.ready.set()  # a waiting take returns

    def connectors(self) -> list[ConnectorInfo]:
        """The connectors offered now."""
        now = self._clock()
        return [s.info for _, s in sorted(self._slots.items()) if s.expires > now]

    def put(self, message: OutboundMessage) -> None:
        """Queue ``message`` for its connector, or raise :class:`ConnectorError`."""
        slot = self._slots.get(message.connector)
        if slot is None or slot.expires <= self._clock():
            running = ", ".join(c.id for c in self.connectors()) or "none"
            raise UnknownConnectorError(
                f"no connector {message.connector!r} is running (running: {running}); "
                "connectors run in `coterie serve`"
            )
        if len(slot.queue) >= self.max_queued:
            raise ConnectorError(
                f"connector {message.connector!r} has {len(slot.queue)} messages waiting; "
                "try again later"
            )
        slot.queue.append(message)
        slot.ready.set()

    async def take(self, connector_id: str, wait: float) -> list[OutboundMessage]:
        """Everything waiting for ``connector_id``, waiting up to ``wait``
        seconds for the first; renews its lease. Raises
        :class:`ConnectorError` for a connector that is not registered."""
        slot = self._slots.get(connector_id)
        if slot is None:
            raise ConnectorError(f"connector {connector_id!r} is not registered")
        slot.expires = self._clock() + self.lease
        if not slot.queue:
            slot.ready.clear()
            try:
                await asyncio.wait_for(slot.ready.wait(), wait)
            except TimeoutError:
                return []
        taken = list(slot.queue)
        slot.queue.clear()
        return taken

    def waiting(self) -> dict[str, int]:
        """Messages waiting per connector."""
        return {cid: len(s.queue) for cid, s in sorted(self._slots.items())}


__all__ = ["LEASE_SECONDS", "MAX_QUEUED", "Outbox"]
