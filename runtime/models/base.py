"""The model provider contract.

A provider is one small class with one async ``request`` method that turns a
provider-neutral :class:`~runtime.messages.ModelRequest` into a neutral
:class:`~runtime.messages.ModelResponse`. Wire format and credentials are the
provider's own business; SDKs are imported lazily inside the provider.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from coterie.runtime.messages import ModelRequest, ModelResponse


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


#: Receives each piece of reply text as the model produces it.
TextSink = Callable[[str], None]


@runtime_checkable
class StreamingModel(Model, Protocol):
    """A model that can also hand out its reply text while it is produced.

    ``stream`` returns the same :class:`ModelResponse` as ``request`` would
    (whole text, tool calls, usage) and calls ``on_text`` with each piece of
    text on the way, in order; the pieces concatenate to the response's text.
    A retry happens only before the first piece was handed out.
    """

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelResponse:
        """Send one request, streaming its text to ``on_text``."""
        ...
