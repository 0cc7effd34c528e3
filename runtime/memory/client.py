"""MemoryClient: one persona's :class:`~runtime.services.MemoryService`.

Bound to one persona: every call carries that persona's name, so no tool
argument can reach another persona's rows. The backend serves every persona —
a :class:`~runtime.memory.server.MemoryServer` in this process, or the
MemoryStore actor behind a proxy (``actors``) — so the same client serves
tests, scripts and the cluster.
"""

from __future__ import annotations

from typing import Protocol

from coterie.runtime.memory.records import (
    IngestResult,
    MemoryRow,
    Mode,
    RecallHit,
    Source,
    UserModelRow,
    in_prompt_order,
)


class MemoryBackend(Protocol):
    """The memory of every persona; each call names the persona."""

    async def write(
        self, persona: str, *, category: str, content: str, importance: int
    ) -> MemoryRow: ...

    async def update(
        self,
        persona: str,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> MemoryRow: ...

    async def delete(self, persona: str, memory_id: str) -> None: ...

    async def recall(
        self,
        persona: str,
        *,
        query: str = "",
        source: Source = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
        mode: Mode = "hybrid",
    ) -> list[RecallHit]: ...

    async def ingest(self, persona: str, *, source: str, text: str) -> IngestResult: ...

    async def write_user_model(
        self, persona: str, *, dimension: str, content: str, confidence: int
    ) -> UserModelRow: ...

    async def user_model(self, persona: str) -> list[UserModelRow]: ...


class MemoryClient:
    """One persona's memory over a :class:`MemoryBackend`.

    The user model goes into every system prompt, so it is cached, and the
    cache follows this persona's own writes (only this persona writes it).
    ``new_scope``: the scope is known to hold nothing yet (an eval sample's),
    so the user model starts empty without asking the backend.
    """

    def __init__(self, backend: MemoryBackend, persona: str, *, new_scope: bool = False) -> None:
        self._backend = backend
        self.persona = persona
        self._user_model: list[UserModelRow] | None = [] if new_scope else None

    async def write(self, *, category: str, content: str, importance: int) -> MemoryRow:
        return await self._backend.write(
            self.persona, category=category, content=content, importance=importance
        )

    async def update(
        self,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> MemoryRow:
        return await self._backend.update(
            self.persona, memory_id, content=content, category=category, importance=importance
        )

    async def delete(self, memory_id: str) -> None:
        await self._backend.delete(self.persona, memory_id)

    async def recall(
        self,
        *,
        query: str = "",
        source: Source = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
        mode: Mode = "hybrid",
    ) -> list[RecallHit]:
        """This persona's hits for ``query``, best first; ``mode`` picks the
        search legs (``hybrid``: vector and full text fused; ``vector`` or
        ``fts`` alone)."""
        return await self._backend.recall(
            self.persona,
            query=query,
            source=source,
            category=category,
            limit=limit,
            date=date,
            mode=mode,
        )

    async def ingest(self, *, source: str, text: str) -> IngestResult:
        return await self._backend.ingest(self.persona, source=source, text=text)

    async def write_user_model(
        self, *, dimension: str, content: str, confidence: int
    ) -> UserModelRow:
        row = await self._backend.write_user_model(
            self.persona, dimension=dimension, content=content, confidence=confidence
        )
        if self._user_model is not None:
            rest = [r for r in self._user_model if r.dimension != row.dimension]
            self._user_model = in_prompt_order([*rest, row])
        return row

    async def user_model(self) -> list[UserModelRow]:
        if self._user_model is None:
            self._user_model = await self._backend.user_model(self.persona)
        return list(self._user_model)


__all__ = ["MemoryBackend", "MemoryClient"]
