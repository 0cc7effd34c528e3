"""The tool loop without Ray: steps, guards, limits, thinking, end_task."""

from __future__ import annotations

import json

import pytest

from coterie.runtime.context import TurnSettings
from coterie.runtime.errors import ModelError
from coterie.runtime.hub import LocalHub
from coterie.runtime.loop import STEP_LIMIT_NOTE, TurnLoop
from coterie.runtime.messages import (
    AssistantMessage,
    HistoryAppended,
    ModelCalled,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models.scripted import FunctionModel, ScriptedModel, tool_call
from coterie.runtime.services import Services
from coterie.tools import builtin_registry
from tests.helpers import make_ctx


def loop_for(model: ScriptedModel | FunctionModel, **kw: int) -> TurnLoop:
    return TurnLoop(model=model, registry=builtin_registry(), **kw)


async def test_plain_reply_ends_turn() -> None:
    model = ScriptedModel(["hello there"])
    ctx = make_ctx()
    result = await loop_for(model).run(ctx, system="sys")
    assert (result.text, result.status, result.steps) == ("hello there", "ok", 1)
    model.assert_consumed()
    assert model.requests[0].system == "sys"
    assert isinstance(ctx.conversation.history[-1], AssistantMessage)


async def test_tool_round_trip_and_order() -> None:
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[
                    tool_call("todo_write", {"todos": [{"content": "a"}]}),
                    tool_call("clock", {"format": "time_only"}),
                ]
            ),
            "done",
        ]
    )
    ctx = make_ctx()
    result = await loop_for(model).run(ctx, system="s")
    assert result.text == "done" and result.steps == 2
    second = model.requests[1].messages
    results = [m for m in second if isinstance(m, ToolResultMessage)]
    assert [r.name for r in results] == ["todo_write", "clock"]
    assert results[0].content.startswith("0/1 completed")
    assert len(results[1].content) == 8  # HH:MM:SS
    model.assert_consumed()


async def test_errors_come_back_to_the_model() -> None:
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[tool_call("nope"), tool_call("clock", {"format": "sundial"})]
            ),
            "recovered",
        ]
    )
    result = await loop_for(model).run(make_ctx(), system="s")
    assert result.text == "recovered"
    errors = [
        json.loads(m.content)["error"]
        for m in model.requests[1].messages
        if isinstance(m, ToolResultMessage)
    ]
    assert errors == ["unknown_tool", "invalid_arguments"]


async def test_end_task_is_terminal() -> None:
    model = ScriptedModel(
        [
            AssistantMessage(
                text="All set.",
                tool_calls=[tool_call("end_task", {"status": "skipped", "reason": "nothing new"})],
            )
        ]
    )
    result = await loop_for(model).run(make_ctx(), system="s")
    model.assert_consumed()  # no follow-up request after end_task
    assert result.status == "skipped"
    assert result.text == "All set."
    assert result.summary == "nothing new"


async def test_end_task_summary_becomes_text_when_silent() -> None:
    model = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[tool_call("end_task", {"status": "failed", "summary": "disk full"})]
            )
        ]
    )
    result = await loop_for(model).run(make_ctx(), system="s")
    assert (result.status, result.text) == ("failed", "disk full")


async def test_repeat_guard_forces_thinking_then_blocks() -> None:
    same = {"todos": [{"content": "x"}]}
    model = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("todo_write", same)]) for _ in range(3)] + ["stop"]
    )
    ctx = make_ctx(settings=TurnSettings(thinking_mode="off"))
    await loop_for(model).run(ctx, system="s")
    assert [r.thinking for r in model.requests] == [False, False, True, True]
    results = [m for m in ctx.conversation.history if isinstance(m, ToolResultMessage)]
    assert [r.error_kind for r in results] == [None, None, "repeated_call"]


