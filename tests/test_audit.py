"""The audit log without Ray: rows, the DuckDB writer, queries, the buffer."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest

from coterie.runtime.audit import (
    EVENT_COLUMNS,
    AuditBuffer,
    AuditWriter,
    Row,
    event_to_row,
    read_only_query,
)
from coterie.runtime.errors import AuditQueryError
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    EnvelopeEvent,
    HistoryAppended,
    MessageEnvelope,
    ModelCalled,
    ToolCall,
    ToolCalled,
    ToolFinished,
    ToolResultMessage,
    TurnEnded,
    TurnEvent,
    TurnStarted,
    UserMessage,
    new_id,
    random_bytes,
    turn_event_adapter,
)
from coterie.runtime.services import AuditSink

BASE = dict(persona="scribe", conversation_id="c1", turn_id="turn_1")


def sample_events() -> list[TurnEvent]:
    """One event of every kind."""
    return [
        TurnStarted(**BASE, message_ids=["msg_1"]),
        HistoryAppended(**BASE, message=UserMessage(text="hi")),
        ModelCalled(
            **BASE,
            provider="openai",
            model="gpt-x",
            step=1,
            latency_ms=12.5,
            input_tokens=100,
            output_tokens=7,
            error="boom",
        ),
        ToolCalled(**BASE, call_id="call_1", tool="search", arguments={"q": "x"}),
        ToolFinished(
            **BASE,
            call_id="call_1",
            tool="search",
            duration_ms=3.25,
            error_kind="timeout",
            result="timed out",
        ),
        TurnEnded(**BASE, status="failed", steps=2, duration_ms=40.0, error="model down"),
        EnvelopeEvent(
            **BASE,
            envelope=MessageEnvelope(recipient="scribe", conversation_id="c1", text="hi"),
        ),
    ]


def conversation() -> list[ChatMessage]:
    """user → assistant asking for a tool → tool result → assistant."""
    return [
        UserMessage(text="what is 2+2?", ts=1000.000001),
        AssistantMessage(
            text="let me compute",
            tool_calls=[ToolCall(id="call_1", name="calc", arguments={"expr": "2+2"})],
            ts=1000.5,
        ),
        ToolResultMessage(call_id="call_1", name="calc", content="4", ts=1000.75),
        AssistantMessage(text="4", ts=1001.0),
    ]


def chat_rows(persona: str, conv: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [
        event_to_row(
            HistoryAppended(
                persona=persona, conversation_id=conv, turn_id="turn_1", message=m, ts=m.ts
            )
        )
        for m in messages
    ]


@pytest.fixture
def writer(tmp_path: Path) -> Any:
    w = AuditWriter(tmp_path / "nested" / "audit.duckdb")
    yield w
    w.close()


# -- rows ---------------------------------------------------------------


def test_rows_from_every_event_kind() -> None:
    rows = {r["kind"]: r for r in map(event_to_row, sample_events())}
    assert set(rows) == {
        "turn_started",
        "chat_message",
        "model_call",
        "tool_call",
        "tool_result",
        "turn_ended",
        "envelope",
    }
    for row in rows.values():
        assert tuple(row) == EVENT_COLUMNS
        assert row["persona"] == "scribe" and row["turn_id"] == "turn_1"
        assert row["ts"].tzinfo is UTC
        # payload round-trips to the original event
        assert turn_event_adapter.validate_json(row["payload"]).kind == row["kind"]

    model = rows["model_call"]
    assert (model["provider"], model["model"]) == ("openai", "gpt-x")
    assert (model["input_tokens"], model["output_tokens"], model["latency_ms"]) == (100, 7, 12.5)
    assert model["error_kind"] == "model_error"
    assert model["tool"] is None and model["duration_ms"] is None

    assert (rows["tool_call"]["tool"], rows["tool_call"]["call_id"]) == ("search", "call_1")
    result = rows["tool_result"]
    assert (result["duration_ms"], result["error_kind"]) == (3.25, "timeout")
    ended = rows["turn_ended"]
    assert (ended["status"], ended["duration_ms"], ended["error_kind"]) == (
        "failed",
        40.0,
        "turn_error",
    )
    started = rows["turn_started"]
    nulls = [c for c in EVENT_COLUMNS if started[c] is None]
    assert set(nulls) == set(EVENT_COLUMNS) - {
        "id",
        "seq",
        "ts",
        "kind",
        "persona",
        "conversation_id",
        "turn_id",
        "payload",
    }


def test_row_ts_is_utc_microseconds_and_seq_increases() -> None:
    a = event_to_row(TurnStarted(**BASE, ts=1_700_000_000.123456))
    b = event_to_row(TurnStarted(**BASE, ts=1_700_000_000.123456))
    assert a["ts"] == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    assert b["seq"] > a["seq"]
    assert a["id"] != b["id"]


def test_row_ids_are_canonical_random_uuids_and_never_repeat() -> None:
    # Ids come from a pool of OS randomness: more than one pool's worth here.
    ids = [event_to_row(TurnStarted(**BASE))["id"] for _ in range(2_000)]
    assert len(set(ids)) == len(ids)
    for row_id in ids[:300]:
        parsed = uuid.UUID(row_id)
        assert str(parsed) == row_id and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_ids_are_hex_of_the_documented_length() -> None:
    ids = {new_id("turn_") for _ in range(3_000)}
    assert len(ids) == 3_000
    assert all(re.fullmatch(r"turn_[0-9a-f]{16}", i) for i in ids)
    assert len(random_bytes(4_096)) == 4_096 and len(random_bytes(5_000)) == 5_000


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_id()  # the parent's pool holds randomness it has not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, " ".join(new_id() for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {new_id() for _ in range(50)}
    assert len(child) == 50 and not child & parent


def test_successful_events_have_no_error_kind() -> None:
    ok = [
        ModelCalled(**BASE, provider="p", model="m", step=1, latency_ms=1.0),
        ToolFinished(**BASE, call_id="c", tool="t", duration_ms=1.0, result="r"),
        TurnEnded(**BASE, status="ok", steps=1, duration_ms=1.0),
    ]
    assert [event_to_row(e)["error_kind"] for e in ok] == [None, None, None]


# -- writer ---------------------------------------------------------------


def test_write_10k_rows_in_one_call(writer: AuditWriter) -> None:
    events = [
        ModelCalled(
            persona=f"p{i % 4}",
            conversation_id=f"c{i % 10}",
            turn_id="t",
            provider="openai",
            model="m",
            step=1,
            latency_ms=1.0,
            input_tokens=i,
        )
        for i in range(10_000)
    ]
    assert writer.write_rows([event_to_row(e) for e in events]) == 10_000
    result = writer.query("SELECT persona, count(*), sum(input_tokens) FROM events GROUP BY 1")
    assert result.columns[0] == "persona"
    counts = {r[0]: r[1] for r in result.rows}
    assert counts == {f"p{i}": 2500 for i in range(4)}
    total = writer.query("SELECT sum(input_tokens) AS s FROM events").as_dicts()
    assert total == [{"s": sum(range(10_000))}]


def test_all_event_kinds_stored_with_columns(writer: AuditWriter) -> None:
    writer.write_rows([event_to_row(e) for e in sample_events()])
    result = writer.query(
        "SELECT kind, tool, error_kind, status, input_tokens FROM events ORDER BY seq"
    )
    assert result.rows == [
        ("turn_started", None, None, None, None),
        ("chat_message", None, None, None, None),
        ("model_call", None, "model_error", None, 100),
        ("tool_call", "search", None, None, None),
        ("tool_result", "search", "timeout", None, None),
        ("turn_ended", None, "turn_error", "failed", None),
        ("envelope", None, None, None, None),
    ]
    # The payload column is plain JSON and queryable as such.
    assert writer.query(
        "SELECT payload::JSON->>'$.envelope.text' FROM events WHERE kind = 'envelope'"
    ).rows == [("hi",)]


def test_order_by_ts_then_seq(writer: AuditWriter) -> None:
    # Inserted out of order; equal timestamps fall back to seq (recording order).
    first = event_to_row(TurnStarted(**BASE, ts=2000.0, message_ids=["a"]))
    second = event_to_row(TurnStarted(**BASE, ts=2000.0, message_ids=["b"]))
    earliest = event_to_row(TurnStarted(**BASE, ts=1999.5, message_ids=["z"]))
    writer.write_rows([second, earliest, first])
    ids = writer.query("SELECT id FROM events ORDER BY ts, seq").rows
    assert [r[0] for r in ids] == [earliest["id"], first["id"], second["id"]]


def test_history_round_trip(writer: AuditWriter) -> None:
    original = conversation()
    rows = chat_rows("scribe", "c1", original)
    # Another conversation and another persona with the same id are not mixed in.
    rows += chat_rows("scribe", "c2", [UserMessage(text="other")])
    rows += chat_rows("critic", "c1", [UserMessage(text="other persona")])
    rows += [event_to_row(e) for e in sample_events()[2:]]  # non-message events of c1
    # Written in reverse: history orders by ts, not by insertion.
    writer.write_rows(list(reversed(rows)))
    assert writer.history("scribe", "c1") == original
    assert writer.history("scribe", "missing") == []


def test_history_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    with AuditWriter(path) as w:
        w.write_rows(chat_rows("scribe", "c1", conversation()))
    with AuditWriter(path) as w:
        assert w.history("scribe", "c1") == conversation()
        assert w.query("SELECT count(*) FROM events").rows == [(4,)]


def test_malformed_rows_are_set_aside_not_blocking(writer: AuditWriter) -> None:
    good = [event_to_row(e) for e in sample_events()]
    bad_type = event_to_row(ModelCalled(**BASE, provider="p", model="m", step=1, latency_ms=1))
    bad_type["input_tokens"] = "many"
    missing = event_to_row(TurnStarted(**BASE))
    missing["persona"] = None
    assert writer.write_rows([good[0], bad_type, *good[1:], missing]) == len(good)
    assert writer.rows_rejected == 2
    assert writer.query("SELECT count(*) FROM events").rows == [(len(good),)]
    rejected = dict(writer.query("SELECT row::JSON->>'$.id', error FROM rejected_rows").rows)
    assert rejected.keys() == {bad_type["id"], missing["id"]}
    assert "int32" in rejected[bad_type["id"]]
    assert "missing required column(s): persona" in rejected[missing["id"]]


def test_lost_connection_is_reopened(writer: AuditWriter) -> None:
    rows = [event_to_row(e) for e in sample_events()]
    assert writer._con is not None
    writer._con.close()  # as if the database had been invalidated
    with pytest.raises(duckdb.Error):
        writer.write_rows(rows)
    assert writer.write_rows(rows) == len(rows)
    assert writer.query("SELECT count(*) FROM events").rows == [(len(rows),)]


def test_failed_commit_writes_nothing_and_can_be_retried(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    rows = [event_to_row(e) for e in sample_events()]
    with AuditWriter(path) as w:
        # The file system refuses the write-ahead log (as with a full disk).
        os.mkdir(f"{path}.wal")
        with pytest.raises(duckdb.Error, match="wal"):
            w.write_rows(rows)
        os.rmdir(f"{path}.wal")
        assert w.query("SELECT count(*) FROM events").rows == [(0,)]
        assert w.write_rows(rows) == len(rows)
    assert read_only_query(path, "SELECT count(*) FROM events").rows == [(len(rows),)]


def test_closed_writer_refuses(tmp_path: Path) -> None:
    w = AuditWriter(tmp_path / "a.duckdb")
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.write_rows([event_to_row(sample_events()[0])])


# -- read-only queries ------------------------------------------------------------


def test_select_and_explain_are_allowed(writer: AuditWriter) -> None:
    writer.write_rows([event_to_row(e) for e in sample_events()])
    assert writer.query("SELECT count(*) FROM events").rows == [(7,)]
    assert writer.query("WITH k AS (SELECT kind FROM events) SELECT count(*) FROM k").rows == [(7,)]
    assert writer.query("EXPLAIN SELECT * FROM events").rows
    assert "events" in {r[0] for r in writer.query("SHOW TABLES").rows}
    assert writer.query("DESCRIBE events").rows[0][0] == "id"
    # Several reads: the last result is returned.
    assert writer.query("SELECT 1; SELECT 2 AS two").as_dicts() == [{"two": 2}]


@pytest.mark.parametrize(
    ("sql", "refused"),
    [
        ("INSERT INTO events (id) VALUES ('x')", "INSERT"),
        ("UPDATE events SET kind = 'x'", "UPDATE"),
        ("DELETE FROM events", "DELETE"),
        ("DROP TABLE events", "DROP"),
        ("CREATE TABLE t (a INT)", "CREATE"),
        ("ATTACH 'other.duckdb' AS other", "ATTACH"),
        ("COPY events TO 'out.csv'", "COPY"),
        ("PRAGMA database_size", "PRAGMA"),
        ("SET threads = 1", "SET"),
        ("CHECKPOINT", "CALL"),
        ("SELECT 1; DELETE FROM events", "DELETE"),
    ],
)
def test_writes_are_refused(writer: AuditWriter, sql: str, refused: str) -> None:
    writer.write_rows([event_to_row(e) for e in sample_events()])
    with pytest.raises(AuditQueryError, match=f"read-only.*refused {refused}"):
        writer.query(sql)
    assert writer.query("SELECT count(*) FROM events").rows == [(7,)]
    assert writer.query("SHOW TABLES").rows == [("approvals",), ("events",), ("rejected_rows",)]


@pytest.mark.parametrize(
    "sql",
    [
        # Parse as SELECT / EXPLAIN but would write: the read-only transaction stops them.
        "WITH d AS (DELETE FROM events RETURNING *) SELECT count(*) FROM d",
        "EXPLAIN ANALYZE DELETE FROM events",
    ],
)
def test_disguised_writes_are_refused(writer: AuditWriter, sql: str) -> None:
    writer.write_rows([event_to_row(e) for e in sample_events()])
    with pytest.raises(AuditQueryError, match="read-only"):
        writer.query(sql)
    assert writer.query("SELECT count(*) FROM events").rows == [(7,)]


def test_queries_cannot_touch_other_files(writer: AuditWriter, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(AuditQueryError, match="disabled"):
        writer.query(f"SELECT * FROM read_csv('{secret}')")


def test_bad_sql_reports_duckdb_message(writer: AuditWriter) -> None:
    with pytest.raises(AuditQueryError, match="nonexistent") as info:
        writer.query("SELECT * FROM nonexistent")
    assert "Catalog Error" in str(info.value)
    with pytest.raises(AuditQueryError, match="syntax error"):
        writer.query("SELEC 1")
    with pytest.raises(AuditQueryError, match="empty"):
        writer.query("  ")
    # The writer still works after failed queries.
    assert writer.write_rows([event_to_row(sample_events()[0])]) == 1


def test_read_only_query_on_closed_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    with AuditWriter(path) as w:
        w.write_rows([event_to_row(e) for e in sample_events()])
    result = read_only_query(path, "SELECT kind FROM events WHERE kind LIKE 'turn%' ORDER BY 1")
    assert result.columns == ["kind"]
    assert result.rows == [("turn_ended",), ("turn_started",)]
    with pytest.raises(AuditQueryError, match="refused DELETE"):
        read_only_query(path, "DELETE FROM events")
    with pytest.raises(AuditQueryError, match="Catalog Error"):
        read_only_query(path, "SELECT * FROM nope")
    assert read_only_query(path, "SELECT count(*) FROM events").rows == [(7,)]


def test_read_only_query_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.duckdb"
    with pytest.raises(AuditQueryError, match="no audit log at"):
        read_only_query(missing, "SELECT 1")
    assert not missing.exists()


def test_read_only_query_while_file_is_open(writer: AuditWriter) -> None:
    # In this process the writer's open connection conflicts; another process
    # would hit the file lock. Either way the error says what to do.
    with pytest.raises(AuditQueryError, match="query through the runtime"):
        read_only_query(writer.path, "SELECT 1")


# -- buffer ---------------------------------------------------------------


class Receiver:
    """A fake audit log: records batches, can be made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.fail = False
        self.calls = 0

    async def send(self, rows: list[dict[str, Any]]) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("audit log unreachable")
        self.batches.append(rows)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for b in self.batches for r in b]


