"""Connectors: the channels between people and personas (see :mod:`.base`)."""

from __future__ import annotations

from coterie.runtime.connectors.base import (
    APPROVAL_BUTTONS,
    Capability,
    Connector,
    ConnectorInfo,
    InboundMessage,
    OutboundMessage,
    info,
)

__all__ = [
    "APPROVAL_BUTTONS",
    "Capability",
    "Connector",
    "ConnectorInfo",
    "InboundMessage",
    "OutboundMessage",
    "info",
]
