"""The writer of the audit log: DuckDB file, ``events`` schema, batched Arrow inserts.

:class:`AuditWriter` owns one DuckDB file: batched Arrow inserts, read-only
queries (see :mod:`runtime.audit.query`) and conversation rebuilds. Sources'
*replayed* batches (resent from a spool after a kill) may repeat rows already
written, so the writer skips rows whose ``id`` it has.

``duckdb`` and ``pyarrow`` are imported when a writer is made, not when this
module is: persona processes import the audit package without them.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from coterie.runtime.audit.query import QueryResult, run_read_only
from coterie.runtime.audit.rows import EVENT_COLUMNS, HISTORY_KINDS
from coterie.runtime.errors import AuditQueryError
from coterie.runtime.messages import (
    ApprovalEvent,
    ChatMessage,
    Compacted,
    ConversationRecord,
    DelegationEvent,
    HistoryAppended,
    QuestionSet,
    TodosSet,
    turn_event_adapter,
)

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

log = logging.getLogger("coterie.audit")


@functools.cache
def event_schema() -> pa.Schema:
    """The Arrow schema of the ``events`` table (column order of :data:`EVENT_COLUMNS`)."""
    import pyarrow as pa

    schema = pa.schema(
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
            ("cache_read_tokens", pa.int32()),
            ("cache_write_tokens", pa.int32()),
            ("cost_usd", pa.float64()),
            ("context", pa.string()),
            ("billed_to", pa.string()),
            ("trace_id", pa.string()),
            ("span_id", pa.string()),
        ]
    )
    if tuple(schema.names) != EVENT_COLUMNS:
        raise AssertionError("events schema and columns disagree")
    return schema


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
    payload VARCHAR NOT NULL,
    cache_read_tokens INTEGER,
    cache_write_tokens INTEGER,
    cost_usd DOUBLE,
    context VARCHAR,
    billed_to VARCHAR,
    trace_id VARCHAR,
    span_id VARCHAR
);
-- Files written before these columns existed get them (NULL in old rows).
ALTER TABLE events ADD COLUMN IF NOT EXISTS cache_read_tokens INTEGER;
ALTER TABLE events ADD COLUMN IF NOT EXISTS cache_write_tokens INTEGER;
ALTER TABLE events ADD COLUMN IF NOT EXISTS cost_usd DOUBLE;
ALTER TABLE events ADD COLUMN IF NOT EXISTS context VARCHAR;
ALTER TABLE events ADD COLUMN IF NOT EXISTS billed_to VARCHAR;
ALTER TABLE events ADD COLUMN IF NOT EXISTS trace_id VARCHAR;
ALTER TABLE events ADD COLUMN IF NOT EXISTS span_id VARCHAR;
-- Every approval a permission rule asked for, and where it stands: one row
-- each, from its requested and decided events (an undecided one past its
-- expiry reads expired).
CREATE OR REPLACE VIEW approvals AS
WITH requested AS (
    SELECT payload->>'approval_id' AS id, persona, conversation_id, turn_id, tool, call_id,
           payload->>'summary' AS summary, payload->>'rule' AS rule, ts AS requested,
           CAST(payload->>'expires_at' AS DOUBLE) AS expires_epoch
    FROM events WHERE kind = 'approval' AND payload->>'phase' = 'requested'
), decided AS (
    SELECT payload->>'approval_id' AS id, arg_max(status, ts) AS state,
           arg_max(payload->>'decided_by', ts) AS decided_by,
           arg_max(payload->>'via', ts) AS via, max(ts) AS decided
    FROM events WHERE kind = 'approval' AND payload->>'phase' = 'decided' GROUP BY 1
)
SELECT r.id, r.persona, r.conversation_id, r.turn_id, r.tool, r.call_id, r.summary, r.rule,
       r.requested, make_timestamp(CAST(r.expires_epoch * 1000000 AS BIGINT)) AS expires,
       COALESCE(d.state, CASE WHEN r.expires_epoch < epoch(current_timestamp)
                              THEN 'expired' ELSE 'pending' END) AS state,
       d.decided_by, d.via, d.decided
FROM requested r LEFT JOIN decided d USING (id);
-- Malformed rows that could not go into events, kept as JSON for inspection.
CREATE TABLE IF NOT EXISTS rejected_rows (
    ts TIMESTAMP NOT NULL,
    error VARCHAR NOT NULL,
    row VARCHAR NOT NULL
);
"""


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> tuple[pa.Table, list[tuple[Any, str]]]:
    """Convert rows to one Arrow table of :func:`event_schema`.

    Returns the table of well-formed rows and the malformed ones with the
    reason; a malformed row can never be written, so it must not hold back the
    rest of its batch.
    """
    import pyarrow as pa

    schema = event_schema()
    # What Arrow raises for a value of the wrong type or range.
    unconvertible = (pa.ArrowException, TypeError, ValueError, OverflowError)
    try:
        table = pa.Table.from_pylist(list(rows), schema=schema)
        if not any(table.column(c).null_count for c in REQUIRED_COLUMNS):
            return table, []
    except unconvertible:
        pass  # find the culprits row by row below
    good: list[Mapping[str, Any]] = []
    bad: list[tuple[Any, str]] = []
    for row in rows:
        try:
            one = pa.Table.from_pylist([row], schema=schema)
        except unconvertible as exc:
            bad.append((row, f"{type(exc).__name__}: {exc}"))
            continue
        missing = [c for c in REQUIRED_COLUMNS if one.column(c).null_count]
        if missing:
            bad.append((row, f"missing required column(s): {', '.join(missing)}"))
        else:
            good.append(row)
    return pa.Table.from_pylist(good, schema=schema), bad


