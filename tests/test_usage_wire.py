"""Token accounting and prompt caching on the wire, through the real SDKs.

The fake servers answer in each provider's own usage shape (Anthropic's
uncached ``input_tokens`` beside ``cache_read_input_tokens`` and
``cache_creation_input_tokens``; OpenAI's ``prompt_tokens`` with
``prompt_tokens_details.cached_tokens`` inside it), whole and streamed, and
the neutral :class:`Usage` must add them up the same way. The Anthropic
requests must carry their cache breakpoints where the provider reads them
back, never more than the API's four, over a prefix that does not change
from one call of a growing conversation to the next. A request longer than
the window is a :class:`ContextLengthError` from either provider, and is
not retried.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from coterie.runtime.config import AnthropicModelConfig, OpenAIModelConfig
from coterie.runtime.errors import ContextLengthError
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ThinkingBlock,
    ToolCall,
    ToolDefinition,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from coterie.runtime.models.anthropic_messages import (
    MAX_CACHE_BREAKPOINTS,
    AnthropicModel,
    mark_history_cache,
)
from coterie.runtime.models.openai_chat import OpenAIChatModel
from tests.fakes import FakeAnthropicServer, FakeOpenAIServer

SYSTEM = "You are terse."
LOOKUP = ToolDefinition(
    name="lookup",
    description="Look a word up.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
)
DEFINE = ToolDefinition(
    name="define",
    description="Define a word.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
)
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
async def ant() -> AsyncIterator[FakeAnthropicServer]:
    async with FakeAnthropicServer() as server:
        yield server


@pytest.fixture
async def oai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


def anthropic_model(srv: FakeAnthropicServer, **config: Any) -> AnthropicModel:
    cfg = AnthropicModelConfig.model_validate(
        {
            "provider": "anthropic",
            "name": "claude-test",
            "base_url": srv.base_url,
            "timeout": 5.0,
            **config,
        }
    )
    return AnthropicModel(cfg, api_key="sk-ant-test", retry_base_delay=0.001, retry_max_delay=0.01)


def openai_model(srv: FakeOpenAIServer, **config: Any) -> OpenAIChatModel:
    cfg = OpenAIModelConfig.model_validate(
        {"provider": "openai", "name": "gpt-test", "base_url": srv.base_url, "timeout": 5.0}
        | config
    )
    return OpenAIChatModel(cfg, api_key="sk-test", retry_base_delay=0.001, retry_max_delay=0.01)


async def call(
    model: AnthropicModel | OpenAIChatModel, request: ModelRequest, *, stream: bool
) -> ModelResponse:
    if stream:
        return await model.stream(request, lambda piece: None)
    return await model.request(request)


def ask(messages: list[ChatMessage] | None = None, **kw: Any) -> ModelRequest:
    return ModelRequest(
        system=SYSTEM, messages=messages or [UserMessage(text="hello")], tools=[LOOKUP], **kw
    )


def breakpoints(value: object, path: str = "") -> list[str]:
    """Where ``cache_control`` appears in a request body, as paths."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "cache_control":
                assert inner == EPHEMERAL, f"{path}: {inner!r}"
                found.append(path)
            else:
                found += breakpoints(inner, f"{path}.{key}")
    elif isinstance(value, list):
        for n, inner in enumerate(value):
            found += breakpoints(inner, f"{path}[{n}]")
    return found


