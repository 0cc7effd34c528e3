"""A persona's reads of its own conversations from the audit log.

A conversation the persona process does not hold (a new one, or one from
before a restart or passivation) is looked up in the log before its first
turn. That was a flush of the persona's audit buffer and then a read: two
actor calls per new conversation, and the flush waited for the log's next
commit (~60 ms here) because the row of the message that had just come in
was always among those waiting. :class:`ConversationLoader` flushes only when
the buffer holds a row the conversation is rebuilt from, and makes one read
of all the lookups that wait at the same time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from coterie.runtime.audit.buffer import AuditBuffer
from coterie.runtime.errors import CoterieError
from coterie.runtime.messages import ConversationRecord

__all__ = ["MAX_BATCH", "ConversationLoader", "Fetch"]

#: What one read may ask for at most.
MAX_BATCH = 64

#: Reads conversations by id; its answer has one record per id, in order.
Fetch = Callable[[list[str]], Awaitable[list[ConversationRecord]]]


class ConversationLoader:
    """Loads one persona's conversations from the audit log, coalescing reads.

    ``fetch`` reads several conversations in one call
    (``AuditLog.conversations`` for this persona). The first :meth:`load`
    sends its read at once; loads that come while a read is under way wait
    for it to end and then go together in the next, up to ``max_batch``
    ids each. A read that fails fails every load it carried, with its error;
    a later load reads again.

    Before a read, ``buffer`` (the persona's own) is flushed if it holds a
    row the conversation is rebuilt from (``AuditBuffer.holds_history``), so
    that the log has everything the persona recorded of it: a conversation
    dropped from memory while its messages were still on their way, or rows
    replayed from the spool after a restart. A new conversation needs no
    flush: its only rows so far are of the message that opens it.
    """

    def __init__(self, fetch: Fetch, buffer: AuditBuffer, *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("need max_batch >= 1")
        self._fetch = fetch
        self._buffer = buffer
        self._max_batch = max_batch
        self._waiting: list[tuple[str, asyncio.Future[ConversationRecord]]] = []
        self._reader: asyncio.Task[None] | None = None
        self._reads = 0

    @property
    def reads(self) -> int:
        """Reads sent so far (each for up to ``max_batch`` conversations)."""
        return self._reads

    async def load(self, conversation_id: str) -> ConversationRecord:
        """The conversation as the log holds it (empty if it is new)."""
        if self._buffer.holds_history(conversation_id):
            await self._buffer.flush()
        future: asyncio.Future[ConversationRecord] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._waiting.append((conversation_id, future))
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="coterie-conversation-reads")
        # Shielded: a cancelled turn leaves the read to the others it carries.
        return await asyncio.shield(future)

    async def _read(self) -> None:
        while self._waiting:
            batch, self._waiting = (
                self._waiting[: self._max_batch],
                self._waiting[self._max_batch :],
            )
            ids = [conversation_id for conversation_id, _ in batch]
            self._reads += 1
            try:
                records = await self._fetch(ids)
                if len(records) != len(ids):
                    raise CoterieError(
                        f"the audit log answered {len(records)} conversation(s) "
                        f"for {len(ids)} asked"
                    )
            except asyncio.CancelledError:
                # The process is going: no load is left waiting for ever.
                for _, future in [*batch, *self._waiting]:
                    future.cancel()
                self._waiting = []
                raise
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), record in zip(batch, records, strict=True):
                if not future.done():
                    future.set_result(record)


def _retrieve(future: asyncio.Future[ConversationRecord]) -> None:
    # A load whose turn was cancelled no longer awaits its read's error.
    if not future.cancelled():
        future.exception()
