"""The reliability contract of the tool runner."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.messages import ToolCall, ToolCalled, ToolFinished
from coterie.runtime.runner import ToolRunner, cap_output
from coterie.runtime.tool import ToolSpec, tool
from tests.helpers import make_ctx


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="what to echo")
    times: int = Field(default=1, ge=1, le=5)


@tool(name="echo")
async def echo(args: EchoArgs, ctx: TurnContext) -> str:
    """Echo text."""
    return args.text * args.times


class SleepArgs(BaseModel):
    seconds: float


@tool(name="sleepy", timeout=0.2)
async def sleepy(args: SleepArgs, ctx: TurnContext) -> str:
    """Sleep a while."""
    await asyncio.sleep(args.seconds)
    return f"slept {args.seconds}"


class NoArgs(BaseModel):
    pass


@tool(name="boom")
async def boom(args: NoArgs, ctx: TurnContext) -> str:
    """Always raises."""
    raise ValueError("the widget is broken")


class Stubborn:
    """What a stubborn tool reports, and the event that finally lets it stop."""

    def __init__(self) -> None:
        self.running = False
        self.cancellations = 0
        self.release = asyncio.Event()


def stubborn_tool(state: Stubborn) -> ToolSpec:
    """A tool that ignores cancellation until ``state.release`` is set."""

    @tool(name="stubborn", timeout=0.2)
    async def stubborn(args: NoArgs, ctx: TurnContext) -> str:
        """Ignores cancellation."""
        state.running = True
        try:
            while not state.release.is_set():
                try:
                    await state.release.wait()
                except asyncio.CancelledError:
                    state.cancellations += 1
            return "released"
        finally:
            state.running = False

    return stubborn


async def until(condition: Callable[[], bool], deadline: float = 10.0) -> None:
    """Yield to the loop until ``condition()`` holds (fails after ``deadline`` s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


@tool(name="flood")
async def flood(args: NoArgs, ctx: TurnContext) -> str:
    """A huge result."""
    return "".join(f"line {i}\n" for i in range(20_000))


@tool(name="structured")
async def structured(args: NoArgs, ctx: TurnContext) -> dict[str, int]:
    """Returns a dict."""
    return {"a": 1}


TOOLS: dict[str, ToolSpec] = {s.name: s for s in [echo, sleepy, boom, flood, structured]}


def call(name: str, arguments: dict[str, object] | str | None = None, cid: str = "") -> ToolCall:
    return ToolCall(
        id=cid or f"c_{name}", name=name, arguments=arguments if arguments is not None else {}
    )


class MeetArgs(BaseModel):
    name: str


ARRIVED: list[str] = []


@tool(name="meet", timeout=5)
async def meet(args: MeetArgs, ctx: TurnContext) -> str:
    """Returns once both callers have arrived: only concurrent calls finish."""
    ARRIVED.append(args.name)
    while len(ARRIVED) < 2:
        await asyncio.sleep(0.005)
    return f"met {args.name}"


async def test_results_in_call_order_and_concurrent() -> None:
    ARRIVED.clear()
    tools = {**TOOLS, "meet": meet}
    calls = [
        call("meet", {"name": "first"}, "a"),
        call("echo", {"text": "x", "times": 3}, "b"),
        call("meet", {"name": "second"}, "c"),
    ]
    outcomes = await ToolRunner().run_calls(calls, make_ctx(), tools)
    assert [o.call.id for o in outcomes] == ["a", "b", "c"]
    # Run one after the other, the first "meet" would wait for the second
    # forever and time out: both finishing proves the calls overlapped.
    assert [o.content for o in outcomes] == ["met first", "xxx", "met second"]


async def test_unknown_tool() -> None:
    [o] = await ToolRunner().run_calls([call("nope")], make_ctx(), TOOLS)
    body = json.loads(o.content)
    assert o.error_kind == body["error"] == "unknown_tool"
    assert "echo" in body["detail"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"text": 5}, {"text": "Input should be a valid string"}),
        ({}, {"text": "Field required"}),
        ({"text": "a", "times": 9}, {"times": "less than or equal to 5"}),
        ({"text": "a", "extra": 1}, {"extra": "Extra inputs are not permitted"}),
        ({"times": "x"}, {"text": "Field required", "times": "valid integer"}),
        ("{not json", "arguments are not valid JSON"),
        ("[1, 2]", "arguments must be a JSON object"),
    ],
)
async def test_invalid_arguments_echo_schema(
    arguments: dict[str, object] | str, expected: dict[str, str] | str
) -> None:
    [o] = await ToolRunner().run_calls([call("echo", arguments)], make_ctx(), TOOLS)
    body = json.loads(o.content)
    assert body["error"] == "invalid_arguments" == o.error_kind
    assert body["schema"]["properties"]["text"]["description"] == "what to echo"
    if isinstance(expected, str):
        assert expected in body["detail"]
    else:
        # Every field that is wrong is named, with pydantic's reason.
        by_field = {item["loc"]: item["msg"] for item in body["detail"]}
        assert set(by_field) == set(expected)
        for field, reason in expected.items():
            assert reason in by_field[field]


