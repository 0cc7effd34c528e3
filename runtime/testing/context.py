"""Building turn contexts outside a persona: for tests, benchmarks and scripts.

A tool is an async function of ``(args, ctx)``: to call one directly, give it
a context made here::

    ctx = turn_context("hi", settings=TurnSettings(workspace=tmp_path, access="full"))
    text = await file_read.fn(FileReadArgs(path="notes.md"), ctx)
    assert ctx.outputs.end_task is None

What the tool reads about its turn is set by the keywords below, what it is
given by ``settings`` (:class:`~runtime.context.TurnSettings`), the services
it reaches by ``services`` (:class:`~runtime.services.Services`; a
:class:`~runtime.services.NullAudit` keeps the events it records); what it
set is read back from ``ctx.outputs``.
"""

from __future__ import annotations

from collections.abc import Sequence

from coterie.runtime.context import Conversation, TurnContext, TurnOutputs, TurnSettings
from coterie.runtime.messages import Origin, TurnContextKind, UserMessage
from coterie.runtime.services import Services


def turn_context(
    text: str = "hi",
    *,
    conversation_id: str = "test:conv",
    persona: str = "tester",
    turn_id: str = "turn_test",
    kind: TurnContextKind = "user",
    depth: int = 0,
    roster: Sequence[tuple[str, str]] = (),
    ask_path: Sequence[str] = (),
    origin: Origin | None = None,
    settings: TurnSettings | None = None,
    services: Services | None = None,
    outputs: TurnOutputs | None = None,
) -> TurnContext:
    """A turn context on a fresh conversation holding one user message ``text``.

    Each keyword sets the :class:`~runtime.context.TurnContext` field of its
    name; ``settings``, ``services`` and ``outputs`` default to empty ones
    (no workspace, ``workspace`` access, no services but an in-memory audit
    sink).
    """
    conversation = Conversation(conversation_id)
    conversation.history.append(UserMessage(text=text))
    return TurnContext(
        persona=persona,
        conversation=conversation,
        turn_id=turn_id,
        kind=kind,
        depth=depth,
        roster=roster,
        ask_path=ask_path,
        origin=origin or Origin(),
        settings=settings or TurnSettings(),
        services=services or Services(),
        outputs=outputs or TurnOutputs(),
    )


__all__ = ["turn_context"]
