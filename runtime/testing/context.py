"""Building turn contexts outside a persona: for tests, benchmarks and scripts."""

from __future__ import annotations

from typing import Any

from coterie.runtime.context import Conversation, TurnContext
from coterie.runtime.messages import UserMessage


def turn_context(
    text: str = "hi",
    *,
    conversation_id: str = "test:conv",
    persona: str = "tester",
    turn_id: str = "turn_test",
    **fields: Any,
) -> TurnContext:
    """A turn context on a fresh conversation holding one user message ``text``.

    ``fields`` set any other :class:`~runtime.context.TurnContext` field
    (``workspace``, ``services``, ``access``, ``settings``…).
    """
    conversation = Conversation(conversation_id)
    conversation.history.append(UserMessage(text=text))
    return TurnContext(persona=persona, conversation=conversation, turn_id=turn_id, **fields)


__all__ = ["turn_context"]
