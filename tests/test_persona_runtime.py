"""PersonaRuntime without Ray: one turn at a time per conversation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coterie.runtime.config import OpenAIModelConfig, load_persona
from coterie.runtime.errors import ActorLostError, MissingAPIKeyError, PersonaPassivatedError
from coterie.runtime.messages import (
    AssistantMessage,
    ConversationRecord,
    HistoryAppended,
    MessageEnvelope,
    ModelCalled,
    ModelRequest,
    TodoItem,
    TurnEnded,
    UserMessage,
)
from coterie.runtime.models.openai_chat import OpenAIChatModel
from coterie.runtime.models.scripted import FunctionModel, latest_user_text
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.tools import builtin_registry
from tests.fakes import FakeOpenAIServer
from tests.helpers import scripted, write_persona


def make_runtime(
    tmp_path: Path, model: FunctionModel | OpenAIChatModel, **kw: object
) -> PersonaRuntime:
    write_persona(tmp_path, "solo", scripted(description="a solo persona"))
    persona = load_persona(tmp_path, "solo")
    return PersonaRuntime(persona, model=model, registry=builtin_registry(), **kw)  # type: ignore[arg-type]


def env(text: str, conv: str = "solo:test") -> MessageEnvelope:
    return MessageEnvelope(recipient="solo", conversation_id=conv, text=text)


async def test_reply_correlates_and_system_prompt(tmp_path: Path) -> None:
    model = FunctionModel(lambda r: f"echo: {latest_user_text(r)}")
    rt = make_runtime(
        tmp_path, model, host=PersonaHost(roster=[("solo", "me"), ("other", "the other one")])
    )
    message = env("hello")
    reply = await rt.handle(message)
    assert reply.reply_to == message.id and reply.text == "echo: hello" and reply.status == "ok"
    system = model.requests[0].system
    assert "You are solo." in system and "- other: the other one" in system and "Today is" in system


async def test_messages_mid_turn_wait_and_merge(tmp_path: Path) -> None:
    gate = asyncio.Event()
    seen: list[list[str]] = []

    async def slow(request: ModelRequest) -> str:
        users = [m.text for m in request.messages if isinstance(m, UserMessage)]
        seen.append(users)
        if len(seen) == 1:
            await gate.wait()
        return f"answered {len(users)}"

    rt = make_runtime(tmp_path, FunctionModel(slow))
    first = asyncio.create_task(rt.handle(env("one")))
    while not seen:  # the first turn is waiting on the gate in its model call
        await asyncio.sleep(0)
    assert rt.busy()
    second = asyncio.create_task(rt.handle(env("two")))
    third = asyncio.create_task(rt.handle(env("three")))
    # A different conversation is not held up by the busy one.
    other = await asyncio.wait_for(rt.handle(env("elsewhere", conv="solo:other")), 30)
    assert other.text == "answered 1"
    # Meanwhile "two" and "three" only waited: no turn of theirs called the model.
    assert seen == [["one"], ["elsewhere"]]
    assert not second.done() and not third.done()
    gate.set()
    r1, r2, r3 = await asyncio.gather(first, second, third)
    assert r1.text == "answered 1"
    # "two" and "three" were answered together by one merged turn.
    assert r2.text == r3.text == "answered 3" and r2.turn_id == r3.turn_id != r1.turn_id
    assert seen[-1] == ["one", "two", "three"]


async def test_a_proxy_page_instead_of_a_completion_fails_the_turn_readably(tmp_path: Path) -> None:
    """A real provider given a page that is not a completion: the turn ends in
    an error naming it, recorded whole (the model call and the turn's end),
    and the next turn works."""
    async with FakeOpenAIServer() as srv:
        srv.enqueue_raw("<html>Sign in to the proxy</html>", headers={"content-type": "text/html"})
        srv.enqueue_text("back")
        config = OpenAIModelConfig.model_validate(
            {"provider": "openai", "name": "gpt-test", "base_url": srv.base_url, "max_retries": 0}
        )
        audit = NullAudit()
        rt = make_runtime(
            tmp_path, OpenAIChatModel(config, api_key="sk-test"), services=Services(audit=audit)
        )  # type: ignore[arg-type]
        try:
            reply = await rt.handle(env("hi"))
            again = await rt.handle(env("hi again"))
        finally:
            await rt.aclose()
    assert reply.status == "error"
    assert reply.error == (
        "model request failed (status None): invalid response from openai model 'gpt-test': "
        "expected a JSON object, got text that is not JSON (33 characters)"
    )
    calls = [e for e in audit.events if isinstance(e, ModelCalled)]
    assert [c.error is not None and "invalid response" in c.error for c in calls] == [True, False]
    ended = [e for e in audit.events if isinstance(e, TurnEnded)]
    assert [e.status for e in ended] == ["error", "ok"]
    assert again.status == "ok" and again.text == "back"


async def test_model_failure_becomes_error_reply(tmp_path: Path) -> None:
    calls = 0

    def fail_once(request: ModelRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise MissingAPIKeyError("OPENAI_API_KEY", "openai")
        return "fine"

    audit = NullAudit()
    rt = make_runtime(tmp_path, FunctionModel(fail_once), services=Services(audit=audit))
    reply = await rt.handle(env("hi"))
    assert reply.status == "error"
    assert reply.error == (
        "openai model needs an API key: set the environment variable OPENAI_API_KEY"
    )
    ended = [e for e in audit.events if isinstance(e, TurnEnded)]
    assert [(e.status, e.error) for e in ended] == [
        (
            "error",
            "MissingAPIKeyError: openai model needs an API key: "
            "set the environment variable OPENAI_API_KEY",
        )
    ]
    # The persona keeps working afterwards, with the same model.
    assert (await rt.handle(env("again"))).text == "fine"
    assert calls == 2
    ended = [e for e in audit.events if isinstance(e, TurnEnded)]
    assert [e.status for e in ended] == ["error", "ok"]


async def test_history_loader_used_once_per_conversation(tmp_path: Path) -> None:
    loads: list[str] = []

    async def loader(conv: str) -> ConversationRecord:
        loads.append(conv)
        return ConversationRecord(messages=[UserMessage(text="from before")])

    model = FunctionModel(lambda r: str(len(r.messages)))
    rt = make_runtime(tmp_path, model, host=PersonaHost(history=loader))
    assert (await rt.handle(env("now"))).text == "2"
    assert (await rt.handle(env("later"))).text == "4"
    assert loads == ["solo:test"]


class Processes:
    """Just enough of a process service for close_if_idle and aclose."""

    def __init__(self) -> None:
        self.is_running = False
        self.closed = False

    async def running(self) -> bool:
        return self.is_running

    async def close(self) -> None:
        self.closed = True


async def test_close_if_idle_only_when_nothing_runs(tmp_path: Path) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        started.set()
        await gate.wait()
        return "done"

    processes = Processes()
    rt = make_runtime(tmp_path, FunctionModel(slow), services=Services(processes=processes))
    turn = asyncio.create_task(rt.handle(env("work")))
    await asyncio.wait_for(started.wait(), 30)
    assert not await rt.close_if_idle(0.0)  # a turn is running
    gate.set()
    await turn
    assert not await rt.close_if_idle(3600.0)  # not idle long enough
    processes.is_running = True
    assert not await rt.close_if_idle(0.0)  # a background command still runs
    assert not rt.closing and not processes.closed
    processes.is_running = False
    assert await rt.close_if_idle(0.0)
    assert rt.closing and processes.closed


async def test_a_closed_persona_refuses_messages_and_stops_what_tools_left(
    tmp_path: Path,
) -> None:
    rt = make_runtime(tmp_path, FunctionModel(lambda r: "hi"))
    await rt.handle(env("warm up"))
    watcher = rt.services.background.spawn(asyncio.sleep(3600), name="left by a tool")
    await rt.aclose()
    assert watcher.cancelled() and len(rt.services.background) == 0
    with pytest.raises(PersonaPassivatedError, match="'solo' is closing"):
        await rt.handle(env("too late"))
    with pytest.raises(PersonaPassivatedError):
        rt.post(env("too late"))


class BrokenMemory:
    """A memory service whose user model cannot be read."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def user_model(self) -> list[object]:
        raise self.error


async def test_a_turn_that_fails_before_the_model_still_ends_in_the_log(tmp_path: Path) -> None:
    audit = NullAudit()
    rt = make_runtime(
        tmp_path,
        FunctionModel(lambda r: "never asked"),
        services=Services(
            audit=audit, memory=BrokenMemory(RuntimeError("a bug in the memory client"))
        ),
    )
    reply = await rt.handle(env("hi"))
    assert reply.status == "error" and "a bug in the memory client" in (reply.error or "")
    kinds = [e.kind for e in audit.events]
    assert kinds.count("turn_started") == kinds.count("turn_ended") == 1
    [ended] = [e for e in audit.events if isinstance(e, TurnEnded)]
    assert ended.status == "error" and "RuntimeError" in (ended.error or "")


async def test_an_unreachable_memory_store_does_not_fail_the_turn(tmp_path: Path) -> None:
    model = FunctionModel(lambda r: "answered anyway")
    rt = make_runtime(
        tmp_path,
        model,
        services=Services(memory=BrokenMemory(ActorLostError("the memory store is restarting"))),
    )
    reply = await rt.handle(env("hi"))
    assert (reply.status, reply.text) == ("ok", "answered anyway")
    assert "What you know about the user" not in model.requests[0].system


@pytest.mark.parametrize(
    ("zone", "offset"), [("Pacific/Kiritimati", 14), ("Pacific/Pago_Pago", -11)]
)
async def test_the_prompt_date_is_the_runtime_timezone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zone: str, offset: int
) -> None:
    from datetime import UTC, datetime, timedelta

    monkeypatch.setenv("COTERIE_TIMEZONE", zone)
    model = FunctionModel(lambda r: "ok")
    rt = make_runtime(tmp_path, model)
    before = datetime.now(UTC) + timedelta(hours=offset)
    await rt.handle(env("what day is it?"))
    after = datetime.now(UTC) + timedelta(hours=offset)
    # UTC+14 and UTC-11 are always on different days: only the zone's own date fits.
    days = {f"{d:%A, %Y-%m-%d}" for d in (before, after)}
    assert any(f"Today is {day}." in model.requests[0].system for day in days)


