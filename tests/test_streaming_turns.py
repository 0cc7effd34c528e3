"""Turns that someone listens to, questions (ask_user) and the delivery tools,
without Ray: PersonaRuntime.stream, the outbox and the mailbox connectors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.config import load_persona
from coterie.runtime.connectors import ConnectorInfo, OutboundMessage
from coterie.runtime.connectors.mailbox import cli_connector, web_connector
from coterie.runtime.connectors.outbox import Outbox
from coterie.runtime.errors import ConnectorError, UnknownConnectorError
from coterie.runtime.messages import (
    AssistantMessage,
    ConversationRecord,
    MessageEnvelope,
    ModelCalled,
    ModelRequest,
    Origin,
    Question,
    QuestionSet,
    ReplyEnvelope,
    StreamItem,
    TextDelta,
    ToolCalled,
    ToolFinished,
    TurnEnded,
    TurnStarted,
    UserMessage,
)
from coterie.runtime.models.scripted import (
    FunctionModel,
    ScriptedModel,
    latest_user_text,
    tool_call,
)
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona


class Deliveries:
    """A DeliveryService over a real Outbox (what the router holds)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    async def deliver(self, message: OutboundMessage) -> None:
        self.outbox.put(message)

    async def connectors(self) -> list[ConnectorInfo]:
        return self.outbox.connectors()


def make_runtime(tmp_path: Path, model: Any, **kw: Any) -> PersonaRuntime:
    write_persona(tmp_path, "solo", scripted(description="a solo persona"))
    persona = load_persona(tmp_path, "solo")
    return PersonaRuntime(persona, model=model, registry=builtin_registry(), **kw)


def env(text: str, conv: str = "solo:test", **kw: Any) -> MessageEnvelope:
    return MessageEnvelope(recipient="solo", conversation_id=conv, text=text, **kw)


async def collect(rt: PersonaRuntime, envelope: MessageEnvelope) -> list[StreamItem]:
    return [item async for item in rt.stream(envelope)]


# -- streaming -------------------------------------------------------------------


async def test_stream_yields_deltas_tool_events_and_the_reply_last(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            AssistantMessage(
                text="let me compute",
                tool_calls=[tool_call("calculate", {"expression": "6*7"})],
            ),
            lambda r: f"The answer is {r.messages[-1].content}.",  # type: ignore[union-attr]
        ]
    )
    rt = make_runtime(tmp_path, model)
    items = await collect(rt, env("what is 6*7?"))
    kinds = [i.kind for i in items]
    assert kinds[0] == "turn_started" and kinds[-1] == "reply"
    assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("turn_ended")
    deltas = [i for i in items if isinstance(i, TextDelta)]
    by_step: dict[int, str] = {}
    for d in deltas:
        by_step[d.step] = by_step.get(d.step, "") + d.text
    # Text streams in pieces (8 characters for ScriptedModel), step by step.
    assert by_step == {1: "let me compute", 2: "The answer is 42."}
    assert len([d for d in deltas if d.step == 2]) > 1
    finished = next(i for i in items if isinstance(i, ToolFinished))
    assert finished.tool == "calculate" and finished.result == "42" and finished.error_kind is None
    assert finished.duration_ms >= 0
    reply = items[-1]
    assert isinstance(reply, ReplyEnvelope) and reply.text == "The answer is 42."
    # Every delta of the answer came before the turn ended.
    assert kinds.index("turn_ended") > max(i for i, k in enumerate(kinds) if k == "text_delta")


async def test_without_a_listener_the_model_is_not_streamed_and_nothing_changes(
    tmp_path: Path,
) -> None:
    streamed: list[int] = []

    class Both(FunctionModel):
        async def stream(self, request: ModelRequest, on_text: Any) -> Any:
            streamed.append(request.step)
            return await self.request(request)

    audit = NullAudit()
    rt = make_runtime(tmp_path, Both(lambda r: "plain"), services=Services(audit=audit))
    reply = await rt.handle(env("hi"))
    assert reply.text == "plain" and streamed == []
    assert not any(e.kind == "text_delta" for e in audit.events)
    await collect(rt, env("again"))
    assert streamed == [1]


async def test_text_deltas_are_never_audited(tmp_path: Path) -> None:
    audit = NullAudit()
    rt = make_runtime(
        tmp_path, ScriptedModel(["a fairly long answer in pieces"]), services=Services(audit=audit)
    )
    items = await collect(rt, env("hi"))
    assert any(isinstance(i, TextDelta) for i in items)
    kinds = {e.kind for e in audit.events}
    assert "text_delta" not in kinds and {"turn_started", "model_call", "turn_ended"} <= kinds


