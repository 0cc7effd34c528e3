"""The connector contract: where people reach personas from, and where
personas' messages go out to.

A connector has an ``id`` (``web``, ``cli``, ``telegram``…), a set of
``capabilities`` (what it can render: ``text`` always, ``buttons`` for a
question with choices, ``markdown``), ``send`` (one outbound message to a
destination — a chat id, a browser session) and ``receive`` (the inbound
messages people send through it, as they come). The front door
(``coterie serve``) runs the connectors: it turns each inbound message into
an envelope whose :class:`~runtime.messages.Origin` names the connector and
destination, and hands the outbound messages personas' tools queued to the
connector they name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.messages import new_id, now

Capability = Literal["text", "buttons", "markdown"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: The buttons of an approval, and the answer each gives.
APPROVAL_BUTTONS: tuple[tuple[str, str], ...] = (
    ("Approve", "approve"),
    ("Deny", "deny"),
    ("Always allow", "always"),
)


class OutboundMessage(_Model):
    """A message a persona sends out through a connector."""

    id: str = Field(default_factory=lambda: new_id("out_"))
    connector: str
    destination: str
    text: str
    persona: str
    conversation_id: str
    # A question (ask_user): its id, its choices and when it expires.
    question_id: str | None = None
    buttons: list[str] = Field(default_factory=list)
    expires_at: float | None = None
    #: An approval a person answers with this message's buttons (then
    #: ``buttons`` are :data:`APPROVAL_BUTTONS`, in that order).
    approval_id: str | None = None
    ts: float = Field(default_factory=now)


class InboundMessage(_Model):
    """A message a person sent through a connector."""

    connector: str
    destination: str
    text: str
    sender: str = "user"
    # The question a button press answers (its id), if any.
    answer_to: str | None = None
    #: A press of an approval's button: the approval, and the answer
    #: (``approve``, ``deny``, ``always``).
    approval: str | None = None
    decision: str | None = None
    # The persona it is for, when the connector knows (else the connector's default).
    persona: str | None = None


class ConnectorInfo(_Model):
    """What the runtime knows of a running connector."""

    id: str
    capabilities: list[Capability] = Field(default_factory=lambda: list[Capability](["text"]))


@runtime_checkable
class Connector(Protocol):
    """A channel between people and personas."""

    id: str
    capabilities: frozenset[Capability]

    async def send(self, message: OutboundMessage) -> str:
        """Deliver ``message`` to its destination; the connector's id for it.

        Raises :class:`~runtime.errors.ConnectorError` when it could not be
        delivered (unknown destination, the service refused it).
        """
        ...

    def receive(self) -> AsyncIterator[InboundMessage]:
        """The inbound messages, as they arrive, until :meth:`aclose`."""
        ...

    async def aclose(self) -> None:
        """Stop receiving and release the connector's clients."""
        ...


def info(connector: Connector) -> ConnectorInfo:
    """The :class:`ConnectorInfo` of ``connector``."""
    return ConnectorInfo(id=connector.id, capabilities=sorted(connector.capabilities))


__all__ = [
    "APPROVAL_BUTTONS",
    "Capability",
    "Connector",
    "ConnectorInfo",
    "InboundMessage",
    "OutboundMessage",
    "info",
]
