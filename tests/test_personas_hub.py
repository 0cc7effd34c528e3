"""Persona-to-persona messaging without Ray (LocalHub): every rule of the tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from coterie.runtime.config import RuntimeSettings, load_persona
from coterie.runtime.errors import QueueFullError
from coterie.runtime.hub import LocalHub
from coterie.runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models.scripted import (
    FunctionModel,
    ScriptedModel,
    latest_user_text,
    tool_call,
)
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.tools import builtin_registry
from tests.helpers import make_ctx, scripted, write_persona

Model = FunctionModel | ScriptedModel


def build(tmp_path: Path, models: dict[str, Model], *, max_queue: int = 256) -> LocalHub:
    hub = LocalHub()
    settings = RuntimeSettings(max_queue=max_queue)
    for name in models:
        write_persona(tmp_path, name, scripted(description=f"the {name} persona"))
    personas = [load_persona(tmp_path, name) for name in models]
    host = PersonaHost(
        settings=settings,
        roster=sorted((p.name, p.config.description) for p in personas),
    )
    for persona in personas:
        model = models[persona.name]
        hub.add(PersonaRuntime(persona, model=model, registry=builtin_registry(), host=host))
    assert hub.roster() == list(host.roster)
    return hub


def user(to: str, text: str, conv: str | None = None) -> MessageEnvelope:
    return MessageEnvelope(recipient=to, conversation_id=conv or f"{to}:test", text=text)


def results(model: Model, index: int = -1) -> list[ToolResultMessage]:
    return [m for m in model.requests[index].messages if isinstance(m, ToolResultMessage)]


def echo_model(prefix: str) -> FunctionModel:
    return FunctionModel(lambda r: f"{prefix}: {latest_user_text(r)}")


async def until(condition: Callable[[], bool], deadline: float = 30.0) -> None:
    """Yield to the loop until ``condition()`` holds (fails after ``deadline`` s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def all_idle(hub: LocalHub) -> bool:
    """No persona has a turn running or a message waiting."""
    return not any(p.busy() for p in hub.personas.values())


async def test_ask_round_trip_and_thread_persists(tmp_path: Path) -> None:
    a = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[tool_call("ask_persona", {"persona": "b", "text": "one"})]
            ),
            "first done",
            AssistantMessage(
                tool_calls=[tool_call("ask_persona", {"persona": "b", "text": "two"})]
            ),
            "second done",
        ]
    )
    b = FunctionModel(lambda r: f"b saw {sum(isinstance(m, UserMessage) for m in r.messages)}")
    hub = build(tmp_path, {"a": a, "b": b})
    assert (await hub.personas["a"].handle(user("a", "go"))).text == "first done"
    assert results(a)[-1].content == "b saw 1"
    await hub.personas["a"].handle(user("a", "again"))
    # The follow-up lands in the same inbox conversation and sees the first exchange.
    assert results(a)[-1].content == "b saw 2"
    inbox = hub.personas["b"].conversation("b:inbox:a").history
    assert [m.kind for m in inbox] == ["user", "assistant", "user", "assistant"]
    assert isinstance(inbox[0], UserMessage) and inbox[0].source == "a"
    assert inbox[0].text == "[message from persona a] one"


