"""AuditLog without Ray: acknowledged once committed, group commit, failed
writes, overload, replay, history.

The same class runs inside the AuditLog actor (tests/test_audit_actor.py and
tests/test_faults.py check it there); here it is driven directly on a real
DuckDB file. ``flush_interval=60`` keeps the log from writing by itself, so a
test decides when a write happens.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.audit import AuditLog, event_to_row, read_only_query
from coterie.runtime.audit.log import KNOWN_CONVERSATIONS_CAP
from coterie.runtime.errors import AuditOverloadedError, AuditQueryError
from coterie.runtime.messages import HistoryAppended, ModelCalled, UserMessage


def rows(n: int, *, persona: str = "scribe", conversation_id: str = "c1") -> list[dict[str, Any]]:
    return [
        event_to_row(
            ModelCalled(
                persona=persona,
                conversation_id=conversation_id,
                turn_id="t",
                provider="openai",
                model="m",
                step=1,
                latency_ms=1.0,
                input_tokens=i,
            )
        )
        for i in range(n)
    ]


def chat_rows(persona: str, conversation_id: str, *texts: str) -> list[dict[str, Any]]:
    return [
        event_to_row(
            HistoryAppended(
                persona=persona,
                conversation_id=conversation_id,
                turn_id="t",
                message=UserMessage(text=text, ts=float(i)),
                ts=float(i),
            )
        )
        for i, text in enumerate(texts, 1)
    ]


@pytest.fixture
async def make_log(tmp_path: Path) -> AsyncIterator[Callable[..., AuditLog]]:
    logs: list[AuditLog] = []

    def make(**kwargs: Any) -> AuditLog:
        log = AuditLog(str(tmp_path / "audit.duckdb"), **kwargs)
        logs.append(log)
        return log

    yield make
    for log in logs:
        await log.shutdown()


async def count(log: AuditLog) -> int:
    result = await log.query("SELECT count(*) FROM events")
    return int(result.rows[0][0])


async def eventually(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return await predicate()


def submit(log: AuditLog, batch: list[dict[str, Any]], **kw: Any) -> asyncio.Task[int]:
    """An append in flight (its caller waits for the commit)."""
    return asyncio.ensure_future(log.append(batch, **kw))


async def settle() -> None:
    """Let every ready task run until it waits on something."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_append_is_acknowledged_only_once_its_rows_are_committed(
    make_log: Any,
) -> None:
    log = make_log(flush_interval=60)
    appends = [submit(log, rows(250)) for _ in range(4)]
    await settle()
    assert not any(a.done() for a in appends)  # received, not yet written
    s = await log.stats()
    assert (s.pending, s.rows_written) == (1000, 0)
    assert await log.flush() == 1000
    assert [await a for a in appends] == [250] * 4
    s = await log.stats()
    # The four appends shared one write (group commit).
    assert (s.rows_written, s.pending, s.write_errors, s.batches_written) == (1000, 0, 0, 1)


