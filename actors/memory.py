"""MemoryStoreActor: the cluster's long-term memory, a thin shell over
:class:`runtime.memory_store.MemoryStore`.

One named actor owns the LanceDB tables and the embedding model, so personas
never load either. Memory writes arriving close together are coalesced into
one batch (one embedding call, one table write); index maintenance runs in a
background thread on a timer and never blocks queries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import ray

from runtime.config import MemorySettings
from runtime.errors import ToolError

log = logging.getLogger("coterie.actors.memory")

BATCH_WINDOW = 0.005
MAX_BATCH = 256


class _LazyEmbedder:
    """Builds the real embedder on the first ``embed`` call.

    Loading all-MiniLM-L6-v2 takes seconds and hundreds of MiB; reads that
    embed nothing (the user model, date listings) should not wait for it.
    """

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings
        self.name = {
            "minilm": "all-MiniLM-L6-v2",
            "openai": settings.openai_model,
            "hashing": "hashing",
        }[settings.embedder]
        self.dim = {"minilm": 384, "openai": settings.openai_dim, "hashing": 256}[settings.embedder]
        self._real: Any = None
        self._lock = threading.Lock()

    def _build(self) -> Any:
        from runtime.embedders import build_embedder

        s = self.settings
        if s.embedder == "openai":
            return build_embedder(
                "openai",
                model=s.openai_model,
                base_url=s.openai_base_url,
                api_key_env=s.openai_api_key_env,
                dim=s.openai_dim,
            )
        if s.embedder == "hashing":
            return build_embedder("hashing", dim=self.dim)
        return build_embedder("minilm")

    def embed(self, texts: Any) -> list[list[float]]:
        with self._lock:
            if self._real is None:
                self._real = self._build()
        result: list[list[float]] = self._real.embed(texts)
        return result


def build_store(uri: str, settings: MemorySettings) -> Any:
    """The MemoryStore for ``settings``; the embedding model loads on first use."""
    from runtime.memory_store import MemoryStore

    return MemoryStore(
        uri, _LazyEmbedder(settings), storage_options=settings.storage_options or None
    )


def _plain(value: Any) -> Any:
    """Rows as JSON-able dicts for the callers."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class _Write:
    persona: str
    category: str
    content: str
    importance: int
    future: asyncio.Future[dict[str, Any]]


class MemoryStoreActor:
    """Every persona's memories, knowledge and user model (persona-scoped)."""

    def __init__(self, uri: str, settings: MemorySettings) -> None:
        self.uri = uri
        self.settings = settings
        self._store: Any = None
        self._store_lock: asyncio.Lock | None = None
        self._pending: list[_Write] = []
        self._flusher: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self.writes = 0
        self.batches = 0
        self.optimizations = 0
        self.optimize_errors = 0

    async def _get_store(self) -> Any:
        if self._store is None:
            if self._store_lock is None:
                self._store_lock = asyncio.Lock()
            async with self._store_lock:
                if self._store is None:
                    # Loading the embedding model takes seconds: off the loop.
                    self._store = await asyncio.to_thread(build_store, self.uri, self.settings)
                    self._maintenance = asyncio.create_task(self._maintain())
        return self._store

    async def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        store = await self._get_store()
        return _plain(await asyncio.to_thread(getattr(store, method), *args, **kwargs))

    # -- memories ------------------------------------------------------------

    async def write(
        self, persona: str, *, category: str, content: str, importance: int
    ) -> dict[str, Any]:
        """Write one memory; concurrent writes share one embedding call and commit."""
        await self._get_store()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Write(persona, category, content, importance, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_writes())
        return await future

    async def _flush_writes(self) -> None:
        from runtime.memory_store import MemoryInput

        while self._pending:
            await asyncio.sleep(BATCH_WINDOW)  # let concurrent writes join the batch
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            items = [MemoryInput(w.persona, w.category, w.content, w.importance) for w in batch]
            try:
                rows = await asyncio.to_thread(self._store.write_memories, items)
            except ToolError:
                # One bad item must not fail its neighbours: write them singly.
                for write, item in zip(batch, items, strict=True):
                    try:
                        [row] = await asyncio.to_thread(self._store.write_memories, [item])
                        write.future.set_result(_plain(row))
                    except Exception as exc:
                        write.future.set_exception(exc)
                continue
            except Exception as exc:
                for write in batch:
                    write.future.set_exception(exc)
                continue
            self.writes += len(rows)
            self.batches += 1
            for write, row in zip(batch, rows, strict=True):
                write.future.set_result(_plain(row))

    async def update(
        self,
        persona: str,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> dict[str, Any]:
        row: dict[str, Any] = await self._run(
            "update_memory",
            persona,
            memory_id,
            content=content,
            category=category,
            importance=importance,
        )
        return row

    async def delete(self, persona: str, memory_id: str) -> None:
        await self._run("delete_memory", persona, memory_id)

    async def recall(
        self,
        persona: str,
        *,
        query: str = "",
        source: str = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
        mode: str = "hybrid",
    ) -> list[dict[str, Any]]:
        hits: list[dict[str, Any]] = await self._run(
            "recall",
            persona,
            query=query,
            source=source,
            category=category,
            limit=limit,
            date=date,
            mode=mode,
        )
        return hits

    # -- knowledge and user model ----------------------------------------------

    async def ingest(self, persona: str, *, source: str, text: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._run("ingest", persona, source=source, text=text)
        return result

    async def write_user_model(
        self, persona: str, *, dimension: str, content: str, confidence: int
    ) -> dict[str, Any]:
        row: dict[str, Any] = await self._run(
            "write_user_model",
            persona,
            dimension=dimension,
            content=content,
            confidence=confidence,
        )
        return row

    async def user_model(self, persona: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self._run("user_model", persona)
        return rows

    # -- maintenance -------------------------------------------------------------

    async def _maintain(self) -> None:
        written = 0
        while True:
            await asyncio.sleep(self.settings.optimize_interval)
            if self.writes == written:
                continue
            written = self.writes
            await self.optimize()

    async def optimize(self) -> dict[str, bool]:
        """Compact and fold new rows into the indexes (in a worker thread)."""
        store = await self._get_store()
        try:
            done: dict[str, bool] = await asyncio.to_thread(store.optimize)
        except Exception:
            self.optimize_errors += 1
            log.exception("memory index maintenance failed")
            raise
        self.optimizations += 1
        return done

    async def stats(self) -> dict[str, Any]:
        store = await self._get_store()
        return {
            "pid": os.getpid(),
            "uri": self.uri,
            "embedder": store.embedder.name,
            "rows": await asyncio.to_thread(store.counts),
            "writes": self.writes,
            "write_batches": self.batches,
            "optimizations": self.optimizations,
            "optimize_errors": self.optimize_errors,
        }

    async def ping(self) -> str:
        return self.uri


MemoryStoreActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(
    MemoryStoreActor
)


def get_or_create_memory_store(
    uri: str, settings: MemorySettings, *, name: str, namespace: str, detached: bool
) -> Any:
    """The named MemoryStore actor, created on first use."""
    return MemoryStoreActorRemote.options(  # type: ignore[attr-defined]
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
    ).remote(uri, settings)


__all__ = [
    "MemoryStoreActor",
    "MemoryStoreActorRemote",
    "build_store",
    "get_or_create_memory_store",
]
