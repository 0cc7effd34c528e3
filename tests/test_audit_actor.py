"""AuditLogActor on a real (local) Ray cluster."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from actors._ray import audit_buffer_for
from actors.audit import get_or_create_audit_log
from runtime.audit import AuditLogStats, event_to_row
from runtime.errors import AuditQueryError
from runtime.messages import HistoryAppended, ModelCalled, UserMessage

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


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


@pytest.fixture
def make_log(tmp_path: Path) -> Any:
    """Creates uniquely named audit log actors; kills them afterwards."""
    handles: list[Any] = []

    def make(**kwargs: Any) -> Any:
        handle = get_or_create_audit_log(
            str(tmp_path / "home" / "audit.duckdb"), name=f"audit-{uuid.uuid4().hex}", **kwargs
        )
        handles.append(handle)
        return handle

    yield make
    for handle in handles:
        ray.kill(handle)


def stats(log: Any) -> AuditLogStats:
    result: AuditLogStats = ray.get(log.stats.remote())
    return result


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def count(log: Any) -> int:
    result = ray.get(log.query.remote("SELECT count(*) FROM events"))
    return int(result.rows[0][0])


def test_append_batches_and_query_sees_them(make_log: Any) -> None:
    log = make_log(flush_interval=60)  # no timer flush: the query must flush
    for _ in range(4):
        assert ray.get(log.append.remote(rows(250))) == 250
    assert stats(log).pending == 1000
    assert count(log) == 1000
    s = stats(log)
    assert (s.rows_written, s.pending, s.write_errors) == (1000, 0, 0)
    # Buffered batches became one DuckDB write.
    assert s.batches_written == 1


def test_flush_when_flush_rows_reached(make_log: Any) -> None:
    log = make_log(flush_interval=60, flush_rows=100)
    ray.get(log.append.remote(rows(60)))
    assert stats(log).pending == 60
    ray.get(log.append.remote(rows(60)))
    s = stats(log)
    assert (s.rows_written, s.pending) == (120, 0)


def test_timer_flush(make_log: Any) -> None:
    log = make_log(flush_interval=0.2)
    ray.get(log.append.remote(rows(10)))
    assert wait_for(lambda: stats(log).rows_written == 10)
    assert stats(log).pending == 0


def test_shutdown_flushes_and_closes(make_log: Any, tmp_path: Path) -> None:
    log = make_log(flush_interval=60)
    ray.get(log.append.remote(rows(42)))
    final: AuditLogStats = ray.get(log.shutdown.remote())
    assert (final.rows_written, final.pending) == (42, 0)
    with pytest.raises(RuntimeError, match="shut down"):
        ray.get(log.append.remote(rows(1)))
    # The file is released: it can be read without the actor.
    from runtime.audit import read_only_query

    path = tmp_path / "home" / "audit.duckdb"
    assert read_only_query(path, "SELECT count(*) FROM events").rows == [(42,)]


def test_query_errors_reach_the_caller(make_log: Any) -> None:
    log = make_log()
    with pytest.raises(AuditQueryError, match="refused DELETE"):
        ray.get(log.query.remote("DELETE FROM events"))
    with pytest.raises(AuditQueryError, match="Catalog Error"):
        ray.get(log.query.remote("SELECT * FROM nope"))
    assert count(log) == 0


def test_history_after_buffered_appends(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    messages = [UserMessage(text="hi", ts=10.0), UserMessage(text="again", ts=11.0)]
    batch = [
        event_to_row(
            HistoryAppended(persona="scribe", conversation_id="c9", turn_id="t", message=m, ts=m.ts)
        )
        for m in reversed(messages)
    ]
    ray.get(log.append.remote(batch))
    assert ray.get(log.history.remote("scribe", "c9")) == messages


def test_write_error_counted_and_rows_kept_until_cause_goes_away(
    make_log: Any, tmp_path: Path
) -> None:
    log = make_log(flush_interval=60)
    assert stats(log).rows_written == 0  # the actor has created and checkpointed the file
    wal = tmp_path / "home" / "audit.duckdb.wal"
    # The file system refuses the write-ahead log, as a full or read-only disk would.
    os.mkdir(wal)
    try:
        ray.get(log.append.remote(rows(30)))
        assert ray.get(log.flush.remote()) == 0
        ray.get(log.append.remote(rows(20)))
        assert ray.get(log.flush.remote()) == 0
        s = stats(log)
        assert s.write_errors == 2
        assert s.pending == 50 and s.rows_written == 0
        assert s.last_error is not None and "wal" in s.last_error
    finally:
        os.rmdir(wal)
    assert ray.get(log.flush.remote()) == 50
    s = stats(log)
    assert (s.pending, s.rows_written, s.write_errors) == (0, 50, 2)
    tokens = ray.get(log.query.remote("SELECT input_tokens FROM events ORDER BY ts, seq")).rows
    assert [t for (t,) in tokens] == list(range(30)) + list(range(20))


def test_timer_retries_failed_write(make_log: Any, tmp_path: Path) -> None:
    log = make_log(flush_interval=0.1)
    stats(log)
    wal = tmp_path / "home" / "audit.duckdb.wal"
    os.mkdir(wal)
    try:
        ray.get(log.append.remote(rows(5)))
        assert wait_for(lambda: stats(log).write_errors >= 2)
    finally:
        os.rmdir(wal)
    assert wait_for(lambda: stats(log).rows_written == 5)
    assert stats(log).pending == 0


def test_malformed_row_does_not_block_the_log(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    good = rows(3)
    bad = dict(good[0], id="bad", input_tokens="lots")
    ray.get(log.append.remote([good[0], bad, *good[1:]]))
    assert ray.get(log.flush.remote()) == 3
    s = stats(log)
    assert (s.rows_written, s.rows_rejected, s.pending, s.write_errors) == (3, 1, 0, 0)
    rejected = ray.get(log.query.remote("SELECT row::JSON->>'$.id', error FROM rejected_rows"))
    assert rejected.rows[0][0] == "bad" and "int32" in rejected.rows[0][1]


def test_overloaded_log_refuses_and_buffer_retries(make_log: Any, tmp_path: Path) -> None:
    # max_pending is not exposed by get_or_create_audit_log: create directly.
    from actors.audit import AuditLogActor

    log = AuditLogActor.remote(  # type: ignore[attr-defined]
        str(tmp_path / "small.duckdb"), flush_interval=60, flush_rows=10_000, max_pending=100
    )
    try:
        ray.get(log.append.remote(rows(80)))
        with pytest.raises(Exception, match="unwritten rows"):
            ray.get(log.append.remote(rows(30)))
        assert stats(log).pending == 80
    finally:
        ray.kill(log)


def test_get_or_create_returns_the_same_actor(make_log: Any, tmp_path: Path) -> None:
    name = f"audit-{uuid.uuid4().hex}"
    a = get_or_create_audit_log(str(tmp_path / "a.duckdb"), name=name)
    try:
        b = get_or_create_audit_log(str(tmp_path / "other.duckdb"), name=name)
        ray.get(a.append.remote(rows(2)))
        assert stats(b).pending == 2
        assert stats(b).path == str(tmp_path / "a.duckdb")
    finally:
        ray.kill(a)


async def test_audit_buffer_into_actor(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    buf = audit_buffer_for(log, max_events=100, interval=60)
    for i in range(1050):
        buf.record(
            HistoryAppended(
                persona="scribe",
                conversation_id="c1",
                turn_id="t",
                message=UserMessage(text=str(i)),
            )
        )
    await buf.aclose()
    assert (buf.events_sent, buf.failures, buf.dropped) == (1050, 0, 0)
    history = await log.history.remote("scribe", "c1")
    assert [m.text for m in history] == [str(i) for i in range(1050)]


def test_replayed_append_skips_rows_already_written_or_pending(make_log: Any) -> None:
    log = make_log(flush_interval=60)
    batch = rows(10)
    ray.get(log.append.remote(batch[:4]))
    ray.get(log.flush.remote())
    ray.get(log.append.remote(batch[4:7]))  # the first copies of these are still pending
    # 2-3 are written, 4-6 pending: written first, then checked against.
    ray.get(log.append.remote(batch[2:], replayed=True))
    assert ray.get(log.flush.remote()) == 3 + 3
    ray.get(log.append.remote(batch, replayed=True))
    assert ray.get(log.flush.remote()) == 0
    result = ray.get(log.query.remote("SELECT count(*), count(DISTINCT id) FROM events"))
    assert result.rows == [(10, 10)]
    s = stats(log)
    assert (s.rows_written, s.duplicates_skipped, s.pending) == (10, 5 + 10, 0)


async def test_killed_persona_process_loses_no_row(make_log: Any, tmp_path: Path) -> None:
    log = make_log(flush_interval=60)
    spool = str(tmp_path / "spool" / "scribe.jsonl")

    @ray.remote(num_cpus=0)
    class Recorder:
        """Stands in for a persona actor."""

        def __init__(self, log: Any, spool: str) -> None:
            # Takes over what a killed predecessor left in the spool, if any.
            self.buffer = audit_buffer_for(log, spool_path=spool, interval=60)

        async def record(self, batch: list[dict[str, Any]]) -> None:
            for row in batch:
                self.buffer.record(ModelCalled.model_validate_json(row["payload"]))

        async def flush(self) -> int:
            await self.buffer.flush()
            return self.buffer.events_sent

    def dead(handle: Any) -> bool:
        try:
            ray.get(handle.flush.remote())
        except ray.exceptions.RayActorError:
            return True
        return False

    recorder = Recorder.remote(log, spool)  # type: ignore[attr-defined]
    ray.get(recorder.record.remote(rows(20)))
    assert ray.get(recorder.flush.remote()) == 20
    ray.get(recorder.record.remote(rows(30)))  # the next flush is 60 s away
    ray.kill(recorder)  # SIGKILLs the worker process
    assert wait_for(lambda: dead(recorder))
    # The successor: here the driver, to spare the test a ~1 s worker start; a
    # restarted Recorder runs the same line in __init__.
    successor = audit_buffer_for(log, spool_path=spool, interval=60)
    assert successor.recovered == 30
    await successor.aclose()
    assert successor.events_sent == 30
    result = await log.query.remote("SELECT count(*), count(DISTINCT id) FROM events")
    assert result.rows == [(50, 50)]
    assert not Path(spool).exists()
