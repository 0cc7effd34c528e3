"""Connectors: the channels between people and personas (see :mod:`.base`)."""

from __future__ import annotations

from coterie.runtime.connectors.base import (
    Capability,
    Connector,
    ConnectorInfo,
    InboundMessage,
    OutboundMessage,
    info,
)

__all__ = [
    "Capability",
    "Connector",
    "ConnectorInfo",
    "InboundMessage",
    "OutboundMessage",
    "info",
]
