"""Models that need no network: scripted steps, a function, YAML rules.

They ship in the package (not in ``tests/``) because the demo, the tests and
the benchmarks all drive personas with them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from coterie.runtime.config import ScriptedModelConfig, ScriptedRule
from coterie.runtime.errors import ModelError, ModelTimeoutError
from coterie.runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    new_id,
    now,
)
from coterie.runtime.models.base import TextSink
from coterie.runtime.usage.tokens import definition_chars

Reply = AssistantMessage | str
StepFn = Callable[[ModelRequest], Reply | Awaitable[Reply]]


def _as_message(reply: Reply) -> AssistantMessage:
    return AssistantMessage(text=reply) if isinstance(reply, str) else reply


#: Characters counted as one token by the local models (rough, never zero).
_CHARS_PER_TOKEN = 4


def _usage(request: ModelRequest, message: AssistantMessage) -> Usage:
    # What a provider would count: the system prompt, the messages and the
    # tool definitions, at a fixed ratio.
    chars_in = len(request.system) + sum(definition_chars(t) for t in request.tools)
    for m in request.messages:
        chars_in += len(m.content) if isinstance(m, ToolResultMessage) else len(m.text)
    chars_out = len(message.text) + sum(len(str(c.arguments)) for c in message.tool_calls)
    return Usage(
        input_tokens=chars_in // _CHARS_PER_TOKEN,
        output_tokens=max(1, chars_out // _CHARS_PER_TOKEN),
    )


async def _stream_chunks(
    response: ModelResponse, on_text: TextSink, chunk_chars: int = 8, delay: float = 0.0
) -> ModelResponse:
    """Hand ``response``'s text to ``on_text`` in pieces, ``delay`` seconds apart.

    A local model has no wire to stream from; pieces let streaming callers
    be tested the way a real model would drive them.
    """
    text = response.message.text
    for start in range(0, len(text), chunk_chars):
        if start and delay:
            await asyncio.sleep(delay)
        on_text(text[start : start + chunk_chars])
    return response


def tool_call(name: str, arguments: dict[str, Any] | str | None = None) -> ToolCall:
    """A tool call with a fresh id, for building scripted replies."""
    return ToolCall(id=new_id("call_"), name=name, arguments=arguments or {})


async def _resolve(step: Reply | StepFn, request: ModelRequest) -> AssistantMessage:
    if callable(step):
        result = step(request)
        if inspect.isawaitable(result):
            result = await result
        return _as_message(result).model_copy(update={"ts": now()})
    # A copy stamped now: one scripted step may be replayed in later turns.
    return _as_message(step).model_copy(deep=True, update={"ts": now()})


class ScriptedModel:
    """Answers with the given steps in order and records every request.

    A step is an :class:`AssistantMessage`, a plain string, or a function of
    the request. Running out of steps raises :class:`ModelError`;
    :meth:`assert_consumed` checks that every step was used.
    """

    provider = "scripted"

    def __init__(
        self, steps: Sequence[Reply | StepFn], *, name: str = "scripted", latency: float = 0.0
    ) -> None:
        self.name = name
        self.steps = list(steps)
        self.latency = latency
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        index = len(self.requests) - 1
        if index >= len(self.steps):
            raise ModelError(
                f"ScriptedModel {self.name!r} has {len(self.steps)} steps; "
                f"request {index + 1} has none"
            )
        if self.latency:
            await asyncio.sleep(self.latency)
        message = await _resolve(self.steps[index], request)
        return ModelResponse(
            message=message,
            usage=_usage(request, message),
            provider=self.provider,
            model=self.name,
            stop_reason="tool_use" if message.tool_calls else "end_turn",
        )

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelResponse:
        """:meth:`request`, its text handed out 8 characters at a time."""
        return await _stream_chunks(await self.request(request), on_text)

    def assert_consumed(self) -> None:
        if len(self.requests) != len(self.steps):
            raise AssertionError(
                f"ScriptedModel {self.name!r}: {len(self.steps)} steps, "
                f"{len(self.requests)} requests"
            )

    async def aclose(self) -> None:
        return None


class FunctionModel:
    """Answers every request by calling ``fn(request)`` (sync or async)."""

    provider = "function"

    def __init__(self, fn: StepFn, *, name: str = "function", latency: float = 0.0) -> None:
        self.name = name
        self.fn = fn
        self.latency = latency
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        message = await _resolve(self.fn, request)
        return ModelResponse(
            message=message,
            usage=_usage(request, message),
            provider=self.provider,
            model=self.name,
            stop_reason="tool_use" if message.tool_calls else "end_turn",
        )

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelResponse:
        """:meth:`request`, its text handed out 8 characters at a time."""
        return await _stream_chunks(await self.request(request), on_text)

    async def aclose(self) -> None:
        return None


def latest_user_text(request: ModelRequest) -> str:
    """Text of the newest user/inbox message in the request."""
    for message in reversed(request.messages):
        if isinstance(message, UserMessage):
            return message.text
    return ""


def latest_tool_results(request: ModelRequest) -> list[str]:
    """Contents of the tool results since the newest assistant message, in order."""
    results: list[str] = []
    for message in reversed(request.messages):
        if isinstance(message, ToolResultMessage):
            results.append(message.content)
        else:
            break
    return results[::-1]


def fill_template(text: str, request: ModelRequest) -> str:
    """Replace ``{last_tool_result}``, ``{tool_results}``, ``{tool_result_N}``
    and ``{input}`` (the latest user, inbox or wake text)."""
    if "{" not in text:
        return text
    text = text.replace("{input}", latest_user_text(request))
    results = latest_tool_results(request)
    text = text.replace("{last_tool_result}", last_tool_result(request))
    text = text.replace("{tool_results}", "\n".join(results))
    for i, content in enumerate(results, 1):
        text = text.replace(f"{{tool_result_{i}}}", content)
    return text


def fill_arguments(arguments: Any, request: ModelRequest) -> Any:
    """A scripted tool call's arguments with the templates of their strings filled."""
    if isinstance(arguments, str):
        return fill_template(arguments, request)
    if isinstance(arguments, dict):
        return {k: fill_arguments(v, request) for k, v in arguments.items()}
    if isinstance(arguments, list):
        return [fill_arguments(v, request) for v in arguments]
    return arguments


