"""OpenAIChatModel through the real ``openai`` SDK against a local fake server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from coterie.runtime.config import OpenAIModelConfig
from coterie.runtime.errors import MissingAPIKeyError, ModelHTTPError, ModelTimeoutError
from coterie.runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ToolCall,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models import _retry
from coterie.runtime.models.openai_chat import OpenAIChatModel, ToolsWire
from tests.fakes import FakeOpenAIServer

KEY = "sk-test-openai"
WEATHER = ToolDefinition(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


@pytest.fixture
async def srv() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


def make_model(base_url: str, *, api_key: str | None = KEY, **config: Any) -> OpenAIChatModel:
    cfg = OpenAIModelConfig.model_validate(
        {"provider": "openai", "name": "gpt-test", "base_url": base_url, "timeout": 5.0, **config}
    )
    return OpenAIChatModel(cfg, api_key=api_key, retry_base_delay=0.001, retry_max_delay=0.05)


def ask(text: str = "hello", **kw: Any) -> ModelRequest:
    return ModelRequest(system="You are terse.", messages=[UserMessage(text=text)], **kw)


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays the retry policy chose before each retry, in order."""
    chosen: list[float] = []
    real = _retry.backoff_delay

    def recording(attempt: int, **kw: Any) -> float:
        delay = real(attempt, **kw)
        chosen.append(delay)
        return delay

    monkeypatch.setattr(_retry, "backoff_delay", recording)
    return chosen


async def test_plain_text_reply(srv: FakeOpenAIServer) -> None:
    srv.enqueue_text("hi there", usage=(12, 3))
    model = make_model(srv.base_url)
    try:
        resp = await model.request(ask(max_tokens=77))
    finally:
        await model.aclose()

    assert resp.message.text == "hi there"
    assert resp.message.tool_calls == []
    assert resp.message.reasoning_content is None
    assert resp.provider == "openai" and resp.model == "gpt-test"
    assert resp.usage.input_tokens == 12 and resp.usage.output_tokens == 3
    assert resp.stop_reason == "stop"
    assert model.provider == "openai" and model.name == "gpt-test"

    body = srv.last_request
    assert body["model"] == "gpt-test"
    assert body["max_tokens"] == 77
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
    ]
    assert "tools" not in body and "tool_choice" not in body
    assert srv.api_keys == [KEY]


async def test_a_server_started_without_recording_answers_and_keeps_nothing() -> None:
    # The benchmarks' server takes thousands of requests it never reads.
    async with FakeOpenAIServer(record=False) as server:
        server.enqueue_text("scripted")
        model = make_model(server.base_url)
        try:
            first = await model.request(ask())
            second = await model.request(ask(tools=[WEATHER]))
        finally:
            await model.aclose()
        assert first.message.text == "scripted"
        assert second.message.text == "ok"  # the default reply once the queue is empty
        assert server.requests == [] and server.headers == []
        with pytest.raises(RuntimeError, match="record=False"):
            _ = server.last_request
        with pytest.raises(RuntimeError, match="record=False"):
            _ = server.api_keys


async def test_tool_call_round_trip(srv: FakeOpenAIServer) -> None:
    srv.enqueue_tool_call("get_weather", {"city": "Paris"}, call_id="call_1")
    srv.enqueue_text("It is sunny.")
    model = make_model(srv.base_url)
    try:
        first = await model.request(ask("weather?", tools=[WEATHER]))
        assert first.stop_reason == "tool_calls"
        assert first.message.text == ""
        assert first.message.tool_calls == [
            ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})
        ]
        history = [
            UserMessage(text="weather?"),
            first.message,
            ToolResultMessage(call_id="call_1", name="get_weather", content="sunny, 21C"),
        ]
        second = await model.request(
            ModelRequest(system="You are terse.", messages=history, tools=[WEATHER])
        )
    finally:
        await model.aclose()

    assert second.message.text == "It is sunny."
    first_body, second_body = srv.requests
    assert first_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert first_body["tool_choice"] == "auto"
    assert second_body["messages"][1:] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]