def unmarked(value: Any) -> Any:
    """``value`` without its cache markers (what the cache compares)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def dumped(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# -- usage -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_anthropic_cache_tokens_add_up(ant: FakeAnthropicServer, stream: bool) -> None:
    ant.enqueue_text("Cached.", usage=(100, 7), cache_read=900, cache_write=50)
    ant.enqueue_tool_call("lookup", {"word": "x"}, usage=(3, 2), cache_read=0, cache_write=1200)
    model = anthropic_model(ant)
    try:
        text = await call(model, ask(), stream=stream)
        tool = await call(model, ask(), stream=stream)
    finally:
        await model.aclose()
    assert text.message.text == "Cached."
    # Anthropic's input_tokens is the uncached part: the whole input is the sum.
    assert text.usage == Usage(
        input_tokens=1050, output_tokens=7, cache_read_tokens=900, cache_write_tokens=50
    )
    assert tool.message.tool_calls[0].name == "lookup"
    assert tool.usage == Usage(
        input_tokens=1203, output_tokens=2, cache_read_tokens=0, cache_write_tokens=1200
    )


async def test_anthropic_fake_streams_cache_counts_in_message_start(
    ant: FakeAnthropicServer,
) -> None:
    """The streamed figures come where the API puts them: input and cache
    counts in message_start, output in message_delta (so the usage above is
    the SDK keeping message_start's counts, not the fake repeating them)."""
    ant.enqueue_text("x", usage=(100, 7), cache_read=900, cache_write=50)
    body = {"model": "m", "max_tokens": 5, "stream": True, "messages": []}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{ant.base_url}/v1/messages", json=body) as response,
    ):
        text = await response.text()
    events = {
        json.loads(line[len("data: ") :])["type"]: json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ")
    }
    start = events["message_start"]["message"]["usage"]
    assert start["input_tokens"] == 100
    assert start["cache_read_input_tokens"] == 900
    assert start["cache_creation_input_tokens"] == 50
    assert events["message_delta"]["usage"] == {"output_tokens": 7}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_openai_cached_tokens_are_part_of_the_prompt(
    oai: FakeOpenAIServer, stream: bool
) -> None:
    oai.enqueue_text("Cached.", usage=(1000, 7), cache_read=900)
    oai.enqueue_tool_call("lookup", {"word": "x"}, usage=(40, 3), cache_read=32)
    model = openai_model(oai)
    try:
        text = await call(model, ask(), stream=stream)
        tool = await call(model, ask(), stream=stream)
        plain = await call(model, ask(), stream=stream)  # the default reply: no cache
    finally:
        await model.aclose()
    # prompt_tokens counts the cached tokens already; OpenAI reports no writes.
    assert text.usage == Usage(
        input_tokens=1000, output_tokens=7, cache_read_tokens=900, cache_write_tokens=0
    )
    assert tool.message.tool_calls[0].name == "lookup"
    assert tool.usage == Usage(input_tokens=40, output_tokens=3, cache_read_tokens=32)
    assert plain.usage == Usage(input_tokens=10, output_tokens=5)


# -- cache breakpoints ----------------------------------------------------------------


async def test_breakpoints_on_tools_system_and_the_last_two_user_turns(
    ant: FakeAnthropicServer,
) -> None:
    history: list[ChatMessage] = [
        UserMessage(text="define actor"),
        AssistantMessage(
            text="Let me look.", tool_calls=[ToolCall(id="t1", name="lookup", arguments={})]
        ),
        ToolResultMessage(call_id="t1", name="lookup", content="a unit of computation"),
    ]
    model = anthropic_model(ant)
    try:
        await model.request(ModelRequest(system=SYSTEM, messages=history, tools=[LOOKUP, DEFINE]))
    finally:
        await model.aclose()
    body = ant.last_request
    assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == EPHEMERAL
    assert sorted(breakpoints(body)) == sorted(
        [
            ".tools[1]",
            ".system[0]",
            ".messages[2].content[0]",  # the last block of the last message
            ".messages[0].content[0]",  # the last block of the user message before it
        ]
    )
    # The assistant turn between them carries none.
    assert breakpoints(body["messages"][1]) == []