async def test_send_returns_at_once_and_reply_is_mirrored(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def slow_b(request: ModelRequest) -> str:
        await gate.wait()
        return "b's answer"

    a = FunctionModel(
        lambda r: (
            AssistantMessage(
                tool_calls=[tool_call("send_to_persona", {"persona": "b", "text": "hello"})]
            )
            if r.step == 1 and "go" in latest_user_text(r)
            else f"a heard: {latest_user_text(r)}"
        )
    )
    hub = build(tmp_path, {"a": a, "b": FunctionModel(slow_b)})
    # b's turn waits on the gate: a's turn can only end if the send did not wait.
    reply = await asyncio.wait_for(hub.personas["a"].handle(user("a", "go")), 30)
    assert results(a)[-1].content == "posted to b:inbox:a"
    assert reply.text == "a heard: go"
    assert hub.personas["b"].busy()  # its turn is still waiting on the gate
    assert hub.personas["a"].conversation("a:inbox:b").history == []
    gate.set()
    # The mirror wakes a in a:inbox:b; once nobody is busy, every turn it
    # caused (and any mirror of a mirror) has run.
    await until(lambda: all_idle(hub))
    thread = hub.personas["a"].conversation("a:inbox:b").history
    assert [m.kind for m in thread] == ["user", "assistant"]
    assert isinstance(thread[0], UserMessage)
    assert thread[0].text == "[message from persona b] b's answer"
    # a's reply to the mirror is not mirrored back: b's inbox has one exchange.
    assert [m.kind for m in hub.personas["b"].conversation("b:inbox:a").history] == [
        "user",
        "assistant",
    ]


async def test_skipped_ends_thread_without_mirror(tmp_path: Path) -> None:
    b = ScriptedModel(
        [AssistantMessage(text="nah", tool_calls=[tool_call("end_task", {"status": "skipped"})])]
    )
    hub = build(tmp_path, {"a": echo_model("a"), "b": b})
    env = MessageEnvelope(
        sender="a",
        recipient="b",
        conversation_id="b:inbox:a",
        text="anything?",
        source_kind="persona",
        reply_mode="mirror",
    )
    await hub.post(env)
    # b's worker posts any mirror before it ends: once b and a are both idle,
    # a mirror would have been posted and answered.
    await until(lambda: all_idle(hub))
    b.assert_consumed()
    assert [m.kind for m in hub.personas["b"].conversation("b:inbox:a").history] == [
        "user",
        "assistant",
        "tool_result",  # end_task(skipped)
    ]
    assert hub.personas["a"].conversation("a:inbox:b").history == []


async def test_ask_timeout_is_readable_and_target_finishes(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        await gate.wait()  # answers only once the test lets it
        return "late"

    a = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[
                    tool_call("ask_persona", {"persona": "b", "text": "x", "timeout_ms": 1000})
                ]
            ),
            "gave up",
        ]
    )
    hub = build(tmp_path, {"a": a, "b": FunctionModel(slow)})
    # b cannot answer before the gate opens: a's turn ends on the 1 s timeout.
    reply = await asyncio.wait_for(hub.personas["a"].handle(user("a", "go")), 30)
    assert reply.text == "gave up"
    a.assert_consumed()
    body = json.loads(results(a)[-1].content)
    assert body["error"] == "timeout" and "within 1 s" in body["detail"]
    # The target's turn was not cancelled: it is still running, and finishes.
    b = hub.personas["b"]
    assert b.busy()
    gate.set()
    await until(lambda: not b.busy())
    last = b.conversation("b:inbox:a").history[-1]
    assert isinstance(last, AssistantMessage) and last.text == "late"


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ({"persona": "a", "text": "me?"}, "invalid_target"),
        ({"persona": "zed", "text": "hi"}, "unknown_persona"),
        ({"persona": "b", "text": "hi", "timeout_ms": 700_000}, "invalid_arguments"),
        ({"persona": "b", "text": ""}, "invalid_arguments"),
    ],
)
async def test_bad_targets_and_arguments(
    tmp_path: Path, args: dict[str, object], kind: str
) -> None:
    a = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[tool_call("ask_persona", args), tool_call("send_to_persona", args)]
            ),
            "ok",
        ]
    )
    hub = build(tmp_path, {"a": a, "b": echo_model("b")})
    await hub.personas["a"].handle(user("a", "go"))
    a.assert_consumed()
    errors = [(r.name, json.loads(r.content)["error"]) for r in results(a)]
    assert errors == [("ask_persona", kind), ("send_to_persona", kind)]
    # Nothing reached b.
    assert all_idle(hub) and hub.personas["b"].conversation("b:inbox:a").history == []


async def test_tools_hidden_with_one_persona_and_in_subagents(tmp_path: Path) -> None:
    reg = builtin_registry()
    hub = build(tmp_path, {"solo": echo_model("s")})
    solo = make_ctx(persona="solo", roster=hub.roster())
    solo.services.messenger = hub
    names = set(reg.visible(solo))
    assert not names & {"ask_persona", "send_to_persona", "list_personas"}
    two = make_ctx(persona="a", roster=[("a", ""), ("b", "")])
    two.services.messenger = hub
    assert {"ask_persona", "send_to_persona", "list_personas"} <= set(reg.visible(two))
    sub = make_ctx(persona="a", roster=[("a", ""), ("b", "")], depth=1)
    sub.services.messenger = hub
    assert not set(reg.visible(sub)) & {"ask_persona", "send_to_persona", "list_personas"}


async def test_list_personas(tmp_path: Path) -> None:
    a = ScriptedModel([AssistantMessage(tool_calls=[tool_call("list_personas")]), "ok"])
    hub = build(tmp_path, {"a": a, "b": echo_model("b"), "c": echo_model("c")})
    await hub.personas["a"].handle(user("a", "who?"))
    assert results(a)[-1].content == "- b: the b persona\n- c: the c persona"