CLOCK = ToolDefinition(
    name="clock",
    description="L'heure qu'il est, à Paris ou ailleurs.",
    parameters={"type": "object", "properties": {}},
)


def wire_tool(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


async def test_the_tools_sent_follow_each_requests_tool_set(srv: FakeOpenAIServer) -> None:
    # The tools' JSON is cached per set of tools: every call must still send
    # exactly the tools it was given, whole, as the JSON it declares.
    sets: list[list[ToolDefinition]] = [[WEATHER], [WEATHER], [WEATHER, CLOCK], [CLOCK], []]
    model = make_model(srv.base_url)
    try:
        for tools in sets:
            await model.request(ask(tools=tools))
    finally:
        await model.aclose()
    for tools, body, headers in zip(sets, srv.requests, srv.headers, strict=True):
        assert body.get("tools", []) == [wire_tool(t) for t in tools]
        assert body["messages"] == [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hello"},
        ]
        assert headers["content-type"] == "application/json"
    assert "tool_choice" not in srv.requests[-1]
    assert srv.requests[3]["tools"][0]["function"]["description"] == CLOCK.description


def test_a_tool_set_dropped_from_the_cache_is_encoded_in_full() -> None:
    model = OpenAIChatModel(OpenAIModelConfig(provider="openai", name="gpt-test"), api_key=KEY)
    model._tools = ToolsWire(size=2)
    first = model.build_params(ask(tools=[WEATHER]))
    assert model.build_params(ask(tools=[WEATHER]))["tools"] is first["tools"]
    model.build_params(ask(tools=[CLOCK]))
    model.build_params(ask(tools=[WEATHER, CLOCK]))  # evicts [WEATHER], the oldest
    assert model._tools.encoded(first["tools"]) is None
    again = model.build_params(ask(tools=[WEATHER]))
    assert again["tools"] is not first["tools"]
    for params in (first, again, model.build_params(ask(tools=[CLOCK]))):
        assert json.loads(model.encode(params)) == params
    # Unknown lists (a body built by hand) are encoded as they are.
    by_hand = {**first, "tools": [wire_tool(CLOCK)]}
    assert json.loads(model.encode(by_hand)) == by_hand


def test_a_body_is_the_json_the_sdk_would_write() -> None:
    from openai._utils._json import openapi_dumps

    model = make_model("http://127.0.0.1:9/v1")
    history = [
        UserMessage(text='héllo "quoted" \\ back\nslash \u2028 \x00 </script> 日本'),
        AssistantMessage(
            text="", tool_calls=[ToolCall(id="c1", name="clock", arguments={"tz": "Europe/Paris"})]
        ),
        ToolResultMessage(call_id="c1", name="clock", content="12:00 \u00e9t\u00e9"),
    ]
    plain = model.build_params(ModelRequest(system="Sé terse.", messages=history, max_tokens=9))
    assert model.encode(plain) == openapi_dumps(plain)
    tooled = model.build_params(
        ModelRequest(system="Sé terse.", messages=history, tools=[WEATHER, CLOCK])
    )
    assert json.loads(model.encode(tooled)) == json.loads(openapi_dumps(tooled))


async def test_tool_choice_named_and_none(srv: FakeOpenAIServer) -> None:
    model = make_model(srv.base_url)
    try:
        await model.request(ask(tools=[WEATHER], tool_choice=ToolChoiceNamed(name="get_weather")))
        await model.request(ask(tools=[WEATHER], tool_choice=ToolChoiceNone()))
    finally:
        await model.aclose()
    named, none = srv.requests
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert none["tool_choice"] == "none"


async def test_raw_string_arguments_are_sent_as_is(srv: FakeOpenAIServer) -> None:
    history = [
        UserMessage(text="go"),
        AssistantMessage(
            text="calling", tool_calls=[ToolCall(id="c1", name="get_weather", arguments="{oops")]
        ),
        ToolResultMessage(call_id="c1", name="get_weather", content="bad", error_kind="invalid"),
    ]
    model = make_model(srv.base_url)
    try:
        await model.request(ModelRequest(system="", messages=history))
    finally:
        await model.aclose()
    messages = srv.last_request["messages"]
    # An empty system prompt is not sent.
    assert messages[0] == {"role": "user", "content": "go"}
    assert messages[1]["content"] == "calling"
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == "{oops"


async def test_malformed_tool_arguments_come_back_raw(srv: FakeOpenAIServer) -> None:
    srv.enqueue_tool_calls(
        [
            ("get_weather", '{"city": "Par', "c1"),
            ("get_weather", "[1, 2]", "c2"),
            ("get_weather", "", "c3"),
        ]
    )
    model = make_model(srv.base_url)
    try:
        resp = await model.request(ask(tools=[WEATHER]))
    finally:
        await model.aclose()
    args = [call.arguments for call in resp.message.tool_calls]
    # Not JSON, and JSON that is not an object, stay raw; empty means "no arguments".
    assert args == ['{"city": "Par', "[1, 2]", {}]


def _completion(message: Any, **choice: Any) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", **choice}],
    }


