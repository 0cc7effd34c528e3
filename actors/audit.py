"""AuditLogActor: the one writer of a runtime's DuckDB audit file.

A thin Ray shell over :class:`runtime.audit.AuditWriter`. Sources (personas)
buffer with :class:`runtime.audit.AuditBuffer` and call :meth:`append` once per
batch; the actor gathers rows in memory and writes them as one Arrow batch
every ``flush_interval`` seconds or every ``flush_rows`` rows.

Rows acknowledged by ``append`` but not yet written are lost if the actor
process dies; ``flush_interval`` bounds that window.

A persona killed mid-turn loses nothing if its buffer has a spool
(:func:`audit_buffer_for` with ``spool_path``): its restarted self resends the
rows left there with ``append(rows, replayed=True)``, and rows of such batches
already written are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import ray

from actors.audit_client import audit_buffer_for
from runtime.audit import AuditLogStats, AuditWriter, QueryResult
from runtime.audit_buffer import AuditOverloadedError, Row
from runtime.messages import ChatMessage

log = logging.getLogger("coterie.audit")

T = TypeVar("T")


class AuditLogActor:
    """Gathers audit rows from every persona and writes them to DuckDB."""

    def __init__(
        self,
        path: str,
        *,
        flush_interval: float = 0.5,
        flush_rows: int = 5000,
        max_pending: int = 1_000_000,
    ) -> None:
        self._writer = AuditWriter(path)
        self._flush_interval = flush_interval
        self._flush_rows = flush_rows
        # Beyond this, append() refuses rows; sources keep and retry them.
        self._max_pending = max_pending
        self._pending: list[Row] = []
        # Replayed rows are written after _pending, so that an earlier copy of
        # one still pending is in ``events`` when they are checked against it.
        self._replayed: list[Row] = []
        # One DuckDB operation at a time; they run in a thread so that append()
        # calls keep being served during a write or a long query.
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        # After a failed write only the timer retries, not every append.
        self._healthy = True
        self._closed = False
        self._rows_written = 0
        self._batches_written = 0
        self._write_errors = 0
        self._last_error: str | None = None
        # Conversations that have chat messages (in the file or on their way):
        # a persona opening a brand-new conversation gets [] at once, without
        # a flush and a scan of the table.
        self._conversations: set[tuple[str, str]] = set()
        self._conversations_loaded = False

    def _ensure_timer(self) -> None:
        # Started lazily: Ray runs __init__ outside the actor's event loop.
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    async def _run_timer(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval)
            if self._unwritten:
                try:
                    await self.flush()
                except Exception:
                    log.exception("audit log timer flush crashed")

    async def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    @property
    def _unwritten(self) -> int:
        return len(self._pending) + len(self._replayed)

    async def append(self, rows: list[Row], *, replayed: bool = False) -> int:
        """Accept rows for the next write; returns how many were accepted.

        ``replayed`` rows are resent by a source (restarted from its spool, or
        retrying a failed send) and may have been written already: those are
        skipped (by ``id``) when written.

        Raises :class:`AuditOverloadedError` (the caller keeps its rows and
        retries) when more than ``max_pending`` rows are waiting to be written.
        """
        if self._closed:
            raise RuntimeError("audit log is shut down")
        if self._unwritten + len(rows) > self._max_pending:
            raise AuditOverloadedError(
                f"audit log has {self._unwritten} unwritten rows "
                f"(max_pending={self._max_pending}; last error: {self._last_error})"
            )
        self._ensure_timer()
        (self._replayed if replayed else self._pending).extend(rows)
        self._conversations.update(
            (row["persona"], row["conversation_id"])
            for row in rows
            if row.get("kind") == "chat_message"
        )
        if self._unwritten >= self._flush_rows and self._healthy:
            await self.flush()
        return len(rows)

    async def flush(self) -> int:
        """Write all pending rows as one batch; returns how many were written.

        Replayed rows follow as a second batch. A failed write is logged and
        counted (see :meth:`stats`); its rows stay pending, ahead of newer ones,
        for the next flush.
        """
        # Shielded: a write in its thread cannot be stopped, so a cancelled caller
        # must not release the lock or skip the bookkeeping of the batch.
        return await asyncio.shield(self._flush())

    async def _flush(self) -> int:
        async with self._lock:
            written = await self._write(replayed=False)
            # Not before every earlier row is written: one of them may be the
            # first copy of a replayed row.
            if written is not None:
                replayed = await self._write(replayed=True)
                written += replayed or 0
            return written or 0

    async def _write(self, *, replayed: bool) -> int | None:
        """Write the pending (or replayed) rows; None if that failed."""
        batch = self._replayed if replayed else self._pending
        if not batch:
            return 0
        if replayed:
            self._replayed = []
        else:
            self._pending = []
        try:
            written = await asyncio.to_thread(self._writer.write_rows, batch, replayed=replayed)
        except Exception as exc:
            (self._replayed if replayed else self._pending)[:0] = batch
            self._healthy = False
            self._write_errors += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            log.error(
                "audit log write of %d row(s) failed, keeping them for the next try: %s",
                len(batch),
                self._last_error,
            )
            return None
        self._healthy = True
        self._rows_written += written
        self._batches_written += 1
        return written

    async def query(self, sql: str) -> QueryResult:
        """Run a read-only query after writing pending rows (raises AuditQueryError)."""
        await self.flush()
        if self._unwritten:
            log.warning("audit query runs with %d unwritten row(s)", self._unwritten)
        return await asyncio.shield(self._locked(self._writer.query, sql))

    async def history(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """The conversation's messages rebuilt from the log, oldest first."""
        if not self._conversations_loaded:
            known = await asyncio.shield(
                self._locked(
                    self._writer.query,
                    "select distinct persona, conversation_id from events "
                    "where kind = 'chat_message'",
                )
            )
            self._conversations.update((str(p), str(c)) for p, c in known.rows)
            self._conversations_loaded = True
        if (persona, conversation_id) not in self._conversations:
            return []
        await self.flush()
        return await asyncio.shield(self._locked(self._writer.history, persona, conversation_id))

    async def stats(self) -> AuditLogStats:
        """Counters: rows and batches written, rejected rows, write errors, pending."""
        return AuditLogStats(
            path=self._writer.path,
            rows_written=self._rows_written,
            batches_written=self._batches_written,
            rows_rejected=self._writer.rows_rejected,
            duplicates_skipped=self._writer.duplicates_skipped,
            write_errors=self._write_errors,
            pending=self._unwritten,
            last_error=self._last_error,
        )

    async def shutdown(self) -> AuditLogStats:
        """Stop the timer, write pending rows and close the file.

        Rows that still cannot be written are logged as an error and reported
        in the returned stats (``pending``).
        """
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.wait({self._timer})
            self._timer = None
        await self.flush()
        stats = await self.stats()
        if self._unwritten:
            log.error(
                "audit log shut down with %d unwritten row(s): %s",
                self._unwritten,
                self._last_error,
            )
        async with self._lock:
            self._writer.close()
        return stats


AuditLogActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(AuditLogActor)


def get_or_create_audit_log(
    path: str,
    *,
    name: str = "coterie:audit",
    namespace: str | None = None,
    detached: bool = False,
    flush_interval: float = 0.5,
    flush_rows: int = 5000,
) -> Any:
    """The named audit log actor, created on first use.

    An existing actor of that name is returned as is, whatever its ``path``
    (check ``stats()["path"]`` if that matters).
    """
    return AuditLogActorRemote.options(  # type: ignore[attr-defined]
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        num_cpus=0,
    ).remote(path, flush_interval=flush_interval, flush_rows=flush_rows)


__all__ = [
    "AuditLogActor",
    "AuditLogActorRemote",
    "audit_buffer_for",
    "get_or_create_audit_log",
]
