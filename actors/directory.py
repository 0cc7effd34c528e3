"""PersonaDirectory: the caller side of the router.

Every caller (the Python API, each persona actor) keeps one. It asks the
router for a persona's actor handle once, caches it, and sends envelopes to
the persona directly — one hop instead of two. It goes back to the router
when the handle goes stale: after a passivation (the message was not taken,
so it is resent) or when the router itself restarts (retried with backoff).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from runtime.errors import CoterieError, DeliveryError, PersonaPassivatedError
from runtime.messages import MessageEnvelope, ReplyEnvelope

log = logging.getLogger("coterie.actors.directory")

ROUTER_RETRY_SECONDS = 30.0


def unwrap(exc: BaseException) -> BaseException:
    """The coterie error inside a Ray task error, else the error itself."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, CoterieError) else exc


class PersonaDirectory:
    """Resolves persona names to actor handles (cached) and delivers to them."""

    def __init__(self, router_name: str, namespace: str) -> None:
        self.router_name = router_name
        self.namespace = namespace
        self._router: Any = None
        self._handles: dict[str, Any] = {}

    def forget(self, persona: str) -> None:
        self._handles.pop(persona, None)

    async def call_router(self, method: str, *args: Any) -> Any:
        """Call the router, waiting out a restart (its calls are idempotent)."""
        delay, waited = 0.05, 0.0
        while True:
            try:
                if self._router is None:
                    self._router = ray.get_actor(self.router_name, namespace=self.namespace)
                return await getattr(self._router, method).remote(*args)
            except ray.exceptions.RayTaskError as exc:
                raise unwrap(exc) from None
            except (ray.exceptions.RayActorError, ValueError) as exc:
                if waited >= ROUTER_RETRY_SECONDS:
                    raise DeliveryError(f"the router is unavailable: {exc}") from None
                self._router = None
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 1.0)

    async def resolve(self, persona: str) -> Any:
        handle = self._handles.get(persona)
        if handle is None:
            handle = await self.call_router("resolve", persona)
            self._handles[persona] = handle
        return handle

    async def _deliver(self, method: str, envelope: MessageEnvelope, timeout: float | None) -> Any:
        data = envelope.model_dump_json()
        for attempt in range(3):
            handle = await self.resolve(envelope.recipient)
            try:
                call = getattr(handle, method).remote(data)
                return await (asyncio.wait_for(call, timeout) if timeout else call)
            except ray.exceptions.RayTaskError as exc:
                cause = unwrap(exc)
                if isinstance(cause, PersonaPassivatedError) and attempt < 2:
                    self.forget(envelope.recipient)
                    continue
                raise cause from None
            except ray.exceptions.RayActorError as exc:
                self.forget(envelope.recipient)
                actor_id = handle._actor_id.hex()
                if attempt < 2 and await self.call_router("was_passivated", actor_id):
                    continue  # it exited idle, before taking the message
                # Answer only once the restarted actor is up, so that the
                # caller's next message finds it alive.
                await self._await_restart(handle)
                raise DeliveryError(
                    f"persona {envelope.recipient!r} died while handling the message "
                    f"({type(exc).__name__}); it has restarted — send again"
                ) from None
        raise DeliveryError(f"persona {envelope.recipient!r} kept passivating; try again")

    async def _await_restart(self, handle: Any, limit: float = ROUTER_RETRY_SECONDS) -> None:
        delay, waited = 0.05, 0.0
        while waited < limit:
            try:
                await asyncio.wait_for(handle.ping.remote(), 5)
                return
            except (ray.exceptions.RayError, TimeoutError):
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 1.0)

    async def ask(self, envelope: MessageEnvelope, *, timeout: float) -> ReplyEnvelope:
        """Deliver and wait for the turn's reply (``TimeoutError`` after ``timeout``)."""
        data = await self._deliver("handle", envelope, timeout)
        return ReplyEnvelope.model_validate_json(data)

    async def post(self, envelope: MessageEnvelope) -> None:
        """Deliver without waiting for the turn; raises if the persona refused it."""
        await self._deliver("post", envelope, None)


__all__ = ["PersonaDirectory", "unwrap"]