PROXY_PAGE = "<html><body>Sign in to the proxy. Authorization: Bearer sk-leaked</body></html>"


@pytest.mark.parametrize(
    ("body", "headers", "named"),
    [
        (
            PROXY_PAGE,
            {"content-type": "text/html"},
            "expected a JSON object, got text that is not JSON",
        ),
        ('{"choices": [', {}, "the body is not valid JSON"),
        ([{"message": "hi"}], {}, "expected a JSON object, got a JSON array"),
        ({"choices": "hi"}, {}, "choices is a string, not a list of objects"),
        (_completion(None), {}, "choices[0].message is null"),
        (_completion({"role": "assistant", "content": 7}), {}, "message.content is a JSON number"),
        (
            _completion({"role": "assistant", "content": None, "tool_calls": {"id": "c1"}}),
            {},
            "message.tool_calls is an object",
        ),
        (
            _completion(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                }
            ),
            {},
            "message.tool_calls[0] is not an object with a string id",
        ),
        (
            _completion(
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": 5}}],
                }
            ),
            {},
            "message.tool_calls[0].function.arguments is a JSON number, not a string",
        ),
    ],
)
async def test_an_answer_that_is_not_a_completion_is_a_model_error_naming_what_is_wrong(
    srv: FakeOpenAIServer, body: Any, headers: dict[str, str], named: str
) -> None:
    srv.enqueue_raw(body, headers=headers)
    model = make_model(srv.base_url)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    message = str(info.value)
    assert "invalid response from openai model 'gpt-test': " + named in message
    # Not retried, and the body itself is not echoed (a proxy's page may quote the key).
    assert len(srv.requests) == 1
    assert "sk-leaked" not in message and "Sign in" not in message


async def test_lenient_shapes_of_compatible_servers_are_read(srv: FakeOpenAIServer) -> None:
    """Arguments sent decoded, content as a list of parts, usage absent, a tool
    call of a kind that is not ours: read, not failed."""
    srv.enqueue_raw(
        _completion(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "two "},
                    {"type": "image_url", "image_url": {"url": "x"}},
                    {"type": "text", "text": "parts"},
                ],
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"a": 1}},
                    },
                    {"id": "c2", "type": "mcp", "mcp": {"server": "x"}},
                    {
                        "id": "c3",
                        "type": "custom",
                        "custom": {"name": "patch", "input": "*** Begin"},
                    },
                ],
            },
            finish_reason="tool_calls",
        )
    )
    model = make_model(srv.base_url)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "two parts"
    assert [(c.id, c.name, c.arguments) for c in resp.message.tool_calls] == [
        ("c1", "f", {"a": 1}),
        ("c3", "patch", "*** Begin"),
    ]
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (0, 0)
    assert resp.stop_reason == "tool_calls"


async def test_429_then_success_is_retried(srv: FakeOpenAIServer) -> None:
    srv.enqueue_error(429, headers={"retry-after": "0"})
    srv.enqueue_text("finally")
    model = make_model(srv.base_url, max_retries=3)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "finally"
    assert len(srv.requests) == 2
    assert srv.requests[0] == srv.requests[1]


