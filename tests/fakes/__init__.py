"""Fake protocol servers: local stand-ins that speak a real wire protocol.

The real SDK clients (openai, anthropic, python-telegram-bot, a coding agent
behind ACP) talk to them over HTTP on 127.0.0.1, so a test checks the wire and
never the network. They are test equipment, not product: they live in tests/,
outside the wheel.

- :mod:`~tests.fakes.servers`: :class:`FakeOpenAIServer` and
  :class:`FakeAnthropicServer`, answering from a queue of replies
  (:class:`ScriptedReply`), streaming included;
- :mod:`~tests.fakes.anthropic_stream`: :class:`AnthropicStreamServer`, the
  Messages API answering by rules, enough for a real coding agent's turns;
- :mod:`~tests.fakes.telegram_server`: :class:`TelegramStandIn`, the Bot API.

The benchmarks may import this package (and :mod:`tests.recall`), so that they
measure against the very servers the tests check; it imports nothing else of
tests/ and no pytest (tests/test_layout.py holds it to that).
"""

from __future__ import annotations

from tests.fakes.anthropic_stream import AnthropicStreamServer
from tests.fakes.servers import (
    FakeAnthropicServer,
    FakeModelServer,
    FakeOpenAIServer,
    ScriptedReply,
)
from tests.fakes.telegram_server import TelegramStandIn

__all__ = [
    "AnthropicStreamServer",
    "FakeAnthropicServer",
    "FakeModelServer",
    "FakeOpenAIServer",
    "ScriptedReply",
    "TelegramStandIn",
]
