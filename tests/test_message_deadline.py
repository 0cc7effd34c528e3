"""A message's deadline: once it has passed, no turn starts on the message.

``ask_persona`` sets it to the end of its wait: an ask that timed out has a
caller who no longer listens, so answering it would spend a turn (model calls,
tool effects) for nobody. A caller still waiting hears why instead.
"""

from __future__ import annotations

import asyncio
import time

from coterie.runtime.messages import MessageEnvelope
from tests.test_persona_parts import StandInTurn, queues


def env(text: str, *, deadline: float | None = None) -> MessageEnvelope:
    return MessageEnvelope(
        recipient="solo",
        conversation_id="solo:c",
        text=text,
        source_kind="persona",
        sender="ada",
        deadline=deadline,
    )


async def test_a_message_that_expires_in_the_queue_is_not_started() -> None:
    turn = StandInTurn()
    q = queues(turn)
    first = q.accept(env("one"), wait=True)
    await asyncio.wait_for(turn.started.wait(), 10)
    stale = q.accept(env("two", deadline=time.time() + 0.05), wait=True)
    fresh = q.accept(env("three", deadline=time.time() + 60), wait=True)
    await asyncio.sleep(0.1)  # "two" expires while the first turn runs
    turn.release.set()
    assert first.future and stale.future and fresh.future
    one, two, three = await asyncio.wait_for(
        asyncio.gather(first.future, stale.future, fresh.future), 10
    )
    # The interrupted turn and the live message get one merged turn; the
    # expired one never enters a turn, and its caller hears why.
    assert [p.envelope.text for b in turn.batches for p in b.new] == ["one", "three"]
    assert one.text == three.text == "turn 2: one,three"
    assert two.status == "error" and two.reply_to == stale.envelope.id
    assert two.error is not None and "expired before solo started a turn" in two.error
    assert not q.busy()


async def test_a_message_past_its_deadline_on_arrival_starts_no_turn() -> None:
    turn = StandInTurn()
    turn.release.set()
    q = queues(turn)
    late = q.accept(env("late", deadline=time.time() - 1), wait=True)
    assert late.future is not None
    reply = await asyncio.wait_for(late.future, 10)
    assert reply.status == "error" and "expired" in (reply.error or "")
    assert turn.batches == []
    # The conversation goes on: the next message gets its turn.
    on_time = q.accept(env("on time", deadline=time.time() + 60), wait=True)
    assert on_time.future is not None
    assert (await asyncio.wait_for(on_time.future, 10)).text == "turn 1: on time"