async def test_a_rebuilt_conversation_gets_its_todo_list_back(tmp_path: Path) -> None:
    saved = [TodoItem(content="Book the venue", status="in_progress", priority="high")]

    async def loader(conv: str) -> ConversationRecord:
        return ConversationRecord(messages=[UserMessage(text="earlier")], todos=saved)

    rt = make_runtime(tmp_path, FunctionModel(lambda r: "ok"), host=PersonaHost(history=loader))
    await rt.handle(env("hello"))
    assert rt.conversation("solo:test").todos == saved


async def test_calls_cut_off_by_a_crash_get_a_result_after_the_rebuild(tmp_path: Path) -> None:
    from coterie.runtime.messages import ToolCall, ToolResultMessage

    calls = [ToolCall(id="c1", name="clock"), ToolCall(id="c2", name="shell_exec")]

    async def loader(conv: str) -> ConversationRecord:
        # The process died after the first result was recorded.
        return ConversationRecord(
            messages=[
                UserMessage(text="do two things"),
                AssistantMessage(tool_calls=calls),
                ToolResultMessage(call_id="c1", name="clock", content="12:00"),
            ]
        )

    audit = NullAudit()
    model = FunctionModel(lambda r: "picked up")
    rt = make_runtime(
        tmp_path, model, services=Services(audit=audit), host=PersonaHost(history=loader)
    )
    assert (await rt.handle(env("are you there?"))).text == "picked up"
    seen = model.requests[0].messages
    assert [m.kind for m in seen] == ["user", "assistant", "tool_result", "tool_result", "user"]
    repaired = seen[3]
    assert isinstance(repaired, ToolResultMessage)
    assert (repaired.call_id, repaired.error_kind) == ("c2", "interrupted")
    # Recorded, so the next rebuild has it too (and adds nothing again).
    logged = [e.message for e in audit.events if isinstance(e, HistoryAppended)]
    assert logged[0] == repaired


def test_unanswered_calls_only_looks_at_the_last_assistant_message() -> None:
    from coterie.runtime.messages import ToolCall, ToolResultMessage
    from coterie.runtime.persona import unanswered_calls

    done = AssistantMessage(tool_calls=[ToolCall(id="a", name="clock")])
    result = ToolResultMessage(call_id="a", name="clock", content="x")
    assert unanswered_calls([UserMessage(text="hi"), done, result]) == []
    assert unanswered_calls([done, result, UserMessage(text="next")]) == []
    assert unanswered_calls([]) == []
    assert [r.call_id for r in unanswered_calls([UserMessage(text="hi"), done])] == ["a"]
