"""An in-process messenger: several PersonaRuntimes talking without Ray.

Used by unit tests and as the in-process floor of the benchmarks; the actor
runtime's messenger (``runtime.routing.Directory`` over Ray) has the same contract.
"""

from __future__ import annotations

import asyncio

from coterie.runtime.errors import UnknownPersonaError
from coterie.runtime.messages import MessageEnvelope, ReplyEnvelope
from coterie.runtime.persona import PersonaRuntime


class LocalHub:
    """Delivers envelopes between PersonaRuntimes of one process."""

    def __init__(self) -> None:
        self.personas: dict[str, PersonaRuntime] = {}

    def add(self, runtime: PersonaRuntime) -> None:
        self.personas[runtime.name] = runtime
        runtime.services.messenger = self

    def roster(self) -> list[tuple[str, str]]:
        return [(n, p.persona.config.description) for n, p in sorted(self.personas.items())]

    def _target(self, name: str) -> PersonaRuntime:
        runtime = self.personas.get(name)
        if runtime is None:
            raise UnknownPersonaError(name, sorted(self.personas))
        return runtime

    async def ask(self, envelope: MessageEnvelope, *, timeout: float) -> ReplyEnvelope:
        target = self._target(envelope.recipient)
        # Shielded: a caller that stops waiting does not cancel the target's turn.
        return await asyncio.wait_for(asyncio.shield(target.handle(envelope)), timeout)

    async def post(self, envelope: MessageEnvelope) -> None:
        self._target(envelope.recipient).post(envelope)


__all__ = ["LocalHub"]
