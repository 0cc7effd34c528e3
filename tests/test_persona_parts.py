"""The parts of a persona, each without the others and without Ray: its
conversation queues driven by a stand-in turn, and the turn builder's
settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coterie.runtime.config import RuntimeSettings, load_persona
from coterie.runtime.errors import PersonaPassivatedError, QueueFullError
from coterie.runtime.loop import TurnLoop, TurnResult
from coterie.runtime.messages import ConversationRecord, MessageEnvelope, UserMessage
from coterie.runtime.models.scripted import ScriptedModel
from coterie.runtime.persona import Batch, ConversationQueues, PersonaHost, TurnBuilder
from coterie.runtime.services import NullAudit, Services
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona


class StandInTurn:
    """A turn that records its batches; the first waits until released."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def run(self, batch: Batch) -> tuple[TurnResult, str]:
        self.batches.append(batch)
        n = len(self.batches)
        if n == 1:
            self.started.set()
            await self.release.wait()
        texts = ",".join(p.envelope.text for p in batch.answers)
        return TurnResult(text=f"turn {n}: {texts}", interrupted=batch.interrupted()), f"t{n}"


def queues(
    turn: StandInTurn, host: PersonaHost | None = None, answered: list[str] | None = None
) -> ConversationQueues:
    async def note(batch: Batch, result: TurnResult) -> None:
        if answered is not None:
            answered.append(result.text)

    return ConversationQueues(
        "solo", host=host or PersonaHost(), audit=NullAudit(), run_turn=turn.run, answered=note
    )


def env(text: str, *, source_kind: str = "user") -> MessageEnvelope:
    return MessageEnvelope(
        recipient="solo", conversation_id="solo:c", text=text, source_kind=source_kind
    )


async def test_a_message_mid_turn_interrupts_it_and_one_merged_turn_answers_all() -> None:
    turn = StandInTurn()
    answered: list[str] = []
    q = queues(turn, answered=answered)
    first = q.accept(env("one"), wait=True)
    await asyncio.wait_for(turn.started.wait(), 10)
    assert not turn.batches[0].interrupted()
    second = q.accept(env("two"), wait=True)
    assert turn.batches[0].interrupted()  # soft: the running turn is asked to stop
    turn.release.set()
    assert first.future is not None and second.future is not None
    one, two = await asyncio.wait_for(asyncio.gather(first.future, second.future), 10)
    # The interrupted turn's message is carried: the next turn answers both,
    # and appends only the one not yet in the history.
    merged = turn.batches[1]
    assert [p.envelope.text for p in merged.answers] == ["one", "two"]
    assert [p.envelope.text for p in merged.new] == ["two"]
    assert one.text == two.text == "turn 2: one,two" and one.turn_id == "t2"
    assert answered == ["turn 2: one,two"]  # the interrupted turn answered nobody
    assert not q.busy()


async def test_persona_messages_are_capped_and_people_never_refused() -> None:
    turn = StandInTurn()
    q = queues(turn, PersonaHost(settings=RuntimeSettings(max_queue=1)))
    q.accept(env("busy"), wait=False)
    await asyncio.wait_for(turn.started.wait(), 10)
    q.accept(env("from a persona", source_kind="persona"), wait=False)
    with pytest.raises(QueueFullError):
        q.accept(env("another", source_kind="persona"), wait=False)
    q.accept(env("from a person"), wait=False)
    assert q.queued() == 2
    turn.release.set()


async def test_the_queued_count_follows_messages_in_every_conversation_as_turns_take_them() -> None:
    turn = StandInTurn()
    q = queues(turn)

    def to(conversation: str, text: str) -> MessageEnvelope:
        return MessageEnvelope(recipient="solo", conversation_id=conversation, text=text)

    first = q.accept(to("solo:a", "one"), wait=True)
    await asyncio.wait_for(turn.started.wait(), 10)
    assert q.queued() == 0  # the running turn took it
    waiting = [q.accept(to("solo:a", t), wait=True) for t in ("two", "three")]
    assert q.queued() == 2
    other = q.accept(to("solo:b", "elsewhere"), wait=True)
    assert other.future is not None
    assert (await asyncio.wait_for(other.future, 10)).text == "turn 2: elsewhere"
    assert q.queued() == 2  # b's turn took only b's message
    turn.release.set()
    futures = [p.future for p in (first, *waiting) if p.future is not None]
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert q.queued() == 0 and not q.busy()


async def test_a_closed_queue_refuses_messages() -> None:
    q = queues(StandInTurn())
    q.close()
    with pytest.raises(PersonaPassivatedError):
        q.accept(env("too late"), wait=False)


async def test_a_conversation_is_read_back_once_before_its_first_turn() -> None:
    loads: list[str] = []

    async def loader(conversation_id: str) -> ConversationRecord:
        loads.append(conversation_id)
        return ConversationRecord(messages=[UserMessage(text="before the restart")])

    turn = StandInTurn()
    turn.release.set()
    q = queues(turn, PersonaHost(history=loader))
    for text in ("a", "b"):
        pending = q.accept(env(text), wait=True)
        assert pending.future is not None
        await asyncio.wait_for(pending.future, 10)
    assert loads == ["solo:c"]
    assert [b.rebuilt for b in turn.batches] == [True, False]
    restored = q.conversation("solo:c").history[0]
    assert isinstance(restored, UserMessage) and restored.text == "before the restart"


def test_turn_settings_are_built_once_and_follow_the_dotenv(tmp_path: Path) -> None:
    path = write_persona(tmp_path, "solo", scripted(access="readonly"))
    persona = load_persona(tmp_path, "solo")
    model = ScriptedModel([])
    builder = TurnBuilder(
        persona,
        loop=TurnLoop(model=model, registry=builtin_registry()),
        services=Services(),
        host=PersonaHost(cluster_addresses=frozenset({"10.0.0.1"})),
    )
    first = builder.turn_settings()
    assert (first.access, first.workspace, first.persona_dir) == (
        "readonly",
        persona.workspace,
        path,
    )
    assert first.cluster_addresses == frozenset({"10.0.0.1"}) and dict(first.secrets) == {}
    # No copy per turn: the same object while nothing changed...
    assert builder.turn_settings() is first
    # ...and a new one once the .env holds a secret (read again every turn).
    (path / ".env").write_text("TOKEN=tok-0123456789\n", encoding="utf-8")
    changed = builder.turn_settings()
    assert changed is not first and dict(changed.secrets) == {"TOKEN": "tok-0123456789"}
    assert changed.redact("a tok-0123456789 b") == "a [redacted:TOKEN] b"
    assert builder.turn_settings() is changed
