"""Streaming from the providers: ``stream`` gives what ``request`` gives, its
text handed out in pieces on the way.

The network providers run through the real ``openai`` and ``anthropic`` SDK
clients against the local fake servers, which answer the same queued reply
plain or streamed, so each test can ask both ways and compare.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from coterie.runtime.config import AnthropicModelConfig, OpenAIModelConfig, ScriptedModelConfig
from coterie.runtime.errors import ModelError, ModelHTTPError, ModelTimeoutError
from coterie.runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ThinkingBlock,
    ToolCall,
    ToolDefinition,
    UserMessage,
)
from coterie.runtime.models import (
    FunctionModel,
    RulesModel,
    ScriptedModel,
    StreamingModel,
    UnavailableModel,
)
from coterie.runtime.models.anthropic_messages import AnthropicModel
from coterie.runtime.models.openai_chat import OpenAIChatModel
from tests.fakes import FakeAnthropicServer, FakeOpenAIServer

LOOKUP = ToolDefinition(
    name="lookup",
    description="Look a word up.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
)


class Pieces(list[str]):
    """An ``on_text`` sink that keeps every piece."""

    def __call__(self, piece: str) -> None:
        self.append(piece)


def ask(text: str = "hello", **kw: Any) -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=[UserMessage(text=text)], **kw)


def comparable(response: ModelResponse) -> dict[str, Any]:
    """The response without its timestamp (the only field two calls differ in)."""
    return response.model_dump(exclude={"message": {"ts"}})


def assert_streamed(pieces: list[str], response: ModelResponse, *, several: bool = True) -> None:
    assert "".join(pieces) == response.message.text
    assert all(pieces), pieces
    if several:
        assert len(pieces) > 1, pieces


@pytest.fixture
async def oai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def ant() -> AsyncIterator[FakeAnthropicServer]:
    async with FakeAnthropicServer() as server:
        yield server


def openai_model(srv: FakeOpenAIServer, **config: Any) -> OpenAIChatModel:
    cfg = OpenAIModelConfig.model_validate(
        {"provider": "openai", "name": "gpt-test", "base_url": srv.base_url, "timeout": 5.0}
        | config
    )
    return OpenAIChatModel(cfg, api_key="sk-test", retry_base_delay=0.001, retry_max_delay=0.01)


def anthropic_model(srv: FakeAnthropicServer, **config: Any) -> AnthropicModel:
    cfg = AnthropicModelConfig.model_validate(
        {"provider": "anthropic", "name": "claude-test", "base_url": srv.base_url, "timeout": 5.0}
        | config
    )
    return AnthropicModel(cfg, api_key="sk-ant-test", retry_base_delay=0.001, retry_max_delay=0.01)


async def both_ways(
    model: OpenAIChatModel | AnthropicModel, enqueue: Callable[[], None], request: ModelRequest
) -> tuple[ModelResponse, ModelResponse, Pieces]:
    """The same scripted answer asked for plainly, then streamed."""
    enqueue()
    enqueue()
    pieces = Pieces()
    try:
        plain = await model.request(request)
        streamed = await model.stream(request, pieces)
    finally:
        await model.aclose()
    return plain, streamed, pieces


# -- OpenAI ---------------------------------------------------------------------------

OPENAI_REPLIES: dict[str, Callable[[FakeOpenAIServer], None]] = {
    "text": lambda s: s.enqueue_text("The quick brown fox jumps.", usage=(12, 3)),
    "cut by max_tokens": lambda s: s.enqueue_text("It was a dark", finish_reason="length"),
    "reasoning": lambda s: s.enqueue_text("Paris.", reasoning_content="The capital is Paris."),
    "tool calls": lambda s: s.enqueue_tool_calls(
        [("lookup", {"word": "actor", "lang": "en"}, "call_1"), ("lookup", "", "call_2")],
        text="Checking both.",
    ),
    "raw arguments": lambda s: s.enqueue_tool_call("lookup", "not json {", call_id="call_9"),
}


@pytest.mark.parametrize("kind", OPENAI_REPLIES)
async def test_openai_stream_gives_what_request_gives(oai: FakeOpenAIServer, kind: str) -> None:
    model = openai_model(oai)
    plain, streamed, pieces = await both_ways(
        model, lambda: OPENAI_REPLIES[kind](oai), ask(tools=[LOOKUP])
    )

    assert comparable(streamed) == comparable(plain)
    assert_streamed(pieces, streamed, several=bool(streamed.message.text))
    plain_body, stream_body = oai.requests
    assert "stream" not in plain_body
    assert stream_body["stream"] is True
    assert stream_body["stream_options"] == {"include_usage": True}
    assert {k: v for k, v in stream_body.items() if not k.startswith("stream")} == plain_body


async def test_openai_stream_parses_split_arguments_and_usage(oai: FakeOpenAIServer) -> None:
    OPENAI_REPLIES["tool calls"](oai)
    oai.enqueue_text("The quick brown fox jumps.", usage=(12, 3), reasoning_content="Hm, foxes.")
    model = openai_model(oai)
    try:
        calls = await model.stream(ask(tools=[LOOKUP]), Pieces())
        text = await model.stream(ask(), Pieces())
    finally:
        await model.aclose()

    assert calls.message.tool_calls == [
        ToolCall(id="call_1", name="lookup", arguments={"word": "actor", "lang": "en"}),
        ToolCall(id="call_2", name="lookup", arguments={}),
    ]
    assert calls.message.text == "Checking both." and calls.stop_reason == "tool_calls"
    assert text.usage.input_tokens == 12 and text.usage.output_tokens == 3
    assert text.message.reasoning_content == "Hm, foxes."
    assert text.stop_reason == "stop"


# -- Anthropic ------------------------------------------------------------------------

ANTHROPIC_REPLIES: dict[str, Callable[[FakeAnthropicServer], None]] = {
    "text blocks": lambda s: s.enqueue_content(
        [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "wide world."}],
        usage=(21, 4),
    ),
    "cut by max_tokens": lambda s: s.enqueue_text("It was a dark", stop_reason="max_tokens"),
    "thinking": lambda s: s.enqueue_text(
        "Paris.", thinking="The capital of France is Paris.", signature="sig-1"
    ),
    "redacted thinking": lambda s: s.enqueue_content(
        [s.redacted_thinking_block("opaque=="), {"type": "text", "text": "Done and done."}]
    ),
    "thinking then tool call": lambda s: s.enqueue_thinking_then_tool_call(
        "I should look it up.",
        "lookup",
        {"word": "actor", "lang": "en"},
        call_id="toolu_1",
        text="Let me check.",
    ),
}


@pytest.mark.parametrize("kind", ANTHROPIC_REPLIES)
async def test_anthropic_stream_gives_what_request_gives(
    ant: FakeAnthropicServer, kind: str
) -> None:
    model = anthropic_model(ant)
    plain, streamed, pieces = await both_ways(
        model, lambda: ANTHROPIC_REPLIES[kind](ant), ask(tools=[LOOKUP])
    )

    assert comparable(streamed) == comparable(plain)
    assert_streamed(pieces, streamed)
    plain_body, stream_body = ant.requests
    assert "stream" not in plain_body and stream_body["stream"] is True
    assert {k: v for k, v in stream_body.items() if k != "stream"} == plain_body


async def test_anthropic_stream_keeps_thinking_and_tool_input(ant: FakeAnthropicServer) -> None:
    ANTHROPIC_REPLIES["thinking then tool call"](ant)
    ANTHROPIC_REPLIES["text blocks"](ant)
    model = anthropic_model(ant)
    pieces = Pieces()
    try:
        call = await model.stream(ask(tools=[LOOKUP], thinking=True), pieces)
        text = await model.stream(ask(), Pieces())
    finally:
        await model.aclose()

    assert call.message.thinking == [
        ThinkingBlock(text="I should look it up.", signature="sig-fake")
    ]
    assert call.message.tool_calls == [
        ToolCall(id="toolu_1", name="lookup", arguments={"word": "actor", "lang": "en"})
    ]
    assert call.stop_reason == "tool_use"
    # Thinking is not text: only the answer streams.
    assert "".join(pieces) == "Let me check."
    assert text.message.text == "Hello, wide world."
    assert text.usage.input_tokens == 21 and text.usage.output_tokens == 4


# -- both: retries and errors ----------------------------------------------------------

Server = FakeOpenAIServer | FakeAnthropicServer
Model = OpenAIChatModel | AnthropicModel
PROVIDERS: dict[str, Callable[[Any], Model]] = {
    "openai": openai_model,
    "anthropic": anthropic_model,
}


@pytest.fixture(params=sorted(PROVIDERS))
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    kind = FakeOpenAIServer if request.param == "openai" else FakeAnthropicServer
    async with kind() as srv:
        yield srv


def model_for(srv: Server, **config: Any) -> Model:
    return PROVIDERS["openai" if isinstance(srv, FakeOpenAIServer) else "anthropic"](srv, **config)


#: Events of a streamed text reply that come before its first text piece.
EVENTS_BEFORE_TEXT = {"openai": 1, "anthropic": 2}


def provider_of(srv: Server) -> str:
    return "openai" if isinstance(srv, FakeOpenAIServer) else "anthropic"


async def test_error_statuses_before_the_first_piece_are_retried(server: Server) -> None:
    server.enqueue_error(429, headers={"retry-after": "0"})
    server.enqueue_error(500)
    server.enqueue_text("Third time lucky, friends.")
    model = model_for(server, max_retries=3)
    pieces = Pieces()
    try:
        response = await model.stream(ask(), pieces)
    finally:
        await model.aclose()

    assert response.message.text == "Third time lucky, friends."
    assert_streamed(pieces, response)
    assert len(server.requests) == 3
    assert all(body["stream"] is True for body in server.requests)


async def test_a_stream_lost_before_its_first_piece_is_retried(server: Server) -> None:
    server.enqueue_text("Lost at once.", cut_after=EVENTS_BEFORE_TEXT[provider_of(server)])
    server.enqueue_text("Second try streams.")
    model = model_for(server, max_retries=2)
    pieces = Pieces()
    try:
        response = await model.stream(ask(), pieces)
    finally:
        await model.aclose()

    assert response.message.text == "Second try streams."
    assert "".join(pieces) == "Second try streams."
    assert len(server.requests) == 2


async def test_a_stream_lost_after_its_first_piece_is_not_retried(server: Server) -> None:
    # One text event gets through, then the connection drops.
    server.enqueue_text("Half a sentence is", cut_after=EVENTS_BEFORE_TEXT[provider_of(server)] + 1)
    server.enqueue_text("never asked for.")
    model = model_for(server, max_retries=3)
    pieces = Pieces()
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.stream(ask(), pieces)
    finally:
        await model.aclose()

    assert info.value.status is None
    assert pieces == ["Half a"]
    assert len(server.requests) == 1 and server.pending == 1


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 529])
async def test_an_error_status_raises_what_request_raises(server: Server, status: int) -> None:
    server.enqueue_error(status, message="scripted failure")
    server.enqueue_error(status, message="scripted failure")
    model = model_for(server, max_retries=0)
    pieces = Pieces()
    try:
        with pytest.raises(ModelError) as plain:
            await model.request(ask())
        with pytest.raises(ModelError) as streamed:
            await model.stream(ask(), pieces)
    finally:
        await model.aclose()

    assert type(streamed.value) is type(plain.value)
    assert str(streamed.value) == str(plain.value)
    assert isinstance(streamed.value, ModelHTTPError) and streamed.value.status == status
    assert pieces == []


async def test_a_client_error_is_not_retried(server: Server) -> None:
    server.enqueue_error(400)
    server.enqueue_text("never asked for.")
    model = model_for(server, max_retries=3)
    try:
        with pytest.raises(ModelHTTPError):
            await model.stream(ask(), Pieces())
    finally:
        await model.aclose()
    assert len(server.requests) == 1


NO_STREAM = {"openai": "the stream carried no chunks", "anthropic": "the stream carried no message"}


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("<html>Sign in to the proxy</html>", "text/html"),
        ('{"id": "x", "object": "chat.completion"}', "application/json"),
        ("data: [1]\n\n", "text/event-stream"),
    ],
    ids=["a page", "a whole JSON body", "events that are not objects"],
)
async def test_an_answer_that_is_not_a_stream_is_an_invalid_response_not_retried(
    server: Server, body: str, content_type: str
) -> None:
    server.enqueue_raw(body, headers={"content-type": content_type})
    server.enqueue_text("never asked for.")
    model = model_for(server, max_retries=3)
    pieces = Pieces()
    try:
        with pytest.raises(ModelHTTPError) as info:
            await model.stream(ask(), pieces)
    finally:
        await model.aclose()
    provider = provider_of(server)
    expected = NO_STREAM[provider]
    if provider == "openai" and content_type == "text/event-stream":
        expected = "stream chunk 1 is a JSON array"
    assert f"invalid response from {provider} model" in str(info.value)
    assert expected in str(info.value)
    assert pieces == [] and len(server.requests) == 1 and server.pending == 1


async def test_an_openai_chunk_whose_choices_are_not_a_list_is_named(
    oai: FakeOpenAIServer,
) -> None:
    oai.enqueue_raw('data: {"choices": "x"}\n\n', headers={"content-type": "text/event-stream"})
    model = openai_model(oai)
    try:
        with pytest.raises(ModelHTTPError, match="stream chunk 1: choices is a string"):
            await model.stream(ask(), Pieces())
    finally:
        await model.aclose()


# -- local models ---------------------------------------------------------------------


def rules_model(**config: Any) -> RulesModel:
    return RulesModel(ScriptedModelConfig.model_validate({"provider": "scripted", **config}))


async def test_rules_model_streams_in_chunks_of_stream_chunk_chars() -> None:
    model = rules_model(default="abcdefghijkl", stream_chunk_chars=5)
    pieces = Pieces()
    streamed = await model.stream(ask(), pieces)
    plain = await model.request(ask())

    assert pieces == ["abcde", "fghij", "kl"]
    assert comparable(streamed) == comparable(plain)
    assert model.requests_seen == 2


async def test_rules_model_streams_the_text_cut_by_max_tokens() -> None:
    model = rules_model(default="x" * 30, stream_chunk_chars=3)
    pieces = Pieces()
    response = await model.stream(ask(max_tokens=2), pieces)

    assert response.stop_reason == "max_tokens"
    assert response.message.text == "x" * 8
    assert pieces == ["xxx", "xxx", "xx"]


async def test_rules_model_stream_times_out_like_request() -> None:
    model = rules_model(latency_ms=200, timeout=0.01)
    pieces = Pieces()
    with pytest.raises(ModelTimeoutError):
        await model.stream(ask(), pieces)
    assert pieces == []


async def watch_progress(stream: Callable[[Pieces], Awaitable[ModelResponse]]) -> list[int]:
    """How many pieces a concurrent task saw whenever it got to run."""
    pieces = Pieces()
    seen: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            seen.append(len(pieces))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        await stream(pieces)
    finally:
        done.set()
        await watcher
    return seen


async def test_rules_model_pauses_between_chunks() -> None:
    paced = rules_model(default="abcdef", stream_chunk_chars=2, stream_delay_ms=1)
    seen = await watch_progress(lambda sink: paced.stream(ask(), sink))
    # Other tasks run between the pieces, each time with some of them out.
    assert {1, 2} <= set(seen)

    eager = rules_model(default="abcdef", stream_chunk_chars=2)
    assert set(await watch_progress(lambda sink: eager.stream(ask(), sink))) <= {0, 3}


async def test_scripted_and_function_models_stream_eight_characters_at_a_time() -> None:
    text = "Nineteen characters"
    scripted = ScriptedModel([AssistantMessage(text=text)])
    function = FunctionModel(lambda request: text)
    for model in (scripted, function):
        pieces = Pieces()
        response = await model.stream(ask(), pieces)
        assert pieces == ["Nineteen", " charact", "ers"]
        assert response.message.text == text
    scripted.assert_consumed()


async def test_unavailable_model_stream_raises_its_error() -> None:
    error = ModelError("no key for this model")
    model = UnavailableModel("openai", "gpt-test", error)
    pieces = Pieces()
    with pytest.raises(ModelError) as info:
        await model.stream(ask(), pieces)
    assert info.value is error and pieces == []


async def test_every_model_is_a_streaming_model(
    oai: FakeOpenAIServer, ant: FakeAnthropicServer
) -> None:
    models: list[object] = [
        openai_model(oai),
        anthropic_model(ant),
        rules_model(),
        ScriptedModel([]),
        FunctionModel(lambda request: ""),
        UnavailableModel("openai", "gpt-test", ModelError("x")),
    ]
    assert all(isinstance(model, StreamingModel) for model in models)


async def test_openai_bodies_go_the_way_the_sdk_supports(oai: FakeOpenAIServer) -> None:
    """The provider posts its pre-encoded body as ``content``: raw bytes as
    ``body`` draw the SDK's DeprecationWarning on every call (the suite's
    filter hides it) and are due to stop working."""
    model = openai_model(oai)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain, streamed, _ = await both_ways(
            model, lambda: oai.enqueue_text("Both ways.", usage=(3, 2)), ask()
        )
    assert plain.message.text == streamed.message.text == "Both ways."
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == []
    plain_body, stream_body = oai.requests
    assert plain_body["messages"][-1] == {"role": "user", "content": "hello"}
    assert stream_body["stream"] is True