@pytest.mark.parametrize(
    "request_",
    [
        ModelRequest(system="", messages=[UserMessage(text="hi")]),
        ModelRequest(system=SYSTEM, messages=[UserMessage(text="hi")]),
        ModelRequest(system=SYSTEM, messages=[UserMessage(text="hi")], tools=[LOOKUP]),
        ModelRequest(
            system=SYSTEM,
            tools=[LOOKUP, DEFINE],
            messages=[
                m
                for n in range(6)
                for m in (
                    UserMessage(text=f"question {n}"),
                    AssistantMessage(
                        text=f"answer {n}",
                        tool_calls=[ToolCall(id=f"t{n}", name="lookup", arguments={})],
                    ),
                    ToolResultMessage(call_id=f"t{n}", name="lookup", content=f"result {n}"),
                    UserMessage(text=f"follow-up {n}"),
                )
            ],
        ),
        ModelRequest(
            system=SYSTEM,
            tools=[LOOKUP],
            thinking=True,
            messages=[
                UserMessage(text="think"),
                AssistantMessage(thinking=[ThinkingBlock(text="hm", signature="s")]),
                UserMessage(text="again"),
                AssistantMessage(
                    thinking=[ThinkingBlock(text="hm", signature="s")],
                    tool_calls=[ToolCall(id="t", name="lookup", arguments={})],
                ),
                ToolResultMessage(call_id="t", name="lookup", content="r"),
            ],
        ),
    ],
    ids=["bare", "system", "system+tools", "long", "thinking"],
)
async def test_never_more_than_four_breakpoints(
    ant: FakeAnthropicServer, request_: ModelRequest
) -> None:
    model = anthropic_model(ant)
    try:
        await model.request(request_)
        await model.stream(request_, lambda piece: None)
    finally:
        await model.aclose()
    plain, streamed = ant.requests
    assert breakpoints(plain) == breakpoints(streamed)
    marks = breakpoints(plain)
    assert 1 <= len(marks) <= MAX_CACHE_BREAKPOINTS == 4
    # The newest block always carries one; system and tools when they are sent.
    last = len(plain["messages"]) - 1
    assert f".messages[{last}].content[{len(plain['messages'][last]['content']) - 1}]" in marks
    assert (".system[0]" in marks) == bool(request_.system)
    assert (f".tools[{len(request_.tools) - 1}]" in marks) == bool(request_.tools)
    if sum(m["role"] == "user" for m in plain["messages"]) >= 2:
        assert len([m for m in marks if m.startswith(".messages")]) == 2


def test_thinking_blocks_are_never_marked() -> None:
    """The API refuses cache_control on a thinking block: the last block
    that may carry one is marked, and a message of thinking alone is not."""
    thinking = {"type": "thinking", "thinking": "hm", "signature": "s"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}, dict(thinking)]},
    ]
    mark_history_cache(messages)
    assert messages[1]["content"] == [
        {"type": "text", "text": "b", "cache_control": EPHEMERAL},
        thinking,
    ]
    assert messages[0]["content"][0]["cache_control"] == EPHEMERAL
    only_thinking: list[dict[str, Any]] = [{"role": "assistant", "content": [dict(thinking)]}]
    mark_history_cache(only_thinking)
    assert breakpoints(only_thinking) == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_cached_prefix_is_the_same_on_the_next_call(
    ant: FakeAnthropicServer, stream: bool
) -> None:
    """A growing conversation: what call N sent up to its last breakpoint is
    sent again by call N+1, with a breakpoint on that very block to read back
    what call N wrote. Tools and system are the same bytes, markers and all;
    in the history only the marker of call N's earlier breakpoint is gone."""
    ant.enqueue_tool_call("lookup", {"word": "actor"}, call_id="t1", text="Looking.")
    ant.enqueue_text("An actor computes.")
    ant.enqueue_text("A persona talks.")
    model = anthropic_model(ant)
    history: list[ChatMessage] = [UserMessage(text="what is an actor?")]
    try:
        reply = await call(model, ask(list(history)), stream=stream)
        history += [
            reply.message,
            ToolResultMessage(call_id="t1", name="lookup", content="a unit of computation"),
        ]
        reply = await call(model, ask(list(history)), stream=stream)
        history += [reply.message, UserMessage(text="and a persona?")]
        await call(model, ask(list(history)), stream=stream)
    finally:
        await model.aclose()

    bodies = ant.requests
    assert [len(b["messages"]) for b in bodies] == [1, 3, 5]
    for before, after in itertools.pairwise(bodies):
        n = len(before["messages"])
        assert dumped(after["tools"]) == dumped(before["tools"])
        assert dumped(after["system"]) == dumped(before["system"])
        assert dumped(unmarked(after["messages"][:n])) == dumped(unmarked(before["messages"]))
        # Call N's last breakpoint is in call N+1, unchanged: the cache read.
        assert dumped(after["messages"][n - 1]) == dumped(before["messages"][n - 1])
        assert after["messages"][n - 1]["content"][-1]["cache_control"] == EPHEMERAL
        # The history's breakpoints are that one and the new last block.
        last = len(after["messages"]) - 1
        assert [m.split(".content")[0] for m in breakpoints(after) if "messages" in m] == [
            f".messages[{n - 1}]",
            f".messages[{last}]",
        ]


