"""The Anthropic Messages API: its wire format, on the shared :class:`SDKModel`.

Prompt caching (``cache``, on by default): a request carries at most four
``cache_control`` breakpoints (the API's limit), on the last tool definition,
on the system prompt (sent as one text block), on the last block of the last
message, and on the last block of the user message before it, which is where
the previous call of the same conversation put its last breakpoint, so that
call's cached prefix is read back. The API caches tools, then system, then
messages: nothing in them may change from call to call but the history's end
(the blocks are built the same way every time). The breakpoints on the
history move on as it grows, which is the API's own pattern for a
conversation: a marker says where to cache, it is not part of what is cached.

The ``anthropic`` package is imported lazily so that importing this module
never pays for the SDK.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import TYPE_CHECKING, Any

from coterie.runtime.config import AnthropicModelConfig
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ThinkingBlock,
    ToolCall,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from coterie.runtime.models.base import TextSink
from coterie.runtime.models.sdk import SDKModel, body_kind, token_count

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import Message

__all__ = ["MAX_CACHE_BREAKPOINTS", "AnthropicModel", "anthropic_usage", "mark_history_cache"]

# Headroom for the visible answer on top of the thinking budget.
_ANSWER_HEADROOM = 1024

#: The API rejects a request with more cache breakpoints than this.
MAX_CACHE_BREAKPOINTS = 4

# Blocks the API does not let carry a ``cache_control`` (they are cached as
# part of the prefix all the same).
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


class AnthropicModel(SDKModel[AnthropicModelConfig]):
    """A Claude model behind ``POST /v1/messages`` (see :class:`SDKModel`)."""

    provider = "anthropic"

    def sdk(self) -> ModuleType:
        import anthropic

        return anthropic

    def sdk_error(self) -> type[Exception]:
        return self.sdk().AnthropicError  # type: ignore[no-any-return]

    def new_client(self, *, api_key: str, base_url: str | None, timeout: float) -> AsyncAnthropic:
        import anthropic

        return anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=0,
            # aiohttp under the SDK: measured ~20% less CPU per turn than the
            # default httpx transport (benchmarks/scale.py).
            http_client=anthropic.DefaultAioHttpClient(timeout=timeout),
        )

    async def send(self, client: AsyncAnthropic, params: dict[str, Any]) -> Message:
        return await client.messages.create(**params)

    async def send_stream(
        self, client: AsyncAnthropic, params: dict[str, Any], on_text: TextSink
    ) -> ModelResponse:
        """Stream the message; the SDK rebuilds it whole (thinking, signatures,
        tool input) for :meth:`parse`.

        A stream that never starts a message (a proxy's page, a JSON body where
        events were due) is an invalid response, not the SDK's bare assertion.
        Its usage is ``message_start``'s input and cache counts and
        ``message_delta``'s output count: the SDK keeps the first where the
        second leaves them out.
        """
        started = False
        async with client.messages.stream(**params) as stream:
            # The events themselves rather than ``text_stream`` (the same text
            # deltas), to see whether a message ever started.
            async for event in stream:
                if event.type == "message_start":
                    started = True
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    on_text(event.delta.text)
            if not started:
                raise self.invalid_response("the stream carried no message (no message_start)")
            message = await stream.get_final_message()
        return self.parse(message)

    # -- request -----------------------------------------------------------

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``messages.create``."""
        # The history and the tool schemas go in the body as they are (already
        # wire-ready): as typed params the SDK walks and copies them on every
        # call. ``messages=[]`` only satisfies the signature (the body wins).
        cache = self.config.cache
        messages = history_to_wire(request.messages)
        body: dict[str, Any] = {"messages": messages}
        params: dict[str, Any] = {
            "model": self.config.name,
            "messages": [],
            "max_tokens": request.max_tokens,
            "extra_body": body,
        }
        if request.system:
            # In the body too; a list of one text block to carry a breakpoint.
            body["system"] = (
                [{"type": "text", "text": request.system, "cache_control": _ephemeral()}]
                if cache
                else request.system
            )
        if cache:
            mark_history_cache(messages)
        if request.tools:
            tools: list[dict[str, Any]] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                }
                for tool in request.tools
            ]
            if cache:
                tools[-1]["cache_control"] = _ephemeral()
            body["tools"] = tools
            choice = request.tool_choice
            if isinstance(choice, ToolChoiceNamed):
                params["tool_choice"] = {"type": "tool", "name": choice.name}
            elif isinstance(choice, ToolChoiceNone):
                params["tool_choice"] = {"type": "none"}
            else:
                params["tool_choice"] = {"type": "auto"}
        if request.thinking:
            budget = self.config.thinking_budget
            params["thinking"] = {"type": "enabled", "budget_tokens": budget}
            # The API requires max_tokens > budget_tokens.
            params["max_tokens"] = max(request.max_tokens, budget + _ANSWER_HEADROOM)
        return params

    # -- response ----------------------------------------------------------

    def parse(self, message: Message) -> ModelResponse:
        """Turn an Anthropic ``Message`` into the neutral response.

        The SDK builds the message without validating it, and hands back a
        body that is not a JSON object as it is: what the turn reads is
        checked, and a body of the wrong shape is a
        :class:`~runtime.errors.ModelHTTPError` naming what was wrong.
        """
        from anthropic import BaseModel

        if not isinstance(message, BaseModel):
            raise self.invalid_response(
                f"expected a JSON object, got {body_kind(message, whole_body=True)}"
            )
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            raise self.invalid_response(f"content is {body_kind(content)}, not a list of blocks")
        texts: list[str] = []
        thinking: list[ThinkingBlock] = []
        tool_calls: list[ToolCall] = []
        for n, block in enumerate(content):
            kind = getattr(block, "type", None)
            if kind == "text":
                text = getattr(block, "text", "")
                if not isinstance(text, str):
                    raise self.invalid_response(f"content[{n}].text is {body_kind(text)}")
                texts.append(text)
            elif kind == "thinking":
                thinking.append(
                    ThinkingBlock(
                        text=getattr(block, "thinking", ""),
                        signature=getattr(block, "signature", None),
                    )
                )
            elif kind == "redacted_thinking":
                thinking.append(
                    ThinkingBlock(text=getattr(block, "data", ""), signature=None, redacted=True)
                )
            elif kind == "tool_use":
                tool_calls.append(
                    ToolCall(
                        id=getattr(block, "id", ""),
                        name=getattr(block, "name", ""),
                        arguments=_parse_input(getattr(block, "input", None)),
                    )
                )
            # Server-side tool blocks (web search …) are not ours to run.
        usage = getattr(message, "usage", None)
        stop_reason = getattr(message, "stop_reason", None)
        return ModelResponse(
            message=AssistantMessage(text="".join(texts), tool_calls=tool_calls, thinking=thinking),
            usage=anthropic_usage(usage),
            provider=self.provider,
            model=self.config.name,
            stop_reason=stop_reason if isinstance(stop_reason, str) else None,
        )