async def test_a_failed_model_call_streams_its_error_and_an_error_reply(tmp_path: Path) -> None:
    rt = make_runtime(tmp_path, ScriptedModel([]))  # no steps: the first request fails
    items = await collect(rt, env("hi"))
    call = next(i for i in items if isinstance(i, ModelCalled))
    assert call.error is not None and "has 0 steps" in call.error
    ended = next(i for i in items if isinstance(i, TurnEnded))
    assert ended.status == "error"
    reply = items[-1]
    assert isinstance(reply, ReplyEnvelope) and reply.status == "error"
    assert reply.error is not None and "has 0 steps" in reply.error


async def test_merged_turn_streams_to_every_listener(tmp_path: Path) -> None:
    gate = asyncio.Event()
    calls: list[list[str]] = []

    async def slow(request: ModelRequest) -> AssistantMessage:
        calls.append([m.text for m in request.messages if isinstance(m, UserMessage)])
        if len(calls) == 1:
            await gate.wait()  # "two" arrives meanwhile: the turn stops after its tools
            return AssistantMessage(tool_calls=[tool_call("calculate", {"expression": "1+1"})])
        return AssistantMessage(text=f"saw {latest_user_text(request)}")

    rt = make_runtime(tmp_path, FunctionModel(slow))
    first = asyncio.create_task(collect(rt, env("one")))
    while not calls:
        await asyncio.sleep(0)
    second = asyncio.create_task(collect(rt, env("two")))
    await asyncio.sleep(0)
    gate.set()
    a, b = await asyncio.gather(first, second)
    # The first listener heard the interrupted turn and the merged one.
    assert sum(isinstance(i, TurnStarted) for i in a) == 2
    assert sum(isinstance(i, TurnStarted) for i in b) == 1
    assert any(isinstance(i, ToolCalled) for i in a) and not any(
        isinstance(i, ToolCalled) for i in b
    )
    ra, rb = a[-1], b[-1]
    assert isinstance(ra, ReplyEnvelope) and isinstance(rb, ReplyEnvelope)
    assert ra.turn_id == rb.turn_id and ra.text == rb.text == "saw two"


async def test_a_listener_that_leaves_does_not_stop_the_turn(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        await gate.wait()
        return "done anyway"

    audit = NullAudit()
    rt = make_runtime(tmp_path, FunctionModel(slow), services=Services(audit=audit))
    stream = rt.stream(env("hi"))
    first = await anext(stream)
    assert first.kind == "turn_started"
    await stream.aclose()  # the client went away mid-turn
    gate.set()
    for _ in range(100):
        if any(isinstance(e, TurnEnded) for e in audit.events):
            break
        await asyncio.sleep(0.01)
    ended = [e for e in audit.events if isinstance(e, TurnEnded)]
    assert ended and ended[0].status == "ok"
    assert rt.conversation("solo:test").history[-1].text == "done anyway"  # type: ignore[union-attr]


# -- questions (ask_user) -----------------------------------------------------------


async def test_ask_user_ends_the_turn_and_the_next_message_answers(tmp_path: Path) -> None:
    audit = NullAudit()
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[
                    tool_call("ask_user", {"question": "Which city?", "buttons": ["Paris", "Oslo"]})
                ]
            ),
            lambda r: f"noted: {latest_user_text(r)}",
        ]
    )
    rt = make_runtime(tmp_path, model, services=Services(audit=audit))
    reply = await rt.handle(env("book me a trip"))
    assert reply.text == "Which city?" and reply.status == "ok"
    assert reply.question is not None and reply.question.buttons == ["Paris", "Oslo"]
    assert len(model.requests) == 1  # nothing ran after ask_user
    assert rt.conversation("solo:test").question == reply.question
    answer = await rt.handle(env("Oslo"))
    assert answer.text == 'noted: [answer to your question "Which city?"] Oslo'
    assert answer.question is None and rt.conversation("solo:test").question is None
    sets = [e for e in audit.events if isinstance(e, QuestionSet)]
    assert [s.question is not None for s in sets] == [True, False]


async def test_an_expired_question_is_named_as_such(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[tool_call("ask_user", {"question": "Go?", "expires_in_minutes": 1})]
            ),
            lambda r: latest_user_text(r),
        ]
    )
    rt = make_runtime(tmp_path, model)
    reply = await rt.handle(env("start"))
    assert reply.question is not None and reply.question.expires_at is not None
    question = rt.conversation("solo:test").question
    assert question is not None
    rt.conversation("solo:test").question = question.model_copy(update={"expires_at": 1.0})
    answer = await rt.handle(env("yes"))
    assert answer.text == '[reply after your question "Go?" expired] yes'


