"""Persona tools: send_to_persona, ask_persona, list_personas.

A message from persona S to persona T lands in T's inbox conversation
``T:inbox:S``, which persists across calls, so a follow-up sees the earlier
exchange. All three are hidden when the runtime has fewer than two personas,
and from subagents.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import AskCycleError, CoterieError, ToolError, UnknownPersonaError
from coterie.runtime.messages import MessageEnvelope, inbox_id
from coterie.runtime.services import Messenger
from coterie.runtime.tool import matches_any, tool
from coterie.tools._effects import persona_effect

ASK_DEFAULT_MS = 120_000
ASK_MAX_MS = 600_000
# Above the longest ask, so the target gets its whole turn before the runner gives up.
ASK_TOOL_TIMEOUT = ASK_MAX_MS / 1000 + 5


def _has_peers(ctx: TurnContext) -> bool:
    return len(ctx.roster) >= 2 and ctx.services.messenger is not None


def _messenger(ctx: TurnContext) -> Messenger:
    if ctx.services.messenger is None:  # available() hides the tools; belt and braces
        raise ToolError("unavailable", "this runtime has no persona messaging")
    return ctx.services.messenger


def _check_target(target: str, ctx: TurnContext) -> None:
    # Unknown names are the messenger's to report: the roster may be abridged.
    if target == ctx.persona:
        raise ToolError("invalid_target", "you cannot send a message to yourself")
    team = ctx.settings.team
    if team is not None and not matches_any(target, team):
        members = [n for n, _ in ctx.roster if n != ctx.persona]
        raise ToolError(
            "not_in_team",
            f"{target} is not in your team ({', '.join(team)}: persona.yaml team); you may "
            f"message {', '.join(members) if members else 'nobody'}",
        )


def ask_chain(ctx: TurnContext, target: str) -> list[str]:
    """The ask path a message to ``target`` carries; raises on a cycle.

    ``ctx.ask_path`` lists the personas already waiting on this turn. If the
    target is among them (or is this persona), asking it would close a loop
    of personas waiting on each other.
    """
    path = [*ctx.ask_path, ctx.persona]
    if target in path:
        cycle = [*path[path.index(target) :], target]
        raise ToolError("ask_cycle", str(AskCycleError(cycle)))
    return path


class SendArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    persona: str = Field(description="name of the persona to message")
    text: str = Field(min_length=1, max_length=100_000, description="the message")


@tool(
    name="send_to_persona",
    timeout=30,
    delegation=True,
    available=_has_peers,
    effect=persona_effect,
)
async def send_to_persona(args: SendArgs, ctx: TurnContext) -> str:
    """Post a message into another persona's inbox and return at once. Its
    reply arrives later in your inbox conversation with it, as a new message.
    Use ask_persona instead when you need the answer now."""
    _check_target(args.persona, ctx)
    conversation = inbox_id(args.persona, ctx.persona)
    envelope = MessageEnvelope(
        sender=ctx.persona,
        recipient=args.persona,
        conversation_id=conversation,
        text=args.text,
        source_kind="persona",
        reply_mode="mirror",
        ask_path=[],  # nobody waits on a posted message
    )
    try:
        await _messenger(ctx).post(envelope)
    except UnknownPersonaError as exc:
        raise ToolError("unknown_persona", str(exc)) from None
    except CoterieError as exc:  # queue full, broken persona file, dead actor…
        raise ToolError("delivery_failed", str(exc)) from None
    return f"posted to {conversation}"


class AskArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    persona: str = Field(description="name of the persona to ask")
    text: str = Field(min_length=1, max_length=100_000, description="the question or task")
    timeout_ms: int = Field(
        default=ASK_DEFAULT_MS,
        ge=1_000,
        le=ASK_MAX_MS,
        description="how long to wait for the reply (default 120000, at most 600000)",
    )


@tool(
    name="ask_persona",
    timeout=ASK_TOOL_TIMEOUT,
    delegation=True,
    available=_has_peers,
    effect=persona_effect,
)
async def ask_persona(args: AskArgs, ctx: TurnContext) -> str:
    """Ask another persona and wait for its reply (it answers with its own
    memory, tools and model). Follow-up asks to the same persona continue the
    same thread."""
    _check_target(args.persona, ctx)
    path = ask_chain(ctx, args.persona)
    timeout = args.timeout_ms / 1000
    envelope = MessageEnvelope(
        sender=ctx.persona,
        recipient=args.persona,
        conversation_id=inbox_id(args.persona, ctx.persona),
        text=args.text,
        source_kind="persona",
        reply_mode="return",
        ask_path=path,
        deadline=time.time() + timeout,
    )
    try:
        reply = await _messenger(ctx).ask(envelope, timeout=timeout)
    except TimeoutError:
        raise ToolError(
            "timeout",
            f"{args.persona} did not reply within {timeout:g} s (its turn may still finish; "
            "that reply will not reach you)",
        ) from None
    except UnknownPersonaError as exc:
        raise ToolError("unknown_persona", str(exc)) from None
    except CoterieError as exc:
        raise ToolError("delivery_failed", str(exc)) from None
    if reply.status == "error":
        raise ToolError("delivery_failed", f"{args.persona} failed: {reply.error}")
    if reply.status == "skipped":
        return f"{args.persona} ended the thread without a reply."
    if reply.status == "failed":
        return f"{args.persona} reports failure: {reply.text}"
    return reply.text


class ListArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


@tool(name="list_personas", timeout=30, delegation=True, available=_has_peers, allow_repeat=True)
async def list_personas(args: ListArgs, ctx: TurnContext) -> str:
    """List the other personas you can message, with what each is for."""
    lines = [f"- {n}: {d}" if d else f"- {n}" for n, d in ctx.roster if n != ctx.persona]
    return "\n".join(lines) if lines else "There are no other personas."


PERSONA_TOOLS = [send_to_persona, ask_persona, list_personas]

__all__ = ["PERSONA_TOOLS", "ask_chain", "ask_persona", "list_personas", "send_to_persona"]
