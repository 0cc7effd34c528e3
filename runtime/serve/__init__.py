"""The front door: the HTTP API, the OpenAI-compatible endpoint and the chat
page of ``coterie serve`` (plain aiohttp over a :class:`FrontDoor`)."""

from __future__ import annotations

from coterie.runtime.serve.backend import FrontDoor

__all__ = ["FrontDoor"]
