"""How many tokens a request will be, before it is sent.

No tokenizer: none can be downloaded at run time here, and each provider
counts its own way. Instead the estimate is anchored on what the provider
said: after each call, its ``usage.input_tokens`` and the size in characters
of the request it answered become the conversation's anchor; the next
request's size is the anchor plus what was added since, converted at the
characters-per-token ratio the provider's counts have shown so far (a
running ratio per model, clamped; :data:`DEFAULT_CHARS_PER_TOKEN` before the
first answer). A request whose prefix changed (a compaction, other tools)
has no usable anchor: it is estimated from its size alone at that ratio.

Sizes count what the provider is sent: the system prompt, each message's
text, tool calls' names and JSON arguments, tool results, and the tool
definitions' JSON (measured once per definition).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)

#: Characters per token assumed before a provider has counted one request:
#: a little under English prose's ~4, so that a first estimate errs high.
DEFAULT_CHARS_PER_TOKEN = 3.5
#: Bounds of a measured ratio (code and JSON run ~2.5, prose ~4.5).
MIN_CHARS_PER_TOKEN = 1.5
MAX_CHARS_PER_TOKEN = 8.0
#: Tokens a provider adds per message for roles and separators.
PER_MESSAGE_TOKENS = 4


def message_chars(message: ChatMessage) -> int:
    """Characters of ``message`` as the provider receives them."""
    if isinstance(message, UserMessage):
        return len(message.text)
    if isinstance(message, ToolResultMessage):
        return len(message.content) + len(message.name) + len(message.call_id)
    assert isinstance(message, AssistantMessage)
    size = len(message.text) + len(message.reasoning_content or "")
    for block in message.thinking:
        size += len(block.text) + len(block.signature or "")
    for call in message.tool_calls:
        args = call.arguments
        size += len(call.name) + len(call.id)
        size += len(args) if isinstance(args, str) else len(json.dumps(args, default=str))
    return size


#: Sizes of the tool definitions measured so far, by ``id`` (each entry
#: holds its definition, so the id is never reused while it is here).
_DEFINITION_CHARS: dict[int, tuple[ToolDefinition, int]] = {}
_DEFINITION_CACHE_CAP = 4096


def definition_chars(definition: ToolDefinition) -> int:
    """Characters of a tool definition's JSON (measured once per definition:
    a spec builds its definition once)."""
    found = _DEFINITION_CHARS.get(id(definition))
    if found is not None and found[0] is definition:
        return found[1]
    size = len(definition.name) + len(definition.description)
    size += len(json.dumps(definition.parameters, separators=(",", ":")))
    if len(_DEFINITION_CHARS) >= _DEFINITION_CACHE_CAP:
        _DEFINITION_CHARS.clear()
    _DEFINITION_CHARS[id(definition)] = (definition, size)
    return size


@dataclass
class Anchor:
    """What the provider counted for the last request of a conversation."""

    tokens: int
    #: Messages of that request, and the last of them (the prefix check).
    messages: int
    last: ChatMessage | None
    #: Characters of that request's messages, and of its system and tools.
    message_chars: int
    fixed_chars: int


class TokenEstimator:
    """Estimates request sizes for one model; learns its ratio as it goes."""

    def __init__(self) -> None:
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN
        self._measured = 0

    def fixed_chars(self, system: str, tools: Sequence[ToolDefinition]) -> int:
        return len(system) + sum(definition_chars(t) for t in tools)

    def estimate(
        self,
        messages: Sequence[ChatMessage],
        *,
        fixed_chars: int,
        anchor: Anchor | None,
    ) -> int:
        """Input tokens of a request of ``messages`` (plus system and tools,
        ``fixed_chars``), from ``anchor`` when its prefix still holds."""
        ratio = self.chars_per_token
        if anchor is not None and _prefix_holds(anchor, messages):
            added = sum(message_chars(m) for m in messages[anchor.messages :])
            added += fixed_chars - anchor.fixed_chars
            more = len(messages) - anchor.messages
            return max(0, anchor.tokens + int(added / ratio) + PER_MESSAGE_TOKENS * more)
        chars = fixed_chars + sum(message_chars(m) for m in messages)
        return int(chars / ratio) + PER_MESSAGE_TOKENS * len(messages)

    def observe(
        self,
        messages: Sequence[ChatMessage],
        *,
        fixed_chars: int,
        input_tokens: int,
        anchor: Anchor | None = None,
    ) -> Anchor | None:
        """Learn from a provider's count of a request; the new anchor (None
        when the provider counted nothing). ``anchor``: the conversation's
        anchor before this request; when its prefix still holds, only the
        messages added since are measured, so a turn's cost does not grow
        with the length of the history."""
        if input_tokens <= 0:
            return None
        if anchor is not None and _prefix_holds(anchor, messages):
            chars = anchor.message_chars
            chars += sum(message_chars(m) for m in messages[anchor.messages :])
        else:
            chars = sum(message_chars(m) for m in messages)
        usable = input_tokens - PER_MESSAGE_TOKENS * len(messages)
        if usable > 0 and chars + fixed_chars > 0:
            ratio = (chars + fixed_chars) / usable
            ratio = min(MAX_CHARS_PER_TOKEN, max(MIN_CHARS_PER_TOKEN, ratio))
            # A running mean over the first calls, then a slow drift.
            self._measured += 1
            weight = 1 / min(self._measured, 20)
            self.chars_per_token += (ratio - self.chars_per_token) * weight
        return Anchor(
            tokens=input_tokens,
            messages=len(messages),
            last=messages[-1] if messages else None,
            message_chars=chars,
            fixed_chars=fixed_chars,
        )


def _prefix_holds(anchor: Anchor, messages: Sequence[ChatMessage]) -> bool:
    if len(messages) < anchor.messages:
        return False
    if anchor.messages == 0:
        return True
    return messages[anchor.messages - 1] is anchor.last


__all__ = [
    "DEFAULT_CHARS_PER_TOKEN",
    "MAX_CHARS_PER_TOKEN",
    "MIN_CHARS_PER_TOKEN",
    "PER_MESSAGE_TOKENS",
    "Anchor",
    "TokenEstimator",
    "definition_chars",
    "message_chars",
]
