"""A stand-in for a model that could not be built (e.g. a missing API key).

A persona whose model cannot be built still starts, so that its actor can
answer: each turn fails with the original, readable error.
"""

from __future__ import annotations

from coterie.runtime.config import ModelConfig
from coterie.runtime.errors import ModelError
from coterie.runtime.messages import ModelRequest, ModelResponse
from coterie.runtime.models.base import TextSink


class UnavailableModel:
    """Raises ``error`` on every request."""

    def __init__(self, provider: str, name: str, error: ModelError) -> None:
        self.provider = provider
        self.name = name
        self.error = error

    async def request(self, request: ModelRequest) -> ModelResponse:
        raise self.error

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelResponse:
        raise self.error

    async def aclose(self) -> None:
        return None

    @classmethod
    def for_config(cls, config: ModelConfig, error: ModelError) -> UnavailableModel:
        return cls(config.provider, config.name, error)


__all__ = ["UnavailableModel"]
