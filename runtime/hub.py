"""LocalHub: persona runtimes of one process asking and messaging each other,
without Ray.

:meth:`LocalHub.add` makes the hub a persona runtime's
:class:`~coterie.runtime.services.Messenger`, so its ``ask_persona`` and
``send_to_persona`` reach the other runtimes added. Part of the testing API
(:mod:`coterie.runtime.testing` re-exports it): tests and scripts try personas
together with it. On Ray the router plays this part (a caller reaches it
through :class:`~coterie.runtime.routing.Directory`) with the same contract:
``ask`` waits for the reply at most ``timeout`` seconds without cancelling the
target's turn, ``post`` delivers without waiting, and an unknown name raises
:class:`~coterie.runtime.errors.UnknownPersonaError`.
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
        # A scheduler's fire is queued only once the persona accepted it.
        await self._target(envelope.recipient).receive(envelope)


__all__ = ["LocalHub"]
