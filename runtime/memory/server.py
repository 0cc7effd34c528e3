"""MemoryServer: one owner of the memory store for every persona.

What the MemoryStore actor runs (and what an in-process runtime can run
itself): the store is opened on first use, off the event loop; memory writes
arriving close together are coalesced into one batch (one embedding call,
one table write); index maintenance runs on a timer in a worker thread and
never blocks queries. Every call names its persona; :class:`MemoryClient`
binds one.

The embedder is chosen when the store opens (:func:`open_store`, from
``memory.embedder`` and what the store already holds), said once in the log,
and reported by :meth:`MemoryServer.embedder_choice`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coterie.runtime.config import MemorySettings
from coterie.runtime.errors import ToolError
from coterie.runtime.memory.records import (
    IngestResult,
    MemoryInput,
    MemoryRow,
    MemoryStats,
    Mode,
    RecallHit,
    Source,
    UserModelRow,
)
from coterie.runtime.metrics import Meter

if TYPE_CHECKING:
    from coterie.runtime.memory._lance import recorded_embedder
    from coterie.runtime.memory.choice import EmbedderChoice
    from coterie.runtime.memory.store import MemoryStore

log = logging.getLogger("coterie.memory")

#: How long a write waits for others to join its batch.
BATCH_WINDOW = 0.005
#: Most memories written by one embedding call and one commit.
MAX_BATCH = 256


@dataclass
class _Write:
    item: MemoryInput
    future: asyncio.Future[MemoryRow]


def _settle(
    future: asyncio.Future[MemoryRow],
    row: MemoryRow | None = None,
    *,
    error: BaseException | None = None,
) -> None:
    """Hand a write's outcome to its caller, unless the caller stopped waiting
    (its future is cancelled: setting it would raise and stop the batch)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert row is not None
        future.set_result(row)


def open_store(uri: str, settings: MemorySettings) -> MemoryStore:
    """The store of ``settings`` at ``uri``; its embedder loads on first use."""
    return open_store_with_choice(uri, settings)[0]


def open_store_with_choice(
    uri: str, settings: MemorySettings
) -> tuple[MemoryStore, EmbedderChoice]:
    """The store at ``uri`` and the embedder chosen for it (logged once here).

    Raises :class:`~runtime.errors.ConfigError` when the settings ask for an
    embedder that is not installed.
    """
    from coterie.runtime.memory._lance import recorded_embedder
    from coterie.runtime.memory.choice import choose_embedder, embedder_for
    from coterie.runtime.memory.store import MemoryStore

    storage_options = settings.storage_options or None
    recorded = recorded_embedder(uri, storage_options=storage_options)
    choice = choose_embedder(settings, recorded=recorded)
    # Falling back to full text is worth a warning (shown without logging
    # set up); any other choice is said at INFO.
    degraded = choice.kind == "none" and choice.configured == "auto"
    log.log(
        logging.WARNING if degraded else logging.INFO, "memory at %s: %s", uri, choice.describe()
    )
    embedder = embedder_for(choice, settings, recorded=recorded)
    return MemoryStore(uri, embedder, storage_options=storage_options), choice