async def test_ask_cycle_fails_at_once(tmp_path: Path) -> None:
    # a asks b; b asks c; c asks a: a is waiting on this chain → cycle.
    def asker(target: str) -> FunctionModel:
        return FunctionModel(
            lambda r: (
                AssistantMessage(
                    tool_calls=[tool_call("ask_persona", {"persona": target, "text": "?"})]
                )
                if r.step == 1
                else f"result: {r.messages[-1].content}"
            )  # type: ignore[union-attr]
        )

    hub = build(tmp_path, {"a": asker("b"), "b": asker("c"), "c": asker("a")})
    # Far below the 120 s ask timeout a cycle waiting on itself would take.
    reply = await asyncio.wait_for(hub.personas["a"].handle(user("a", "go")), 30)
    assert "ask cycle: a → b → c → a" in reply.text
    assert reply.text.startswith("result: result: result: ")


async def test_direct_cycle_names_both(tmp_path: Path) -> None:
    b = FunctionModel(
        lambda r: (
            AssistantMessage(tool_calls=[tool_call("ask_persona", {"persona": "a", "text": "?"})])
            if r.step == 1
            else str(r.messages[-1].content)
        )  # type: ignore[union-attr]
    )
    a = FunctionModel(
        lambda r: (
            AssistantMessage(tool_calls=[tool_call("ask_persona", {"persona": "b", "text": "?"})])
            if r.step == 1
            else str(r.messages[-1].content)
        )  # type: ignore[union-attr]
    )
    hub = build(tmp_path, {"a": a, "b": b})
    reply = await asyncio.wait_for(hub.personas["a"].handle(user("a", "go")), 30)
    body = json.loads(reply.text)
    assert body["error"] == "ask_cycle" and "a → b → a" in body["detail"]


async def test_queue_cap_for_persona_messages_only(tmp_path: Path) -> None:
    gate = asyncio.Event()
    in_turn = asyncio.Event()

    async def blocked(request: ModelRequest) -> str:
        in_turn.set()
        await gate.wait()
        return "done"

    hub = build(tmp_path, {"a": echo_model("a"), "b": FunctionModel(blocked)}, max_queue=2)
    b = hub.personas["b"]

    def from_a(i: int) -> MessageEnvelope:
        return MessageEnvelope(
            sender="a",
            recipient="b",
            conversation_id="b:inbox:a",
            text=f"m{i}",
            source_kind="persona",
            reply_mode="none",
        )

    await hub.post(from_a(0))  # starts the turn (taken off the queue)
    await asyncio.wait_for(in_turn.wait(), 30)
    await hub.post(from_a(1))
    await hub.post(from_a(2))
    with pytest.raises(QueueFullError, match=r"b:inbox:a is full \(2/2"):
        await hub.post(from_a(3))
    # People are never refused, even past the cap.
    for i in range(5):
        b.post(MessageEnvelope(recipient="b", conversation_id="b:inbox:a", text=f"u{i}"))
    gate.set()
    await until(lambda: not b.busy())
    texts = [m.text for m in b.conversation("b:inbox:a").history if isinstance(m, UserMessage)]
    # m0, m1, m2 and the five user messages: nothing dropped, m3 refused.
    assert texts == [f"[message from persona a] m{i}" for i in range(3)] + [
        f"u{i}" for i in range(5)
    ]


async def test_soft_interrupt_merges_into_one_turn(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def b_model(request: ModelRequest) -> AssistantMessage:
        users = [m.text for m in request.messages if isinstance(m, UserMessage)]
        if request.step == 1 and len(users) == 1:
            started.set()
            # A slow tool batch: the interrupt lands while it runs.
            return AssistantMessage(tool_calls=[tool_call("clock"), tool_call("todo_read")])
        if any(isinstance(m, ToolResultMessage) for m in request.messages[-2:]) and len(users) == 1:
            return AssistantMessage(tool_calls=[tool_call("todo_read")])  # would go on…
        return AssistantMessage(text="answered: " + " + ".join(users))

    hub = build(tmp_path, {"a": echo_model("a"), "b": FunctionModel(b_model)})
    b = hub.personas["b"]
    first = asyncio.create_task(b.handle(user("b", "q1", conv="b:c")))
    await started.wait()
    second = asyncio.create_task(b.handle(user("b", "q2", conv="b:c")))
    third = asyncio.create_task(b.handle(user("b", "q3", conv="b:c")))
    r1, r2, r3 = await asyncio.wait_for(asyncio.gather(first, second, third), 30)
    # The running turn stopped after its tools; one merged turn answered all three.
    assert r1.text == r2.text == r3.text == "answered: q1 + q2 + q3"
    assert r1.turn_id == r2.turn_id == r3.turn_id
    kinds = [m.kind for m in b.conversation("b:c").history]
    assert kinds == ["user", "assistant", "tool_result", "tool_result", "user", "user", "assistant"]