async def test_raw_json_string_arguments_are_parsed() -> None:
    [o] = await ToolRunner().run_calls([call("echo", '{"text": "hi"}')], make_ctx(), TOOLS)
    assert o.content == "hi" and o.error_kind is None


async def test_crash_is_readable() -> None:
    [o] = await ToolRunner().run_calls([call("boom")], make_ctx(), TOOLS)
    assert json.loads(o.content) == {
        "error": "crashed",
        "detail": "ValueError: the widget is broken",
    }


async def test_timeout_and_hang_never_wedge() -> None:
    state = Stubborn()
    tools = {**TOOLS, "stubborn": stubborn_tool(state)}
    # A runner that waited for the cancelled stubborn call would hang: the
    # watchdog lets it go after a while, so that such a runner fails below
    # instead of wedging the test.
    watchdog = asyncio.get_running_loop().call_later(10, state.release.set)
    try:
        outcomes = await ToolRunner().run_calls(
            [call("sleepy", {"seconds": 30}), call("stubborn"), call("echo", {"text": "ok"})],
            make_ctx(),
            tools,
        )
        # The runner answered while the stubborn call was still running.
        assert state.running and not state.release.is_set()
        assert [o.error_kind for o in outcomes] == ["timeout", "timeout", None]
        assert json.loads(outcomes[0].content)["detail"] == "sleepy did not finish within 0.2 s"
        assert json.loads(outcomes[1].content)["detail"] == "stubborn did not finish within 0.2 s"
        assert outcomes[2].content == "ok"
        # It was cancelled, swallowed the cancellation and kept running.
        await until(lambda: state.cancellations >= 1)
        assert state.running
    finally:
        watchdog.cancel()
        state.release.set()
    await until(lambda: not state.running)


async def test_persona_timeout_overrides_tool_timeout() -> None:
    [o] = await ToolRunner(timeout=0.05).run_calls(
        [call("sleepy", {"seconds": 30})], make_ctx(), TOOLS
    )
    assert o.error_kind == "timeout"
    # The persona's 0.05 s, not the tool's own 0.2 s.
    assert json.loads(o.content)["detail"] == "sleepy did not finish within 0.05 s"


async def test_output_cap_keeps_head_and_tail_and_spills(tmp_path: Path) -> None:
    ctx = make_ctx(settings=TurnSettings(spill_dir=tmp_path))
    [o] = await ToolRunner(output_cap=2_000).run_calls([call("flood", cid="big")], ctx, TOOLS)
    full = "".join(f"line {i}\n" for i in range(20_000))
    assert len(o.content) < 2_400
    assert o.content.startswith("line 0\n")
    assert o.content.endswith("line 19999\n")
    spill = tmp_path / "turn_test" / "big.txt"
    assert f"full output: {spill}" in o.content
    assert f"{len(full) - 2_000} of {len(full)} characters cut" in o.content
    assert spill.read_text() == full


def test_cap_output_leaves_short_text(tmp_path: Path) -> None:
    assert cap_output("short", cap=10, spill_path=tmp_path / "x") == "short"
    assert not (tmp_path / "x").exists()


async def test_structured_results_and_audit_events() -> None:
    ctx = make_ctx()
    [o] = await ToolRunner().run_calls([call("structured")], ctx, TOOLS)
    assert json.loads(o.content) == {"a": 1}
    kinds = [type(e) for e in ctx.audit.events]  # type: ignore[attr-defined]
    assert kinds == [ToolCalled, ToolFinished]


async def test_runner_failure_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(value: object) -> str:
        raise RuntimeError("serializer exploded")

    monkeypatch.setattr("coterie.runtime.runner.to_text", broken)
    [o] = await ToolRunner().run_calls([call("echo", {"text": "x"})], make_ctx(), TOOLS)
    assert o.error_kind == "runner_exception"
    assert "serializer exploded" in o.content


def test_tool_decorator_rejects_bad_functions() -> None:
    with pytest.raises(TypeError, match="async"):
        tool()(lambda a, c: None)  # type: ignore[arg-type,return-value]

    async def no_model(args: int, ctx: TurnContext) -> str:
        """x"""
        return ""

    with pytest.raises(TypeError, match="pydantic model"):
        tool()(no_model)  # type: ignore[arg-type]
