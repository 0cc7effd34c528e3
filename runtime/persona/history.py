"""A conversation's history as a persona keeps it: rebuilt from the audit
log, trimmed to the newest messages, and the text a turn's model sees for
each incoming envelope."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from coterie.runtime.context import Conversation
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ConversationRecord,
    MessageEnvelope,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.runner import error_result

#: Rebuilds a conversation (messages and todo list) after a restart or passivation.
HistoryLoader = Callable[[str], Awaitable[ConversationRecord]]


def trim_history(history: Sequence[ChatMessage], cap: int) -> list[ChatMessage]:
    """The newest messages of ``history``, at most ``cap``, starting at a user
    message (so no tool result is kept without the call it answers).

    What is dropped stays in the audit log; only the model stops seeing it.
    """
    if len(history) <= cap:
        return list(history)
    starts = [i for i, m in enumerate(history) if isinstance(m, UserMessage)]
    inside = [i for i in starts if i >= len(history) - cap]
    # No user message in the window (one very long turn): keep that whole turn.
    start = inside[0] if inside else max((i for i in starts), default=0)
    return list(history[start:])


async def rebuild(conversation: Conversation, loader: HistoryLoader, *, cap: int) -> None:
    """Read ``conversation`` back from the log: its newest ``cap`` messages,
    its todo list and its pending question."""
    record = await loader(conversation.id)
    conversation.history = trim_history(record.messages, cap)
    conversation.todos = list(record.todos)
    conversation.question = record.question


def unanswered_calls(history: Sequence[ChatMessage]) -> list[ToolResultMessage]:
    """Results for the tool calls of the last assistant message that have none.

    A rebuilt conversation can end in calls whose results were never recorded:
    the persona's process died while they ran. Each gets an ``interrupted``
    result (the call may or may not have taken effect).
    """
    answered: set[str] = set()
    for message in reversed(history):
        if isinstance(message, ToolResultMessage):
            answered.add(message.call_id)
            continue
        if isinstance(message, AssistantMessage):
            return [
                ToolResultMessage(
                    call_id=call.id,
                    name=call.name,
                    content=error_result(
                        "interrupted",
                        "the persona stopped before this call finished and has restarted; "
                        "the call may or may not have taken effect",
                    ),
                    error_kind="interrupted",
                )
                for call in message.tool_calls
                if call.id not in answered
            ]
        return []
    return []


def last_tool_calls(history: Sequence[ChatMessage]) -> list[ToolCall]:
    """The tool calls of the last assistant message (none if it made none)."""
    for message in reversed(history):
        if isinstance(message, AssistantMessage):
            return list(message.tool_calls)
    return []


def render_input(envelope: MessageEnvelope) -> str:
    """The text a turn's model sees for an incoming envelope."""
    if envelope.source_kind == "persona":
        return f"[message from persona {envelope.sender}] {envelope.text}"
    if envelope.source_kind == "wake":
        return f"[{envelope.sender}] {envelope.text}"
    return envelope.text


__all__ = [
    "HistoryLoader",
    "last_tool_calls",
    "rebuild",
    "render_input",
    "trim_history",
    "unanswered_calls",
]