def anthropic_usage(usage: object) -> Usage:
    """The neutral usage of an Anthropic ``usage`` block: its ``input_tokens``
    are the uncached part only, so the cache reads and writes are added to
    make the request's whole input."""
    uncached = token_count(getattr(usage, "input_tokens", None))
    read = token_count(getattr(usage, "cache_read_input_tokens", None))
    written = token_count(getattr(usage, "cache_creation_input_tokens", None))
    return Usage(
        input_tokens=uncached + read + written,
        output_tokens=token_count(getattr(usage, "output_tokens", None)),
        cache_read_tokens=read,
        cache_write_tokens=written,
    )


def mark_history_cache(messages: list[dict[str, Any]]) -> None:
    """Put cache breakpoints (in place) on the last block of the last message
    and of the user message before it: two of the four the API allows, the
    other two being the tools' and the system prompt's.

    In a growing conversation the user message before the last one is the
    previous call's last message: its breakpoint reads back what that call
    wrote, and the new last one writes the longer prefix for the next call.
    A thinking block cannot carry a breakpoint, so the last block that can
    is marked (none when a message holds only thinking).
    """
    if not messages:
        return
    marked = [messages[-1]]
    earlier = next((m for m in reversed(messages[:-1]) if m.get("role") == "user"), None)
    if earlier is not None:
        marked.append(earlier)
    for message in marked:
        blocks = message.get("content")
        if not isinstance(blocks, list):
            continue
        block = next((b for b in reversed(blocks) if b.get("type") not in _UNMARKABLE), None)
        if block is not None:
            block["cache_control"] = _ephemeral()


def _ephemeral() -> dict[str, Any]:
    # A new dict per breakpoint: none is shared between blocks or requests.
    return {"type": "ephemeral"}


def history_to_wire(history: list[ChatMessage]) -> list[dict[str, Any]]:
    """Neutral history -> Anthropic ``messages``.

    Runs of user text and tool results collapse into one ``user`` message,
    because the API wants roles to alternate and all results of one
    assistant turn in the next user message.
    """
    wire: list[dict[str, Any]] = []
    pending: list[UserMessage | ToolResultMessage] = []

    def flush() -> None:
        if pending:
            wire.append({"role": "user", "content": _user_blocks(pending)})
            pending.clear()

    for message in history:
        if isinstance(message, UserMessage | ToolResultMessage):
            pending.append(message)
            continue
        blocks = _assistant_blocks(message)
        if not blocks:
            # An empty assistant turn is rejected by the API; dropping it lets
            # the user messages around it merge.
            continue
        flush()
        wire.append({"role": "assistant", "content": blocks})
    flush()
    return wire


def _user_blocks(messages: list[UserMessage | ToolResultMessage]) -> list[dict[str, Any]]:
    # The API wants tool_result blocks before any text in a user message.
    results: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ToolResultMessage):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.call_id,
                "content": message.content,
            }
            if message.error_kind is not None:
                block["is_error"] = True
            results.append(block)
        elif message.text:
            # Empty text blocks are rejected by the API.
            texts.append({"type": "text", "text": message.text})
    if not results and not texts:
        texts.append({"type": "text", "text": "(empty message)"})
    return results + texts


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for block in message.thinking:
        if block.redacted:
            blocks.append({"type": "redacted_thinking", "data": block.text})
        else:
            blocks.append(
                {"type": "thinking", "thinking": block.text, "signature": block.signature or ""}
            )
    if message.text:
        blocks.append({"type": "text", "text": message.text})
    for call in message.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                # Raw (invalid) arguments cannot be replayed as an object.
                "input": call.arguments if isinstance(call.arguments, dict) else {},
            }
        )
    return blocks


def _parse_input(raw: Any) -> dict[str, Any] | str:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return json.dumps(raw)
