"""AuditLog: the one writer of a runtime's audit file, as a plain async class.

What the AuditLog actor runs. Sources (personas) buffer rows with
:class:`~runtime.audit.buffer.AuditBuffer` and call :meth:`AuditLog.append`
once per batch; the log gathers rows in memory and writes them as one Arrow
batch every ``flush_interval`` seconds or every ``flush_rows`` rows. A failed
write keeps its rows, ahead of newer ones; only the timer retries it, so a
broken disk is not hammered once per append.

Rows acknowledged by :meth:`append` but not yet written are lost if the
process dies; ``flush_interval`` bounds that window.

DuckDB calls run in a worker thread, one at a time, so appends keep being
served during a write or a long query.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from runtime.audit.query import QueryResult
from runtime.audit.rows import Row
from runtime.audit.writer import AuditWriter
from runtime.errors import AuditOverloadedError
from runtime.messages import ChatMessage, ConversationRecord

log = logging.getLogger("coterie.audit")

T = TypeVar("T")

#: Conversations remembered as "has chat messages" before the oldest are
#: forgotten (a forgotten one costs one indexed lookup, not a wrong answer).
KNOWN_CONVERSATIONS_CAP = 100_000


class AuditLogStats(BaseModel):
    """Counters of an audit log (see :meth:`AuditLog.stats`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    rows_written: int
    batches_written: int
    rows_rejected: int
    # Replayed rows (resent after a source was killed) that were already written.
    duplicates_skipped: int
    write_errors: int
    pending: int
    last_error: str | None
    # Conversations known to have chat messages (bounded; see AuditLog).
    known_conversations: int


class AuditLog:
    """Gathers audit rows from every persona and writes them to DuckDB.

    ``writer`` serves an already open writer (tests); otherwise one is opened
    on ``path``. Beyond ``max_pending`` unwritten rows :meth:`append` refuses
    more (the sources keep theirs and retry). At most
    ``known_conversations_cap`` conversations are remembered as having
    messages, so that a new conversation's empty history costs no query.
    """

    def __init__(
        self,
        path: str,
        *,
        flush_interval: float = 0.5,
        flush_rows: int = 5000,
        max_pending: int = 1_000_000,
        known_conversations_cap: int = KNOWN_CONVERSATIONS_CAP,
        writer: AuditWriter | None = None,
    ) -> None:
        if flush_interval <= 0 or flush_rows < 1 or max_pending < 1:
            raise ValueError("need flush_interval > 0, flush_rows >= 1, max_pending >= 1")
        self._writer = writer or AuditWriter(path)
        self._flush_interval = flush_interval
        self._flush_rows = flush_rows
        self._max_pending = max_pending
        self._pending: list[Row] = []
        # Replayed rows are written after _pending, so that an earlier copy of
        # one still pending is in ``events`` when they are checked against it.
        self._replayed: list[Row] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._healthy = True
        self._closed = False
        self._rows_written = 0
        self._batches_written = 0
        self._write_errors = 0
        self._last_error: str | None = None
        # Conversations that have chat messages (in the file or on their way):
        # a persona opening a brand-new conversation gets [] at once, without
        # a flush and a scan of the table. Bounded, oldest forgotten first.
        self._conversations: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._conversations_cap = known_conversations_cap
        self._conversations_loaded = False

    @property
    def path(self) -> str:
        return self._writer.path

    @property
    def unwritten(self) -> int:
        return len(self._pending) + len(self._replayed)

    def _ensure_timer(self) -> None:
        # Started lazily: an actor's constructor runs outside its event loop.
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    async def _run_timer(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval)
            if self.unwritten:
                # flush() reports its own failures (logged, counted); it never raises.
                await self.flush()

    async def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    def _remember(self, key: tuple[str, str]) -> None:
        self._conversations[key] = None
        self._conversations.move_to_end(key)
        while len(self._conversations) > self._conversations_cap:
            self._conversations.popitem(last=False)

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
        if self.unwritten + len(rows) > self._max_pending:
            raise AuditOverloadedError(
                f"audit log has {self.unwritten} unwritten rows "
                f"(max_pending={self._max_pending}; last error: {self._last_error})"
            )
        self._ensure_timer()
        (self._replayed if replayed else self._pending).extend(rows)
        for row in rows:
            if row.get("kind") == "chat_message":
                self._remember((row["persona"], row["conversation_id"]))
        if self.unwritten >= self._flush_rows and self._healthy:
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
        except Exception as exc:  # kept for the next try, logged and counted
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
        if self.unwritten:
            log.warning("audit query runs with %d unwritten row(s)", self.unwritten)
        return await asyncio.shield(self._locked(self._writer.query, sql))

    async def history(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """The conversation's messages rebuilt from the log, oldest first."""
        return (await self.conversation(persona, conversation_id)).messages

    async def conversation(self, persona: str, conversation_id: str) -> ConversationRecord:
        """The conversation rebuilt from the log: messages and latest todo list."""
        if not self._conversations_loaded:
            known = await asyncio.shield(
                self._locked(
                    self._writer.query,
                    "select distinct persona, conversation_id from events "
                    "where kind = 'chat_message'",
                )
            )
            for p, c in known.rows:
                self._remember((str(p), str(c)))
            self._conversations_loaded = True
        key = (persona, conversation_id)
        if key not in self._conversations and len(self._conversations) < self._conversations_cap:
            # Under the cap the set is complete: a conversation not in it is new.
            return ConversationRecord()
        await self.flush()
        return await asyncio.shield(
            self._locked(self._writer.conversation, persona, conversation_id)
        )

    async def stats(self) -> AuditLogStats:
        """Counters: rows and batches written, rejected rows, write errors, pending."""
        return AuditLogStats(
            path=self._writer.path,
            rows_written=self._rows_written,
            batches_written=self._batches_written,
            rows_rejected=self._writer.rows_rejected,
            duplicates_skipped=self._writer.duplicates_skipped,
            write_errors=self._write_errors,
            pending=self.unwritten,
            last_error=self._last_error,
            known_conversations=len(self._conversations),
        )

    async def ping(self) -> str:
        return self._writer.path

    async def shutdown(self) -> AuditLogStats:
        """Stop the timer, write pending rows and close the file.

        Rows that still cannot be written are logged as an error and reported
        in the returned stats (``pending``). A second call only reports.
        """
        if self._closed:
            return await self.stats()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.wait({self._timer})
            self._timer = None
        await self.flush()
        stats = await self.stats()
        if self.unwritten:
            log.error(
                "audit log shut down with %d unwritten row(s): %s",
                self.unwritten,
                self._last_error,
            )
        async with self._lock:
            self._writer.close()
        return stats


__all__ = ["KNOWN_CONVERSATIONS_CAP", "AuditLog", "AuditLogStats"]
