"""What the front door needs of a runtime.

:class:`FrontDoor` is the runtime as the HTTP server sees it: ``coterie``'s
``Runtime`` (over Ray) is one; the tests may pass another. Everything is
async: the server never blocks its loop on the runtime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from coterie.runtime.audit.query import QueryResult
from coterie.runtime.connectors.base import ConnectorInfo, OutboundMessage
from coterie.runtime.memory.records import RecallHit
from coterie.runtime.messages import ChatMessage, MessageEnvelope, ReplyEnvelope, StreamItem
from coterie.runtime.routing.router import PersonaInfo


class FrontDoor(Protocol):
    """A running runtime, as ``coterie serve`` uses it."""

    async def personas_async(
        self, offset: int = 0, limit: int | None = None
    ) -> list[PersonaInfo]: ...

    async def persona_count_async(self) -> int: ...

    async def deliver_async(
        self, envelope: MessageEnvelope, *, timeout: float
    ) -> ReplyEnvelope: ...

    async def post_async(self, envelope: MessageEnvelope) -> None: ...

    def stream_async(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]: ...

    async def recall_async(
        self, persona: str, query: str = "", *, limit: int = 8
    ) -> list[RecallHit]: ...

    async def history_async(self, persona: str, conversation_id: str) -> list[ChatMessage]: ...

    async def query_async(self, sql: str) -> QueryResult: ...

    async def status_async(self) -> dict[str, Any]: ...

    # The connectors' outbox (in the router).
    async def connectors_register_async(self, infos: list[ConnectorInfo]) -> None: ...

    async def connectors_unregister_async(self, ids: list[str]) -> None: ...

    async def connector_take_async(
        self, connector_id: str, wait: float
    ) -> list[OutboundMessage]: ...


__all__ = ["FrontDoor"]
