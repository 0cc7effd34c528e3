"""The persona's side of the scheduler's fires, without Ray: a fire is
accepted once (a second delivery is dropped), finished with its turn's
status; a heartbeat that found nothing to do leaves the history (in memory
and when rebuilt from the audit log); light heartbeats; a heartbeat's own
model; the forced end_task on every background kind; the audit rows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime import tracing
from coterie.runtime.audit import event_to_row
from coterie.runtime.errors import ActorLostError, ModelError
from coterie.runtime.fires import fire_envelope
from coterie.runtime.loop import END_TASK_NOTE
from coterie.runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    ModelCalled,
    ScheduleEvent,
    ToolChoiceNamed,
    TurnDropped,
    UserMessage,
)
from coterie.runtime.models.scripted import FunctionModel, ScriptedModel
from coterie.runtime.persona import scheduled
from coterie.runtime.schedule import RemindRequest
from coterie.runtime.testing import tool_call
from tests.schedule_helpers import T0
from tests.schedule_persona_helpers import Rig, write_persona

CHECKLIST = "- look at the inbox\n"


def user_message() -> MessageEnvelope:
    return MessageEnvelope(recipient="ada", conversation_id="ada:api", text="hello")


def skip_now() -> AssistantMessage:
    return AssistantMessage(tool_calls=[tool_call("end_task", {"status": "skipped"})])


def end_ok() -> AssistantMessage:
    return AssistantMessage(tool_calls=[tool_call("end_task", {"status": "ok"})])


@pytest.fixture
async def rig(tmp_path: Path):
    write_persona(tmp_path, schedules={"heartbeat": {"every": "1m"}}, checklist=CHECKLIST)
    r = Rig(tmp_path)
    r.open()
    yield r
    await r.s.stop()


async def test_a_heartbeat_runs_once_and_is_finished(rig: Rig) -> None:
    model = ScriptedModel([end_ok()])
    rt = rig.persona(model=model)
    assert await rig.tick() == []  # the entry starts from now
    [fire] = await rig.tick(60)
    [request] = model.requests
    assert request.context == "heartbeat"
    seen = request.messages[-1]
    assert isinstance(seen, UserMessage) and seen.text.startswith("[scheduler] Heartbeat (")
    assert "look at the inbox" in seen.text
    assert rig.s.store.state(fire.fire_id) == "done"
    assert sorted(e.outcome for e in rig.audit.schedule()) == ["accepted", "done", "fired"]
    # The persona's events sit on the fire's conversation; the scheduler's on its log.
    [accepted], [done], [fired] = (rig.audit.schedule(o) for o in ("accepted", "done", "fired"))
    assert accepted.conversation_id == "ada:heartbeat" and accepted.fire_id == fire.fire_id
    assert done.turn_id.startswith("turn_") and fired.conversation_id == "ada:schedule"
    assert rt.turns.scheduled.accepted == 1


async def test_a_second_delivery_of_a_fire_is_dropped(rig: Rig) -> None:
    model = ScriptedModel([end_ok()])
    rig.persona(model=model)
    await rig.tick()
    [fire] = await rig.tick(60)
    # Sent again, as a restarted scheduler would: the persona drops it.
    await rig.hub.post(fire_envelope(fire))
    await rig.settle()
    assert len(model.requests) == 1
    assert len(rig.audit.turns("heartbeat")) == 1
    [dropped] = rig.audit.schedule("dropped")
    assert dropped.fire_id == fire.fire_id and "second delivery" in (dropped.reason or "")


async def test_a_fire_the_scheduler_cannot_confirm_is_dropped_and_stays_claimed(
    rig: Rig,
) -> None:
    model = ScriptedModel([end_ok()])
    rt = rig.persona(model=model)

    class Away:
        async def accept(self, fire_id: str) -> bool:
            raise ActorLostError("the scheduler is restarting")

    real = rt.services.scheduler
    rt.services.scheduler = Away()  # type: ignore[assignment]
    rt.turns.scheduled.accept_wait = 0.3  # asked again meanwhile, then given up
    await rig.tick()
    [fire] = await rig.tick(60)
    assert model.requests == []
    assert rig.s.store.state(fire.fire_id) == "claimed"  # sent again after a restart
    [dropped] = rig.audit.schedule("dropped")
    assert "could not be asked" in (dropped.reason or "")
    # The scheduler back: the recovered fire runs, once.
    rt.services.scheduler = real
    await rig.s.recover()
    await rig.settle()
    assert len(model.requests) == 1 and rig.s.store.state(fire.fire_id) == "done"


async def test_an_accept_whose_answer_was_lost_still_runs_the_fire_once(rig: Rig) -> None:
    """The scheduler records the accept and dies before answering: asked
    again, it says "already accepted" — this persona's own call — so the
    fire runs, once; a redispatch arriving meanwhile is dropped here."""
    model = ScriptedModel([end_ok()])
    rt = rig.persona(model=model)
    real = rt.services.scheduler
    assert real is not None
    calls: list[str] = []

    class Dying:
        async def accept(self, fire_id: str) -> bool:
            calls.append(fire_id)
            if len(calls) == 1:
                assert await real.accept(fire_id)  # recorded...
                # ...and while its answer is lost, the fire is sent again.
                await rig.hub.post(fire_envelope(fired[0]))
                raise ActorLostError("the scheduler died before answering")
            return await real.accept(fire_id)

        async def finish(self, *args: object, **kwargs: object) -> None:
            await real.finish(*args, **kwargs)  # type: ignore[arg-type]

    fired: list = []
    original = rig.s._dispatch

    async def keep(fire):  # type: ignore[no-untyped-def]
        fired.append(fire)
        await original(fire)

    rig.s._dispatch = keep  # type: ignore[method-assign]
    rt.services.scheduler = Dying()  # type: ignore[assignment]
    await rig.tick()
    [fire] = await rig.tick(60)
    assert len(model.requests) == 1 and calls == [fire.fire_id, fire.fire_id]
    assert rig.s.store.state(fire.fire_id) == "done"
    [dropped] = rig.audit.schedule("dropped")
    assert "accepting now" in (dropped.reason or "")


async def test_a_skipped_heartbeat_leaves_the_history_in_memory_and_on_rebuild(
    rig: Rig,
) -> None:
    # First heartbeat: does something (ok); second: finds nothing (skipped);
    # third: looks at a tool, then skips (activity: it stays).
    model = ScriptedModel(
        [
            end_ok(),
            skip_now(),
            AssistantMessage(tool_calls=[tool_call("clock")]),
            skip_now(),
        ]
    )
    rt = rig.persona(model=model)
    await rig.tick()
    await rig.tick(60)
    kept = list(rt.conversation("ada:heartbeat").history)
    assert len(kept) == 3  # the prompt, end_task's call, its result
    # The checklist changes so that the next heartbeat is not gated.
    (rig.home / "personas" / "ada" / "HEARTBEAT.md").write_text(CHECKLIST + "- and the mail\n")
    await rig.tick(60)
    assert rt.conversation("ada:heartbeat").history == kept
    [dropped] = [e for e in rig.audit.events if isinstance(e, TurnDropped)]
    assert "nothing to do" in dropped.reason
    # The audit log keeps the dropped turn's events...
    rows = rig.audit.writer.query(
        f"select count(*) from events where turn_id = '{dropped.turn_id}' and kind = 'chat_message'"
    ).rows
    assert rows == [(3,)]
    # ...and a rebuild leaves them out, as the persona did.
    rebuilt = rig.audit.writer.conversation("ada", "ada:heartbeat").messages
    assert [m.model_dump(exclude={"ts"}) for m in rebuilt] == [
        m.model_dump(exclude={"ts"}) for m in kept
    ]
    (rig.home / "personas" / "ada" / "HEARTBEAT.md").write_text(CHECKLIST + "- and the bins\n")
    await rig.tick(60)
    assert len(rt.conversation("ada:heartbeat").history) == 3 + 5  # activity: kept
    assert len([e for e in rig.audit.events if isinstance(e, TurnDropped)]) == 1


async def test_a_persona_restarted_rebuilds_without_the_skipped_heartbeat(rig: Rig) -> None:
    first = ScriptedModel([end_ok(), skip_now()])
    rig.persona(model=first)
    await rig.tick()
    await rig.tick(60)
    (rig.home / "personas" / "ada" / "HEARTBEAT.md").write_text(CHECKLIST + "- more\n")
    await rig.tick(60)
    # The persona's process restarts: a new runtime reads the log back.
    second = ScriptedModel([end_ok()])
    rig.persona(model=second)
    (rig.home / "personas" / "ada" / "HEARTBEAT.md").write_text(CHECKLIST + "- again\n")
    await rig.tick(60)
    [request] = second.requests
    texts = [m.text for m in request.messages if isinstance(m, UserMessage)]
    assert len(texts) == 2  # the first heartbeat's prompt and this one's; not the skipped one
    assert "- more" not in texts[0] and "- again" in texts[1]


async def test_a_light_heartbeat_sees_only_soul_and_checklist(tmp_path: Path) -> None:
    write_persona(
        tmp_path,
        schedules={"heartbeat": {"every": "1m", "light": True}},
        checklist=CHECKLIST,
        soul="You are Ada, terse.",
    )
    rig = Rig(tmp_path)
    rig.open()
    model = ScriptedModel([end_ok(), "plain answer"])
    rt = rig.persona(model=model)
    await rt.handle(user_message())  # an ordinary conversation beside it
    await rig.tick()
    [fire] = await rig.tick(60)
    request = model.requests[1]
    assert request.system == "You are Ada, terse."
    assert fire.conversation_id == f"ada:heartbeat:{fire.fire_id}"
    assert [m.kind for m in request.messages] == ["user"]  # a fresh conversation
    # Its conversation is forgotten once the turn ended; the other stays.
    assert rt.conversations() == 1
    await rig.s.stop()


async def test_a_heartbeat_model_is_used_for_its_turn_only_and_built_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cheap = {"provider": "scripted", "name": "cheap", "default": "cheap says hi"}
    write_persona(tmp_path, schedules={"heartbeat": {"every": "1m", "model": cheap}})
    (tmp_path / "personas" / "ada" / "HEARTBEAT.md").write_text(CHECKLIST)
    built: list[object] = []
    real_build = scheduled.build_model_or_unavailable

    def counting(config):  # type: ignore[no-untyped-def]
        built.append(config)
        return real_build(config)

    monkeypatch.setattr(scheduled, "build_model_or_unavailable", counting)
    rig = Rig(tmp_path)
    rig.open()
    own = FunctionModel(lambda r: "own model")
    rt = rig.persona(model=own)
    await rig.tick()
    await rig.tick(60)
    (tmp_path / "personas" / "ada" / "HEARTBEAT.md").write_text(CHECKLIST + "- x\n")
    await rig.tick(60)
    calls = [e for e in rig.audit.events if isinstance(e, ModelCalled)]
    assert len(rig.audit.turns("heartbeat")) == 2
    assert {c.model for c in calls} == {"cheap"} and own.requests == []
    assert len(built) == 1  # one model for both heartbeats
    # The persona's own turns keep its own model.
    reply = await rt.handle(user_message())
    assert reply.text == "own model"
    await rig.s.stop()


@pytest.mark.parametrize("kind", ["heartbeat", "cron", "reminder"])
async def test_a_background_turn_in_plain_text_gets_one_forced_end_task(
    tmp_path: Path, kind: str
) -> None:
    schedules = {"heartbeat": {"every": "1m"}} if kind == "heartbeat" else {}
    if kind == "cron":
        schedules = {"cron": [{"name": "digest", "cron": "* * * * *", "prompt": "digest"}]}
    write_persona(tmp_path, schedules=schedules, checklist=CHECKLIST)
    rig = Rig(tmp_path)
    rig.open()
    model = ScriptedModel(["All quiet.", skip_now()])
    rig.persona(model=model)
    await rig.tick()
    if kind == "reminder":
        await rig.s.remind(
            "ada",
            RemindRequest(action="remind", prompt="stretch", in_seconds=60),
            origin=None,
            background=False,
        )
    [fire] = await rig.tick(60)
    first, forced = model.requests
    assert first.context == ("heartbeat" if kind == "heartbeat" else "cron")
    assert forced.tool_choice == ToolChoiceNamed(name="end_task")
    assert [t.name for t in forced.tools] == ["end_task"] and forced.thinking is False
    note = forced.messages[-1]
    assert isinstance(note, UserMessage) and note.text == END_TASK_NOTE
    model.assert_consumed()  # exactly one forced follow-up
    assert rig.s.store.state(fire.fire_id) == "skipped"
    await rig.s.stop()


async def test_a_turn_that_fails_finishes_its_fire_as_failed(rig: Rig) -> None:
    def broken(request):
        raise ModelError("the provider is down")

    rig.persona(model=FunctionModel(broken))
    await rig.tick()
    [fire] = await rig.tick(60)
    assert rig.s.store.state(fire.fire_id) == "failed"
    [failed] = rig.audit.schedule("failed")
    assert "the provider is down" in (failed.reason or "")


async def test_a_persona_is_not_passivated_while_it_accepts_a_fire(rig: Rig) -> None:
    rt = rig.persona(model=ScriptedModel([end_ok()]))
    gate = asyncio.Event()
    real = rt.services.scheduler
    assert real is not None

    class Slow:
        async def accept(self, fire_id: str) -> bool:
            await gate.wait()
            return await real.accept(fire_id)

        async def finish(self, *args, **kwargs) -> None:
            await real.finish(*args, **kwargs)

    rt.services.scheduler = Slow()  # type: ignore[assignment]
    await rig.tick()
    rig.clock.advance(60)
    ticking = asyncio.create_task(rig.s.tick())
    while not rt.busy():
        await asyncio.sleep(0.005)
    assert await rt.close_if_idle(0) is False  # it is accepting a fire
    gate.set()
    await ticking
    await rig.settle()
    assert {e.outcome for e in rig.audit.schedule()} == {"accepted", "done", "fired"}


def test_a_schedule_event_is_a_row_that_answers_who_and_why() -> None:
    event = ScheduleEvent(
        persona="ada",
        conversation_id="ada:schedule",
        turn_id="",
        entry_kind="cron",
        name="digest",
        instant=T0,
        fire_id="fire_abc",
        outcome="deliver_unavailable",
        reason="deliver_unavailable: connector 'telegram' is not running",
    )
    row = event_to_row(event)
    assert row["kind"] == "schedule" and row["status"] == "deliver_unavailable"
    assert row["call_id"] == "fire_abc" and row["tool"] == "cron"
    assert row["error_kind"] == "deliver_unavailable"
    fired = event_to_row(event.model_copy(update={"outcome": "skipped"}))
    assert fired["error_kind"] is None


async def test_a_fire_is_a_span_and_its_turn_is_its_child(rig: Rig, spans: Any) -> None:
    rig.persona(model=ScriptedModel([end_ok()]))
    await rig.tick()
    [fire] = await rig.tick(60)
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    (sent,) = [s for s in finished if s.name == "schedule_fire heartbeat heartbeat"]
    assert sent.parent is None
    assert sent.attributes["coterie.schedule.fire_id"] == fire.fire_id
    assert sent.attributes["gen_ai.agent.name"] == "ada"
    assert sent.attributes["coterie.schedule.late"] is False
    (turn,) = [s for s in finished if s.name == "invoke_agent ada"]
    assert turn.parent is not None and turn.parent.span_id == sent.context.span_id
    assert turn.attributes["coterie.schedule.kind"] == "heartbeat"