def _connection_lost(exc: BaseException) -> bool:
    """After these the connection is unusable (closed, or the database
    invalidated); the next call opens a fresh one."""
    import duckdb

    return isinstance(
        exc, duckdb.ConnectionException | duckdb.FatalException | duckdb.InternalException
    )


class AuditWriter:
    """Owns one DuckDB audit file: batched inserts, read-only queries, history.

    Not thread-safe: callers serialize access (the actor holds a lock).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # Malformed rows set aside in ``rejected_rows`` instead of ``events``.
        self.rows_rejected = 0
        # Rows of replayed batches skipped because ``events`` already had them.
        self.duplicates_skipped = 0
        self._closed = False
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._con: duckdb.DuckDBPyConnection | None = self._open()

    def _open(self) -> duckdb.DuckDBPyConnection:
        import duckdb

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
        import duckdb

        if _connection_lost(exc) and self._con is not None:
            log.error("audit log connection lost (%s); reopening on next use", exc)
            try:
                self._con.close()
            except duckdb.Error:
                pass  # it is already unusable; the original error is re-raised
            self._con = None

    def write_rows(self, rows: Sequence[Mapping[str, Any]], *, replayed: bool = False) -> int:
        """Insert rows as one Arrow batch; returns how many reached ``events``.

        Malformed rows (wrong types, missing required columns) go to the
        ``rejected_rows`` table in the same transaction, are counted in
        :attr:`rows_rejected` and logged. DuckDB errors are raised unchanged and
        nothing of the batch is written.

        A ``replayed`` batch (resent from a source's spool) may repeat rows
        already written: rows whose ``id`` is in ``events``, or repeated within
        the batch, are skipped and counted in :attr:`duplicates_skipped`. Only
        such batches pay for that lookup.
        """
        if not rows:
            return 0
        table, bad = rows_to_table(rows)
        con = self._connection()
        name = f"_audit_batch_{uuid.uuid4().hex}"
        inserted = 0
        try:
            con.execute("BEGIN TRANSACTION")
            if table.num_rows:
                con.register(name, table)
                try:
                    if replayed:
                        inserted = self._insert_new(con, name)
                    else:
                        con.execute(
                            f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) "
                            f"SELECT {', '.join(EVENT_COLUMNS)} FROM {name}"
                        )
                        inserted = table.num_rows
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
        if inserted < table.num_rows:
            self.duplicates_skipped += table.num_rows - inserted
            log.info(
                "audit log: skipped %d replayed row(s) already written",
                table.num_rows - inserted,
            )
        return inserted

    @staticmethod
    def _insert_new(con: duckdb.DuckDBPyConnection, batch: str) -> int:
        """Insert the rows of the registered table ``batch`` that ``events`` lacks."""
        columns = ", ".join(EVENT_COLUMNS)
        # One anti-join for the batch. The ts range lets zonemaps skip most of
        # events: a replayed row keeps the ts of its first copy.
        result = con.execute(
            f"INSERT INTO events ({columns}) "
            f"SELECT {columns} FROM ("
            f"  SELECT * FROM {batch} QUALIFY row_number() OVER (PARTITION BY id ORDER BY seq) = 1"
            f") AS b ANTI JOIN ("
            f"  SELECT id FROM events WHERE ts BETWEEN (SELECT min(ts) FROM {batch})"
            f"  AND (SELECT max(ts) FROM {batch})"
            f") AS e ON b.id = e.id"
        ).fetchone()
        return int(result[0]) if result is not None else 0

    @staticmethod
    def _rollback(con: duckdb.DuckDBPyConnection) -> None:
        import duckdb

        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            # A failed COMMIT already ended the transaction; the caller re-raises
            # the original error, so nothing is hidden.
            pass

    def query(self, sql: str) -> QueryResult:
        """Run a read-only query (SELECT / EXPLAIN only); raises AuditQueryError."""
        import duckdb

        try:
            cur = self._connection().cursor()
        except duckdb.Error as exc:
            self._lost(exc)
            raise AuditQueryError(f"audit query failed: {exc}") from exc
        try:
            return run_read_only(cur, sql)
        finally:
            cur.close()

    def _rows(self, sql: str, params: list[Any]) -> list[Any]:
        """The rows of one read on a cursor of its own."""
        import duckdb

        try:
            cur = self._connection().cursor()
        except duckdb.Error as exc:
            self._lost(exc)
            raise
        try:
            return cur.execute(sql, params).fetchall()
        finally:
            cur.close()

    def history(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """Rebuild a conversation's messages from its ``chat_message`` events, in order."""
        return self.conversation(persona, conversation_id).messages

    def conversation(self, persona: str, conversation_id: str) -> ConversationRecord:
        """Rebuild a conversation: its messages (``chat_message`` events, in
        order, but those of turns a ``turn_dropped`` event left out), its
        latest todo list (the last ``todos`` event) and its pending question
        (the last ``question`` event)."""
        rows = self._rows(
            "SELECT kind, turn_id, payload FROM events WHERE persona = ? "
            "AND conversation_id = ? "
            f"AND kind IN ({', '.join('?' * len(HISTORY_KINDS))}) ORDER BY ts, seq",
            [persona, conversation_id, *HISTORY_KINDS],
        )
        # Turns left out of the history (a heartbeat that found nothing to do):
        # their messages stay in the log, not in the conversation.
        dropped = {turn_id for kind, turn_id, _ in rows if kind == "turn_dropped"}
        record = ConversationRecord()
        for kind, turn_id, payload in rows:
            if kind == "turn_dropped" or (kind == "chat_message" and turn_id in dropped):
                continue
            event = turn_event_adapter.validate_json(payload)
            if kind == "chat_message":
                record.messages.append(cast(HistoryAppended, event).message)
            elif kind == "compaction":
                # The history from here on is the compacted one; the messages
                # its own turn added before it are in it (unless that turn
                # was left out afterwards).
                compacted = cast(Compacted, event)
                kept = compacted.messages
                if turn_id in dropped:
                    kept = kept[: compacted.turn_start]
                record.messages = list(kept)
            elif kind == "todos":
                record.todos = cast(TodosSet, event).todos
            else:
                record.question = cast(QuestionSet, event).question
        return record

    def unfinished_delegations(self, persona: str) -> list[DelegationEvent]:
        """``persona``'s delegations that started and never finished (their
        ``started`` events, oldest first): work lost when its process died."""
        rows = self._rows(
            "SELECT payload FROM events WHERE persona = ? AND kind = 'delegation' "
            "AND payload->>'phase' = 'started' AND call_id NOT IN ("
            "SELECT call_id FROM events WHERE persona = ? AND kind = 'delegation' "
            "AND payload->>'phase' = 'finished') ORDER BY ts, seq",
            [persona, persona],
        )
        return [cast(DelegationEvent, turn_event_adapter.validate_json(p)) for (p,) in rows]

    def pending_approvals(self, persona: str) -> list[ApprovalEvent]:
        """``persona``'s approvals requested and never decided (their
        ``requested`` events, oldest first): calls a process paused and did
        not live to see answered."""
        rows = self._rows(
            "SELECT payload FROM events WHERE persona = ? AND kind = 'approval' "
            "AND payload->>'phase' = 'requested' AND payload->>'approval_id' NOT IN ("
            "SELECT payload->>'approval_id' FROM events WHERE persona = ? "
            "AND kind = 'approval' AND payload->>'phase' = 'decided') ORDER BY ts, seq",
            [persona, persona],
        )
        return [cast(ApprovalEvent, turn_event_adapter.validate_json(p)) for (p,) in rows]

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


__all__ = ["REQUIRED_COLUMNS", "AuditWriter", "event_schema", "rows_to_table"]
