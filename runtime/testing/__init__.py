"""Test helpers: local fake model servers speaking the provider wire formats."""

from __future__ import annotations

from runtime.testing.servers import (
    FakeAnthropicServer,
    FakeModelServer,
    FakeOpenAIServer,
    ScriptedReply,
)

__all__ = ["FakeAnthropicServer", "FakeModelServer", "FakeOpenAIServer", "ScriptedReply"]
