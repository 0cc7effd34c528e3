"""ConversationLoader without Ray: a persona's reads of its conversations
from the audit log, coalesced, flushing its buffer only when it must.

The Persona actor loads every conversation it does not hold through one of
these (tests/test_actors.py rebuilds conversations through it after a
restart); here the log is a real AuditLog on a DuckDB file, or a fake read
where a test needs to hold one open.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.audit import AuditBuffer, AuditLog, ConversationLoader, event_to_row
from coterie.runtime.audit.rows import HISTORY_KINDS
from coterie.runtime.errors import CoterieError
from coterie.runtime.messages import (
    ConversationRecord,
    EnvelopeEvent,
    HistoryAppended,
    MessageEnvelope,
    TurnStarted,
    UserMessage,
)


def said(conversation_id: str, text: str) -> HistoryAppended:
    return HistoryAppended(
        persona="scribe",
        conversation_id=conversation_id,
        turn_id="t",
        message=UserMessage(text=text),
    )


opening = MessageEnvelope(recipient="scribe", conversation_id="new", text="hello")


def texts(record: ConversationRecord) -> list[str]:
    return [m.text for m in record.messages]  # type: ignore[union-attr]


class HeldReads:
    """A fetch whose reads wait until the test lets them go."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.gates: list[asyncio.Event] = []
        self.fail: Exception | None = None
        self.short = False

    async def __call__(self, ids: list[str]) -> list[ConversationRecord]:
        self.asked.append(list(ids))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.fail is not None:
            raise self.fail
        records = [ConversationRecord(messages=[UserMessage(text=f"in {i}")]) for i in ids]
        return records[:-1] if self.short else records

    async def release(self) -> None:
        while not self.gates:
            await asyncio.sleep(0)
        self.gates.pop(0).set()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def nothing(rows: list[dict[str, Any]]) -> None:
    return None


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[AuditLog]:
    audit = AuditLog(str(tmp_path / "audit.duckdb"), flush_interval=0.02)
    yield audit
    await audit.shutdown()


async def test_loads_that_wait_together_share_one_read(log: AuditLog) -> None:
    await log.append([row for c in ("a", "b", "c") for row in rows_of(said(c, f"hi {c}"))])
    reads: list[list[str]] = []

    async def fetch(ids: list[str]) -> list[ConversationRecord]:
        reads.append(list(ids))
        return await log.conversations("scribe", ids)

    loader = ConversationLoader(fetch, AuditBuffer(nothing))
    first = asyncio.create_task(loader.load("a"))
    await settle()  # its read is under way...
    others = [asyncio.create_task(loader.load(c)) for c in ("c", "new", "b")]
    records = [await first, *[await t for t in others]]
    # ...and the three that came meanwhile went in the next one, together.
    assert reads == [["a"], ["c", "new", "b"]]
    assert loader.reads == 2
    assert [texts(r) for r in records] == [["hi a"], ["hi c"], [], ["hi b"]]


def rows_of(*events: HistoryAppended) -> list[dict[str, Any]]:
    return [event_to_row(e) for e in events]


async def test_a_read_carries_at_most_max_batch_conversations() -> None:
    reads = HeldReads()
    loader = ConversationLoader(reads, AuditBuffer(nothing), max_batch=2)
    loads = [asyncio.create_task(loader.load(f"c{i}")) for i in range(5)]
    for _ in range(3):
        await reads.release()
    assert [texts(await t) for t in loads] == [[f"in c{i}"] for i in range(5)]
    assert reads.asked == [["c0", "c1"], ["c2", "c3"], ["c4"]]
    with pytest.raises(ValueError, match="max_batch"):
        ConversationLoader(reads, AuditBuffer(nothing), max_batch=0)


async def test_only_a_conversation_whose_history_is_buffered_is_flushed_first(
    log: AuditLog,
) -> None:
    sent: list[list[str]] = []

    async def send(rows: list[dict[str, Any]]) -> None:
        sent.append([r["conversation_id"] for r in rows])
        await log.append(rows)

    buffer = AuditBuffer(send, interval=3600)
    buffer.record(said("dropped", "still on its way"))
    buffer.record(said("busy", "in another conversation"))
    # A new conversation's first rows (the message coming in, its turn
    # starting) are not what it is rebuilt from.
    buffer.record(
        EnvelopeEvent(persona="scribe", conversation_id="new", turn_id="", envelope=opening)
    )
    buffer.record(TurnStarted(persona="scribe", conversation_id="new", turn_id="t1"))
    loader = ConversationLoader(lambda ids: log.conversations("scribe", ids), buffer)
    # So it is read at once, and nothing is sent (no wait for a commit).
    assert texts(await loader.load("new")) == []
    assert sent == []
    # One whose rows are still buffered: they reach the log before the read.
    assert texts(await loader.load("dropped")) == ["still on its way"]
    assert sent == [["dropped", "busy", "new", "new"]]
    assert buffer.pending == 0 and not buffer.holds_history("busy")
    await buffer.aclose()


