"""AnthropicModel through the real ``anthropic`` SDK against a local fake server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from coterie.runtime.config import AnthropicModelConfig
from coterie.runtime.errors import MissingAPIKeyError, ModelHTTPError, ModelTimeoutError
from coterie.runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ThinkingBlock,
    ToolCall,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models.anthropic_messages import AnthropicModel
from tests.fakes import FakeAnthropicServer

KEY = "sk-ant-test"
LOOKUP = ToolDefinition(
    name="lookup",
    description="Look a word up.",
    parameters={
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    },
)


@pytest.fixture
async def srv() -> AsyncIterator[FakeAnthropicServer]:
    async with FakeAnthropicServer() as server:
        yield server


def make_model(base_url: str, *, api_key: str | None = KEY, **config: Any) -> AnthropicModel:
    # Prompt caching off: these tests read the wire shape block by block, and
    # the cache breakpoints have their own tests (tests/test_usage_wire.py).
    cfg = AnthropicModelConfig.model_validate(
        {
            "provider": "anthropic",
            "name": "claude-test",
            "base_url": base_url,
            "timeout": 5.0,
            "cache": False,
            **config,
        }
    )
    return AnthropicModel(cfg, api_key=api_key, retry_base_delay=0.001, retry_max_delay=0.05)


def ask(text: str = "hello", **kw: Any) -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=[UserMessage(text=text)], **kw)


async def test_plain_text_reply(srv: FakeAnthropicServer) -> None:
    srv.enqueue_content(
        [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world."}],
        usage=(21, 4),
    )
    model = make_model(srv.base_url)
    try:
        resp = await model.request(ask(max_tokens=300))
    finally:
        await model.aclose()

    assert resp.message.text == "Hello, world."
    assert resp.message.tool_calls == [] and resp.message.thinking == []
    assert resp.provider == "anthropic" and resp.model == "claude-test"
    assert resp.usage.input_tokens == 21 and resp.usage.output_tokens == 4
    assert resp.stop_reason == "end_turn"
    assert model.provider == "anthropic" and model.name == "claude-test"

    body = srv.last_request
    assert body["model"] == "claude-test"
    assert body["max_tokens"] == 300
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert "tools" not in body and "tool_choice" not in body and "thinking" not in body
    # anthropic 2.x sends the API key as a bearer token, not x-api-key.
    assert srv.api_keys == [KEY]
    assert "anthropic-version" in srv.headers[0]


async def test_tool_call_round_trip(srv: FakeAnthropicServer) -> None:
    srv.enqueue_tool_call("lookup", {"word": "actor"}, call_id="toolu_1", text="Let me check.")
    srv.enqueue_text("An actor is a unit of computation.")
    model = make_model(srv.base_url)
    try:
        first = await model.request(ask("define actor", tools=[LOOKUP]))
        assert first.stop_reason == "tool_use"
        assert first.message.text == "Let me check."
        assert first.message.tool_calls == [
            ToolCall(id="toolu_1", name="lookup", arguments={"word": "actor"})
        ]
        history = [
            UserMessage(text="define actor"),
            first.message,
            ToolResultMessage(call_id="toolu_1", name="lookup", content="a unit of computation"),
        ]
        second = await model.request(
            ModelRequest(system="Be brief.", messages=history, tools=[LOOKUP])
        )
    finally:
        await model.aclose()

    assert second.message.text == "An actor is a unit of computation."
    first_body, second_body = srv.requests
    assert first_body["tools"] == [
        {"name": "lookup", "description": "Look a word up.", "input_schema": LOOKUP.parameters}
    ]
    assert first_body["tool_choice"] == {"type": "auto"}
    assert second_body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "define actor"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"word": "actor"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "a unit of computation",
                }
            ],
        },
    ]


async def test_tool_choice_named_and_none(srv: FakeAnthropicServer) -> None:
    model = make_model(srv.base_url)
    try:
        await model.request(ask(tools=[LOOKUP], tool_choice=ToolChoiceNamed(name="lookup")))
        await model.request(ask(tools=[LOOKUP], tool_choice=ToolChoiceNone()))
    finally:
        await model.aclose()
    named, none = srv.requests
    assert named["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert none["tool_choice"] == {"type": "none"}


async def test_tool_results_merge_into_one_user_message(srv: FakeAnthropicServer) -> None:
    history = [
        UserMessage(text="look up two words"),
        AssistantMessage(
            tool_calls=[
                ToolCall(id="t1", name="lookup", arguments={"word": "a"}),
                ToolCall(id="t2", name="lookup", arguments="{not json"),
            ]
        ),
        ToolResultMessage(call_id="t1", name="lookup", content="first"),
        ToolResultMessage(
            call_id="t2", name="lookup", content="invalid arguments", error_kind="invalid"
        ),
        UserMessage(text="(a new message arrived)"),
    ]
    model = make_model(srv.base_url)
    try:
        await model.request(ModelRequest(system="", messages=history, tools=[LOOKUP]))
    finally:
        await model.aclose()
    body = srv.last_request
    assert "system" not in body
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    # Raw (unparseable) arguments are replayed as an empty object.
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"word": "a"}},
        {"type": "tool_use", "id": "t2", "name": "lookup", "input": {}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "first"},
        {
            "type": "tool_result",
            "tool_use_id": "t2",
            "content": "invalid arguments",
            "is_error": True,
        },
        {"type": "text", "text": "(a new message arrived)"},
    ]


async def test_thinking_blocks_are_sent_back_with_signatures(srv: FakeAnthropicServer) -> None:
    srv.enqueue_content(
        [
            FakeAnthropicServer.thinking_block("The user wants a word.", "sig-abc"),
            FakeAnthropicServer.redacted_thinking_block("opaque-bytes"),
            srv.tool_use_block("lookup", {"word": "ray"}, "toolu_9"),
        ]
    )
    srv.enqueue_text("Ray is a framework.", thinking="Answer now.", signature="sig-def")
    model = make_model(srv.base_url, thinking_budget=2048)
    try:
        first = await model.request(ask("define ray", tools=[LOOKUP], thinking=True))
        assert first.message.thinking == [
            ThinkingBlock(text="The user wants a word.", signature="sig-abc"),
            ThinkingBlock(text="opaque-bytes", redacted=True),
        ]
        assert first.message.tool_calls[0].arguments == {"word": "ray"}
        history = [
            UserMessage(text="define ray"),
            first.message,
            ToolResultMessage(call_id="toolu_9", name="lookup", content="a framework"),
        ]
        second = await model.request(
            ModelRequest(system="Be brief.", messages=history, tools=[LOOKUP], thinking=True)
        )
    finally:
        await model.aclose()

    assert second.message.text == "Ray is a framework."
    assert second.message.thinking == [ThinkingBlock(text="Answer now.", signature="sig-def")]
    first_body, second_body = srv.requests
    assert first_body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    # max_tokens must exceed the budget: 4096 already does.
    assert first_body["max_tokens"] == 4096
    assert second_body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "The user wants a word.", "signature": "sig-abc"},
            {"type": "redacted_thinking", "data": "opaque-bytes"},
            {"type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {"word": "ray"}},
        ],
    }
    assert second_body["messages"][2]["content"][0]["type"] == "tool_result"


async def test_enqueue_thinking_then_tool_call(srv: FakeAnthropicServer) -> None:
    srv.enqueue_thinking_then_tool_call("hm", "lookup", {"word": "x"}, signature="s1")
    model = make_model(srv.base_url)
    try:
        resp = await model.request(ask(tools=[LOOKUP], thinking=True))
    finally:
        await model.aclose()
    assert resp.message.thinking == [ThinkingBlock(text="hm", signature="s1")]
    assert resp.message.tool_calls[0].name == "lookup"


async def test_thinking_raises_max_tokens_above_budget(srv: FakeAnthropicServer) -> None:
    model = make_model(srv.base_url, thinking_budget=3000)
    try:
        await model.request(ask(max_tokens=1000, thinking=True))
    finally:
        await model.aclose()
    body = srv.last_request
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 3000}
    assert body["max_tokens"] == 3000 + 1024


async def test_malformed_tool_input_comes_back_raw(srv: FakeAnthropicServer) -> None:
    srv.enqueue_tool_call("lookup", '{"word": "tr', call_id="t1")
    srv.enqueue_tool_call("lookup", '{"word": "ok"}', call_id="t2")
    model = make_model(srv.base_url)
    try:
        bad = await model.request(ask(tools=[LOOKUP]))
        good = await model.request(ask(tools=[LOOKUP]))
    finally:
        await model.aclose()
    assert bad.message.tool_calls[0].arguments == '{"word": "tr'
    # A JSON-encoded object sent as a string is still understood.
    assert good.message.tool_calls[0].arguments == {"word": "ok"}


def _message(**fields: Any) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", **fields}


PROXY_PAGE = "<html><body>Sign in to the proxy. Authorization: Bearer sk-leaked</body></html>"


@pytest.mark.parametrize(
    ("body", "headers", "named"),
    [
        (
            PROXY_PAGE,
            {"content-type": "text/html"},
            "expected a JSON object, got text that is not JSON",
        ),
        ('{"content": [', {}, "the body is not valid JSON"),
        ([{"type": "text", "text": "hi"}], {}, "expected a JSON object, got a JSON array"),
        (_message(stop_reason="end_turn"), {}, "content is null, not a list of blocks"),
        (_message(content={"type": "text"}), {}, "content is an object, not a list of blocks"),
        (_message(content=[{"type": "text", "text": 7}]), {}, "content[0].text is a JSON number"),
    ],
)
async def test_an_answer_that_is_not_a_message_is_a_model_error_naming_what_is_wrong(
    srv: FakeAnthropicServer, body: Any, headers: dict[str, str], named: str
) -> None:
    srv.enqueue_raw(body, headers=headers)
    model = make_model(srv.base_url)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    message = str(info.value)
    assert "invalid response from anthropic model 'claude-test': " + named in message
    # Not retried, and the body itself is not echoed (a proxy's page may quote the key).
    assert len(srv.requests) == 1
    assert "sk-leaked" not in message and "Sign in" not in message


async def test_a_message_without_usage_counts_no_tokens(srv: FakeAnthropicServer) -> None:
    srv.enqueue_raw(_message(content=[{"type": "text", "text": "hi"}], stop_reason="end_turn"))
    model = make_model(srv.base_url)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "hi" and resp.stop_reason == "end_turn"
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (0, 0)


async def test_429_then_success_is_retried(srv: FakeAnthropicServer) -> None:
    srv.enqueue_error(429, headers={"retry-after": "0"})
    srv.enqueue_text("finally")
    model = make_model(srv.base_url, max_retries=3)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "finally"
    assert len(srv.requests) == 2


async def test_500_twice_then_success(srv: FakeAnthropicServer) -> None:
    srv.enqueue_error(500)
    srv.enqueue_error(529, message="Overloaded")
    srv.enqueue_text("recovered")
    model = make_model(srv.base_url, max_retries=3)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "recovered"
    assert len(srv.requests) == 3


async def test_400_is_not_retried(srv: FakeAnthropicServer) -> None:
    srv.enqueue_error(400, message="messages.0.content: empty")
    model = make_model(srv.base_url, max_retries=3)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    assert info.value.status == 400
    assert "400" in str(info.value) and "messages.0.content: empty" in str(info.value)
    assert len(srv.requests) == 1


async def test_exhausted_retries_raise_model_http_error(srv: FakeAnthropicServer) -> None:
    for _ in range(2):
        srv.enqueue_error(429, headers={"retry-after": "0"})
    model = make_model(srv.base_url, max_retries=1)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    assert info.value.status == 429
    assert type(info.value) is ModelHTTPError
    assert len(srv.requests) == 2


async def test_timeout_raises_model_timeout_error() -> None:
    async with FakeAnthropicServer(latency=1.0) as srv:
        model = make_model(srv.base_url, timeout=0.2, max_retries=0)
        try:
            with pytest.raises(ModelTimeoutError, match=r"0\.2s"):
                await model.request(ask())
        finally:
            await model.aclose()
        assert len(srv.requests) == 1


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COTERIE_TEST_ANTHROPIC_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError) as info:
        make_model("http://127.0.0.1:9", api_key=None, api_key_env="COTERIE_TEST_ANTHROPIC_KEY")
    assert "COTERIE_TEST_ANTHROPIC_KEY" in str(info.value)
    assert "anthropic" in str(info.value)


async def test_api_key_from_environment_reaches_server(
    srv: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTERIE_TEST_ANTHROPIC_KEY", "sk-ant-env")
    model = make_model(srv.base_url, api_key=None, api_key_env="COTERIE_TEST_ANTHROPIC_KEY")
    try:
        await model.request(ask())
    finally:
        await model.aclose()
    assert srv.api_keys == ["sk-ant-env"]


async def test_default_reply_and_concurrency() -> None:
    import asyncio

    async with FakeAnthropicServer(latency=0.2) as srv:
        model = make_model(srv.base_url)
        try:
            replies = await asyncio.gather(*(model.request(ask(f"q{i}")) for i in range(50)))
        finally:
            await model.aclose()
        assert {r.message.text for r in replies} == {"ok"}
        assert len(srv.requests) == 50
        # Latency overlaps instead of queueing.
        assert srv.max_in_flight > 10