async def test_cache_off_sends_no_cache_control(ant: FakeAnthropicServer) -> None:
    history: list[ChatMessage] = [
        UserMessage(text="one"),
        AssistantMessage(text="two"),
        UserMessage(text="three"),
    ]
    model = anthropic_model(ant, cache=False)
    try:
        await model.request(ask(history))
        await model.stream(ask(history), lambda piece: None)
    finally:
        await model.aclose()
    for body in ant.requests:
        assert "cache_control" not in json.dumps(body)
        assert body["system"] == SYSTEM
        assert body["tools"] == [
            {"name": "lookup", "description": "Look a word up.", "input_schema": LOOKUP.parameters}
        ]


def test_cache_is_on_by_default_and_strict() -> None:
    base = {"provider": "anthropic", "name": "claude-test"}
    assert AnthropicModelConfig.model_validate(base).cache is True
    assert AnthropicModelConfig.model_validate({**base, "cache": False}).cache is False
    with pytest.raises(ValueError, match="cache"):
        AnthropicModelConfig.model_validate({**base, "cache": "sometimes"})
    assert "cache_control" in (AnthropicModelConfig.model_fields["cache"].description or "")


# -- context length ----------------------------------------------------------------------


LONG = [UserMessage(text="x" * 500)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_anthropic_prompt_too_long_is_a_context_length_error(stream: bool) -> None:
    async with FakeAnthropicServer(context_limit_chars=400) as srv:
        srv.enqueue_text("kept for later")
        model = anthropic_model(srv, max_retries=3)
        try:
            with pytest.raises(ContextLengthError) as info:
                await call(model, ask(LONG), stream=stream)
            assert info.value.status == 400
            assert "prompt is too long" in info.value.detail
            # Refused once, not retried; the queued reply was not consumed.
            assert len(srv.requests) == 1 and srv.context_rejections == 1
            assert srv.pending == 1
            assert srv.context_chars(srv.last_request) > 400
            srv.context_limit_chars = None
            reply = await call(model, ask(LONG), stream=stream)
        finally:
            await model.aclose()
    assert reply.message.text == "kept for later"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_openai_context_length_exceeded_is_a_context_length_error(stream: bool) -> None:
    async with FakeOpenAIServer(context_limit_chars=400) as srv:
        srv.enqueue_text("kept for later")
        model = openai_model(srv, max_retries=3)
        try:
            with pytest.raises(ContextLengthError) as info:
                await call(model, ask(LONG), stream=stream)
            assert info.value.status == 400
            assert "maximum context length" in info.value.detail
            assert len(srv.requests) == 1 and srv.context_rejections == 1
            assert srv.pending == 1
            srv.context_limit_chars = None
            reply = await call(model, ask(LONG), stream=stream)
        finally:
            await model.aclose()
    assert reply.message.text == "kept for later"


async def test_context_limit_counts_anthropic_system_too() -> None:
    """Anthropic's system prompt is outside ``messages`` but inside the window."""
    async with FakeAnthropicServer() as srv:
        body = {"system": "s" * 300, "messages": [{"role": "user", "content": "hi"}]}
        assert srv.context_chars(body) == len(json.dumps(body["messages"])) + len(
            json.dumps(body["system"])
        )
        srv.context_limit_chars = 200
        model = anthropic_model(srv, cache=False)
        try:
            with pytest.raises(ContextLengthError):
                await model.request(
                    ModelRequest(system="s" * 300, messages=[UserMessage(text="hi")])
                )
        finally:
            await model.aclose()
