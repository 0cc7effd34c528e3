"""The audit log: turn events flattened into rows of a DuckDB ``events`` table.

Three pieces, none of which imports Ray:

* :func:`event_to_row` flattens a :data:`~runtime.messages.TurnEvent` into a
  row (a dict) of the ``events`` table.
* :class:`AuditWriter` owns the DuckDB file: batched Arrow inserts, read-only
  queries and conversation rebuilds. :func:`read_only_query` queries a file
  when no runtime has it open.
* :class:`AuditBuffer` is the source-side buffer every persona records into; it
  batches rows and ships them with one call per batch (``actors.audit`` wires
  it to the ``AuditLogActor``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypedDict, cast

import duckdb
import pyarrow as pa

from runtime.errors import AuditQueryError, CoterieError
from runtime.messages import (
    ChatMessage,
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

# --------------------------------------------------------------------------
# Row schema
# --------------------------------------------------------------------------

EVENT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("seq", pa.int64()),
        ("ts", pa.timestamp("us")),
        ("kind", pa.string()),
        ("persona", pa.string()),
        ("conversation_id", pa.string()),
        ("turn_id", pa.string()),
        ("provider", pa.string()),
        ("model", pa.string()),
        ("tool", pa.string()),
        ("call_id", pa.string()),
        ("input_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("latency_ms", pa.float64()),
        ("duration_ms", pa.float64()),
        ("error_kind", pa.string()),
        ("status", pa.string()),
        ("payload", pa.string()),
    ]
)
EVENT_COLUMNS: tuple[str, ...] = tuple(EVENT_SCHEMA.names)
# Every event has these; a row without them is malformed (see rows_to_table).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "id",
    "seq",
    "ts",
    "kind",
    "persona",
    "conversation_id",
    "turn_id",
    "payload",
)

# No index: DuckDB does not use an ART index for the (persona, conversation_id)
# filter of history() (measured: still a sequential scan), while one costs ~35%
# more file size and slower inserts. Zonemaps and filter pushdown suffice.
_DDL = """
CREATE TABLE IF NOT EXISTS events (
    id VARCHAR NOT NULL,
    seq BIGINT NOT NULL,
    ts TIMESTAMP NOT NULL,
    kind VARCHAR NOT NULL,
    persona VARCHAR NOT NULL,
    conversation_id VARCHAR NOT NULL,
    turn_id VARCHAR NOT NULL,
    provider VARCHAR,
    model VARCHAR,
    tool VARCHAR,
    call_id VARCHAR,
    input_tokens INTEGER,
    output_tokens INTEGER,
    latency_ms DOUBLE,
    duration_ms DOUBLE,
    error_kind VARCHAR,
    status VARCHAR,
    payload VARCHAR NOT NULL
);
-- Malformed rows that could not go into events, kept as JSON for inspection.
CREATE TABLE IF NOT EXISTS rejected_rows (
    ts TIMESTAMP NOT NULL,
    error VARCHAR NOT NULL,
    row VARCHAR NOT NULL
);
"""

# Orders events of one process that share a timestamp; ``ts`` orders the rest.
_seq = itertools.count(1)


def event_to_row(event: TurnEvent) -> Row:
    """Flatten a turn event into a row of the ``events`` table.

    Columns that do not apply to the event's kind are ``None``; ``payload``
    holds the whole event as JSON, so nothing is lost by flattening.
    """
    row: Row = dict.fromkeys(EVENT_COLUMNS)
    row["id"] = str(uuid.uuid4())
    row["seq"] = next(_seq)
    row["ts"] = datetime.fromtimestamp(event.ts, UTC)
    row["kind"] = event.kind
    row["persona"] = event.persona
    row["conversation_id"] = event.conversation_id
    row["turn_id"] = event.turn_id
    row["payload"] = turn_event_adapter.dump_json(event).decode()
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


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> tuple[pa.Table, list[tuple[Any, str]]]:
    """Convert rows to one Arrow table of :data:`EVENT_SCHEMA`.

    Returns the table of well-formed rows and the malformed ones with the
    reason; a malformed row can never be written, so it must not hold back the
    rest of its batch.
    """
    try:
        table = pa.Table.from_pylist(list(rows), schema=EVENT_SCHEMA)
        if not any(table.column(c).null_count for c in REQUIRED_COLUMNS):
            return table, []
    except Exception:
        pass  # find the culprits row by row below
    good: list[Mapping[str, Any]] = []
    bad: list[tuple[Any, str]] = []
    for row in rows:
        try:
            one = pa.Table.from_pylist([row], schema=EVENT_SCHEMA)
        except Exception as exc:
            bad.append((row, f"{type(exc).__name__}: {exc}"))
            continue
        missing = [c for c in REQUIRED_COLUMNS if one.column(c).null_count]
        if missing:
            bad.append((row, f"missing required column(s): {', '.join(missing)}"))
        else:
            good.append(row)
    return pa.Table.from_pylist(good, schema=EVENT_SCHEMA), bad


# --------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryResult:
    """The result of an audit query: column names and rows."""

    columns: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def as_dicts(self) -> list[dict[str, Any]]:
        """The rows as ``{column: value}`` dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


_READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def _parse_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    """Parse ``sql`` and refuse it unless every statement only reads."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise AuditQueryError(f"audit query failed: {exc}") from exc
    if not statements:
        raise AuditQueryError("audit query is empty")
    refused = [s.type.name for s in statements if s.type not in _READ_ONLY_STATEMENTS]
    if refused:
        raise AuditQueryError(
            "audit queries are read-only (SELECT, EXPLAIN); refused "
            f"{', '.join(refused)} statement{'s' if len(refused) > 1 else ''}"
        )
    return statements


def _run_read_only(cur: duckdb.DuckDBPyConnection, sql: str) -> QueryResult:
    """Run ``sql`` on a dedicated cursor inside a read-only transaction.

    The statement-type check alone is not enough: ``WITH d AS (DELETE ...
    RETURNING *) SELECT ...`` parses as a SELECT and ``EXPLAIN ANALYZE``
    executes its statement. The read-only transaction refuses both.
    """
    statements = _parse_read_only(cur, sql)
    result = QueryResult(columns=[])
    try:
        cur.execute("BEGIN TRANSACTION READ ONLY")
        for statement in statements:
            cur.execute(statement)
            # Always fetch fully: a partly fetched result blocks the connection.
            rows = cur.fetchall()
            columns = [d[0] for d in cur.description or ()]
            result = QueryResult(columns=columns, rows=rows)
    except duckdb.Error as exc:
        if "read-only mode" in str(exc):
            raise AuditQueryError(
                f"audit queries are read-only; refused a statement that writes: {exc}"
            ) from exc
        raise AuditQueryError(f"audit query failed: {exc}") from exc
    return result


def read_only_query(path: str | Path, sql: str) -> QueryResult:
    """Query an audit file directly, for when no runtime has it open.

    Only SELECT and EXPLAIN statements are admitted. A running runtime holds
    the file's write lock; query through it (``AuditLogActor.query``) instead.
    """
    path = Path(path)
    if not path.exists():
        raise AuditQueryError(f"no audit log at {path}")
    try:
        con = duckdb.connect(str(path), read_only=True, config={"enable_external_access": False})
    except duckdb.Error as exc:
        raise AuditQueryError(
            f"cannot open audit log {path} read-only (is a runtime using it? "
            f"then query through the runtime): {exc}"
        ) from exc
    try:
        return _run_read_only(con, sql)
    finally:
        con.close()


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------

# After these the connection is unusable (closed, or the database invalidated);
# the next call opens a fresh one.
_CONNECTION_LOST = (duckdb.ConnectionException, duckdb.FatalException, duckdb.InternalException)


class AuditWriter:
    """Owns one DuckDB audit file: batched inserts, read-only queries, history.

    Not thread-safe: callers serialize access (the actor holds a lock).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # Malformed rows set aside in ``rejected_rows`` instead of ``events``.
        self.rows_rejected = 0
        self._closed = False
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._con: duckdb.DuckDBPyConnection | None = self._open()

    def _open(self) -> duckdb.DuckDBPyConnection:
        # No file access from SQL: queries must not read or write other files.
        con = duckdb.connect(self.path, config={"enable_external_access": False})
        try:
            con.execute(_DDL)
            # Checkpoint so that the file is self-contained from the start.
            con.execute("CHECKPOINT")
        except BaseException:
            con.close()
            raise
        return con

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._closed:
            raise RuntimeError(f"audit writer for {self.path} is closed")
        if self._con is None:
            log.info("reopening audit log %s", self.path)
            self._con = self._open()
        return self._con

    def _lost(self, exc: BaseException) -> None:
        if isinstance(exc, _CONNECTION_LOST) and self._con is not None:
            log.error("audit log connection lost (%s); reopening on next use", exc)
            try:
                self._con.close()
            except duckdb.Error:
                pass  # it is already unusable; the original error is re-raised
            self._con = None

    def write_rows(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Insert rows as one Arrow batch; returns how many reached ``events``.

        Malformed rows (wrong types, missing required columns) go to the
        ``rejected_rows`` table in the same transaction, are counted in
        :attr:`rows_rejected` and logged. DuckDB errors are raised unchanged and
        nothing of the batch is written.
        """
        if not rows:
            return 0
        table, bad = rows_to_table(rows)
        con = self._connection()
        name = f"_audit_batch_{uuid.uuid4().hex}"
        try:
            con.execute("BEGIN TRANSACTION")
            if table.num_rows:
                con.register(name, table)
                try:
                    con.execute(
                        f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) "
                        f"SELECT {', '.join(EVENT_COLUMNS)} FROM {name}"
                    )
                finally:
                    con.unregister(name)
            if bad:
                now = datetime.now(UTC).replace(tzinfo=None)
                con.executemany(
                    "INSERT INTO rejected_rows VALUES (?, ?, ?)",
                    [[now, error, json.dumps(row, default=str)] for row, error in bad],
                )
            con.execute("COMMIT")
        except Exception as exc:
            self._rollback(con)
            self._lost(exc)
            raise
        if bad:
            self.rows_rejected += len(bad)
            log.error(
                "audit log: %d malformed row(s) stored in rejected_rows, not events (first: %s)",
                len(bad),
                bad[0][1],
            )
        return table.num_rows

    @staticmethod
    def _rollback(con: duckdb.DuckDBPyConnection) -> None:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            # A failed COMMIT already ended the transaction; the caller re-raises
            # the original error, so nothing is hidden.
            pass

    def query(self, sql: str) -> QueryResult:
        """Run a read-only query (SELECT / EXPLAIN only); raises AuditQueryError."""
        try:
            cur = self._connection().cursor()
        except duckdb.Error as exc:
            self._lost(exc)
            raise AuditQueryError(f"audit query failed: {exc}") from exc
        try:
            return _run_read_only(cur, sql)
        finally:
            cur.close()

    def history(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """Rebuild a conversation from its ``chat_message`` events, in order."""
        try:
            cur = self._connection().cursor()
        except duckdb.Error as exc:
            self._lost(exc)
            raise
        try:
            rows = cur.execute(
                "SELECT payload FROM events WHERE persona = ? AND conversation_id = ? "
                "AND kind = 'chat_message' ORDER BY ts, seq",
                [persona, conversation_id],
            ).fetchall()
        finally:
            cur.close()
        messages: list[ChatMessage] = []
        for (payload,) in rows:
            event = cast(HistoryAppended, turn_event_adapter.validate_json(payload))
            messages.append(event.message)
        return messages

    def close(self) -> None:
        """Close the file; further calls raise."""
        self._closed = True
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------
# Source-side buffer
# --------------------------------------------------------------------------


class AuditSink(Protocol):
    """Where the turn loop records its events."""

    def record(self, event: TurnEvent) -> None: ...

    async def flush(self) -> None: ...


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


class AuditLogStats(TypedDict):
    """Counters of an audit log writer (see ``AuditLogActor.stats``)."""

    path: str
    rows_written: int
    batches_written: int
    rows_rejected: int
    write_errors: int
    pending: int
    last_error: str | None


__all__ = [
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "AuditBuffer",
    "AuditLogStats",
    "AuditOverloadedError",
    "AuditSink",
    "AuditWriter",
    "QueryResult",
    "event_to_row",
    "read_only_query",
    "rows_to_table",
]
