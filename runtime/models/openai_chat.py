"""OpenAI Chat Completions (and compatible servers): the wire format, on the
shared :class:`SDKModel`.

The ``openai`` package is imported lazily so that importing this module (or
building a scripted persona) never pays for the SDK.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pydantic_core

from coterie.runtime.config import OpenAIModelConfig
from coterie.runtime.errors import ModelError
from coterie.runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolDefinition,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from coterie.runtime.models.base import TextSink
from coterie.runtime.models.sdk import SDKModel, body_kind, token_count

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types import CompletionUsage

__all__ = ["OpenAIChatModel", "ToolsWire", "dump_json", "openai_usage"]


class OpenAIChatModel(SDKModel[OpenAIModelConfig]):
    """A model behind ``POST /v1/chat/completions`` (see :class:`SDKModel`)."""

    provider = "openai"

    def __init__(self, config: OpenAIModelConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._tools = ToolsWire()

    def sdk(self) -> ModuleType:
        import openai

        return openai

    def sdk_error(self) -> type[Exception]:
        return self.sdk().OpenAIError  # type: ignore[no-any-return]

    def new_client(self, *, api_key: str, base_url: str | None, timeout: float) -> AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=0,
            # aiohttp under the SDK: measured ~20% less CPU per turn than the
            # default httpx transport (benchmarks/scale.py).
            http_client=openai.DefaultAioHttpClient(timeout=timeout),
        )

    async def send(self, client: AsyncOpenAI, params: dict[str, Any]) -> object:
        """The decoded JSON body of the answer (or its text when it is not
        JSON), for :meth:`parse` to check and read."""
        # ``cast_to=object``: the SDK hands back the decoded body instead of
        # building a ChatCompletion from it, which costs ~0.3-0.6 ms of CPU
        # per request (``construct`` over every nested field) and is read once.
        return await client.post(
            "/chat/completions",
            # The encoded body goes as ``content``: the SDK deprecates raw
            # bytes as ``body`` (a DeprecationWarning on every call) and will
            # take them only as JSON data to encode.
            content=self.encode(params),
            cast_to=object,
            # What ``chat.completions.create`` passes: the API key as a bearer
            # token (an admin key the client holds is for admin endpoints).
            options={"security": {"bearer_auth": True}},
        )

    async def send_stream(
        self, client: AsyncOpenAI, params: dict[str, Any], on_text: TextSink
    ) -> ModelResponse:
        """Stream the completion, folding its chunks into the response :meth:`parse` gives.

        Tool calls arrive as deltas keyed by index (id and name once, the
        arguments string in pieces); usage comes in a last chunk of its own.
        """
        from openai import AsyncStream, BaseModel
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        stream = await client.post(
            "/chat/completions",
            content=self.encode(
                {**params, "stream": True, "stream_options": {"include_usage": True}}
            ),
            cast_to=ChatCompletion,
            options={"security": {"bearer_auth": True}},
            stream=True,
            stream_cls=AsyncStream[ChatCompletionChunk],
        )
        text: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish_reason: str | None = None
        usage: CompletionUsage | None = None
        answered = False
        chunks = 0
        async with stream:
            async for chunk in stream:
                chunks += 1
                # The SDK builds chunks without checking them: one that is not
                # an object, or whose choices are not a list, is not read.
                if not isinstance(chunk, BaseModel):
                    raise self.invalid_response(f"stream chunk {chunks} is {body_kind(chunk)}")
                if not isinstance(chunk.choices, list | None):
                    raise self.invalid_response(
                        f"stream chunk {chunks}: choices is {body_kind(chunk.choices)}"
                    )
                usage = chunk.usage or usage
                for choice in chunk.choices or []:
                    if choice.index != 0:
                        continue
                    answered = True
                    delta = choice.delta
                    if delta is None:
                        continue
                    finish_reason = choice.finish_reason or finish_reason
                    if delta.content:
                        text.append(delta.content)
                        on_text(delta.content)
                    piece = _reasoning_content(delta)
                    if piece is not None:
                        reasoning.append(piece)
                    for call in delta.tool_calls or []:
                        slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                        # Some servers repeat id and name in every delta: the first counts.
                        slot["id"] = slot["id"] or call.id or ""
                        if call.function is not None:
                            slot["name"] = slot["name"] or call.function.name or ""
                            slot["arguments"] += call.function.arguments or ""
        if not chunks:
            raise self.invalid_response("the stream carried no chunks (no data: events)")
        if not answered:
            raise ModelError(f"openai model {self.name!r} returned no choices")
        return self._response(
            text="".join(text),
            tool_calls=[
                ToolCall(id=c["id"], name=c["name"], arguments=_parse_arguments(c["arguments"]))
                for _, c in sorted(calls.items())
            ],
            reasoning_content="".join(reasoning) if reasoning else None,
            usage=openai_usage(usage),
            stop_reason=finish_reason,
        )

    # -- request -----------------------------------------------------------

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of ``POST /chat/completions``."""
        backfill = self.config.reasoning_content and request.thinking
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        for message in request.messages:
            if isinstance(message, UserMessage):
                messages.append({"role": "user", "content": message.text})
            elif isinstance(message, ToolResultMessage):
                messages.append(
                    {"role": "tool", "tool_call_id": message.call_id, "content": message.content}
                )
            else:
                messages.append(_assistant_to_wire(message, backfill=backfill))
        # The body goes to the SDK's client as it is, through its public
        # ``post`` (what ``chat.completions.create`` ends in): the history and
        # the tool schemas are wire-ready JSON already, and as typed params the
        # SDK walks all of ``create``'s ~40 arguments and copies the values on
        # every call (~0.2 ms of CPU per request, more as the history grows).
        body: dict[str, Any] = {
            "model": self.config.name,
            "messages": messages,
            "max_tokens": request.max_tokens,
        }
        if request.tools:
            body["tools"] = self._tools.wire(request.tools)
            choice = request.tool_choice
            if isinstance(choice, ToolChoiceNamed):
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            elif isinstance(choice, ToolChoiceNone):
                body["tool_choice"] = "none"
            else:
                body["tool_choice"] = "auto"
        return body

    def encode(self, params: dict[str, Any]) -> bytes:
        """The body as the bytes the SDK sends (its own JSON settings), the
        tool schemas spliced in from :class:`ToolsWire`'s cache when they came
        from it."""
        tools = params.get("tools")
        encoded = self._tools.encoded(tools) if tools is not None else None
        if encoded is None:
            return dump_json(params)
        rest = dump_json({k: v for k, v in params.items() if k != "tools"})
        return b"".join((rest[:-1], b',"tools":', encoded, b"}"))

    # -- response ----------------------------------------------------------

    def parse(self, body: object) -> ModelResponse:
        """Turn the decoded answer into the neutral response.

        Its shape is checked as it is read: a body that is not a completion
        (a proxy's page, a field of the wrong type) is a
        :class:`~runtime.errors.ModelHTTPError` naming what was wrong, never a
        Python error from deep inside the turn.
        """
        if not isinstance(body, dict):
            raise self.invalid_response(
                f"expected a JSON object, got {body_kind(body, whole_body=True)}"
            )
        choices = body.get("choices")
        if not choices:
            raise ModelError(f"openai model {self.name!r} returned no choices")
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise self.invalid_response(f"choices is {body_kind(choices)}, not a list of objects")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self.invalid_response(f"choices[0].message is {body_kind(message)}")
        tool_calls: list[ToolCall] = []
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise self.invalid_response(f"message.tool_calls is {body_kind(raw_calls)}")
        for n, raw_call in enumerate(raw_calls):
            call = self._tool_call(raw_call, n)
            if call is not None:
                tool_calls.append(call)
        usage = body.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        finish_reason = choice.get("finish_reason")
        reasoning = message.get("reasoning_content")
        return self._response(
            text=self._content(message.get("content")),
            tool_calls=tool_calls,
            reasoning_content=reasoning if isinstance(reasoning, str) else None,
            usage=openai_usage(usage),
            stop_reason=finish_reason if isinstance(finish_reason, str) else None,
        )

    def _content(self, content: object) -> str:
        """The message's text: a string, null, or (some compatible servers) a
        list of content parts whose text parts are joined."""
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [
                part.get("text")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            ]
            if all(isinstance(text, str) for text in texts):
                return "".join(texts)  # type: ignore[arg-type]
        raise self.invalid_response(f"message.content is {body_kind(content)}, not text")

    def _tool_call(self, call: object, n: int) -> ToolCall | None:
        """One tool call of the answer (``None`` for a kind of tool that is
        not ours to run: neither a function nor a custom tool)."""
        where = f"message.tool_calls[{n}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise self.invalid_response(f"{where} is not an object with a string id")
        function = call.get("function")
        if function is not None:
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise self.invalid_response(f"{where}.function has no name")
            arguments = function.get("arguments")
            if isinstance(arguments, dict):
                # Some compatible servers send the arguments decoded already.
                return ToolCall(id=call["id"], name=function["name"], arguments=arguments)
            if arguments is not None and not isinstance(arguments, str):
                raise self.invalid_response(
                    f"{where}.function.arguments is {body_kind(arguments)}, not a string"
                )
            return ToolCall(
                id=call["id"], name=function["name"], arguments=_parse_arguments(arguments or "")
            )
        # Custom (free-text) tools carry raw input instead of JSON arguments.
        custom = call.get("custom")
        if custom is None:
            return None
        if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
            raise self.invalid_response(f"{where}.custom has no name")
        raw = custom.get("input")
        return ToolCall(
            id=call["id"], name=custom["name"], arguments=raw if isinstance(raw, str) else ""
        )

    def _response(
        self,
        *,
        text: str,
        tool_calls: list[ToolCall],
        reasoning_content: str | None,
        usage: Usage,
        stop_reason: str | None,
    ) -> ModelResponse:
        """The neutral response, whether the answer came whole or streamed."""
        return ModelResponse(
            message=AssistantMessage(
                text=text, tool_calls=tool_calls, reasoning_content=reasoning_content
            ),
            usage=usage,
            provider=self.provider,
            model=self.config.name,
            stop_reason=stop_reason,
        )


