"""The model provider contract.

A provider is one small class with one async ``request`` method that turns a
provider-neutral :class:`~runtime.messages.ModelRequest` into a neutral
:class:`~runtime.messages.ModelResponse`. Wire format and credentials are the
provider's own business; SDKs are imported lazily inside the provider.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from runtime.messages import ModelRequest, ModelResponse


@runtime_checkable
class Model(Protocol):
    """Anything that can answer a :class:`ModelRequest`."""

    provider: str
    name: str

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request and return the neutral response.

        Raises :class:`runtime.errors.ModelError` (or a subclass) on failure.
        """
        ...

    async def aclose(self) -> None:
        """Release network clients (no-op for local models)."""
        ...
