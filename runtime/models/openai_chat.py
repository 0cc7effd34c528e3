"""OpenAI Chat Completions (and compatible servers) as a :class:`Model`.

The ``openai`` package is imported lazily so that importing this module (or
building a scripted persona) never pays for the SDK.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from runtime.config import OpenAIModelConfig
from runtime.errors import (
    MissingAPIKeyError,
    ModelError,
    ModelHTTPError,
    ModelTimeoutError,
)
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
from runtime.models._retry import (
    sdk_error_message,
    sdk_retry_after,
    status_is_retryable,
    with_retries,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion

__all__ = ["OpenAIChatModel"]


class OpenAIChatModel:
    """A model behind ``POST /v1/chat/completions``.

    The API key comes from ``api_key`` or the environment variable named by
    ``config.api_key_env``; a missing key fails at construction with
    :class:`MissingAPIKeyError`. ``retry_base_delay`` / ``retry_max_delay``
    tune the backoff (tests make it tiny).
    """

    provider: str = "openai"

    def __init__(
        self,
        config: OpenAIModelConfig,
        *,
        api_key: str | None = None,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get(config.api_key_env)
        if not api_key:
            raise MissingAPIKeyError(config.api_key_env, "openai")
        self.config = config
        self.name = config.name
        self._api_key = api_key
        self._retry_base_delay = retry_base_delay
        self._retry_max_delay = retry_max_delay
        self._client: AsyncOpenAI | None = None

    def _get_client(self) -> AsyncOpenAI:
        # Built on first use so the model object can be created outside the
        # event loop that will drive it.
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.config.base_url,
                timeout=self.config.timeout,
                max_retries=0,
            )
        return self._client

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one chat completion; raises :class:`ModelError` subclasses."""
        params = self.build_params(request)
        client = self._get_client()

        async def call() -> ChatCompletion:
            return await client.chat.completions.create(**params)

        completion = await with_retries(
            call,
            max_retries=self.config.max_retries,
            is_retryable=_is_retryable,
            to_error=self._to_error,
            retry_after=sdk_retry_after,
            base_delay=self._retry_base_delay,
            max_delay=self._retry_max_delay,
        )
        return self.parse_completion(completion)

    async def aclose(self) -> None:
        """Close the HTTP client (a later request opens a new one)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

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

    def parse_completion(self, completion: ChatCompletion) -> ModelResponse:
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

    # -- errors ------------------------------------------------------------

    def _to_error(self, exc: Exception) -> ModelError | None:
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return ModelTimeoutError(
                f"openai model {self.name!r} did not answer within {self.config.timeout:g}s"
            )
        if isinstance(exc, openai.APIStatusError):
            return ModelHTTPError(exc.status_code, sdk_error_message(exc))
        if isinstance(exc, openai.APIResponseValidationError):
            return ModelHTTPError(exc.status_code, f"invalid response: {exc.message}")
        if isinstance(exc, openai.APIConnectionError):
            return ModelHTTPError(None, f"connection error: {exc.message}")
        if isinstance(exc, openai.OpenAIError):
            return ModelError(f"openai model {self.name!r} failed: {exc}")
        return None


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


def _is_retryable(exc: Exception) -> bool:
    import openai

    if isinstance(exc, openai.APIStatusError):
        return status_is_retryable(exc.status_code)
    return isinstance(exc, openai.APIConnectionError)