async def test_holds_history_follows_every_row_in_and_out(tmp_path: Path) -> None:
    """holds_history is kept as a count per conversation; it must say what a
    scan of the unacknowledged rows (waiting or in flight) says, through
    sends that succeed or fail, drops over max_pending, a close that leaves
    rows in the spool and the next buffer's recovery of them."""
    rng = random.Random(1313)
    conversations = [f"c{i}" for i in range(4)]
    failing = False
    gate = asyncio.Event()
    gate.set()

    async def send(rows: list[dict[str, Any]]) -> None:
        await gate.wait()
        if failing:
            raise ConnectionError("the log is away")

    def check(buffer: AuditBuffer) -> None:
        unacknowledged = [*buffer._inflight, *buffer._rows]
        for c in conversations:
            scanned = any(
                r["conversation_id"] == c and r["kind"] in HISTORY_KINDS for r in unacknowledged
            )
            assert buffer.holds_history(c) == scanned, (c, [r["kind"] for r in unacknowledged])

    spool = tmp_path / "scribe.spool"
    checked = {"held": 0, "in_flight": 0, "dropped": 0, "recovered": 0}
    for _ in range(3):  # each round ends with a close; the next recovers its spool
        buffer = AuditBuffer(
            send, replay=send, spool_path=spool, interval=3600, max_events=3, max_pending=8
        )
        checked["recovered"] += buffer.pending
        check(buffer)
        for _ in range(150):
            action = rng.random()
            c = rng.choice(conversations)
            if action < 0.45:
                buffer.record(said(c, "hi"))
            elif action < 0.7:
                buffer.record(TurnStarted(persona="scribe", conversation_id=c, turn_id="t"))
            elif action < 0.85:
                failing = rng.random() < 0.4
                await buffer.flush()
            else:  # a send held open: its batch is in flight
                failing = rng.random() < 0.4
                gate.clear()
                flushing = asyncio.create_task(buffer.flush())
                await settle()
                checked["in_flight"] += bool(buffer._inflight)
                check(buffer)
                gate.set()
                await flushing
            check(buffer)
            checked["held"] += any(buffer.holds_history(c) for c in conversations)
        checked["dropped"] = buffer.dropped
        failing = True  # the close cannot send: what is left stays in the spool
        await buffer.aclose()
    # The walk went through every case it is meant to check.
    assert all(checked.values()), checked


async def test_the_batch_being_sent_counts_as_held() -> None:
    release = asyncio.Event()
    sent: list[int] = []

    async def slow_send(rows: list[dict[str, Any]]) -> None:
        await release.wait()
        sent.append(len(rows))

    buffer = AuditBuffer(slow_send, interval=3600)
    buffer.record(said("c1", "hello"))
    flushing = asyncio.create_task(buffer.flush())
    await settle()
    assert buffer.pending == 0 and buffer.holds_history("c1")  # in flight, not acknowledged
    release.set()
    await flushing
    assert sent == [1] and not buffer.holds_history("c1")
    await buffer.aclose()


async def test_a_failed_read_fails_the_loads_it_carried_and_the_next_reads_again() -> None:
    reads = HeldReads()
    loader = ConversationLoader(reads, AuditBuffer(nothing))
    reads.fail = CoterieError("audit log unreachable")
    first = asyncio.create_task(loader.load("a"))
    await settle()
    second = asyncio.create_task(loader.load("b"))
    await reads.release()
    with pytest.raises(CoterieError, match="unreachable"):
        await first
    reads.fail = None
    await reads.release()
    assert texts(await second) == ["in b"]  # its read came after, and worked
    again = asyncio.create_task(loader.load("a"))
    await reads.release()
    assert texts(await again) == ["in a"]
    assert reads.asked == [["a"], ["b"], ["a"]]


async def test_an_answer_of_the_wrong_length_is_an_error_naming_it() -> None:
    reads = HeldReads()
    reads.short = True
    loader = ConversationLoader(reads, AuditBuffer(nothing))
    loads = [asyncio.create_task(loader.load(c)) for c in ("a", "b")]
    await reads.release()
    for load in loads:
        with pytest.raises(CoterieError, match=r"answered 1 conversation\(s\) for 2 asked"):
            await load


async def test_a_cancelled_load_leaves_the_read_to_the_others() -> None:
    reads = HeldReads()
    loader = ConversationLoader(reads, AuditBuffer(nothing))
    gone = asyncio.create_task(loader.load("a"))
    kept = asyncio.create_task(loader.load("b"))
    await settle()
    gone.cancel()
    await reads.release()
    assert texts(await kept) == ["in b"]
    assert gone.cancelled()
    assert reads.asked == [["a", "b"]]


async def test_loads_waiting_when_the_reader_is_cancelled_are_cancelled_too() -> None:
    reads = HeldReads()
    loader = ConversationLoader(reads, AuditBuffer(nothing))
    first = asyncio.create_task(loader.load("a"))
    await settle()
    waiting = asyncio.create_task(loader.load("b"))
    await settle()
    reader = loader._reader
    assert reader is not None
    reader.cancel()
    for load in (first, waiting):
        with pytest.raises(asyncio.CancelledError):
            await load
    # A later load starts a new reader.
    reads.gates.clear()  # the cancelled read's
    later = asyncio.create_task(loader.load("c"))
    await reads.release()
    assert texts(await later) == ["in c"]