async def test_retry_after_header_is_honoured(srv: FakeOpenAIServer, delays: list[float]) -> None:
    srv.enqueue_error(429, headers={"retry-after": "0.3"})
    srv.enqueue_text("ok")
    cfg = make_model(srv.base_url).config.model_copy(update={"max_retries": 1})
    model = OpenAIChatModel(cfg, api_key=KEY, retry_base_delay=0.001, retry_max_delay=1.0)
    start = time.monotonic()
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "ok" and len(srv.requests) == 2
    # The server's 0.3 s, not the 0.001 s backoff; and it was slept (a lower bound).
    assert delays == [0.3]
    assert time.monotonic() - start >= 0.25


async def test_retry_after_is_capped_by_max_delay(
    srv: FakeOpenAIServer, delays: list[float]
) -> None:
    srv.enqueue_error(503, headers={"retry-after": "30"})
    srv.enqueue_text("ok")
    model = make_model(srv.base_url, max_retries=1)  # retry_max_delay=0.05
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "ok" and len(srv.requests) == 2
    assert delays == [0.05]  # the cap, not the server's 30 s


async def test_500_twice_then_success(srv: FakeOpenAIServer) -> None:
    srv.enqueue_error(500)
    srv.enqueue_error(502, body="<html>bad gateway</html>")
    srv.enqueue_text("recovered")
    model = make_model(srv.base_url, max_retries=3)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "recovered"
    assert len(srv.requests) == 3


async def test_400_is_not_retried(srv: FakeOpenAIServer) -> None:
    srv.enqueue_error(400, message="messages: bad role")
    srv.enqueue_text("never sent")
    model = make_model(srv.base_url, max_retries=3)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    assert info.value.status == 400
    assert "400" in str(info.value) and "messages: bad role" in str(info.value)
    assert len(srv.requests) == 1


async def test_exhausted_retries_raise_model_http_error(srv: FakeOpenAIServer) -> None:
    for _ in range(3):
        srv.enqueue_error(503)
    model = make_model(srv.base_url, max_retries=2)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    assert info.value.status == 503
    assert "503" in str(info.value)
    assert len(srv.requests) == 3
    # The SDK exception stays a cause; the raised type is ours.
    assert type(info.value) is ModelHTTPError


async def test_timeout_raises_model_timeout_error() -> None:
    async with FakeOpenAIServer(latency=10.0) as srv:
        model = make_model(srv.base_url, timeout=0.2, max_retries=0)
        try:
            with pytest.raises(ModelTimeoutError, match=r"0\.2s"):
                await model.request(ask())
        finally:
            await model.aclose()
        assert len(srv.requests) == 1


async def test_timeout_is_retried(srv: FakeOpenAIServer) -> None:
    srv.enqueue_text("slow", latency=10.0)
    srv.enqueue_text("fast")
    # 0.5 s is far beyond a local round trip: only the slow reply times out.
    model = make_model(srv.base_url, timeout=0.5, max_retries=1)
    try:
        resp = await model.request(ask())
    finally:
        await model.aclose()
    assert resp.message.text == "fast"
    assert len(srv.requests) == 2


async def test_connection_refused_raises_model_http_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = make_model(f"http://127.0.0.1:{port}/v1", max_retries=1)
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.request(ask())
    finally:
        await model.aclose()
    assert info.value.status is None
    assert "connection" in str(info.value).lower()


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COTERIE_TEST_OPENAI_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError) as info:
        make_model("http://127.0.0.1:9/v1", api_key=None, api_key_env="COTERIE_TEST_OPENAI_KEY")
    assert "COTERIE_TEST_OPENAI_KEY" in str(info.value)
    assert info.value.env_var == "COTERIE_TEST_OPENAI_KEY"

    monkeypatch.setenv("COTERIE_TEST_OPENAI_KEY", "")
    with pytest.raises(MissingAPIKeyError):
        make_model("http://127.0.0.1:9/v1", api_key=None, api_key_env="COTERIE_TEST_OPENAI_KEY")


