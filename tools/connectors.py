"""Delivery tools: messages out to people through connectors.

- ``send_message``: to a connector's destination (a Telegram chat, a web
  session), now, mid-turn;
- ``reply_to_origin``: back to where this turn's message came from — at most
  once per turn, so a retrying model cannot post twice;
- ``ask_user``: a question (with optional choices and an expiry) that ends
  the turn; the person's next message on the conversation is its answer.

The connectors run in ``coterie serve``; the tools reach them through
``ctx.services.deliveries`` and are offered only where that exists.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.connectors.base import OutboundMessage
from coterie.runtime.context import EndTask, TurnContext
from coterie.runtime.errors import ConnectorError, ToolError, UnknownConnectorError
from coterie.runtime.messages import API_ORIGIN, Question, now
from coterie.runtime.services import DeliveryService
from coterie.runtime.tool import tool

MAX_TEXT = 20_000
MAX_BUTTONS = 10


def _deliveries(ctx: TurnContext) -> DeliveryService:
    if ctx.services.deliveries is None:
        raise ToolError("unavailable", "this runtime delivers no messages to connectors")
    return ctx.services.deliveries


def _has_deliveries(ctx: TurnContext) -> bool:
    return ctx.services.deliveries is not None


async def _deliver(ctx: TurnContext, connector: str, destination: str, text: str) -> str:
    message = OutboundMessage(
        connector=connector,
        destination=destination,
        text=ctx.settings.redact(text),
        persona=ctx.persona,
        conversation_id=ctx.conversation_id,
    )
    try:
        await _deliveries(ctx).deliver(message)
    except UnknownConnectorError as exc:
        raise ToolError("unknown_connector", str(exc)) from None
    except ConnectorError as exc:
        raise ToolError("connector_failed", str(exc)) from None
    return f"queued for {connector}:{destination} (message {message.id})"


class SendMessageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    connector: str = Field(min_length=1, max_length=64, description="e.g. telegram, web, cli")
    destination: str = Field(
        min_length=1, max_length=200, description="where on it: a chat id, a web session id"
    )
    text: str = Field(min_length=1, max_length=MAX_TEXT)


@tool(name="send_message", timeout=30, available=_has_deliveries)
async def send_message(args: SendMessageArgs, ctx: TurnContext) -> str:
    """Send a message to a person through a connector (a chat app, the web
    page), now. For answering the person who wrote this turn's message, use
    reply_to_origin or simply your reply."""
    return await _deliver(ctx, args.connector, args.destination, args.text)


class ReplyToOriginArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_TEXT)


@tool(name="reply_to_origin", timeout=30, available=_has_deliveries)
async def reply_to_origin(args: ReplyToOriginArgs, ctx: TurnContext) -> str:
    """Send a message back to where this turn's message came from (the chat,
    the web session) before the turn ends — e.g. to say a long task has
    started. At most once per turn; the final reply still goes there as usual."""
    origin = ctx.origin
    if origin.connector == API_ORIGIN or not origin.destination:
        raise ToolError(
            "no_origin",
            f"this turn's message came through the {origin.connector!r} interface, not a "
            "connector; your reply is how it is answered",
        )
    if ctx.outputs.replied_to_origin:
        raise ToolError(
            "already_replied", "reply_to_origin was already used on this turn; it was not sent"
        )
    result = await _deliver(ctx, origin.connector, origin.destination, args.text)
    ctx.outputs.replied_to_origin = True
    return result


class AskUserArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=4000)
    buttons: list[str] = Field(
        default_factory=list,
        max_length=MAX_BUTTONS,
        description="choices shown as buttons where the connector can (a typed answer works too)",
    )
    expires_in_minutes: float | None = Field(
        default=None, gt=0, le=60 * 24 * 30, description="after this the question lapses"
    )


@tool(name="ask_user", timeout=30, terminal=True, contexts=["user"])
async def ask_user(args: AskUserArgs, ctx: TurnContext) -> str:
    """Ask the person a question and end this turn; their next message is the
    answer (a button press or free text). Use it when you cannot go on without
    them."""
    if any(not b.strip() or len(b) > 64 for b in args.buttons):
        raise ToolError("invalid_arguments", "each button needs 1 to 64 characters")
    expires = now() + args.expires_in_minutes * 60 if args.expires_in_minutes else None
    ctx.outputs.question = Question(
        text=ctx.settings.redact(args.question), buttons=args.buttons, expires_at=expires
    )
    ctx.outputs.end_task = EndTask(status="ok", summary=ctx.outputs.question.text)
    return f"asked (question {ctx.outputs.question.id}); the turn ends here"


CONNECTOR_TOOLS = [send_message, reply_to_origin, ask_user]

__all__ = ["CONNECTOR_TOOLS", "ask_user", "reply_to_origin", "send_message"]
