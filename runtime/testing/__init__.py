"""Test helpers shipped with the package (the tests, the benchmarks and the
demo share them): local model servers speaking the provider wire formats,
turn contexts for calling tools directly, and the recall evaluation set."""

from __future__ import annotations

from coterie.runtime.testing.context import turn_context
from coterie.runtime.testing.servers import (
    FakeAnthropicServer,
    FakeModelServer,
    FakeOpenAIServer,
    ScriptedReply,
)

__all__ = [
    "FakeAnthropicServer",
    "FakeModelServer",
    "FakeOpenAIServer",
    "ScriptedReply",
    "turn_context",
]