def openai_usage(usage: object) -> Usage:
    """The neutral usage of a ``usage`` object, decoded (a whole answer's) or
    as the SDK built it (a stream's last chunk): ``prompt_tokens`` counts
    cached tokens too; ``prompt_tokens_details.cached_tokens`` is the part
    read from the cache (OpenAI reports no cache writes)."""
    details = _usage_field(usage, "prompt_tokens_details")
    return Usage(
        input_tokens=token_count(_usage_field(usage, "prompt_tokens")),
        output_tokens=token_count(_usage_field(usage, "completion_tokens")),
        cache_read_tokens=token_count(_usage_field(details, "cached_tokens")),
    )


def _usage_field(value: object, name: str) -> object:
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def dump_json(value: object) -> bytes:
    """JSON as the openai SDK writes a request body (UTF-8, compact), the
    same bytes, by pydantic's Rust encoder: ~5x faster than ``json.dumps``,
    and a long history is encoded again on every call. (A NaN, which no body
    of ours holds, would go as the literal ``NaN``, where the SDK raises.)"""
    return pydantic_core.to_json(value)


class ToolsWire:
    """The ``tools`` of the body, built and encoded once per set of tools.

    A persona offers the same few dozen tools on every call, and their
    schemas are most of a short conversation's body (35 built-in tools:
    25 kB; building and encoding them takes ~0.14 ms per request with
    :func:`dump_json`, 0.45 ms with ``json.dumps``). A set is known by the
    identity of its :class:`ToolDefinition` objects (each spec builds its own
    once, see ``ToolSpec.definition``); an entry holds them, so an id is never
    reused while it lives. The last ``size`` sets are kept.
    """

    def __init__(self, size: int = 16) -> None:
        self._size = size
        # ids of the set -> (the set, its wire list, that list's JSON)
        self._sets: dict[tuple[int, ...], tuple[tuple[ToolDefinition, ...], list[Any], bytes]] = {}

    def wire(self, tools: list[ToolDefinition]) -> list[Any]:
        """The wire form of ``tools`` (the same list object for the same set)."""
        key = tuple(map(id, tools))
        hit = self._sets.get(key)
        if hit is None:
            wire: list[Any] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in tools
            ]
            if len(self._sets) >= self._size:
                del self._sets[next(iter(self._sets))]  # the oldest
            hit = self._sets[key] = (tuple(tools), wire, dump_json(wire))
        return hit[1]

    def encoded(self, wire: object) -> bytes | None:
        """The JSON of a list :meth:`wire` returned (``None`` for any other)."""
        return next((data for _, cached, data in self._sets.values() if cached is wire), None)


def _assistant_to_wire(message: AssistantMessage, *, backfill: bool) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": "assistant"}
    if message.tool_calls:
        wire["content"] = message.text or None
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments
                    if isinstance(call.arguments, str)
                    else json.dumps(call.arguments),
                },
            }
            for call in message.tool_calls
        ]
    else:
        wire["content"] = message.text
    # Reasoning providers reject tool-call turns that lack reasoning_content
    # once thinking is on, even when they never produced any.
    if message.reasoning_content is not None:
        wire["reasoning_content"] = message.reasoning_content
    elif backfill and message.tool_calls:
        wire["reasoning_content"] = ""
    return wire


def _parse_arguments(raw: str) -> dict[str, Any] | str:
    # Some compatible servers send "" for a tool without parameters.
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    return parsed if isinstance(parsed, dict) else raw


def _reasoning_content(message: Any) -> str | None:
    # A streamed delta's: not part of the OpenAI schema, it arrives as a
    # pydantic extra field.
    extra = getattr(message, "model_extra", None) or {}
    value = extra.get("reasoning_content", getattr(message, "reasoning_content", None))
    return value if isinstance(value, str) else None