async def test_a_pending_question_comes_back_after_a_restart(tmp_path: Path) -> None:
    question = Question(text="Which one?", buttons=["a", "b"])

    async def loader(conversation_id: str) -> ConversationRecord:
        return ConversationRecord(
            messages=[UserMessage(text="earlier"), AssistantMessage(text="Which one?")],
            question=question,
        )

    rt = make_runtime(
        tmp_path, FunctionModel(lambda r: latest_user_text(r)), host=PersonaHost(history=loader)
    )
    answer = await rt.handle(env("b"))
    assert answer.text == '[answer to your question "Which one?"] b'


async def test_a_message_from_a_persona_does_not_answer_the_question(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            AssistantMessage(tool_calls=[tool_call("ask_user", {"question": "Sure?"})]),
            lambda r: latest_user_text(r),
        ]
    )
    rt = make_runtime(tmp_path, model)
    await rt.handle(env("go"))
    reply = await rt.handle(env("hello", sender="other", source_kind="persona"))
    assert reply.text == "[message from persona other] hello"
    assert rt.conversation("solo:test").question is not None


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ({"question": "Q", "buttons": [""]}, "1 to 64 characters"),
        ({"question": "Q", "buttons": ["x" * 65]}, "1 to 64 characters"),
        ({"question": ""}, "at least 1 character"),
    ],
)
async def test_ask_user_bad_arguments_are_errors_and_the_turn_goes_on(
    tmp_path: Path, arguments: dict[str, Any], detail: str
) -> None:
    model = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("ask_user", arguments)]), "carried on"]
    )
    rt = make_runtime(tmp_path, model)
    reply = await rt.handle(env("go"))
    assert reply.text == "carried on" and reply.question is None
    result = json.loads(model.requests[1].messages[-1].content)  # type: ignore[union-attr]
    assert result["error"] == "invalid_arguments" and detail in json.dumps(result["detail"])


# -- send_message and reply_to_origin ----------------------------------------------


def web_outbox() -> Outbox:
    outbox = Outbox()
    outbox.register([ConnectorInfo(id="web", capabilities=["text", "buttons"])])
    return outbox


async def test_reply_to_origin_goes_back_once(tmp_path: Path) -> None:
    outbox = web_outbox()
    model = ScriptedModel(
        [
            AssistantMessage(tool_calls=[tool_call("reply_to_origin", {"text": "working on it"})]),
            AssistantMessage(tool_calls=[tool_call("reply_to_origin", {"text": "again"})]),
            "all done",
        ]
    )
    rt = make_runtime(tmp_path, model)
    rt.services.deliveries = Deliveries(outbox)
    origin = Origin(connector="web", destination="tab-1")
    reply = await rt.handle(env("long job", origin=origin))
    assert reply.text == "all done"
    sent = await outbox.take("web", 0)
    assert [(m.destination, m.text, m.persona) for m in sent] == [
        ("tab-1", "working on it", "solo")
    ]
    second = json.loads(model.requests[2].messages[-1].content)  # type: ignore[union-attr]
    assert second["error"] == "already_replied"


async def test_reply_to_origin_from_the_api_has_no_origin(tmp_path: Path) -> None:
    model = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("reply_to_origin", {"text": "x"})]), "ok"]
    )
    rt = make_runtime(tmp_path, model)
    rt.services.deliveries = Deliveries(web_outbox())
    await rt.handle(env("hi"))
    result = json.loads(model.requests[1].messages[-1].content)  # type: ignore[union-attr]
    assert result["error"] == "no_origin" and "'api'" in result["detail"]


async def test_send_message_to_a_connector_and_to_one_not_running(tmp_path: Path) -> None:
    outbox = web_outbox()
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[
                    tool_call(
                        "send_message", {"connector": "web", "destination": "s1", "text": "hi"}
                    ),
                    tool_call(
                        "send_message",
                        {"connector": "telegram", "destination": "42", "text": "hi"},
                    ),
                ]
            ),
            "sent",
        ]
    )
    rt = make_runtime(tmp_path, model)
    rt.services.deliveries = Deliveries(outbox)
    await rt.handle(env("tell them"))
    results = [
        json.loads(m.content) if m.content.startswith("{") else m.content
        for m in model.requests[1].messages[-2:]
    ]  # type: ignore[union-attr]
    assert "queued for web:s1" in results[0]
    assert results[1]["error"] == "unknown_connector" and "running: web" in results[1]["detail"]
    assert [m.text for m in await outbox.take("web", 0)] == ["hi"]


