"""Tools on demand: the catalogue, find_tools, and what each call carries."""

from __future__ import annotations

import pytest

from coterie.runtime.catalogue import DEFAULT_CORE, FIND_TOOLS, search
from coterie.runtime.config import ToolFilter
from coterie.runtime.context import TurnSettings
from coterie.runtime.loop import TurnLoop
from coterie.runtime.messages import AssistantMessage, ModelRequest, ToolResultMessage
from coterie.runtime.models.scripted import FunctionModel, tool_call
from coterie.runtime.testing.context import turn_context
from coterie.runtime.usage.tokens import definition_chars
from coterie.tools import builtin_registry


def names(request: ModelRequest) -> set[str]:
    return {t.name for t in request.tools}


def ctx_with(**tool_filter: object):  # type: ignore[no-untyped-def]
    tool_filter.setdefault("catalogue", "on")
    return turn_context(
        "what is 6 times 7?", settings=TurnSettings(tool_filter=ToolFilter(**tool_filter))
    )


async def test_find_tools_reveals_a_tool_that_the_next_call_then_uses() -> None:
    def step(request: ModelRequest) -> AssistantMessage | str:
        n = len([m for m in request.messages if isinstance(m, AssistantMessage)])
        if n == 0:
            return AssistantMessage(tool_calls=[tool_call(FIND_TOOLS, {"query": "calculate"})])
        if n == 1:
            return AssistantMessage(tool_calls=[tool_call("calculate", {"expression": "6*7"})])
        last = request.messages[-1]
        assert isinstance(last, ToolResultMessage)
        return f"It is {last.content}."

    model = FunctionModel(step)
    ctx = ctx_with()
    result = await TurnLoop(model=model, registry=builtin_registry()).run(ctx, system="s")
    first, second, third = model.requests
    # The first call: the core set and find_tools, not the calculator.
    assert FIND_TOOLS in names(first) and "calculate" not in names(first)
    assert names(first) - {FIND_TOOLS} <= set(DEFAULT_CORE)
    found = second.messages[-1]
    assert isinstance(found, ToolResultMessage) and "- calculate:" in found.content
    # From the next call on it is offered in full, and used.
    assert "calculate" in names(second) and "calculate" in names(third)
    assert result.text == "It is 42."


async def test_the_catalogue_cuts_what_each_call_carries() -> None:
    model = FunctionModel(lambda r: "hi")
    await TurnLoop(model=model, registry=builtin_registry()).run(ctx_with(), system="s")
    everything = builtin_registry().visible(ctx_with(catalogue="off"))
    all_chars = sum(definition_chars(s.definition()) for s in everything.values())
    sent = sum(definition_chars(t) for t in model.requests[0].tools)
    assert len(everything) >= 14
    assert sent < all_chars * 0.7


@pytest.mark.parametrize(
    ("tool_filter", "expect_catalogue"),
    [
        ({"catalogue": "off"}, False),
        ({"catalogue": "auto"}, False),  # the 14 tools a bare turn sees: under 20
        ({"allow": ["clock", "calculate"], "catalogue": "on"}, True),
    ],
)
async def test_when_the_catalogue_is_on(tool_filter: dict, expect_catalogue: bool) -> None:
    model = FunctionModel(lambda r: "hi")
    ctx = ctx_with(**tool_filter)
    await TurnLoop(model=model, registry=builtin_registry()).run(ctx, system="s")
    offered = names(model.requests[0])
    assert (FIND_TOOLS in offered) is expect_catalogue
    if not expect_catalogue:
        assert offered == set(builtin_registry().visible(ctx))


async def test_auto_turns_it_on_above_twenty_tools() -> None:
    from pydantic import BaseModel

    from coterie.runtime.tool import ToolRegistry, ToolSpec

    class NoArgs(BaseModel):
        pass

    async def run(args: NoArgs, ctx: object) -> str:
        return "ran"

    def registry(n: int) -> ToolRegistry:
        return ToolRegistry(
            [
                ToolSpec(name=f"extra_{i}", description=f"Extra {i}.", args_model=NoArgs, fn=run)
                for i in range(n)
            ]
            + [builtin_registry().get(FIND_TOOLS)]  # type: ignore[list-item]
        )

    for count, on in ((20, False), (21, True)):
        model = FunctionModel(lambda r: "hi")
        await TurnLoop(model=model, registry=registry(count)).run(
            ctx_with(catalogue="auto"), system="s"
        )
        assert (FIND_TOOLS in names(model.requests[0])) is on
        if on:
            assert names(model.requests[0]) == {FIND_TOOLS}  # no extra_* is core


async def test_core_replaces_the_default_core_set() -> None:
    model = FunctionModel(lambda r: "hi")
    ctx = ctx_with(core=["clock", "web_*"])
    await TurnLoop(model=model, registry=builtin_registry()).run(ctx, system="s")
    assert names(model.requests[0]) == {"clock", "web_fetch", FIND_TOOLS}


async def test_a_held_back_tool_called_by_name_still_runs_and_reveals_last_one_turn() -> None:
    replies = iter(
        [
            AssistantMessage(tool_calls=[tool_call("calculate", {"expression": "1+1"})]),
            "two",
        ]
    )
    model = FunctionModel(lambda r: next(replies))
    loop = TurnLoop(model=model, registry=builtin_registry())
    ctx = ctx_with()
    await loop.run(ctx, system="s")
    result = model.requests[1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.content.strip() == "2"
    assert result.error_kind is None


async def test_find_tools_with_nothing_matching_names_what_can_be_found() -> None:
    replies = iter(
        [AssistantMessage(tool_calls=[tool_call(FIND_TOOLS, {"query": "teleport"})]), "ok"]
    )
    model = FunctionModel(lambda r: next(replies))
    await TurnLoop(model=model, registry=builtin_registry()).run(ctx_with(), system="s")
    answer = model.requests[1].messages[-1]
    assert isinstance(answer, ToolResultMessage)
    assert "No tool matches 'teleport'" in answer.content and "calculate" in answer.content
    assert names(model.requests[1]) == names(model.requests[0])  # nothing revealed


def test_search_ranks_names_first_and_takes_patterns() -> None:
    hidden = {s.name: s for s in builtin_registry()._specs.values()}
    assert [s.name for s in search(hidden, "web_*")] == ["web_fetch", "web_search"]
    assert search(hidden, "web fetch page")[0].name == "web_fetch"
    assert search(hidden, "background process")[0].name in {"process", "shell_exec"}
    assert search(hidden, "   ") == []
