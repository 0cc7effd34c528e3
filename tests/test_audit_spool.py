"""The audit buffer's spool: rows survive their process being killed (no Ray)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.audit import AuditBuffer, AuditWriter, Row
from coterie.runtime.errors import AuditSpoolInUseError
from coterie.runtime.messages import (
    AssistantMessage,
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
)

ROOT = Path(__file__).resolve().parent.parent
BASE = dict(persona="scribe", conversation_id="c1", turn_id="turn_1")


class Receiver:
    """A fake audit log: records batches and whether they were replayed."""

    def __init__(self) -> None:
        self.batches: list[tuple[bool, list[Row]]] = []
        self.fail = False

    async def _take(self, rows: list[Row], replayed: bool) -> None:
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("audit log unreachable")
        self.batches.append((replayed, rows))

    async def send(self, rows: list[Row]) -> None:
        await self._take(rows, False)

    async def replay(self, rows: list[Row]) -> None:
        await self._take(rows, True)

    @property
    def rows(self) -> list[Row]:
        return [r for _, b in self.batches for r in b]

    def buffer(self, spool: Path, **kwargs: Any) -> AuditBuffer:
        kwargs.setdefault("interval", 60)
        return AuditBuffer(self.send, replay=self.replay, spool_path=spool, **kwargs)


def numbered(n: int, start: int = 0) -> list[TurnEvent]:
    return [TurnStarted(**BASE, message_ids=[str(i)]) for i in range(start, start + n)]


def ids(rows: list[Row]) -> list[str]:
    return [json.loads(r["payload"])["message_ids"][0] for r in rows]


def abandon(buf: AuditBuffer) -> None:
    """What a killed process leaves behind: its spool file, nothing else."""
    for task in (buf._timer, buf._size_flush):
        if task is not None:
            task.cancel()
    assert buf._spool is not None
    buf._spool.close()  # the kernel closes it (and drops the lock) on a kill


async def until(condition: Callable[[], bool], deadline: float = 10.0) -> None:
    """Yield to the loop until ``condition()`` holds (fails after ``deadline`` s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def lines(spool: Path) -> int:
    return spool.read_bytes().count(b"\n") if spool.exists() else 0


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return tmp_path / "spool" / "scribe.jsonl"


def tricky_events() -> list[TurnEvent]:
    """One event of every kind, with text that could break a line format."""
    text = 'a\nb\r\u2028c\u2029 "quoted" ,"event": {} \x00 ünï 🎉'
    return [
        TurnStarted(**BASE, message_ids=["m1"], ts=1_700_000_000.123456),
        HistoryAppended(**BASE, message=UserMessage(text=text, ts=1000.000001)),
        HistoryAppended(
            **BASE,
            message=AssistantMessage(
                text="x", tool_calls=[ToolCall(id="call_1", name="calc", arguments={"q": text})]
            ),
        ),
        HistoryAppended(
            **BASE, message=ToolResultMessage(call_id="call_1", name="calc", content=text)
        ),
        ModelCalled(
            **BASE,
            provider="openai",
            model="gpt-x",
            step=1,
            latency_ms=0.1 + 0.2,
            input_tokens=100,
            output_tokens=7,
            error="boom",
        ),
        ToolCalled(**BASE, call_id="call_1", tool="search", arguments=text),
        ToolFinished(
            **BASE, call_id="call_1", tool="search", duration_ms=3.25, error_kind="t", result=text
        ),
        TurnEnded(**BASE, status="failed", steps=2, duration_ms=1e-7, error="model down"),
        EnvelopeEvent(
            **BASE, envelope=MessageEnvelope(recipient="scribe", conversation_id="c1", text=text)
        ),
    ]


async def test_spooled_rows_are_recovered_exactly(spool: Path) -> None:
    rx = Receiver()
    buf = rx.buffer(spool)
    for event in tricky_events():
        buf.record(event)
    # What a restarted process would find (the spool is written unbuffered).
    recovered = AuditBuffer.recover(spool)
    await buf.aclose()
    # The rows the receiver got are the ones recorded.
    assert len(rx.rows) == len(tricky_events())
    assert recovered == rx.rows  # every column, ts (a UTC datetime) included
    assert recovered[0]["ts"].microsecond == 123456


async def test_abandoned_rows_are_replayed_first_then_new_ones(spool: Path) -> None:
    first = Receiver()
    buf = first.buffer(spool)
    for e in numbered(7):
        buf.record(e)
    abandon(buf)  # killed before any flush
    assert first.batches == []

    rx = Receiver()
    buf = rx.buffer(spool, max_events=3)
    assert (buf.recovered, buf.pending) == (7, 7)
    for e in numbered(4, start=7):
        buf.record(e)
    await buf.flush()
    assert ids(rx.rows) == [str(i) for i in range(11)]
    # Recovered rows travel in replayed batches of their own.
    assert [(replayed, len(b)) for replayed, b in rx.batches] == [
        (True, 3),
        (True, 3),
        (True, 1),
        (False, 3),
        (False, 1),
    ]
    assert buf.events_sent == 11 and lines(spool) == 0
    await buf.aclose()
    assert not spool.exists()  # nothing left to recover: the spool is removed


async def test_recovered_rows_are_sent_without_waiting_for_new_ones(spool: Path) -> None:
    buf = Receiver().buffer(spool)
    for e in numbered(3):
        buf.record(e)
    abandon(buf)
    rx = Receiver()
    # Created on a running loop: the timer starts at once.
    buf = rx.buffer(spool, interval=0.01)
    await until(lambda: bool(rx.rows))
    assert ids(rx.rows) == ["0", "1", "2"] and rx.batches[0][0] is True
    await buf.aclose()


def test_torn_last_line_is_ignored_and_not_glued_to_the_next(spool: Path) -> None:
    buf = Receiver().buffer(spool)
    for e in numbered(5):
        buf.record(e)
    abandon(buf)
    whole = spool.read_bytes()
    last = whole[whole.rindex(b"\n", 0, -1) + 1 :]
    # Killed mid-write of a sixth row: half a line, no newline.
    spool.write_bytes(whole + last[: len(last) // 2])
    assert ids(AuditBuffer.recover(spool)) == [str(i) for i in range(5)]

    rx = Receiver()
    buf = rx.buffer(spool)
    assert buf.recovered == 5 and spool.read_bytes() == whole  # torn tail cut
    for e in numbered(2, start=5):
        buf.record(e)
    abandon(buf)
    assert ids(AuditBuffer.recover(spool)) == [str(i) for i in range(7)]


def test_unreadable_line_is_skipped_and_logged(
    spool: Path, caplog: pytest.LogCaptureFixture
) -> None:
    buf = Receiver().buffer(spool)
    for e in numbered(2):
        buf.record(e)
    abandon(buf)
    good = spool.read_bytes().splitlines(keepends=True)
    spool.write_bytes(good[0] + b'{"id":"x","seq":1,"event":{"nope"}\n' + good[1])
    with caplog.at_level(logging.ERROR, logger="coterie.audit"):
        buf = Receiver().buffer(spool)
    assert buf.recovered == 2 and "skipped 1 unreadable line" in caplog.text
    abandon(buf)


def test_event_of_another_version_keeps_its_common_columns(spool: Path) -> None:
    spool.parent.mkdir(parents=True)
    event = {**BASE, "kind": "turn_started", "ts": 1.5, "field_from_the_future": 1}
    payload = json.dumps(event, separators=(",", ":"))
    spool.write_text(f'{{"id":"abc","seq":4,"event":{payload}}}\n')
    (row,) = AuditBuffer.recover(spool)
    assert (row["id"], row["seq"], row["kind"], row["persona"], row["payload"]) == (
        "abc",
        4,
        "turn_started",
        "scribe",
        payload,
    )
    assert row["ts"].timestamp() == 1.5


async def test_spool_truncated_only_when_every_row_is_acknowledged(spool: Path) -> None:
    rx = Receiver()
    sends = 0
    flaky = True

    async def fails_after_first(rows: list[Row]) -> None:
        nonlocal sends
        sends += 1
        if sends > 1 and flaky:
            raise ConnectionError("flaky")
        await rx.send(rows)

    # A retry goes through replay (here: the same function).
    buf = AuditBuffer(
        fails_after_first,
        replay=fails_after_first,
        spool_path=spool,
        max_events=4,
        interval=60,
    )
    for e in numbered(10):
        buf.record(e)
    await buf.flush()  # 4 sent, then a failure: 6 wait
    assert (buf.events_sent, buf.pending, lines(spool)) == (4, 6, 10)
    flaky = False
    await buf.flush()
    assert (buf.events_sent, buf.pending, lines(spool)) == (10, 0, 0)
    assert spool.stat().st_size == 0
    # Recording goes on into the truncated spool.
    buf.record(numbered(1, start=10)[0])
    assert lines(spool) == 1
    await buf.aclose()
    assert ids(rx.rows) == [str(i) for i in range(11)]


async def test_failed_batch_is_retried_as_replayed(spool: Path) -> None:
    rx = Receiver()
    buf = rx.buffer(spool, max_events=3)
    rx.fail = True
    for e in numbered(5):
        buf.record(e)
    await buf.flush()
    rx.fail = False
    await buf.aclose()
    # The receiver may have taken the failed batch: only it is sent as replayed.
    assert [(replayed, ids(b)) for replayed, b in rx.batches] == [
        (True, ["0", "1", "2"]),
        (False, ["3", "4"]),
    ]


async def test_failed_sends_keep_the_spool(spool: Path) -> None:
    rx = Receiver()
    rx.fail = True
    buf = rx.buffer(spool, max_events=2)
    for e in numbered(5):
        buf.record(e)
    before = spool.read_bytes()
    await buf.flush()
    await buf.aclose()  # still failing: rows stay for the next start
    assert buf.failures >= 2 and spool.read_bytes() == before
    rx.fail = False
    buf = rx.buffer(spool)
    await buf.aclose()
    assert ids(rx.rows) == [str(i) for i in range(5)]
    assert all(replayed for replayed, _ in rx.batches)


async def test_second_crash_during_recovery_loses_nothing(spool: Path) -> None:
    buf = Receiver().buffer(spool)
    for e in numbered(6):
        buf.record(e)
    abandon(buf)

    # Restarted: sends one replayed batch, records more, is killed again.
    rx = Receiver()
    buf = rx.buffer(spool, max_events=4)
    for e in numbered(2, start=6):
        buf.record(e)
    first_batch = asyncio.ensure_future(buf._flush())
    while not rx.batches:
        await asyncio.sleep(0)
    first_batch.cancel()  # the kill, between two batches
    abandon(buf)
    assert ids(rx.rows) == ["0", "1", "2", "3"]

    rx = Receiver()
    buf = rx.buffer(spool)
    assert buf.recovered == 8  # the replayed batch was never acknowledged by truncation
    await buf.aclose()
    assert ids(rx.rows) == [str(i) for i in range(8)]


async def test_replay_of_rows_written_but_not_truncated_does_not_duplicate(
    spool: Path, tmp_path: Path
) -> None:
    with AuditWriter(tmp_path / "audit.duckdb") as writer:

        async def send(rows: list[Row]) -> None:
            writer.write_rows(rows)

        killed = False

        async def written_then_killed(rows: list[Row]) -> None:
            nonlocal killed
            if not killed:
                writer.write_rows(rows)
                killed = True
            raise ConnectionError("killed before the acknowledgement arrived")

        async def replay(rows: list[Row]) -> None:
            writer.write_rows(rows, replayed=True)

        buf = AuditBuffer(
            written_then_killed,
            replay=written_then_killed,
            spool_path=spool,
            max_events=5,
            interval=60,
        )
        for e in numbered(8):
            buf.record(e)
        await buf.flush()  # the first 5 are in DuckDB, all 8 still spooled
        abandon(buf)

        buf = AuditBuffer(send, replay=replay, spool_path=spool, max_events=5, interval=60)
        assert buf.recovered == 8
        for e in numbered(2, start=8):
            buf.record(e)
        await buf.aclose()
        result = writer.query(
            "SELECT count(*), count(DISTINCT id), max(n) FROM "
            "(SELECT id, count(*) OVER (PARTITION BY id) AS n FROM events)"
        )
        assert result.rows == [(10, 10, 1)]
        assert writer.duplicates_skipped == 5


def test_spool_needs_replay(spool: Path) -> None:
    with pytest.raises(ValueError, match="replay"):
        AuditBuffer(Receiver().send, spool_path=spool)


def test_one_buffer_per_spool(spool: Path) -> None:
    buf = Receiver().buffer(spool)
    with pytest.raises(AuditSpoolInUseError, match="in use"):
        Receiver().buffer(spool, spool_lock_wait=0.05)
    abandon(buf)  # the lock goes with the process
    abandon(Receiver().buffer(spool))


async def test_spool_write_error_keeps_row_in_memory_and_spool_whole(
    spool: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rx = Receiver()
    buf = rx.buffer(spool)
    buf.record(numbered(1)[0])
    real = buf._spool
    assert real is not None

    class DiskFull:
        def write(self, data: bytes) -> int:
            assert real is not None
            real.write(data[:10])  # part of the line made it to disk
            raise OSError(28, "No space left on device")

        def truncate(self, size: int) -> int:
            assert real is not None
            return real.truncate(size)

    buf._spool = DiskFull()  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR, logger="coterie.audit"):
        buf.record(numbered(1, start=1)[0])
    assert buf.spool_errors == 1 and "No space left" in caplog.text
    buf._spool = real
    buf.record(numbered(1, start=2)[0])
    # The failed row is in memory only; the spool has no broken line.
    assert ids(AuditBuffer.recover(spool)) == ["0", "2"]
    await buf.aclose()
    assert ids(rx.rows) == ["0", "1", "2"]


async def test_spool_is_compacted_during_an_outage(spool: Path) -> None:
    rx = Receiver()
    rx.fail = True
    buf = rx.buffer(spool, max_events=5, max_pending=20)
    for e in numbered(200):
        buf.record(e)
        if buf.pending % 7 == 0:
            await buf.flush()  # fails: rows pile up, the oldest are dropped
    assert buf.pending == 20 and buf.dropped == 180
    assert lines(spool) <= 2 * 20 + 1  # not every row ever recorded
    abandon(buf)
    recovered = ids(AuditBuffer.recover(spool))
    assert recovered[-20:] == [str(i) for i in range(180, 200)]
    assert recovered == sorted(recovered, key=int)


# --------------------------------------------------------------------------
# A real process, really killed
# --------------------------------------------------------------------------

CHILD = """
import asyncio, sys
from coterie.runtime.audit import AuditBuffer
from coterie.runtime.messages import TurnStarted

async def never(rows):  # the audit log is unreachable: a send that never returns
    await asyncio.Event().wait()

async def main(spool, n):
    buf = AuditBuffer(never, replay=never, spool_path=spool, max_events=10, interval=0.001)
    i = 0
    while n < 0 or i < n:
        buf.record(TurnStarted(persona="p", conversation_id="c", turn_id="t", message_ids=[str(i)]))
        i += 1
        if i == 1 or i == n:
            print("recording" if i == 1 else "done", flush=True)
        if i % 50 == 0:
            await asyncio.sleep(0)  # let the timer start a flush: its send hangs mid-turn
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def run_child(spool: Path, n: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(spool), str(n)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=5) == -signal.SIGKILL
    assert child.stdout is not None
    child.stdout.close()


async def test_sigkilled_process_loses_no_row(spool: Path) -> None:
    child = run_child(spool, 300)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "recording"
    assert child.stdout.readline().strip() == "done"
    kill(child)
    rx = Receiver()
    buf = rx.buffer(spool)
    assert buf.recovered == 300
    await buf.aclose()
    assert ids(rx.rows) == [str(i) for i in range(300)]  # each exactly once, in order
    assert all(replayed for replayed, _ in rx.batches)


def test_sigkill_while_recording_leaves_a_whole_prefix(spool: Path) -> None:
    child = run_child(spool, -1)  # records until killed, likely mid-write
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "recording"
    deadline = time.monotonic() + 10
    while lines(spool) < 1000 and time.monotonic() < deadline:
        time.sleep(0.005)
    kill(child)
    recovered = ids(AuditBuffer.recover(spool))
    # Every row whose record() returned, in order, with no gap: nothing lost.
    assert len(recovered) >= 1000
    assert recovered == [str(i) for i in range(len(recovered))]