async def test_api_key_from_environment_reaches_server(
    srv: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTERIE_TEST_OPENAI_KEY", "sk-from-env")
    model = make_model(srv.base_url, api_key=None, api_key_env="COTERIE_TEST_OPENAI_KEY")
    try:
        await model.request(ask())
    finally:
        await model.aclose()
    assert srv.headers[0]["authorization"] == "Bearer sk-from-env"


def _tool_history() -> list[Any]:
    return [
        UserMessage(text="weather?"),
        AssistantMessage(tool_calls=[ToolCall(id="c1", name="get_weather", arguments={})]),
        ToolResultMessage(call_id="c1", name="get_weather", content="rain"),
        AssistantMessage(
            text="checking again",
            tool_calls=[ToolCall(id="c2", name="get_weather", arguments={"city": "Oslo"})],
            reasoning_content="need Oslo too",
        ),
        ToolResultMessage(call_id="c2", name="get_weather", content="snow"),
        AssistantMessage(text="It rains and snows."),
        UserMessage(text="thanks"),
    ]


@pytest.mark.parametrize("enabled", [True, False])
async def test_reasoning_content_backfill(srv: FakeOpenAIServer, enabled: bool) -> None:
    srv.enqueue_text("you're welcome", reasoning_content="polite reply")
    model = make_model(srv.base_url, reasoning_content=enabled)
    try:
        resp = await model.request(
            ModelRequest(system="s", messages=_tool_history(), tools=[WEATHER], thinking=True)
        )
    finally:
        await model.aclose()
    assert resp.message.reasoning_content == "polite reply"

    assistants = [m for m in srv.last_request["messages"] if m["role"] == "assistant"]
    first, second, plain = assistants
    # A stored value is always sent back; "" is only back-filled when enabled.
    assert second["reasoning_content"] == "need Oslo too"
    if enabled:
        assert first["reasoning_content"] == ""
    else:
        assert "reasoning_content" not in first
    assert "reasoning_content" not in plain


async def test_no_backfill_without_thinking(srv: FakeOpenAIServer) -> None:
    model = make_model(srv.base_url, reasoning_content=True)
    try:
        await model.request(ModelRequest(system="s", messages=_tool_history(), thinking=False))
    finally:
        await model.aclose()
    first = next(m for m in srv.last_request["messages"] if m["role"] == "assistant")
    assert "reasoning_content" not in first


async def test_reasoning_round_trip_from_response(srv: FakeOpenAIServer) -> None:
    srv.enqueue_tool_call("get_weather", {"city": "Rome"}, call_id="r1", reasoning_content="hmm")
    srv.enqueue_text("done")
    model = make_model(srv.base_url, reasoning_content=True)
    try:
        first = await model.request(ask(tools=[WEATHER], thinking=True))
        assert first.message.reasoning_content == "hmm"
        history = [
            UserMessage(text="hello"),
            first.message,
            ToolResultMessage(call_id="r1", name="get_weather", content="warm"),
        ]
        await model.request(
            ModelRequest(system="s", messages=history, tools=[WEATHER], thinking=True)
        )
    finally:
        await model.aclose()
    assistant = srv.last_request["messages"][2]
    assert assistant["reasoning_content"] == "hmm"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}


def test_module_import_does_not_import_openai() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runtime.models.openai_chat, runtime.models.anthropic_messages;"
        "sys.exit(int('openai' in sys.modules or 'anthropic' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_threaded_server_with_blocking_caller() -> None:
    import asyncio

    with FakeOpenAIServer(latency=0.05) as srv:
        srv.enqueue_text("from a thread")

        async def call() -> str:
            model = make_model(srv.base_url)
            try:
                return (await model.request(ask())).message.text
            finally:
                await model.aclose()

        # The caller's own loop is separate from the server's.
        assert asyncio.run(call()) == "from a thread"
        assert asyncio.run(call()) == "ok"
    assert len(srv.requests) == 2
