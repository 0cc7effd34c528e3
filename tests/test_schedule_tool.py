"""The remind tool end to end in one process: where it is offered, a
reminder set from a web session that fires and is delivered back there, a
cron entry's deliver target as the fired turn's origin, a deliver connector
that is not running (deliver_unavailable: no turn, a visible outcome), the
bound on what a background turn may create, and errors the model reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ActorLostError, ToolError
from coterie.runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    Origin,
    ToolResultMessage,
)
from coterie.runtime.models.scripted import ScriptedModel
from coterie.runtime.schedule import RemindRequest
from coterie.runtime.services import Services
from coterie.runtime.testing import tool_call, turn_context
from coterie.tools import builtin_registry
from coterie.tools.schedule import remind
from tests.schedule_persona_helpers import Rig, write_persona

WEB = Origin(connector="web", destination="session-1")


def calls(name: str, arguments: dict) -> AssistantMessage:
    return AssistantMessage(tool_calls=[tool_call(name, arguments)])


def ended() -> AssistantMessage:
    return calls("end_task", {"status": "ok"})


def results(model: ScriptedModel) -> list[str]:
    """The tool results the model was shown, in order."""
    seen: dict[str, str] = {}
    for request in model.requests:
        for message in request.messages:
            if isinstance(message, ToolResultMessage):
                seen[message.call_id] = message.content
    return list(seen.values())


@pytest.fixture
async def rig(tmp_path: Path):
    write_persona(tmp_path)
    r = Rig(tmp_path)
    r.open()
    yield r
    await r.s.stop()


def offered(ctx: TurnContext) -> bool:
    return "remind" in builtin_registry().visible(ctx)


def test_remind_is_offered_only_with_a_scheduler_and_not_to_subagents(rig: Rig) -> None:
    assert not offered(turn_context("hi"))
    with_scheduler = Services(scheduler=rig.s)
    for kind in ("user", "heartbeat", "cron"):
        assert offered(turn_context("hi", kind=kind, services=with_scheduler)), kind
    assert not offered(turn_context("hi", kind="subagent", services=with_scheduler))
    schema = builtin_registry().get("remind")
    assert schema is not None and "in_seconds" in json.dumps(schema.definition().parameters)


async def test_a_reminder_from_a_web_session_is_delivered_back_there(rig: Rig) -> None:
    model = ScriptedModel(
        [
            calls("remind", {"action": "remind", "prompt": "tea time", "in_seconds": 60}),
            "I will remind you.",
            calls("reply_to_origin", {"text": "Tea time!"}),
            ended(),
        ]
    )
    rt = rig.persona(model=model)
    await rig.tick()
    asked = MessageEnvelope(
        recipient="ada", conversation_id="ada:web:session-1", text="remind me", origin=WEB
    )
    await rt.handle(asked)
    assert "tea-time" in results(model)[0]
    [fire] = await rig.tick(60)
    assert fire.kind == "reminder" and fire.reply_origin == WEB
    [sent] = rig.deliveries.sent
    assert (sent.connector, sent.destination, sent.text) == ("web", "session-1", "Tea time!")
    assert sent.conversation_id == fire.conversation_id
    fired = model.requests[2]
    assert fired.context == "cron"
    assert "reply_to_origin" in fired.messages[-1].text  # type: ignore[union-attr]
    assert rig.s.store.state(fire.fire_id) == "done"


async def test_a_cron_entry_delivers_to_its_deliver_target(tmp_path: Path) -> None:
    cron = {
        "name": "digest",
        "cron": "* * * * *",
        "prompt": "the digest",
        "deliver": {"connector": "cli", "destination": "term-7"},
    }
    write_persona(tmp_path, schedules={"cron": [cron]})
    rig = Rig(tmp_path)
    rig.open()
    model = ScriptedModel([calls("reply_to_origin", {"text": "digest: nothing new"}), ended()])
    rig.persona(model=model)
    await rig.tick()
    [fire] = await rig.tick(60)
    [sent] = rig.deliveries.sent
    assert (sent.connector, sent.destination) == ("cli", "term-7")
    assert fire.conversation_id == "ada:cron:digest"
    await rig.s.stop()


async def test_a_deliver_connector_not_running_is_a_visible_failure_not_a_turn(
    tmp_path: Path,
) -> None:
    cron = {
        "name": "digest",
        "cron": "* * * * *",
        "prompt": "the digest",
        "deliver": {"connector": "telegram", "destination": "42"},
    }
    write_persona(tmp_path, schedules={"cron": [cron]})
    rig = Rig(tmp_path)
    rig.open()
    model = ScriptedModel([])
    rig.persona(model=model)
    await rig.tick()
    [fire] = await rig.tick(60)
    assert model.requests == [] and rig.audit.turns() == []
    [event] = rig.audit.schedule("deliver_unavailable")
    assert "'telegram' is not running" in (event.reason or "")
    assert "running: cli, web" in (event.reason or "")
    assert rig.audit.schedule("fired") == []  # nothing was sent
    assert rig.s.store.state(fire.fire_id) == "failed"
    [row] = (await rig.s.listing("ada")).entries
    assert row.last_outcome == "failed" and "deliver_unavailable" in (row.last_reason or "")
    # Once telegram runs, the next minute's fire goes out.
    rig.deliveries.running.append("telegram")
    model.steps.append(ended())
    await rig.tick(60)
    assert len(model.requests) == 1
    await rig.s.stop()


async def test_a_background_turn_creates_only_a_few_reminders(tmp_path: Path) -> None:
    write_persona(tmp_path, schedules={"heartbeat": {"every": "1m"}}, checklist="- plan\n")
    rig = Rig(tmp_path)
    rig.open()
    many = [
        {"action": "remind", "prompt": f"thing {i}", "in_seconds": 600, "name": f"thing-{i}"}
        for i in range(4)
    ]
    model = ScriptedModel([*(calls("remind", a) for a in many), ended()])
    rig.persona(model=model)
    await rig.tick()
    await rig.tick(60)
    said = results(model)
    assert all("thing-" in text for text in said[:3])
    assert '"error": "limit_reached"' in said[3] or '"error":"limit_reached"' in said[3]
    listing = await rig.s.listing("ada")
    assert sorted(r.name for r in listing.entries if r.kind == "reminder") == [
        "thing-0",
        "thing-1",
        "thing-2",
    ]
    await rig.s.stop()


async def test_bad_input_and_an_unreachable_scheduler_are_errors_the_model_reads(
    rig: Rig,
) -> None:
    ctx = turn_context("hi", services=Services(scheduler=rig.s), persona="ada")
    with pytest.raises(ToolError) as past:
        await remind.fn(RemindRequest(action="remind", prompt="x", at="2001-01-01T00:00:00Z"), ctx)
    assert past.value.kind == "invalid_arguments" and "at:" in str(past.value)

    class Away:
        async def remind(self, *args: object, **kwargs: object) -> object:
            raise ActorLostError("the scheduler actor is restarting")

    away = turn_context("hi", services=Services(scheduler=Away()))  # type: ignore[arg-type]
    with pytest.raises(ToolError) as lost:
        await remind.fn(RemindRequest(action="list"), away)
    assert lost.value.kind == "unavailable" and "restarting" in str(lost.value)
