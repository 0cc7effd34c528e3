"""An in-process :class:`~runtime.context.MemoryService` over a MemoryStore.

The actor runtime uses ``actors.memory_client.MemoryClient`` instead; this
one serves tests, scripts and single-process use. Store calls run in worker
threads so the event loop keeps turning while LanceDB works.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.memory_store import MemoryInput, MemoryStore


class LocalMemory:
    """One persona's view of a :class:`MemoryStore` (the persona is fixed)."""

    def __init__(self, store: MemoryStore, persona: str) -> None:
        self.store = store
        self.persona = persona

    async def write(self, *, category: str, content: str, importance: int) -> dict[str, Any]:
        item = MemoryInput(self.persona, category, content, importance)
        [row] = await asyncio.to_thread(self.store.write_memories, [item])
        return row.model_dump(mode="json")

    async def update(
        self,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> dict[str, Any]:
        row = await asyncio.to_thread(
            self.store.update_memory,
            self.persona,
            memory_id,
            content=content,
            category=category,
            importance=importance,
        )
        return row.model_dump(mode="json")

    async def delete(self, memory_id: str) -> None:
        await asyncio.to_thread(self.store.delete_memory, self.persona, memory_id)

    async def recall(
        self,
        *,
        query: str = "",
        source: str = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
    ) -> list[dict[str, Any]]:
        hits = await asyncio.to_thread(
            self.store.recall,
            self.persona,
            query=query,
            source=source,  # type: ignore[arg-type]
            category=category,
            limit=limit,
            date=date,
        )
        return [h.model_dump(mode="json") for h in hits]

    async def ingest(self, *, source: str, text: str) -> dict[str, Any]:
        result = await asyncio.to_thread(self.store.ingest, self.persona, source=source, text=text)
        return result.model_dump(mode="json")

    async def write_user_model(
        self, *, dimension: str, content: str, confidence: int
    ) -> dict[str, Any]:
        row = await asyncio.to_thread(
            self.store.write_user_model,
            self.persona,
            dimension=dimension,
            content=content,
            confidence=confidence,
        )
        return row.model_dump(mode="json")

    async def user_model(self) -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(self.store.user_model, self.persona)
        return [r.model_dump(mode="json") for r in rows]


__all__ = ["LocalMemory"]
