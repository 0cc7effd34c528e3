"""The source side of the audit log: events to rows, and the batching buffer.

Kept apart from :mod:`runtime.audit` (the DuckDB writer) so that persona
processes, which only record events, never import DuckDB or Arrow.

With a spool file the buffer also survives its process being killed: every
recorded row is appended to the spool first, and a buffer created on the same
spool later sends what was left there before anything new (see
:class:`AuditBuffer`).
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import io
import itertools
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runtime.errors import CoterieError
from runtime.messages import (
    HistoryAppended,
    ModelCalled,
    ToolCalled,
    ToolFinished,
    ToolResultMessage,
    TurnEnded,
    TurnEvent,
    turn_event_adapter,
)

log = logging.getLogger("coterie.audit")

Row = dict[str, Any]
# Ships one batch of rows to the audit log (e.g. ``AuditLogActor.append``).
Send = Callable[[list[Row]], Awaitable[object]]

# The columns of the ``events`` table, in order (runtime.audit holds the types).
EVENT_COLUMNS: tuple[str, ...] = (
    "id",
    "seq",
    "ts",
    "kind",
    "persona",
    "conversation_id",
    "turn_id",
    "provider",
    "model",
    "tool",
    "call_id",
    "input_tokens",
    "output_tokens",
    "latency_ms",
    "duration_ms",
    "error_kind",
    "status",
    "payload",
)

# Orders events of one process that share a timestamp; ``ts`` orders the rest.
_seq = itertools.count(1)


def event_to_row(event: TurnEvent) -> Row:
    """Flatten a turn event into a row of the ``events`` table.

    Columns that do not apply to the event's kind are ``None``; ``payload``
    holds the whole event as JSON, so nothing is lost by flattening.
    """
    return _event_row(
        event, str(uuid.uuid4()), next(_seq), turn_event_adapter.dump_json(event).decode()
    )


def _event_row(event: TurnEvent, row_id: str, seq: int, payload: str) -> Row:
    """The row of ``event``; ``payload`` is its JSON (the spool replays it verbatim)."""
    row: Row = dict.fromkeys(EVENT_COLUMNS)
    row["id"] = row_id
    row["seq"] = seq
    row["ts"] = datetime.fromtimestamp(event.ts, UTC)
    row["kind"] = event.kind
    row["persona"] = event.persona
    row["conversation_id"] = event.conversation_id
    row["turn_id"] = event.turn_id
    row["payload"] = payload
    if isinstance(event, ModelCalled):
        row["provider"] = event.provider
        row["model"] = event.model
        row["input_tokens"] = event.input_tokens
        row["output_tokens"] = event.output_tokens
        row["latency_ms"] = event.latency_ms
        if event.error is not None:
            row["error_kind"] = "model_error"
    elif isinstance(event, ToolCalled):
        row["tool"] = event.tool
        row["call_id"] = event.call_id
    elif isinstance(event, ToolFinished):
        row["tool"] = event.tool
        row["call_id"] = event.call_id
        row["duration_ms"] = event.duration_ms
        row["error_kind"] = event.error_kind
    elif isinstance(event, TurnEnded):
        row["status"] = event.status
        row["duration_ms"] = event.duration_ms
        if event.error is not None or event.status in ("failed", "error"):
            row["error_kind"] = "turn_error"
    elif isinstance(event, HistoryAppended) and isinstance(event.message, ToolResultMessage):
        # Only the join key: tool and error_kind stay on the tool_result event so
        # that aggregations over those columns do not count a tool call twice.
        row["call_id"] = event.message.call_id
    return row


# --------------------------------------------------------------------------
# Source-side buffer
# --------------------------------------------------------------------------


class AuditOverloadedError(CoterieError):
    """The audit log holds too many unwritten rows to accept more right now."""


_MAX_BACKOFF = 5.0
_DROP_LOG_INTERVAL = 5.0


class AuditBuffer:
    """Buffers a persona's audit rows and sends them in batches.

    ``send`` is an async callable taking a list of rows (e.g. a call to
    ``AuditLogActor.append``). Rows are sent in recording order. A batch whose
    send raised goes back to the front of the buffer and is retried by the next
    flush (at least once: a receiver that failed after taking it sees it again).
    Only when more than ``max_pending`` rows are waiting are the oldest dropped,
    and that is counted in :attr:`dropped` and logged as an error.
    """

    def __init__(
        self,
        send: Callable[[list[Row]], Awaitable[object]],
        *,
        max_events: int = 500,
        interval: float = 0.2,
        max_pending: int = 100_000,
    ) -> None:
        if max_events < 1 or max_pending < max_events or interval <= 0:
            raise ValueError("need max_events >= 1, max_pending >= max_events, interval > 0")
        self._send = send
        self._max_events = max_events
        self._interval = interval
        self._max_pending = max_pending
        self._rows: collections.deque[Row] = collections.deque()
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._size_flush: asyncio.Task[None] | None = None
        # After a failed send only the timer retries (with backoff), so that a
        # dead receiver is not hammered once per recorded event.
        self._healthy = True
        self._closed = False
        self._recorded = 0
        self._sent = 0
        self._failures = 0
        self._dropped = 0
        self._unlogged_drops = 0
        self._last_drop_log = -math.inf

    @property
    def events_recorded(self) -> int:
        return self._recorded

    @property
    def events_sent(self) -> int:
        return self._sent

    @property
    def failures(self) -> int:
        """Failed sends so far (their rows were kept for retry)."""
        return self._failures

    @property
    def dropped(self) -> int:
        """Rows dropped because more than ``max_pending`` were waiting."""
        return self._dropped

    @property
    def pending(self) -> int:
        return len(self._rows)

    def record(self, event: TurnEvent) -> None:
        """Buffer one event; cheap and synchronous."""
        if self._closed:
            raise RuntimeError("audit buffer is closed")
        self._rows.append(event_to_row(event))
        self._recorded += 1
        self._enforce_cap()
        if self._timer is None or self._wants_size_flush():
            self._schedule()

    def _wants_size_flush(self) -> bool:
        return (
            len(self._rows) >= self._max_events
            and self._healthy
            and (self._size_flush is None or self._size_flush.done())
        )

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: rows wait for an explicit flush()
        if self._timer is None:
            self._timer = loop.create_task(self._run_timer(), name="coterie-audit-buffer")
        if self._wants_size_flush():
            self._size_flush = loop.create_task(self._flush(), name="coterie-audit-flush")

    async def _run_timer(self) -> None:
        delay = self._interval
        while True:
            await asyncio.sleep(delay)
            try:
                await self.flush()
            except Exception:
                log.exception("audit buffer flush crashed")
            delay = self._interval if self._healthy else min(delay * 2, _MAX_BACKOFF)

    async def flush(self) -> None:
        """Send everything buffered, one call per batch of ``max_events``.

        Stops at the first failed send (logged, counted in :attr:`failures`);
        its rows stay first in line for the next flush.
        """
        # Shielded: cancelling the caller must not abandon a send in flight — the
        # receiver may already have the batch, and resending it would duplicate it.
        await asyncio.shield(self._flush())

    async def _flush(self) -> None:
        async with self._lock:
            while self._rows:
                n = min(self._max_events, len(self._rows))
                batch = [self._rows.popleft() for _ in range(n)]
                try:
                    await self._send(batch)
                except Exception as exc:
                    self._rows.extendleft(reversed(batch))
                    self._failures += 1
                    self._healthy = False
                    log.warning(
                        "audit send of %d row(s) failed, %d pending, will retry: %s",
                        len(batch),
                        len(self._rows),
                        exc,
                    )
                    self._enforce_cap()
                    return
                self._sent += len(batch)
                self._healthy = True
            if self._unlogged_drops:
                self._log_drops()

    def _enforce_cap(self) -> None:
        excess = len(self._rows) - self._max_pending
        if excess <= 0:
            return
        for _ in range(excess):
            self._rows.popleft()
        self._dropped += excess
        self._unlogged_drops += excess
        if time.monotonic() - self._last_drop_log >= _DROP_LOG_INTERVAL:
            self._log_drops()

    def _log_drops(self) -> None:
        log.error(
            "audit buffer over max_pending=%d: dropped %d oldest row(s) (%d in total)",
            self._max_pending,
            self._unlogged_drops,
            self._dropped,
        )
        self._unlogged_drops = 0
        self._last_drop_log = time.monotonic()

    async def aclose(self) -> None:
        """Stop the timer and flush; unsent rows are logged as an error."""
        self._closed = True
        if self._timer is not None:
            # Safe at any point: a flush in progress is shielded and completes.
            self._timer.cancel()
            await asyncio.wait({self._timer})
            self._timer = None
        await self.flush()
        if self._unlogged_drops:
            self._log_drops()
        if self._rows:
            log.error("audit buffer closed with %d unsent row(s)", len(self._rows))


__all__ = ["EVENT_COLUMNS", "AuditBuffer", "AuditOverloadedError", "Row", "event_to_row"]