async def test_delivery_tools_are_not_offered_without_deliveries(tmp_path: Path) -> None:
    model = FunctionModel(lambda r: "ok")
    rt = make_runtime(tmp_path, model)
    await rt.handle(env("hi"))
    offered = {t.name for t in model.requests[0].tools}
    assert "send_message" not in offered and "reply_to_origin" not in offered
    assert "ask_user" in offered  # asking needs no connector: the reply carries it


async def test_sent_text_is_redacted(tmp_path: Path) -> None:
    (tmp_path / "personas" / "solo").mkdir(parents=True, exist_ok=True)
    outbox = web_outbox()
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[
                    tool_call(
                        "send_message",
                        {"connector": "web", "destination": "s", "text": "key sk-secret-123456"},
                    )
                ]
            ),
            "ok",
        ]
    )
    rt = make_runtime(tmp_path, model)
    (tmp_path / "personas" / "solo" / ".env").write_text("API_KEY=sk-secret-123456\n")
    rt.services.deliveries = Deliveries(outbox)
    await rt.handle(env("go"))
    [message] = await outbox.take("web", 0)
    assert "sk-secret" not in message.text and "[redacted:API_KEY]" in message.text


# -- the outbox and the mailboxes -----------------------------------------------------


def out(connector: str = "web", destination: str = "d", text: str = "t") -> OutboundMessage:
    return OutboundMessage(
        connector=connector, destination=destination, text=text, persona="p", conversation_id="c"
    )


async def test_outbox_lease_expires_without_takes() -> None:
    now = [0.0]
    outbox = Outbox(lease=60, clock=lambda: now[0])
    outbox.register([ConnectorInfo(id="web")])
    outbox.put(out())
    now[0] = 59
    assert [c.id for c in outbox.connectors()] == ["web"]
    assert len(await outbox.take("web", 0)) == 1  # renews the lease
    now[0] = 118
    outbox.put(out())
    now[0] = 200
    assert outbox.connectors() == []
    with pytest.raises(UnknownConnectorError, match="no connector 'web' is running"):
        outbox.put(out())


async def test_outbox_refuses_when_full_and_take_waits_for_a_message() -> None:
    outbox = Outbox(max_queued=2)
    outbox.register([ConnectorInfo(id="web")])
    outbox.put(out(text="1"))
    outbox.put(out(text="2"))
    with pytest.raises(ConnectorError, match="2 messages waiting"):
        outbox.put(out(text="3"))
    assert [m.text for m in await outbox.take("web", 0)] == ["1", "2"]
    waiter = asyncio.create_task(outbox.take("web", 30))
    await asyncio.sleep(0)
    assert not waiter.done()
    outbox.put(out(text="late"))
    assert [m.text for m in await asyncio.wait_for(waiter, 5)] == ["late"]
    assert await outbox.take("web", 0.01) == []
    with pytest.raises(ConnectorError, match="not registered"):
        await outbox.take("nope", 0)


async def test_outbox_unregister_wakes_a_take() -> None:
    outbox = Outbox()
    outbox.register([ConnectorInfo(id="web")])
    waiter = asyncio.create_task(outbox.take("web", 30))
    await asyncio.sleep(0)
    outbox.unregister(["web"])
    assert await asyncio.wait_for(waiter, 5) == []
    with pytest.raises(UnknownConnectorError):
        outbox.put(out())


async def test_mailbox_keeps_messages_per_session_bounded() -> None:
    box = web_connector()
    box.size = 3
    for i in range(5):
        await box.send(out(destination="a", text=str(i)))
    await box.send(out(destination="b", text="other"))
    assert [m.text for m in await box.take("a", 0)] == ["2", "3", "4"]
    assert await box.take("a", 0) == []
    assert [m.text for m in await box.take("b", 0)] == ["other"]
    waiter = asyncio.create_task(box.take("a", 30))
    await asyncio.sleep(0)
    await box.send(out(destination="a", text="now"))
    assert [m.text for m in await asyncio.wait_for(waiter, 5)] == ["now"]
    assert cli_connector().capabilities == frozenset({"text"})


async def test_mailbox_receive_ends_when_closed() -> None:
    box = cli_connector()
    received = asyncio.create_task(anext(box.receive(), None))
    await asyncio.sleep(0)
    assert not received.done()
    await box.aclose()
    assert await asyncio.wait_for(received, 5) is None