async def test_allow_repeat_tools_are_exempt() -> None:
    model = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("clock")]) for _ in range(4)] + ["x"]
    )
    ctx = make_ctx(settings=TurnSettings(thinking_mode="off"))
    await loop_for(model).run(ctx, system="s")
    model.assert_consumed()
    results = [m for m in ctx.conversation.history if isinstance(m, ToolResultMessage)]
    # Four identical clock calls in a row all ran: none blocked, no thinking forced.
    assert [(r.name, r.error_kind) for r in results] == [("clock", None)] * 4
    assert [r.thinking for r in model.requests] == [False] * 5


async def test_max_steps_withdraws_tools_and_requires_summary() -> None:
    def fn(request: ModelRequest) -> AssistantMessage:
        if not request.tools:
            return AssistantMessage(text="Summary: looked at the clock a lot.")
        return AssistantMessage(tool_calls=[tool_call("clock")])

    model = FunctionModel(fn)
    ctx = make_ctx()
    result = await loop_for(model, max_steps=3).run(ctx, system="s")
    assert result.steps == 4
    assert result.text == "Summary: looked at the clock a lot."
    final = model.requests[-1]
    assert final.tools == [] and final.tool_choice.kind == "none"
    note = final.messages[-1]
    assert isinstance(note, UserMessage) and note.source == "harness"
    assert note.text == STEP_LIMIT_NOTE.format(max_steps=3)


async def test_think_harder_escalates_and_hides_itself() -> None:
    model = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("think_harder", {"reason": "r" * 500})]), "deep"]
    )
    ctx = make_ctx(kind="user", settings=TurnSettings(thinking_mode="auto"))
    await loop_for(model).run(ctx, system="s")
    first, second = model.requests
    assert "think_harder" in [t.name for t in first.tools] and not first.thinking
    assert "think_harder" not in [t.name for t in second.tools] and second.thinking
    result = next(m for m in ctx.conversation.history if isinstance(m, ToolResultMessage))
    assert "r" * 10 not in result.content  # the reason is never echoed
    assert ctx.outputs.think_reason == "r" * 80


async def test_thinking_resolution() -> None:
    assert make_ctx(kind="user", settings=TurnSettings(thinking_mode="auto")).thinking_on is False
    assert make_ctx(kind="cron", settings=TurnSettings(thinking_mode="auto")).thinking_on is True
    assert make_ctx(kind="cron", settings=TurnSettings(thinking_mode="off")).thinking_on is False
    assert make_ctx(kind="user", settings=TurnSettings(thinking_mode="on")).thinking_on is True


async def test_background_turn_gets_forced_end_task() -> None:
    model = ScriptedModel(
        [
            "Checked the inbox, nothing to do.",
            AssistantMessage(tool_calls=[tool_call("end_task", {"status": "skipped"})]),
        ]
    )
    ctx = make_ctx(kind="heartbeat")
    result = await loop_for(model).run(ctx, system="s")
    model.assert_consumed()
    forced = model.requests[1]
    assert forced.tool_choice.kind == "named" and [t.name for t in forced.tools] == ["end_task"]
    assert forced.thinking is False
    assert result.status == "skipped"
    assert result.text == "Checked the inbox, nothing to do."


async def test_user_turn_is_not_forced() -> None:
    model = ScriptedModel(["plain"])
    await loop_for(model).run(make_ctx(kind="user"), system="s")
    model.assert_consumed()


async def test_model_error_propagates_and_is_audited() -> None:
    model = ScriptedModel([])
    ctx = make_ctx()
    with pytest.raises(ModelError, match="has 0 steps"):
        await loop_for(model).run(ctx, system="s")
    calls = [e for e in ctx.audit.events if isinstance(e, ModelCalled)]  # type: ignore[attr-defined]
    assert [c.error for c in calls] == ["ScriptedModel 'scripted' has 0 steps; request 1 has none"]