async def test_a_query_writes_what_is_waiting_first(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    append = submit(log, rows(30))
    await settle()
    assert await count(log) == 30
    assert await append == 30


async def test_rows_are_written_soon_after_they_arrive(make_log: Any) -> None:
    log = make_log(flush_interval=0.02)
    assert await asyncio.wait_for(log.append(rows(10)), 10) == 10
    # Acknowledged means written.
    assert (await log.stats()).rows_written == 10


async def test_a_full_batch_is_written_at_once(make_log: Any) -> None:
    log = make_log(flush_interval=60, flush_rows=100)
    first = submit(log, rows(60))
    await settle()
    assert not first.done()
    second = submit(log, rows(60))  # 120 waiting: over flush_rows, no waiting for the timer
    assert await asyncio.wait_for(asyncio.gather(first, second), 10) == [60, 60]
    s = await log.stats()
    assert (s.rows_written, s.pending) == (120, 0)


async def test_shutdown_writes_what_is_waiting_and_releases_the_file(
    make_log: Any, tmp_path: Path
) -> None:
    log = make_log(flush_interval=60)
    append = submit(log, rows(42))
    await settle()
    final = await log.shutdown()
    assert (final.rows_written, final.pending) == (42, 0)
    assert await append == 42
    with pytest.raises(RuntimeError, match="shut down"):
        await log.append(rows(1))
    assert read_only_query(tmp_path / "audit.duckdb", "SELECT count(*) FROM events").rows == [(42,)]


async def test_query_errors_reach_the_caller(make_log: Any) -> None:
    log = make_log()
    with pytest.raises(AuditQueryError, match="refused DELETE"):
        await log.query("DELETE FROM events")
    with pytest.raises(AuditQueryError, match="Catalog Error"):
        await log.query("SELECT * FROM nope")
    assert await count(log) == 0


async def test_history_in_order_and_new_conversations_answered_at_once(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    chat = submit(log, list(reversed(chat_rows("scribe", "c9", "hi", "again"))))
    await settle()
    assert [m.text for m in await log.history("scribe", "c9")] == ["hi", "again"]
    await chat
    # A conversation nobody wrote to is answered from memory: nothing is written.
    other = submit(log, rows(5))
    await settle()
    assert await log.history("scribe", "never") == []
    assert (await log.stats()).pending == 5
    await log.flush()
    await other


async def test_history_of_conversations_written_before_a_restart(make_log: Any) -> None:
    first = make_log(flush_interval=0.02)
    await first.append(chat_rows("scribe", "old", "before"))
    await first.shutdown()
    second = make_log(flush_interval=60)  # learns the known conversations from the file
    assert [m.text for m in await second.history("scribe", "old")] == ["before"]


async def test_several_conversations_in_one_read_in_the_order_asked(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    chats = [
        submit(log, chat_rows("scribe", "c1", "one")),
        submit(log, chat_rows("scribe", "c2", "two", "more")),
        submit(log, chat_rows("other", "c3", "not scribe's")),
    ]
    await settle()
    # Pending rows are written first; a conversation the log never saw (or
    # another persona's) comes back empty, in its place.
    records = await log.conversations("scribe", ["c2", "new", "c3", "c1"])
    assert [[m.text for m in r.messages] for r in records] == [["two", "more"], [], [], ["one"]]
    for chat in chats:
        await chat
    assert await log.conversations("scribe", []) == []


async def test_known_conversations_are_bounded(make_log: Any) -> None:
    log = make_log(flush_interval=0.02, known_conversations_cap=2)
    for name in ("a", "b", "c"):
        await log.append(chat_rows("scribe", name, f"in {name}"))
    assert (await log.stats()).known_conversations == 2
    # "a" was forgotten; at the cap a miss is looked up, never answered [] wrongly.
    assert [m.text for m in await log.history("scribe", "a")] == ["in a"]
    assert KNOWN_CONVERSATIONS_CAP >= 10_000


async def test_a_failed_write_keeps_its_rows_in_order_and_its_appends_waiting(
    make_log: Any, tmp_path: Path
) -> None:
    log = make_log(flush_interval=60)
    wal = tmp_path / "audit.duckdb.wal"
    # The file system refuses the write-ahead log, as a full or read-only disk would.
    os.mkdir(wal)
    try:
        first = submit(log, rows(30))
        await settle()
        assert await log.flush() == 0
        second = submit(log, rows(20))
        await settle()
        assert await log.flush() == 0
        s = await log.stats()
        assert (s.write_errors, s.pending, s.rows_written) == (2, 50, 0)
        assert s.last_error is not None and "wal" in s.last_error
        assert not first.done() and not second.done()  # nothing acknowledged
    finally:
        os.rmdir(wal)
    assert await log.flush() == 50
    assert (await first, await second) == (30, 20)
    s = await log.stats()
    assert (s.pending, s.rows_written, s.write_errors) == (0, 50, 2)
    tokens = (await log.query("SELECT input_tokens FROM events ORDER BY ts, seq")).rows
    assert [t for (t,) in tokens] == list(range(30)) + list(range(20))


async def test_failed_writes_are_retried_with_backoff(make_log: Any, tmp_path: Path) -> None:
    log = make_log(flush_interval=0.02)
    wal = tmp_path / "audit.duckdb.wal"
    os.mkdir(wal)
    try:
        append = submit(log, rows(5))

        async def failed_twice() -> bool:
            return (await log.stats()).write_errors >= 2

        assert await eventually(failed_twice)
        assert not append.done()
    finally:
        os.rmdir(wal)
    assert await asyncio.wait_for(append, 30) == 5
    assert (await log.stats()).pending == 0


async def test_an_append_not_committed_in_time_fails_and_its_copy_is_written_once(
    make_log: Any, tmp_path: Path
) -> None:
    log = make_log(flush_interval=60, ack_timeout=0.2)
    wal = tmp_path / "audit.duckdb.wal"
    os.mkdir(wal)
    batch = rows(8)
    try:
        with pytest.raises(AuditOverloadedError, match=r"not committed within 0\.2 s"):
            await log.append(batch)
        await log.flush()  # fails: the rows stay queued
    finally:
        os.rmdir(wal)
    # The source kept its copy and sends it again, as a replay.
    replay = submit(log, batch, replayed=True)
    await settle()
    assert await log.flush() == 8  # the queued first copy; the replay is all duplicates
    assert await replay == 8
    result = await log.query("SELECT count(*), count(DISTINCT id) FROM events")
    assert result.rows == [(8, 8)]


async def test_malformed_row_does_not_block_the_log(make_log: Any) -> None:
    log = make_log(flush_interval=0.02)
    good = rows(3)
    bad = dict(good[0], id="bad", input_tokens="lots")
    assert await log.append([good[0], bad, *good[1:]]) == 4
    s = await log.stats()
    assert (s.rows_written, s.rows_rejected, s.pending, s.write_errors) == (3, 1, 0, 0)
    rejected = await log.query("SELECT row::JSON->>'$.id', error FROM rejected_rows")
    assert [row_id for row_id, _ in rejected.rows] == ["bad"]  # only the bad row
    assert "int32" in rejected.rows[0][1]


async def test_overloaded_log_refuses_and_keeps_what_it_has(make_log: Any) -> None:
    log = make_log(flush_interval=60, flush_rows=10_000, max_pending=100)
    waiting = submit(log, rows(80))
    await settle()
    with pytest.raises(AuditOverloadedError, match="80 unwritten rows"):
        await log.append(rows(30))
    assert (await log.stats()).pending == 80
    assert await count(log) == 80  # a query writes, and then there is room again
    assert await waiting == 80
    room = submit(log, rows(30))
    await settle()
    assert (await log.stats()).pending == 30  # taken this time
    await log.flush()
    assert await room == 30


async def test_replayed_rows_already_written_or_pending_are_skipped(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    batch = rows(10)
    written = submit(log, batch[:4])
    await settle()
    await log.flush()
    await written
    pending = submit(log, batch[4:7])  # the first copies of these are still waiting
    replay = submit(log, batch[2:], replayed=True)
    await settle()
    # 2-3 are written, 4-6 waiting: written first, then checked against.
    assert await log.flush() == 3 + 3
    assert (await pending, await replay) == (3, 8)
    again = submit(log, batch, replayed=True)
    await settle()
    assert await log.flush() == 0
    assert await again == 10
    result = await log.query("SELECT count(*), count(DISTINCT id) FROM events")
    assert result.rows == [(10, 10)]
    s = await log.stats()
    assert (s.rows_written, s.duplicates_skipped, s.pending) == (10, 5 + 10, 0)


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_interval"):
        AuditLog(str(tmp_path / "a.duckdb"), flush_interval=0)


async def test_conversation_brings_back_the_latest_todo_list(make_log: Any) -> None:
    from coterie.runtime.messages import TodoItem, TodosSet

    log = make_log(flush_interval=0.02)

    def todos(ts: float, *items: str) -> dict[str, Any]:
        return event_to_row(
            TodosSet(
                persona="scribe",
                conversation_id="c1",
                turn_id="t",
                ts=ts,
                todos=[TodoItem(content=i) for i in items],
            )
        )

    await log.append([*chat_rows("scribe", "c1", "plan it"), todos(5.0, "a", "b"), todos(6.0, "c")])
    record = await log.conversation("scribe", "c1")
    assert [m.text for m in record.messages] == ["plan it"]
    assert [t.content for t in record.todos] == ["c"]  # the latest list, not a merge
    assert (await log.conversation("scribe", "new")).todos == []