class MemoryServer:
    """Every persona's memories, knowledge and user model (persona-scoped).

    ``store`` serves an already open store (tests, scripts); otherwise one is
    opened at ``uri`` on first use. Maintenance runs every
    ``settings.optimize_interval`` seconds once something was written.
    """

    def __init__(
        self,
        uri: str,
        settings: MemorySettings | None = None,
        *,
        store: MemoryStore | None = None,
        batch_window: float = BATCH_WINDOW,
        max_batch: int = MAX_BATCH,
        meter: Meter | None = None,
    ) -> None:
        if max_batch < 1 or batch_window < 0:
            raise ValueError("need max_batch >= 1 and batch_window >= 0")
        self.uri = uri
        self.settings = settings or MemorySettings()
        self._store = store
        self._choice: EmbedderChoice | None = None
        self._store_lock: asyncio.Lock | None = None
        self._batch_window = batch_window
        self._max_batch = max_batch
        self._pending: list[_Write] = []
        self._flusher: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._closed = False
        self.writes = 0
        self.batches = 0
        self.optimizations = 0
        self.optimize_errors = 0
        #: Where each operation is counted and timed (the actor's: Ray metrics).
        self.meter = meter or Meter()

    @classmethod
    def serving(cls, store: MemoryStore, settings: MemorySettings | None = None) -> MemoryServer:
        """A server over an open store."""
        return cls(store.uri, settings, store=store)

    async def _get_store(self) -> MemoryStore:
        if self._closed:
            raise RuntimeError("memory server is closed")
        if self._store is None:
            if self._store_lock is None:
                self._store_lock = asyncio.Lock()
            async with self._store_lock:
                if self._store is None:
                    # Opening a store reads its tables' schema: off the loop.
                    store, self._choice = await asyncio.to_thread(
                        open_store_with_choice, self.uri, self.settings
                    )
                    self._store = store
        if self._maintenance is None:
            self._maintenance = asyncio.get_running_loop().create_task(self._maintain())
        return self._store

    async def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._measured(method):
            store = await self._get_store()
            return await asyncio.to_thread(getattr(store, method), *args, **kwargs)

    @contextlib.contextmanager
    def _measured(self, operation: str) -> Iterator[None]:
        """Count ``operation`` and time it on :attr:`meter` (ok, or error if it raised)."""
        started = time.perf_counter()
        outcome = "error"
        try:
            yield
            outcome = "ok"
        finally:
            self.meter.count(
                "coterie_memory_operations", 1, {"operation": operation, "outcome": outcome}
            )
            self.meter.observe(
                "coterie_memory_duration_ms",
                (time.perf_counter() - started) * 1000,
                {"operation": operation},
            )

    # -- memories ------------------------------------------------------------

    async def write(
        self, persona: str, *, category: str, content: str, importance: int
    ) -> MemoryRow:
        """Write one memory; concurrent writes share one embedding call and commit."""
        with self._measured("write_memory"):
            await self._get_store()
            future: asyncio.Future[MemoryRow] = asyncio.get_running_loop().create_future()
            item = MemoryInput(persona, category, content, importance)
            self._pending.append(_Write(item, future))
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush_writes())
            return await future

    async def _flush_writes(self) -> None:
        store = await self._get_store()
        while self._pending:
            await asyncio.sleep(self._batch_window)  # let concurrent writes join the batch
            # A caller that stopped waiting before its batch began is not written.
            waiting = [w for w in self._pending if not w.future.done()]
            batch, self._pending = waiting[: self._max_batch], waiting[self._max_batch :]
            if not batch:
                continue
            try:
                rows = await asyncio.to_thread(store.write_memories, [w.item for w in batch])
            except ToolError:
                # One bad item must not fail its neighbours: write them singly.
                for write in batch:
                    await self._write_one(store, write)
                continue
            except Exception as exc:  # every waiter hears of it; nothing is lost silently
                for write in batch:
                    _settle(write.future, error=exc)
                continue
            self.writes += len(rows)
            self.batches += 1
            for write, row in zip(batch, rows, strict=True):
                _settle(write.future, row)

    async def _write_one(self, store: MemoryStore, write: _Write) -> None:
        try:
            [row] = await asyncio.to_thread(store.write_memories, [write.item])
        except Exception as exc:  # handed to the one caller this write belongs to
            _settle(write.future, error=exc)
            return
        self.writes += 1
        self.batches += 1
        _settle(write.future, row)

    async def update(
        self,
        persona: str,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> MemoryRow:
        row: MemoryRow = await self._run(
            "update_memory",
            persona,
            memory_id,
            content=content,
            category=category,
            importance=importance,
        )
        self.writes += 1
        return row

    async def delete(self, persona: str, memory_id: str) -> None:
        await self._run("delete_memory", persona, memory_id)
        self.writes += 1

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
    ) -> list[RecallHit]:
        hits: list[RecallHit] = await self._run(
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

    async def ingest(self, persona: str, *, source: str, text: str) -> IngestResult:
        result: IngestResult = await self._run("ingest", persona, source=source, text=text)
        self.writes += 1
        return result

    async def write_user_model(
        self, persona: str, *, dimension: str, content: str, confidence: int
    ) -> UserModelRow:
        row: UserModelRow = await self._run(
            "write_user_model",
            persona,
            dimension=dimension,
            content=content,
            confidence=confidence,
        )
        self.writes += 1
        return row

    async def user_model(self, persona: str) -> list[UserModelRow]:
        rows: list[UserModelRow] = await self._run("user_model", persona)
        return rows

    # -- maintenance -------------------------------------------------------------

    async def _maintain(self) -> None:
        written = 0
        while True:
            await asyncio.sleep(self.settings.optimize_interval)
            if self.writes == written:
                continue
            written = self.writes
            try:
                await self.optimize()
            except Exception:  # logged and counted by optimize(); the next run tries again
                continue

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

    async def embedder_choice(self) -> EmbedderChoice:
        """The embedder this server's store runs with, and why (opens the store)."""
        store = await self._get_store()
        if self._choice is None:  # served an open store: it came with its embedder
            from coterie.runtime.memory.choice import EmbedderChoice

            self._choice = EmbedderChoice.of(store.embedder, configured=self.settings.embedder)
        return self._choice

    async def stats(self) -> MemoryStats:
        store = await self._get_store()
        return MemoryStats(
            pid=os.getpid(),
            uri=self.uri,
            embedder=(await self.embedder_choice()).name,
            rows=await asyncio.to_thread(store.counts),
            writes=self.writes,
            write_batches=self.batches,
            optimizations=self.optimizations,
            optimize_errors=self.optimize_errors,
        )

    async def ping(self) -> str:
        return self.uri

    async def aclose(self) -> None:
        """Stop maintenance; writes already queued are still written."""
        if self._flusher is not None and not self._flusher.done():
            await self._flusher
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
            self._maintenance = None


def __getattr__(name: str) -> Any:
    # Re-exported, loaded on first use: a process that only holds a handle to
    # the MemoryStore actor (every persona: Ray loads the actor's class to make
    # it) loads neither the store, the embedders nor their choice.
    if name == "recorded_embedder":
        return importlib.import_module("coterie.runtime.memory._lance").recorded_embedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BATCH_WINDOW",
    "MAX_BATCH",
    "MemoryServer",
    "open_store",
    "open_store_with_choice",
    "recorded_embedder",
]
