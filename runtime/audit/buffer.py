"""The source side of the audit log: the batching buffer every persona records into.

Kept apart from the writer so that persona processes, which only record
events, never import DuckDB or Arrow.

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
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from coterie.runtime.audit.rows import HISTORY_KINDS, Row, Send, event_to_row
from coterie.runtime.audit.spool import LOCK_WAIT, open_spool, read_spool, spool_line
from coterie.runtime.messages import TurnEvent

log = logging.getLogger("coterie.audit")

_MAX_BACKOFF = 5.0
_LOG_INTERVAL = 5.0


class AuditBuffer:
    """Buffers a persona's audit rows and sends them in batches.

    ``send`` is an async callable taking a list of rows (e.g. a call to
    ``AuditLog.append``). Rows are sent in recording order. A batch whose
    send raised goes back to the front of the buffer and is retried by the next
    flush, through ``replay`` (the receiver may have taken it before failing).
    Only when more than ``max_pending`` rows are waiting are the oldest dropped,
    and that is counted in :attr:`dropped` and logged as an error.

    A batch goes when ``max_events`` rows wait, else every ``interval``
    seconds while rows wait (the timer stops when none do). Each send is a
    call to the AuditLog actor, paid on both sides: in a burst over 100
    personas, sending every 2 s instead of every 0.2 s cut the AuditLog
    actor's CPU per turn from 2.1 to 0.9 ms and the personas' by ~1 ms; at
    the default of 1 s it measured 0.6 ms, and what a lost node's spools may
    hold unacknowledged stays short. ``Runtime.query`` and ``Runtime.history``
    flush every persona's buffer first, so they do not wait for it.

    ``replay`` (default: ``send``) sends rows that may have reached the receiver
    already, and should skip those whose ``id`` it has
    (``AuditLog.append(rows, replayed=True)``); only such rows take it.

    With ``spool_path``, :meth:`record` also appends each row to that file
    (flushed to the OS, not fsynced: it survives the process being killed, not
    the machine crashing), and a flush that leaves the buffer empty truncates
    it. A new buffer on the same spool (the restarted process) starts with the
    rows left there and sends them through ``replay`` before any new row. The
    spool is only truncated once they are acknowledged, so a crash during
    recovery loses nothing either. One buffer at a time may use a spool: a second
    one waits up to ``spool_lock_wait`` seconds (a killed predecessor's lock goes
    with its process) and then raises :class:`AuditSpoolInUseError`.
    ``observer`` sees every event as it is recorded (the process's metrics,
    :class:`~runtime.metrics.EventMetrics`); it must not raise.
    """

    def __init__(
        self,
        send: Send,
        *,
        replay: Send | None = None,
        spool_path: str | Path | None = None,
        max_events: int = 500,
        interval: float = 1.0,
        max_pending: int = 100_000,
        spool_lock_wait: float = LOCK_WAIT,
        observer: Callable[[TurnEvent], None] | None = None,
    ) -> None:
        if max_events < 1 or max_pending < max_events or interval <= 0:
            raise ValueError("need max_events >= 1, max_pending >= max_events, interval > 0")
        if spool_path is not None and replay is None:
            raise ValueError("a spool needs replay=: a send that skips rows the log already has")
        self._send = send
        # Sees every event recorded (the process's metrics); must not raise.
        self._observer = observer
        self._replay = replay if replay is not None else send
        self._max_events = max_events
        self._interval = interval
        self._max_pending = max_pending
        self._rows: collections.deque[Row] = collections.deque()
        # The first _replay_left rows may have been delivered (they come from the
        # spool, or from a failed send) and go through replay.
        self._replay_left = 0
        # The batch being sent: unacknowledged, so kept by a spool compaction.
        self._inflight: list[Row] = []
        # Per conversation, its HISTORY_KINDS rows among _rows and _inflight
        # (absent at zero): what holds_history answers from, in O(1).
        self._history: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._size_flush: asyncio.Task[None] | None = None
        # After a failed send only the timer retries (with backoff), so that a
        # dead receiver is not hammered once per recorded event.
        self._healthy = True
        self._closed = False
        self._recorded = 0
        self._recovered = 0
        self._sent = 0
        self._failures = 0
        self._dropped = 0
        self._unlogged_drops = 0
        self._last_drop_log = -math.inf
        self._spool_path = Path(spool_path) if spool_path is not None else None
        self._spool_lock_wait = spool_lock_wait
        self._spool: io.FileIO | None = None
        self._spool_size = 0  # bytes of whole lines in the spool
        self._spooled = 0  # lines in the spool
        self._compact_at = 2 * max_pending
        self._spool_errors = 0
        self._last_spool_error_log = -math.inf
        if self._spool_path is not None:
            self._recover(self._spool_path)

    @staticmethod
    def recover(spool_path: str | Path) -> list[Row]:
        """The rows left in a spool, oldest first (a torn last line is ignored).

        Only reads the file: a buffer created on the spool replays these rows
        itself.
        """
        rows, _, _ = read_spool(Path(spool_path))
        return rows

    def _recover(self, path: Path) -> None:
        spool = open_spool(path, lock_wait=self._spool_lock_wait)
        try:
            rows, size, bad = read_spool(path)
            if size != os.fstat(spool.fileno()).st_size:
                # Cut the torn last line, or the next row would be glued to it.
                spool.truncate(size)
        except BaseException:
            spool.close()
            raise
        self._spool = spool
        self._spool_size = size
        self._spooled = len(rows) + bad
        if bad:
            log.error("audit spool %s: skipped %d unreadable line(s)", path, bad)
        if rows:
            log.warning("audit spool %s: replaying %d unacknowledged row(s)", path, len(rows))
            self._rows.extend(rows)
            self._count_history(rows, 1)
            self._replay_left = self._recovered = len(rows)
            self._enforce_cap()
            self._schedule()

    @property
    def spool_path(self) -> Path | None:
        return self._spool_path

    @property
    def events_recorded(self) -> int:
        return self._recorded

    @property
    def recovered(self) -> int:
        """Rows found in the spool at start, sent (through ``replay``) before new ones."""
        return self._recovered

    @property
    def events_sent(self) -> int:
        """Rows sent, recovered ones included."""
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
    def spool_errors(self) -> int:
        """Failed spool writes (those rows were kept in memory only)."""
        return self._spool_errors

    @property
    def pending(self) -> int:
        return len(self._rows)

    def holds_history(self, conversation_id: str) -> bool:
        """Whether a row ``conversation_id`` is rebuilt from (its messages,
        todo lists, questions: ``HISTORY_KINDS``) is still unacknowledged here,
        waiting or in the batch being sent: what a read of that conversation
        from the log must :meth:`flush` first to see. Its other rows (the
        message that just came in, say) change nothing in what is read."""
        return conversation_id in self._history

    def _count_history(self, rows: Iterable[Row], delta: int) -> None:
        """Add ``delta`` to :attr:`_history` for each of ``rows`` of a history kind."""
        counts = self._history
        for row in rows:
            if row["kind"] in HISTORY_KINDS:
                conversation_id = row["conversation_id"]
                n = counts.get(conversation_id, 0) + delta
                if n:
                    counts[conversation_id] = n
                else:
                    del counts[conversation_id]

    def record(self, event: TurnEvent) -> None:
        """Buffer one event (and spool it); cheap and synchronous."""
        if self._closed:
            raise RuntimeError("audit buffer is closed")
        row = event_to_row(event)
        self._rows.append(row)
        self._count_history((row,), 1)
        if self._spool is not None:
            # After the append: a compaction rewrites the spool from _rows.
            self._spool_append(row)
        self._recorded += 1
        if self._observer is not None:
            self._observer(event)
        self._enforce_cap()
        if self._timer is None or self._wants_size_flush():
            self._schedule()

    def _spool_append(self, row: Row) -> None:
        assert self._spool is not None
        line = spool_line(row)
        try:
            written = self._spool.write(line)
            if written != len(line):
                raise OSError(f"short write: {written} of {len(line)} bytes")
        except OSError as exc:
            self._spool_failed("write", exc)
            return
        self._spool_size += len(line)
        self._spooled += 1
        if self._spooled > self._compact_at:
            self._compact_spool()

    def _spool_failed(self, what: str, exc: OSError) -> None:
        assert self._spool is not None
        self._spool_errors += 1
        try:
            # Remove a partial line: the next row would be glued to it.
            self._spool.truncate(self._spool_size)
        except OSError:
            pass  # recovery skips an unreadable line; the error is logged below
        if time.monotonic() - self._last_spool_error_log >= _LOG_INTERVAL:
            self._last_spool_error_log = time.monotonic()
            log.error(
                "audit spool %s %s failed (%d spool error(s) so far): %s",
                self._spool_path,
                what,
                self._spool_errors,
                exc,
            )

    def _truncate_spool(self) -> None:
        """Forget the spooled rows: every one of them is acknowledged."""
        if self._spool is None or self._spool_size == 0:
            return
        try:
            self._spool.truncate(0)
        except OSError as exc:
            # The rows stay and are replayed after a restart; replay skips them.
            self._spool_failed("truncate", exc)
            return
        self._spool_size = self._spooled = 0
        self._compact_at = 2 * self._max_pending

    def _compact_spool(self) -> None:
        """Rewrite the spool with only the unacknowledged rows.

        Rows sent while others wait, or dropped over ``max_pending``, stay in
        the spool until a flush empties the buffer; during a long outage of the
        audit log it would otherwise grow without bound.
        """
        assert self._spool is not None and self._spool_path is not None
        path = self._spool_path
        tmp = path.with_name(path.name + ".compact")
        rows = [*self._inflight, *self._rows]
        data = b"".join(spool_line(r) for r in rows)
        new: io.FileIO | None = None
        try:
            new = open(tmp, "ab", buffering=0)  # noqa: SIM115 - replaces self._spool
            fcntl.flock(new.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            new.truncate(0)
            if new.write(data) != len(data):
                raise OSError("short write")
            # Atomic: a kill leaves either spool whole, and both hold every unsent row.
            os.replace(tmp, path)
        except OSError as exc:
            if new is not None:
                new.close()
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            self._compact_at = self._spooled + self._max_pending
            self._spool_failed("compaction", exc)
            return
        self._spool.close()
        self._spool = new
        self._spool_size, self._spooled = len(data), len(rows)
        self._compact_at = max(2 * self._max_pending, self._spooled + self._max_pending)
        log.info("audit spool %s compacted to %d unsent row(s)", path, len(rows))

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
            self._size_flush = loop.create_task(
                self._flush(until=self._recovered + self._recorded), name="coterie-audit-flush"
            )

    async def _run_timer(self) -> None:
        delay = self._interval
        while True:
            await asyncio.sleep(delay)
            try:
                await self.flush()
            except Exception:
                log.exception("audit buffer flush crashed")
            if self._healthy and not self._rows:
                # Nothing left: stop waking up (a hundred idle personas would
                # otherwise tick for nothing); the next record() restarts us.
                self._timer = None
                return
            delay = self._interval if self._healthy else min(delay * 2, _MAX_BACKOFF)

    async def flush(self) -> None:
        """Send everything buffered when it was called, one call per batch of
        ``max_events``; rows recorded meanwhile wait for the next flush, so a
        steady stream of new rows cannot keep the caller waiting.

        Stops at the first failed send (logged, counted in :attr:`failures`);
        its rows stay first in line for the next flush.
        """
        # Shielded: cancelling the caller must not abandon a send in flight — the
        # receiver may already have the batch, and resending it would duplicate it.
        await asyncio.shield(self._flush(until=self._recovered + self._recorded))

    async def _flush(self, until: int | None = None) -> None:
        """Send until the first ``until`` rows ever buffered are gone (all, if None)."""
        async with self._lock:
            while self._rows and (until is None or self._sent + self._dropped < until):
                # Rows that may have been delivered go first and alone: only their
                # batches pay for the receiver's duplicate check.
                replayed = self._replay_left > 0
                n = min(self._max_events, self._replay_left if replayed else len(self._rows))
                batch = [self._rows.popleft() for _ in range(n)]
                if replayed:
                    self._replay_left -= n
                self._inflight = batch
                kept = False
                try:
                    await (self._replay if replayed else self._send)(batch)
                except Exception as exc:
                    self._rows.extendleft(reversed(batch))
                    kept = True
                    self._replay_left += n
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
                finally:
                    self._inflight = []
                    if not kept:  # acknowledged (or abandoned by a cancel): gone
                        self._count_history(batch, -1)
                self._sent += len(batch)
                self._healthy = True
            if not self._rows:
                # No await since the loop saw the buffer empty: every spooled row
                # is acknowledged.
                self._truncate_spool()
            if self._unlogged_drops:
                self._log_drops()

    def _enforce_cap(self) -> None:
        excess = len(self._rows) - self._max_pending
        if excess <= 0:
            return
        self._count_history([self._rows.popleft() for _ in range(excess)], -1)
        self._replay_left = max(0, self._replay_left - excess)
        self._dropped += excess
        self._unlogged_drops += excess
        if time.monotonic() - self._last_drop_log >= _LOG_INTERVAL:
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
        """Stop the timer and flush; unsent rows are logged as an error.

        With a spool, unsent rows stay in it for the next buffer on that spool;
        an empty spool is removed.
        """
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
            log.error(
                "audit buffer closed with %d unsent row(s)%s",
                len(self._rows),
                f" (kept in spool {self._spool_path})" if self._spool is not None else "",
            )
        if self._spool is not None:
            if self._spool_size == 0 and self._spool_path is not None:
                try:
                    # Under the lock: a buffer waiting for it re-checks the path.
                    self._spool_path.unlink()
                except OSError:
                    pass  # an empty spool left behind is harmless
            self._spool.close()
            self._spool = None


__all__ = ["AuditBuffer"]
