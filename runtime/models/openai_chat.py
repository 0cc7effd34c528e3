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
from runtime.models.sdk import SDKModel

if TYPE_CHECKING:
    from openai import AsyncOpenAI
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
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )

    async def send(self, client: AsyncOpenAI, params: dict[str, Any]) -> ChatCompletion:
        return await client.chat.completions.create(**params)

    # -- request -----------------------------------------------------------

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``chat.completions.create``."""
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
        params: dict[str, Any] = {
            "model": self.config.name,
            "messages": messages,
            "max_tokens": request.max_tokens,
        }
        if request.tools:
            # Tool schemas are already wire-ready JSON. Passed as typed params,
            # the SDK deep-copies and re-validates them on every call (~2 ms of
            # CPU per request with a dozen tools), so they go in the body as is.
            body: dict[str, Any] = params.setdefault("extra_body", {})
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
        return params

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
        usage = Usage()
        if completion.usage is not None:
            usage = Usage(
                input_tokens=completion.usage.prompt_tokens or 0,
                output_tokens=completion.usage.completion_tokens or 0,
            )
        return ModelResponse(
            message=AssistantMessage(
                text=message.content or "",
                tool_calls=tool_calls,
                reasoning_content=_reasoning_content(message),
            ),
            usage=usage,
            provider=self.provider,
            model=self.config.name,
            stop_reason=choice.finish_reason,
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