def numbered(n: int, start: int = 0) -> list[TurnEvent]:
    return [TurnStarted(**BASE, message_ids=[str(i)]) for i in range(start, start + n)]


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [json.loads(r["payload"])["message_ids"][0] for r in rows]


async def until(condition: Callable[[], bool], deadline: float = 10.0) -> None:
    """Yield to the loop until ``condition()`` holds (fails after ``deadline`` s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_buffer_is_an_audit_sink() -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, interval=60)
    sink: AuditSink = buf  # used through the protocol only
    events = numbered(3)
    for e in events:
        sink.record(e)
    assert rx.rows == []  # buffered, not sent one by one
    await sink.flush()
    assert [turn_event_adapter.validate_json(r["payload"]) for r in rx.rows] == events
    assert len(rx.batches) == 1
    await buf.aclose()


@pytest.mark.parametrize("n", [1, 499, 500, 501, 1234])
async def test_buffer_batches(n: int) -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=500, interval=60)
    for e in numbered(n):
        buf.record(e)
    assert buf.events_recorded == n
    await buf.aclose()
    assert len(rx.batches) == math.ceil(n / 500)
    assert all(len(b) <= 500 for b in rx.batches)
    assert ids(rx.rows) == [str(i) for i in range(n)]
    assert buf.events_sent == n and buf.pending == 0


async def test_buffer_flushes_when_full_without_waiting_for_timer() -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=10, interval=60)
    for e in numbered(10):
        buf.record(e)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(rx.rows) == 10
    await buf.aclose()


async def test_buffer_flushes_on_interval() -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=500, interval=0.05)
    for e in numbered(3):
        buf.record(e)
    assert rx.calls == 0
    await until(lambda: bool(rx.rows))
    assert ids(rx.rows) == ["0", "1", "2"]
    assert buf.events_sent == 3
    await buf.aclose()


async def test_buffer_concurrent_flushes_send_each_row_once_in_order() -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=7, interval=60)
    for e in numbered(100):
        buf.record(e)
    await asyncio.gather(*(buf.flush() for _ in range(5)))
    assert ids(rx.rows) == [str(i) for i in range(100)]
    await buf.aclose()


async def test_buffer_send_failure_is_counted_logged_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=5, interval=60)
    rx.fail = True
    with caplog.at_level(logging.WARNING, logger="coterie.audit"):
        for e in numbered(12):
            buf.record(e)
        await buf.flush()
    # Every failed send is counted (a size-triggered flush may have failed too).
    assert buf.failures == rx.calls >= 1
    assert "audit log unreachable" in caplog.text
    assert buf.pending == 12 and buf.events_sent == 0 and rx.batches == []
    # Recorded during the outage: queued behind the failed rows.
    for e in numbered(3, start=12):
        buf.record(e)
    rx.fail = False
    await buf.flush()
    assert ids(rx.rows) == [str(i) for i in range(15)]
    assert buf.events_sent == 15 and buf.pending == 0 and buf.dropped == 0
    await buf.aclose()


async def test_buffer_failure_mid_flush_keeps_order() -> None:
    rx = Receiver()
    sent = 0

    async def flaky(rows: list[dict[str, Any]]) -> None:
        nonlocal sent
        sent += 1
        if sent == 2:  # the second batch fails
            raise ConnectionError("flaky")
        await rx.send(rows)

    # A retry goes through replay (here: the same function).
    buf = AuditBuffer(flaky, replay=flaky, max_events=4, interval=60)
    for e in numbered(10):
        buf.record(e)
    await buf.flush()  # stops at the failure (or after another flusher met it)
    await buf.flush()
    assert ids(rx.rows) == [str(i) for i in range(10)]
    assert buf.failures == 1 and sent == 4
    await buf.aclose()


async def test_buffer_timer_retries_after_failure() -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=500, interval=0.02)
    rx.fail = True
    for e in numbered(5):
        buf.record(e)
    await until(lambda: buf.failures >= 1)  # the timer's flush failed
    rx.fail = False
    # Nobody flushes but the timer (backing off, at most 5 s between tries).
    await until(lambda: buf.events_sent == 5, deadline=30)
    assert ids(rx.rows) == [str(i) for i in range(5)]
    await buf.aclose()


async def test_buffer_overflow_drops_oldest_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=10, interval=60, max_pending=50)
    rx.fail = True
    with caplog.at_level(logging.ERROR, logger="coterie.audit"):
        for e in numbered(80):
            buf.record(e)
        await buf.flush()
    assert buf.dropped == 30 and buf.pending == 50
    assert "dropped" in caplog.text and "max_pending=50" in caplog.text
    rx.fail = False
    await buf.aclose()
    # The newest 50 survive, in order; nothing else is missing silently.
    assert ids(rx.rows) == [str(i) for i in range(30, 80)]
    assert buf.events_sent + buf.dropped == buf.events_recorded


async def test_buffer_cancelled_flush_completes_its_send_once() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    got: list[dict[str, Any]] = []

    async def slow(rows: list[dict[str, Any]]) -> None:
        started.set()
        await release.wait()
        got.extend(rows)

    buf = AuditBuffer(slow, max_events=100, interval=60)
    for e in numbered(3):
        buf.record(e)
    task = asyncio.create_task(buf.flush())
    await started.wait()
    task.cancel()
    await asyncio.wait({task})
    assert task.cancelled()
    # The batch is in flight; closing waits for it instead of sending it again.
    release.set()
    await buf.aclose()
    assert ids(got) == ["0", "1", "2"]
    assert (buf.events_sent, buf.pending) == (3, 0)


async def test_buffer_aclose_reports_unsent(caplog: pytest.LogCaptureFixture) -> None:
    rx = Receiver()
    rx.fail = True
    buf = AuditBuffer(rx.send, interval=60)
    for e in numbered(2):
        buf.record(e)
    with caplog.at_level(logging.ERROR, logger="coterie.audit"):
        await buf.aclose()
    assert "closed with 2 unsent" in caplog.text
    with pytest.raises(RuntimeError, match="closed"):
        buf.record(numbered(1)[0])


def test_buffer_records_without_event_loop() -> None:
    rx = Receiver()
    buf = AuditBuffer(rx.send, max_events=2, interval=60)
    for e in numbered(5):
        buf.record(e)  # no loop: nothing scheduled, rows wait
    assert buf.pending == 5
    asyncio.run(buf.aclose())
    assert ids(rx.rows) == [str(i) for i in range(5)]
    assert len(rx.batches) == 3


async def test_buffer_into_writer_end_to_end(tmp_path: Path) -> None:
    with AuditWriter(tmp_path / "audit.duckdb") as w:

        async def send(rows: list[dict[str, Any]]) -> None:
            w.write_rows(rows)

        buf = AuditBuffer(send, max_events=3, interval=60)
        for m in conversation():
            buf.record(HistoryAppended(**BASE, message=m, ts=m.ts))
        await buf.aclose()
        assert w.history("scribe", "c1") == conversation()


# --------------------------------------------------------------------------
# Replayed batches (a restarted source resending its spool)
# --------------------------------------------------------------------------


def test_replayed_batch_skips_rows_already_written(writer: AuditWriter) -> None:
    rows = [event_to_row(e) for e in numbered(10)]
    assert writer.write_rows(rows[:6]) == 6
    # Rows 3-5 are written already; 8 and 9 come twice in the batch.
    assert writer.write_rows(rows[3:] + rows[8:], replayed=True) == 4
    assert writer.duplicates_skipped == 5
    assert writer.write_rows(rows, replayed=True) == 0
    result = writer.query("SELECT count(*), count(DISTINCT id) FROM events")
    assert result.rows == [(10, 10)]
    order = writer.query("SELECT payload FROM events ORDER BY ts, seq").rows
    assert ids([{"payload": p} for (p,) in order]) == [str(i) for i in range(10)]


def test_replayed_batch_with_a_malformed_row(writer: AuditWriter) -> None:
    rows = [event_to_row(e) for e in numbered(3)]
    writer.write_rows(rows[:1])
    bad = dict(rows[1], id="bad", ts=None)
    assert writer.write_rows([*rows, bad], replayed=True) == 2
    assert (writer.rows_rejected, writer.duplicates_skipped) == (1, 1)


def test_ordinary_batches_are_not_checked_for_duplicates(writer: AuditWriter) -> None:
    # Only replayed batches pay for the id lookup: a source sends a row again only
    # through replay (after its process was killed, or its send failed).
    rows = [event_to_row(e) for e in numbered(3)]
    writer.write_rows(rows)
    assert writer.write_rows(rows) == 3
    assert writer.query("SELECT count(DISTINCT id), count(*) FROM events").rows == [(3, 6)]


def model_called(i: int) -> ModelCalled:
    return ModelCalled(
        persona="p",
        conversation_id="c",
        turn_id="t",
        provider="x",
        model="m",
        step=1,
        latency_ms=1.0,
        input_tokens=i,
    )


async def test_flush_returns_while_new_rows_keep_arriving() -> None:
    # Each send takes a while (the log acknowledges only committed rows); a
    # source recording all the time must not keep flush() waiting forever.
    received: list[int] = []

    async def slow_send(rows: list[Row]) -> None:
        await asyncio.sleep(0.01)
        received.extend(int(r["input_tokens"]) for r in rows)

    buf = AuditBuffer(slow_send, max_events=5, interval=60)
    for i in range(20):
        buf.record(model_called(i))
    keep_recording = True

    async def recorder() -> None:
        i = 20
        while keep_recording:
            buf.record(model_called(i))
            i += 1
            await asyncio.sleep(0.001)

    task = asyncio.ensure_future(recorder())
    try:
        await asyncio.wait_for(buf.flush(), 10)
        assert received[:20] == list(range(20))  # all of what was there when asked
    finally:
        keep_recording = False
        await task
    await buf.aclose()
