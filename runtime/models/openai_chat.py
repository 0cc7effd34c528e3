"""OpenAI Chat Completions (and compatible servers): the wire format, on the
shared :class:`SDKModel`.

The ``openai`` package is imported lazily so that importing this module (or
building a scripted persona) never pays for the SDK.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import TYPE_CHECKING, Any

from runtime.config import OpenAIModelConfig
from runtime.errors import ModelError
from runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from runtime.models.base import TextSink
from runtime.models.sdk import SDKModel

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion

__all__ = ["OpenAIChatModel"]


class OpenAIChatModel(SDKModel[OpenAIModelConfig]):
    """A model behind ``POST /v1/chat/completions`` (see :class:`SDKModel`)."""

    provider = "openai"

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

    async def send(self, client: AsyncOpenAI, params: dict[str, Any]) -> ChatCompletion:
        from openai.types.chat import ChatCompletion

        return await client.post(
            "/chat/completions",
            body=params,
            cast_to=ChatCompletion,
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
        from openai import AsyncStream
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        stream = await client.post(
            "/chat/completions",
            body={**params, "stream": True, "stream_options": {"include_usage": True}},
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
        async with stream:
            async for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    answered = True
                    delta = choice.delta
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
        if not answered:
            raise ModelError(f"openai model {self.name!r} returned no choices")
        return self._response(
            text="".join(text),
            tool_calls=[
                ToolCall(id=c["id"], name=c["name"], arguments=_parse_arguments(c["arguments"]))
                for _, c in sorted(calls.items())
            ],
            reasoning_content="".join(reasoning) if reasoning else None,
            usage=usage,
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
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
            choice = request.tool_choice
            if isinstance(choice, ToolChoiceNamed):
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            elif isinstance(choice, ToolChoiceNone):
                body["tool_choice"] = "none"
            else:
                body["tool_choice"] = "auto"
        return body

    # -- response ----------------------------------------------------------

    def parse(self, completion: ChatCompletion) -> ModelResponse:
        """Turn a ``ChatCompletion`` into the neutral response."""
        if not completion.choices:
            raise ModelError(f"openai model {self.name!r} returned no choices")
        choice = completion.choices[0]
        message = choice.message
        tool_calls: list[ToolCall] = []
        for call in message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is not None:
                tool_calls.append(
                    ToolCall(
                        id=call.id,
                        name=function.name,
                        arguments=_parse_arguments(function.arguments),
                    )
                )
                continue
            # Custom (free-text) tools carry raw input instead of JSON arguments.
            custom = getattr(call, "custom", None)
            if custom is not None:
                tool_calls.append(ToolCall(id=call.id, name=custom.name, arguments=custom.input))
        return self._response(
            text=message.content or "",
            tool_calls=tool_calls,
            reasoning_content=_reasoning_content(message),
            usage=completion.usage,
            stop_reason=choice.finish_reason,
        )

    def _response(
        self,
        *,
        text: str,
        tool_calls: list[ToolCall],
        reasoning_content: str | None,
        usage: CompletionUsage | None,
        stop_reason: str | None,
    ) -> ModelResponse:
        """The neutral response, whether the answer came whole or streamed."""
        return ModelResponse(
            message=AssistantMessage(
                text=text, tool_calls=tool_calls, reasoning_content=reasoning_content
            ),
            usage=Usage()
            if usage is None
            else Usage(
                input_tokens=usage.prompt_tokens or 0, output_tokens=usage.completion_tokens or 0
            ),
            provider=self.provider,
            model=self.config.name,
            stop_reason=stop_reason,
        )


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
    # Not part of the OpenAI schema: it arrives as a pydantic extra field.
    extra = getattr(message, "model_extra", None) or {}
    value = extra.get("reasoning_content", getattr(message, "reasoning_content", None))
    return value if isinstance(value, str) else None