async def test_every_message_is_audited() -> None:
    model = ScriptedModel([AssistantMessage(tool_calls=[tool_call("clock")]), "t"])
    ctx = make_ctx()
    await loop_for(model).run(ctx, system="s")
    kinds = [e.kind for e in ctx.audit.events]  # type: ignore[attr-defined]
    assert kinds == [
        "model_call",
        "chat_message",  # the assistant's tool call
        "tool_call",
        "tool_result",
        "chat_message",  # the tool result
        "model_call",
        "chat_message",  # the final text
    ]
    appended = [e.message for e in ctx.audit.events if isinstance(e, HistoryAppended)]  # type: ignore[attr-defined]
    assert appended == ctx.conversation.history[1:]


async def test_tool_filters_allow_deny_context_and_depth() -> None:
    from coterie.runtime.config import ToolFilter

    reg = builtin_registry()
    names = lambda ctx: sorted(reg.visible(ctx))  # noqa: E731
    assert names(make_ctx(settings=TurnSettings(tool_filter=ToolFilter(allow=["todo_*"])))) == [
        "todo_read",
        "todo_write",
    ]
    everything = names(make_ctx())
    assert "clock" in everything
    denied = names(make_ctx(settings=TurnSettings(tool_filter=ToolFilter(deny=["clo?k"]))))
    assert denied == [n for n in everything if n != "clock"]  # exactly clock went
    # think_harder is for user turns only (and only while thinking is off).
    assert "think_harder" in names(make_ctx(settings=TurnSettings(thinking_mode="off")))
    assert "think_harder" not in names(
        make_ctx(kind="cron", settings=TurnSettings(thinking_mode="off"))
    )
    assert "think_harder" not in names(make_ctx(settings=TurnSettings(thinking_mode="on")))
    # Depth: the delegation tools are offered at the top, never below it.
    peers = {"roster": [("tester", ""), ("other", "")], "services": Services(messenger=LocalHub())}
    delegation = {"ask_persona", "send_to_persona", "list_personas"}
    assert delegation <= set(names(make_ctx(**peers)))
    below = set(names(make_ctx(depth=1, **peers)))
    assert not delegation & below
    assert below == set(names(make_ctx(**peers))) - delegation  # the rest stays
    assert {"clock", "todo_write"} <= below


async def test_the_turn_context_reaches_the_model() -> None:
    model = FunctionModel(lambda request: f"context={request.context}")
    for context in ("user", "heartbeat", "cron"):
        ctx = make_ctx(kind=context)
        await loop_for(model).run(ctx, system="s")
    # A background turn's forced end_task request (the second of each) carries
    # its context too.
    assert [(r.context, r.tool_choice.kind) for r in model.requests] == [
        ("user", "auto"),
        ("heartbeat", "auto"),
        ("heartbeat", "named"),
        ("cron", "auto"),
        ("cron", "named"),
    ]


@pytest.mark.parametrize(
    ("name", "patterns", "expected"),
    [
        ("mcp_time", ["mcp_*"], True),
        ("Mcp_time", ["mcp_*"], False),  # case-sensitive
        ("file_read", ["file_?ead", "shell_*"], True),
        ("shell_exec", ["file_?ead", "shell_*"], True),
        ("web_fetch", ["file_?ead", "shell_*"], False),
        ("calc", ["[a-c]*"], True),
        ("draft", ["[!a-c]*"], True),
        ("calc", ["[!a-c]*"], False),
        ("a.b", ["*.*"], True),
        ("ab", ["*.*"], False),
        ("clock", ["*"], True),
        ("clock", [], False),
        ("clock", ["clock2", "cloc"], False),  # whole names only
        ("recall", ["rec*", "recall"], True),
    ],
)
def test_tool_patterns_match_whole_names_like_fnmatchcase(
    name: str, patterns: list[str], expected: bool
) -> None:
    import fnmatch

    from coterie.runtime.tool import matches_any

    assert matches_any(name, patterns) is expected
    assert matches_any(name, iter(patterns)) is expected  # any iterable, any number of times
    assert expected == any(fnmatch.fnmatchcase(name, p) for p in patterns)
