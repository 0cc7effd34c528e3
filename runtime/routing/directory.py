"""Directory: the caller side of the router.

Every caller (the Python API, each persona actor) keeps one. It asks the
router for a persona's actor handle once, caches it, and sends envelopes to
the persona directly — one hop instead of two. It goes back to the router
when the handle goes stale: after a passivation (the message was not taken,
so it is resent) or when the router itself restarts (waited out with
backoff). How calls travel is a :class:`PersonaLink`'s business (Ray in a
cluster; a fake in the unit tests).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, Literal, Protocol, TypeVar

from coterie.runtime.errors import ActorLostError, DeliveryError, PersonaPassivatedError
from coterie.runtime.messages import MessageEnvelope, ReplyEnvelope, StreamItem, stream_item_adapter
from coterie.runtime.tracing import carrier

H = TypeVar("H")
H_contra = TypeVar("H_contra", contravariant=True)

#: How long a caller waits for a restarting router (or persona) to come back.
ROUTER_WAIT_SECONDS = 30.0
#: Persona handles cached per caller (least recently used forgotten first).
HANDLE_CACHE = 10_000
#: Attempts to deliver one envelope through passivations of its target.
DELIVERY_ATTEMPTS = 3


class PersonaLink(Protocol[H_contra]):
    """Carries calls to the router and to persona actors.

    Errors raised by the far side come back as themselves (coterie errors);
    an actor that cannot be reached raises :class:`ActorLostError`.
    """

    async def call_router(self, method: str, *args: Any) -> Any: ...

    async def call(self, handle: H_contra, method: Literal["handle", "post"], data: str) -> Any: ...

    def stream(self, handle: H_contra, data: str) -> AsyncIterator[str]:
        """The persona's ``stream`` of one envelope: its items as JSON."""
        ...

    async def ping(self, handle: H_contra) -> None: ...

    def actor_id(self, handle: H_contra) -> str: ...


def _died(persona: str, exc: ActorLostError, restarted: bool) -> str:
    if restarted:
        return (
            f"persona {persona!r} died while handling the message ({exc}); "
            "it has restarted — send again"
        )
    # Its node is gone (or full): Ray starts it again once a node can hold it.
    return (
        f"persona {persona!r} died while handling the message ({exc}) and has not "
        "restarted yet (no node may be able to hold it now) — send again later"
    )


class Directory(Generic[H]):
    """Resolves persona names to actor handles (cached) and delivers to them."""

    def __init__(
        self,
        link: PersonaLink[H],
        *,
        router_wait: float = ROUTER_WAIT_SECONDS,
        cache_size: int = HANDLE_CACHE,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.link = link
        self.router_wait = router_wait
        self._cache_size = cache_size
        self._handles: OrderedDict[str, H] = OrderedDict()
        self._sleep = sleep

    async def _waiting(self, make_call: Callable[[], Awaitable[Any]], what: str) -> Any:
        """``make_call()``, again with backoff while it raises ActorLostError."""
        delay, waited = 0.05, 0.0
        began = time.monotonic()
        while True:
            try:
                return await make_call()
            except ActorLostError as exc:
                # The calls' own time counts too: a ping of an actor with no
                # node to run on takes its whole timeout each time.
                if waited >= self.router_wait or time.monotonic() - began >= self.router_wait:
                    raise DeliveryError(f"{what} is unavailable: {exc}") from None
            await self._sleep(delay)
            waited += delay
            delay = min(delay * 2, 1.0)

    async def call_router(self, method: str, *args: Any) -> Any:
        """Call the router, waiting out a restart (its calls are idempotent)."""
        return await self._waiting(lambda: self.link.call_router(method, *args), "the router")

    def forget(self, persona: str) -> None:
        self._handles.pop(persona, None)

    async def resolve(self, persona: str) -> H:
        handle = self._handles.get(persona)
        if handle is not None:
            self._handles.move_to_end(persona)
            return handle
        # The caller's trace context: a start of the persona's actor is its child.
        handle = await self.call_router("resolve", persona, carrier())
        self._handles[persona] = handle
        while len(self._handles) > self._cache_size:
            self._handles.popitem(last=False)
        return handle

    async def _deliver(
        self, method: Literal["handle", "post"], envelope: MessageEnvelope, timeout: float | None
    ) -> Any:
        data = envelope.model_dump_json()
        recipient = envelope.recipient
        for attempt in range(DELIVERY_ATTEMPTS):
            last = attempt == DELIVERY_ATTEMPTS - 1
            handle = await self.resolve(recipient)
            call = self.link.call(handle, method, data)
            try:
                return await (asyncio.wait_for(call, timeout) if timeout else call)
            except PersonaPassivatedError:
                self.forget(recipient)
                if last:
                    raise
                continue
            except ActorLostError as exc:
                self.forget(recipient)
                if not last and await self.call_router(
                    "was_passivated", self.link.actor_id(handle)
                ):
                    continue  # it exited idle, before taking the message
                # Answer only once the restarted actor is up, so that the
                # caller's next message finds it alive.
                raise DeliveryError(
                    _died(recipient, exc, await self._await_restart(handle))
                ) from None
        raise AssertionError("unreachable")

    async def _await_restart(self, handle: H) -> bool:
        """Whether the persona's actor answers again within ``router_wait``."""
        try:
            await self._waiting(lambda: self.link.ping(handle), "the persona")
        except DeliveryError:
            return False  # not back in time: the caller's next send resolves it again
        return True

    async def ask(self, envelope: MessageEnvelope, *, timeout: float) -> ReplyEnvelope:
        """Deliver and wait for the turn's reply (``TimeoutError`` after ``timeout``)."""
        data = await self._deliver("handle", envelope, timeout)
        return ReplyEnvelope.model_validate_json(data)

    async def post(self, envelope: MessageEnvelope) -> None:
        """Deliver without waiting for the turn; raises if the persona refused it."""
        await self._deliver("post", envelope, None)

    async def stream(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]:
        """Deliver and yield the answering turn's events, then its reply.

        A persona that was passivating before it took the message is resolved
        again (as :meth:`ask` does); once events have flowed, a lost persona
        ends the stream with :class:`DeliveryError`.
        """
        data = envelope.model_dump_json()
        recipient = envelope.recipient
        for attempt in range(DELIVERY_ATTEMPTS):
            last = attempt == DELIVERY_ATTEMPTS - 1
            handle = await self.resolve(recipient)
            started = False
            try:
                async for raw in self.link.stream(handle, data):
                    started = True
                    yield stream_item_adapter.validate_json(raw)
                return
            except PersonaPassivatedError:
                self.forget(recipient)
                if last or started:
                    raise
            except ActorLostError as exc:
                self.forget(recipient)
                if (
                    not last
                    and not started
                    and await self.call_router("was_passivated", self.link.actor_id(handle))
                ):
                    continue
                raise DeliveryError(
                    _died(recipient, exc, await self._await_restart(handle))
                ) from None


__all__ = ["DELIVERY_ATTEMPTS", "HANDLE_CACHE", "ROUTER_WAIT_SECONDS", "Directory", "PersonaLink"]
