"""State has a bound: conversations and histories a persona keeps, processes
it holds, spill files it leaves — each capped by a setting, with a clear
error where a cap refuses work."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from coterie.runtime.config import RuntimeSettings, load_persona
from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ConversationRecord,
    MessageEnvelope,
    ModelRequest,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models.scripted import FunctionModel, latest_user_text
from coterie.runtime.persona import HistoryLoader, PersonaHost, PersonaRuntime, trim_history
from coterie.runtime.runner import ToolRunner, remove_old_spills, safe_name
from coterie.runtime.shell import LocalProcesses, StartSpec, scrubbed_env
from coterie.runtime.tool import tool
from coterie.tools import builtin_registry
from tests.helpers import make_ctx, scripted, write_persona


def runtime(
    tmp_path: Path,
    model: FunctionModel,
    settings: RuntimeSettings,
    history_loader: HistoryLoader | None = None,
) -> PersonaRuntime:
    write_persona(tmp_path, "solo", scripted())
    return PersonaRuntime(
        load_persona(tmp_path, "solo"),
        model=model,
        registry=builtin_registry(),
        host=PersonaHost(settings=settings, history=history_loader),
    )


def env(text: str, conv: str) -> MessageEnvelope:
    return MessageEnvelope(recipient="solo", conversation_id=conv, text=text)


async def test_idle_conversations_beyond_the_cap_are_dropped_and_rebuilt(tmp_path: Path) -> None:
    loads: list[str] = []

    async def loader(conv: str) -> ConversationRecord:
        loads.append(conv)
        return ConversationRecord(messages=[UserMessage(text=f"earlier in {conv}")])

    model = FunctionModel(lambda r: str(len(r.messages)))
    rt = runtime(tmp_path, model, RuntimeSettings(max_conversations=3), history_loader=loader)
    for i in range(5):
        await rt.handle(env("hi", f"c{i}"))
    assert rt.conversations() == 3  # c0 and c1 were dropped, least recently used first
    assert loads == ["c0", "c1", "c2", "c3", "c4"]
    # A dropped conversation comes back from the log with its history.
    assert (await rt.handle(env("back", "c0"))).text == "2"
    assert loads[-1] == "c0" and rt.conversations() == 3


async def test_nothing_is_dropped_without_a_log_to_rebuild_from(tmp_path: Path) -> None:
    rt = runtime(tmp_path, FunctionModel(lambda r: "ok"), RuntimeSettings(max_conversations=2))
    for i in range(4):
        await rt.handle(env("hi", f"c{i}"))
    assert rt.conversations() == 4


async def test_a_busy_conversation_is_never_dropped(tmp_path: Path) -> None:
    gate = asyncio.Event()
    loads: list[str] = []

    async def answer(request: ModelRequest) -> str:
        if latest_user_text(request) == "slow":
            await gate.wait()
        return "ok"

    async def loader(conv: str) -> ConversationRecord:
        loads.append(conv)
        return ConversationRecord()

    rt = runtime(
        tmp_path, FunctionModel(answer), RuntimeSettings(max_conversations=1), history_loader=loader
    )
    slow = asyncio.ensure_future(rt.handle(env("slow", "busy")))
    await asyncio.sleep(0.01)
    for i in range(3):  # each new conversation pushes the oldest idle one out
        await rt.handle(env("quick", f"c{i}"))
    gate.set()
    assert (await slow).text == "ok"
    await rt.handle(env("again", "busy"))
    # Held throughout: it was never rebuilt, while c0 and c1 were dropped.
    assert loads.count("busy") == 1
    assert rt.conversations() == 2  # busy (over the cap while it ran) and c2


def test_trim_history_keeps_whole_turns() -> None:
    call = ToolCall(id="c", name="clock")
    turn: list[ChatMessage] = [
        UserMessage(text="q"),
        AssistantMessage(tool_calls=[call]),
        ToolResultMessage(call_id="c", name="clock", content="now"),
        AssistantMessage(text="a"),
    ]
    history = turn * 5  # 20 messages
    kept = trim_history(history, 10)
    assert len(kept) == 8 and isinstance(kept[0], UserMessage)  # two whole turns
    assert trim_history(history, 20) == history
    # One turn longer than the cap is kept whole rather than cut inside.
    long_turn = [UserMessage(text="q"), *[AssistantMessage(text=str(i)) for i in range(15)]]
    assert trim_history(long_turn, 10) == long_turn


async def test_a_long_conversation_keeps_its_newest_messages(tmp_path: Path) -> None:
    model = FunctionModel(lambda r: f"seen {len(r.messages)}")
    rt = runtime(tmp_path, model, RuntimeSettings(max_history_messages=10))
    for i in range(12):
        await rt.handle(env(f"m{i}", "long"))
    history = rt.conversation("long").history
    assert len(history) == 10 and isinstance(history[0], UserMessage)
    assert [m.text for m in history if isinstance(m, UserMessage)][-1] == "m11"
    assert max(len(r.messages) for r in model.requests) <= 11


async def test_processes_beyond_the_cap_are_refused_with_the_setting_named(
    tmp_path: Path,
) -> None:
    svc = LocalProcesses(bwrap=None, max_processes=2)
    spec = StartSpec(
        "sleep 30", ["/bin/sh", "-c", "sleep 30"], str(tmp_path), scrubbed_env(home=tmp_path)
    )
    try:
        first, _ = await svc.start(spec), await svc.start(spec)
        with pytest.raises(ToolError) as err:
            await svc.start(spec)
        assert err.value.kind == "limit_reached"
        assert "max_background_processes: 2" in err.value.detail
        await svc.remove(first)
        assert (await svc.start(spec)).startswith("bg_")  # room again
    finally:
        await svc.close()


class NoArgs(BaseModel):
    pass


@tool(name="flood")
async def flood(args: NoArgs, ctx: TurnContext) -> str:
    """A result far over the cap."""
    return "x" * 50_000


async def test_a_hostile_call_id_cannot_place_a_spill_file_elsewhere(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    ctx = make_ctx(settings=TurnSettings(spill_dir=spill))
    hostile = ToolCall(id="../../../outside", name="flood")
    [outcome] = await ToolRunner(output_cap=1_000).run_calls([hostile], ctx, {"flood": flood})
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].is_relative_to(spill / "turn_test")
    assert str(files[0]) in outcome.content
    assert safe_name("call_abc-1") == "call_abc-1"
    assert "/" not in safe_name("../x") and safe_name("../x") != safe_name("__x")


def test_old_spill_folders_are_swept(tmp_path: Path) -> None:
    old, fresh = tmp_path / "turn_old", tmp_path / "turn_new"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "c.txt").write_text("full text")
    week_ago = time.time() - 8 * 86_400
    os.utime(old, (week_ago, week_ago))
    assert remove_old_spills(tmp_path, older_than=7 * 86_400) == 1
    assert not old.exists() and fresh.exists()
    assert remove_old_spills(tmp_path / "missing", older_than=1) == 0


async def test_a_persona_sweeps_its_old_spill_files_when_it_starts(tmp_path: Path) -> None:
    spill = tmp_path / "personas" / "solo" / ".spill" / "turn_ancient"
    spill.mkdir(parents=True)
    ancient = time.time() - 30 * 86_400
    os.utime(spill, (ancient, ancient))
    runtime(tmp_path, FunctionModel(lambda r: "ok"), RuntimeSettings(spill_retention_days=7))
    assert not spill.exists()