def last_tool_result(request: ModelRequest) -> str:
    """Content of the newest tool result in the request, or ''."""
    for message in reversed(request.messages):
        if isinstance(message, ToolResultMessage):
            return message.content
        if isinstance(message, UserMessage):
            break
    return ""


class RulesModel:
    """The ``provider: scripted`` model of persona.yaml.

    Rules are tried in order; the first whose ``when`` matches answers.
    ``turn`` is the 1-based model call within the current turn, ``contains``
    matches the latest user/inbox text case-insensitively, ``context`` is the
    kind of turn (``user``, ``heartbeat``, ``cron``, ``subagent``, ``eval``),
    ``tool_result`` whether the request ends with tool results.
    In a rule's text and in the strings of its tool calls' arguments,
    ``{last_tool_result}`` is the newest tool result, ``{tool_result_N}`` the
    N-th result of the latest tool batch,
    ``{tool_results}`` all of them and ``{input}`` the latest user, inbox or
    wake text. ``default`` answers when nothing matches.

    Like a real model it is bound by ``timeout`` (a ``latency_ms`` above it
    raises :class:`ModelTimeoutError`) and by the request's ``max_tokens``
    (a longer text is cut, at about four characters a token, and the stop
    reason is ``max_tokens``). :meth:`stream` hands out that same (cut) text
    in pieces of ``stream_chunk_chars`` with ``stream_delay_ms`` between.
    """

    provider = "scripted"

    def __init__(self, config: ScriptedModelConfig) -> None:
        self.config = config
        self.name = config.name
        self.requests_seen = 0

    def _matches(self, rule: ScriptedRule, request: ModelRequest) -> bool:
        when = rule.when
        if when.turn is not None and when.turn != request.step:
            return False
        if when.context is not None and when.context != request.context:
            return False
        if when.tool_result is not None and when.tool_result != (
            bool(request.messages) and isinstance(request.messages[-1], ToolResultMessage)
        ):
            return False
        return not (
            when.contains is not None
            and when.contains.lower() not in latest_user_text(request).lower()
        )

    def answer(self, request: ModelRequest) -> AssistantMessage:
        """The reply the rules give for ``request`` (no latency)."""
        forced = request.tool_choice
        for rule in self.config.rules:
            if not self._matches(rule, request):
                continue
            text = fill_template(rule.text or "", request)
            calls = [
                tool_call(c.name, fill_arguments(c.arguments, request)) for c in rule.tool_calls
            ]
            if forced.kind == "none":
                calls = []
            return AssistantMessage(text=text, tool_calls=calls)
        if forced.kind == "named":
            # The loop pinned a tool (e.g. end_task after a background turn).
            return AssistantMessage(tool_calls=[tool_call(forced.name, {"status": "ok"})])
        return AssistantMessage(text=self.config.default)

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests_seen += 1
        latency = self.config.latency_ms / 1000
        if latency > self.config.timeout:
            await asyncio.sleep(self.config.timeout)
            raise ModelTimeoutError(
                f"scripted model {self.name!r} did not answer within {self.config.timeout:g}s"
            )
        if latency:
            await asyncio.sleep(latency)
        message = self.answer(request)
        stop_reason = "tool_use" if message.tool_calls else "end_turn"
        limit = request.max_tokens * _CHARS_PER_TOKEN
        if len(message.text) > limit:
            message = message.model_copy(update={"text": message.text[:limit]})
            stop_reason = "max_tokens"
        return ModelResponse(
            message=message,
            usage=_usage(request, message),
            provider=self.provider,
            model=self.name,
            stop_reason=stop_reason,
        )

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelResponse:
        """:meth:`request` (latency, timeout and cut included), then its text in chunks."""
        response = await self.request(request)
        config = self.config
        return await _stream_chunks(
            response, on_text, config.stream_chunk_chars, config.stream_delay_ms / 1000
        )

    async def aclose(self) -> None:
        return None


__all__ = [
    "FunctionModel",
    "RulesModel",
    "ScriptedModel",
    "fill_template",
    "last_tool_result",
    "latest_user_text",
    "tool_call",
]
