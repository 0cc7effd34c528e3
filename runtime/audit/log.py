"""AuditLog: the one writer of a runtime's audit file, as a plain async class.

What the AuditLog actor runs. Sources (personas) buffer rows with
:class:`~runtime.audit.buffer.AuditBuffer` and call :meth:`AuditLog.append`
once per batch.

**An append is acknowledged only once its rows are committed** to DuckDB
(group commit: rows arriving within ``flush_interval`` of each other, or
while a write is under way, share one Arrow batch and one transaction). So a
source drops a row from its spool only when the row is in the file: if this
process dies, every row it held unwritten is still held by its source, which
sends it again; rows sent again are written once (duplicates are skipped by
``id``). A failed write keeps its rows, ahead of newer ones, and is retried
with backoff; an append not committed within ``ack_timeout`` raises
:class:`~runtime.errors.AuditOverloadedError` — the source keeps its rows and
sends them again later, and whichever copy is written first counts.

DuckDB calls run in a worker thread, one at a time, so appends keep being
served during a write or a long query.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from coterie.runtime.audit.query import QueryResult
from coterie.runtime.audit.rows import Row
from coterie.runtime.audit.writer import AuditWriter
from coterie.runtime.errors import AuditOverloadedError
from coterie.runtime.messages import (
    ApprovalEvent,
    ChatMessage,
    ConversationRecord,
    DelegationEvent,
)

log = logging.getLogger("coterie.audit")

T = TypeVar("T")

#: Conversations remembered as "has chat messages" before the oldest are
#: forgotten (a forgotten one costs one indexed lookup, not a wrong answer).
KNOWN_CONVERSATIONS_CAP = 100_000
#: Longest pause between retries of a failing write.
MAX_BACKOFF = 5.0


@dataclass
class _Queue:
    """Rows waiting to be written, and the appends waiting for them."""

    rows: list[Row] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def take(self) -> _Queue:
        taken = _Queue(self.rows, self.waiters)
        self.rows, self.waiters = [], []
        return taken

    def put_back(self, taken: _Queue) -> None:
        self.rows[:0] = taken.rows
        self.waiters[:0] = taken.waiters


class AuditLogStats(BaseModel):
    """Counters of an audit log (see :meth:`AuditLog.stats`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
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
        flush_interval: float = 0.05,
        flush_rows: int = 5000,
        max_pending: int = 1_000_000,
        ack_timeout: float = 30.0,
        known_conversations_cap: int = KNOWN_CONVERSATIONS_CAP,
        writer: AuditWriter | None = None,
    ) -> None:
        if flush_interval <= 0 or flush_rows < 1 or max_pending < 1 or ack_timeout <= 0:
            raise ValueError(
                "need flush_interval > 0, flush_rows >= 1, max_pending >= 1, ack_timeout > 0"
            )
        self._writer = writer or AuditWriter(path)
        self._flush_interval = flush_interval
        self._flush_rows = flush_rows
        self._max_pending = max_pending
        self._ack_timeout = ack_timeout
        self._pending = _Queue()
        # Replayed rows are written after _pending, so that an earlier copy of
        # one still pending is in ``events`` when they are checked against it.
        self._replayed = _Queue()
        self._lock = asyncio.Lock()
        self._committer: asyncio.Task[None] | None = None
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
        return len(self._pending.rows) + len(self._replayed.rows)

    def _ensure_committer(self) -> None:
        # Started on demand: an actor's constructor runs outside its event loop.
        if self._committer is None or self._committer.done():
            self._committer = asyncio.get_running_loop().create_task(self._commit_loop())

    async def _commit_loop(self) -> None:
        """Write what is waiting: soon after it arrives, later after a failure."""
        delay = self._flush_interval
        while self.unwritten and not self._closed:
            await asyncio.sleep(delay)
            # flush() reports its own failures (logged, counted); it never raises.
            await self.flush()
            delay = self._flush_interval if self._healthy else min(max(delay, 0.1) * 2, MAX_BACKOFF)

    async def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    def _remember(self, key: tuple[str, str]) -> None:
        self._conversations[key] = None
        self._conversations.move_to_end(key)
        while len(self._conversations) > self._conversations_cap:
            self._conversations.popitem(last=False)

    async def append(self, rows: list[Row], *, replayed: bool = False) -> int:
        """Write rows; returns how many were taken, once they are committed.

        ``replayed`` rows are sent again by a source (restarted from its spool,
        or retrying a send that failed) and may be in the file already: those
        are skipped (by ``id``).

        Raises :class:`AuditOverloadedError` when more than ``max_pending``
        rows are waiting, or when these were not committed within
        ``ack_timeout`` (they stay queued and are written when the cause goes;
        the caller keeps its copy and sends it again, and the duplicate is
        skipped). Either way the caller must not drop its rows.
        """
        if self._closed:
            raise RuntimeError("audit log is shut down")
        if self.unwritten + len(rows) > self._max_pending:
            raise AuditOverloadedError(
                f"audit log has {self.unwritten} unwritten rows "
                f"(max_pending={self._max_pending}; last error: {self._last_error})"
            )
        if not rows:
            return 0
        queue = self._replayed if replayed else self._pending
        committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.rows.extend(rows)
        queue.waiters.append(committed)
        for row in rows:
            if row.get("kind") == "chat_message":
                self._remember((row["persona"], row["conversation_id"]))
        if self._healthy and self.unwritten >= self._flush_rows:
            await self.flush()  # a full batch goes at once
        else:
            self._ensure_committer()
        try:
            await asyncio.wait_for(asyncio.shield(committed), self._ack_timeout)
        except TimeoutError:
            raise AuditOverloadedError(
                f"audit rows not committed within {self._ack_timeout:g} s "
                f"(last error: {self._last_error}); they stay queued"
            ) from None
        return len(rows)

    async def flush(self) -> int:
        """Write all waiting rows now; returns how many were written.

        Replayed rows follow as a second batch. A failed write is logged and
        counted (see :meth:`stats`); its rows stay, ahead of newer ones, for
        the next try, and their appends keep waiting.
        """
        # Shielded: a write in its thread cannot be stopped, so a cancelled caller
        # must not release the lock or skip the bookkeeping of the batch.
        return await asyncio.shield(self._flush())

    async def _flush(self) -> int:
        async with self._lock:
            written = await self._write(self._pending, replayed=False)
            # Not before every earlier row is written: one of them may be the
            # first copy of a replayed row.
            if written is not None:
                replayed = await self._write(self._replayed, replayed=True)
                written += replayed or 0
            return written or 0

    async def _write(self, queue: _Queue, *, replayed: bool) -> int | None:
        """Write a queue's rows and release its appends; None if that failed."""
        if not queue.rows:
            return 0
        batch = queue.take()
        try:
            written = await asyncio.to_thread(
                self._writer.write_rows, batch.rows, replayed=replayed
            )
        except Exception as exc:  # kept for the next try, logged and counted
            queue.put_back(batch)
            self._healthy = False
            self._write_errors += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            log.error(
                "audit log write of %d row(s) failed, keeping them for the next try: %s",
                len(batch.rows),
                self._last_error,
            )
            return None
        self._healthy = True
        self._rows_written += written
        self._batches_written += 1
        for waiter in batch.waiters:
            if not waiter.done():
                waiter.set_result(None)
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
        return (await self.conversations(persona, [conversation_id]))[0]

    async def conversations(
        self, persona: str, conversation_ids: list[str]
    ) -> list[ConversationRecord]:
        """Several of ``persona``'s conversations rebuilt from the log, in the
        order asked (empty for one the log has never seen): the loads a
        persona has waiting at once, in one call (``ConversationLoader``)."""
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
        # Under the cap the set is complete: a conversation not in it is new.
        complete = len(self._conversations) < self._conversations_cap
        wanted = [
            c
            for c in dict.fromkeys(conversation_ids)
            if not complete or (persona, c) in self._conversations
        ]
        records: dict[str, ConversationRecord] = {}
        if wanted:
            await self.flush()
        for c in wanted:
            records[c] = await asyncio.shield(self._locked(self._writer.conversation, persona, c))
        return [records[c] if c in records else ConversationRecord() for c in conversation_ids]

    async def unfinished_delegations(self, persona: str) -> list[DelegationEvent]:
        """``persona``'s delegations started and never finished (pending rows written first)."""
        await self.flush()
        return await asyncio.shield(self._locked(self._writer.unfinished_delegations, persona))

    async def pending_approvals(self, persona: str) -> list[ApprovalEvent]:
        """``persona``'s approvals requested and never decided (pending rows written first)."""
        await self.flush()
        return await asyncio.shield(self._locked(self._writer.pending_approvals, persona))

    async def stats(self) -> AuditLogStats:
        """Counters: rows and batches written, rejected rows, write errors, pending."""
        return AuditLogStats(
            pid=os.getpid(),
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
        """Write what is waiting and close the file.

        Rows that still cannot be written are logged as an error and reported
        in the returned stats (``pending``); their appends fail, so their
        sources keep them. A second call only reports.
        """
        if self._closed:
            return await self.stats()
        await self.flush()
        self._closed = True
        if self._committer is not None:
            self._committer.cancel()
            await asyncio.gather(self._committer, return_exceptions=True)
            self._committer = None
        stats = await self.stats()
        if self.unwritten:
            log.error(
                "audit log shut down with %d unwritten row(s): %s",
                self.unwritten,
                self._last_error,
            )
        for queue in (self._pending, self._replayed):
            for waiter in queue.take().waiters:
                if not waiter.done():
                    waiter.set_exception(RuntimeError("audit log is shut down"))
        async with self._lock:
            self._writer.close()
        return stats


__all__ = ["KNOWN_CONVERSATIONS_CAP", "AuditLog", "AuditLogStats"]
