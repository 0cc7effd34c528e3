"""Router: the address book of one runtime, and the lifecycle of its personas.

Personas are *virtual actors*: a registered persona (a directory in the home)
costs nothing until its first message, when :meth:`Router.resolve` starts its
actor — once, however many callers ask at the same moment. An actor idle for
``idle_timeout`` asks to be passivated and is stopped; the router remembers
that it stopped it on purpose, so a caller that finds it gone knows its
message was never taken and can resend. At most ``start_limit`` actors start
at a time; the others wait their turn (see :meth:`Router.resolve`).

How actors are started, asked and stopped is a :class:`PersonaHost`'s
business (Ray in a cluster; a fake in the unit tests).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from coterie.runtime.config import load_persona_dir
from coterie.runtime.connectors.base import ConnectorInfo
from coterie.runtime.connectors.outbox import Outbox
from coterie.runtime.errors import ActorLostError, CoterieError, UnknownPersonaError
from coterie.runtime.frontdoor import PersonaInfo
from coterie.runtime.mcp.config import load_servers
from coterie.runtime.messages import MessageEnvelope, PersonaStats, ReplyEnvelope
from coterie.runtime.routing.roster import Roster
from coterie.runtime.tracing import Carrier
from coterie.runtime.tracing import genai as g
from coterie.runtime.tracing.spans import start_activation

H = TypeVar("H")

#: Actor ids of deliberately stopped personas remembered (oldest forgotten first).
PASSIVATED_CAP = 10_000


#: Seconds an active persona has to report its activity to ``status``.
STATS_TIMEOUT = 2.0


class RouterStatus(BaseModel):
    """What the router knows runs (see :meth:`Router.status`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    registered: int
    active: list[PersonaStats]
    unresponsive: list[str]
    #: Starting, or waiting to (those in ``waiting_to_start`` too).
    activating: list[str]
    #: Waiting for one of the ``start_limit`` starts at a time to end.
    waiting_to_start: list[str]
    start_limit: int | None
    connectors: list[ConnectorInfo]
    outbound_waiting: dict[str, int]


class PersonaHost(Protocol[H]):
    """Starts, asks and stops the actors of personas (handles of type ``H``).

    Calls to an actor that is gone raise :class:`ActorLostError`.
    """

    async def start(self, name: str, roster: list[tuple[str, str]]) -> H:
        """Start (or find) the persona's actor and return once it answers."""
        ...

    async def deliver(self, handle: H, data: str) -> str:
        """Hand the actor a message envelope (JSON); the reply envelope (JSON)."""
        ...

    async def prepare_passivation(self, handle: H, idle_timeout: float) -> bool:
        """Ask the actor to close if still idle; whether it did."""
        ...

    async def flush(self, handle: H) -> None: ...

    async def shutdown(self, handle: H) -> None: ...

    async def activity(self, handle: H) -> PersonaStats: ...

    def stop(self, handle: H) -> None:
        """End the actor's process (it is not restarted)."""
        ...

    def actor_id(self, handle: H) -> str: ...


class Router(Generic[H]):
    """Activates, tracks and passivates the persona actors of one home."""

    def __init__(
        self,
        home: Path,
        host: PersonaHost[H],
        *,
        idle_timeout: float | None,
        start_limit: int | None = None,
        passivated_cap: int = PASSIVATED_CAP,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        if start_limit is not None and start_limit < 1:
            raise ValueError(f"start_limit must be at least 1 (or None), got {start_limit}")
        self.home = home
        self.host = host
        self.idle_timeout = idle_timeout
        self.start_limit = start_limit
        # A process that starts imports its modules: on a few cores, a hundred
        # doing so at once take far more CPU each than a few at a time
        # (benchmarks/scale.py's cold start).
        self._start_slots = asyncio.Semaphore(start_limit) if start_limit is not None else None
        self._waiting: set[str] = set()
        self.roster = Roster(home)
        self._actors: dict[str, H] = {}
        self._activating: dict[str, asyncio.Task[H]] = {}
        self._passivated: OrderedDict[str, None] = OrderedDict()
        self._passivated_cap = passivated_cap
        # Outbound messages for the connectors of `coterie serve`.
        self.outbox = Outbox()
        # Told how many personas are live whenever that may have changed (a gauge).
        self._on_change = on_change

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(len(self._actors))

    # -- activation --------------------------------------------------------

    async def resolve(self, name: str, trace: Carrier | None = None) -> H:
        """The actor of persona ``name``, started on first use (an
        ``activate_persona`` span, a child of ``trace``: the caller's).

        Concurrent calls for one persona share one start; a caller that stops
        waiting does not stop the start. Beyond ``start_limit`` starts at a
        time a start waits for one to end, except a pinned persona's (its
        placement may keep it pending for its ``start_timeout``, which must
        not hold up the others). Unknown names raise
        :class:`UnknownPersonaError`, a broken persona file its own
        :class:`~runtime.errors.PersonaConfigError`.
        """
        handle = self._actors.get(name)
        if handle is not None:
            return handle
        task = self._activating.get(name)
        if task is None:
            if not self.roster.knows(name):
                raise UnknownPersonaError(name, self.roster.names)
            # A clear error if broken: persona.yaml, then its mcp.json files.
            persona = load_persona_dir(self.home / "personas" / name, name)
            load_servers(self.home, self.home / "personas" / name)
            limited = not persona.config.placement.pinned
            task = asyncio.get_running_loop().create_task(
                self._start(name, limited=limited, trace=trace)
            )
            self._activating[name] = task
            task.add_done_callback(lambda done: self._activated(name, done))
        return await asyncio.shield(task)

    async def _start(self, name: str, *, limited: bool, trace: Carrier | None = None) -> H:
        span = start_activation(persona=name, parent=trace)
        slots = self._start_slots if limited else None
        try:
            if slots is not None:
                queued = time.monotonic()
                self._waiting.add(name)
                try:
                    await slots.acquire()
                finally:
                    self._waiting.discard(name)
                span.set(g.START_WAITED_MS, round((time.monotonic() - queued) * 1000, 3))
            try:
                handle = await self.host.start(name, self.roster.entries())
            finally:
                if slots is not None:
                    slots.release()
        except BaseException as exc:
            span.fail(type(exc).__name__, str(exc))
            span.end()
            raise
        span.end()
        self._actors[name] = handle
        self._changed()
        return handle

    def _activated(self, name: str, task: asyncio.Task[H]) -> None:
        if self._activating.get(name) is task:
            del self._activating[name]
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have gone

    def adopt(self, handles: dict[str, H]) -> int:
        """Take on actors already running (a restarted router finds its
        personas' actors by name); returns how many were new to it."""
        new = {n: h for n, h in handles.items() if n not in self._actors}
        self._actors.update(new)
        self._changed()
        return len(new)

    def activating(self, name: str) -> bool:
        return name in self._activating

    async def deliver(self, data: str) -> str:
        """Deliver an envelope (JSON) through the router; returns the reply (JSON).

        For callers without a directory: a recipient that dies becomes an
        error reply rather than an exception.
        """
        envelope = MessageEnvelope.model_validate_json(data)
        handle = await self.resolve(envelope.recipient)
        try:
            return await self.host.deliver(handle, data)
        except ActorLostError as exc:
            return ReplyEnvelope.failure(
                envelope,
                sender=envelope.recipient,
                error=f"persona {envelope.recipient!r} failed: {exc}",
            ).model_dump_json()

    # -- passivation -------------------------------------------------------

    async def passivate(self, name: str) -> bool:
        """Stop persona ``name``'s actor if it is still idle (it asked for this)."""
        handle = self._actors.get(name)
        timeout = self.idle_timeout
        if handle is None or timeout is None or name in self._activating:
            return False
        try:
            ready = await self.host.prepare_passivation(handle, timeout)
        except ActorLostError:
            ready = True  # already gone
        if not ready:
            return False
        if self._actors.get(name) is handle:
            del self._actors[name]
            self._changed()
        self._remember_passivated(self.host.actor_id(handle))
        self.host.stop(handle)
        return True

    def _remember_passivated(self, actor_id: str) -> None:
        self._passivated[actor_id] = None
        while len(self._passivated) > self._passivated_cap:
            self._passivated.popitem(last=False)

    def was_passivated(self, actor_id: str) -> bool:
        """Whether the actor with this id was stopped on purpose (while idle)."""
        return actor_id in self._passivated

    def active(self) -> list[str]:
        return sorted(self._actors)

    def handles(self) -> dict[str, H]:
        return dict(self._actors)

    # -- listing and lifecycle ---------------------------------------------

    async def personas(self, offset: int = 0, limit: int | None = None) -> list[PersonaInfo]:
        """The personas by name — all, or the page ``offset``, ``limit`` of
        them (only its files are read): name, description, whether active.
        Invalid persona files are left out, so a page may be shorter."""
        return [
            PersonaInfo(name=n, description=d, active=a)
            for n, d, a in await self.persona_rows(offset, limit)
        ]

    async def persona_rows(
        self, offset: int = 0, limit: int | None = None
    ) -> list[tuple[str, str, bool]]:
        """:meth:`personas` as plain ``(name, description, active)`` rows: what
        crosses a process boundary (pickling 10,000 pydantic models and
        loading them again cost ~0.15 s; tuples ~0.01 s)."""
        self.roster.refresh()
        # Reading thousands of persona files takes seconds: not on the loop,
        # which must keep resolving and passivating meanwhile.
        entries = await asyncio.to_thread(self.roster.page, max(0, offset), limit)
        return [(n, d, n in self._actors) for n, d in entries]

    def count(self) -> int:
        """How many persona directories the home holds (valid or not)."""
        return len(self.roster)

    async def status(self, timeout: float = STATS_TIMEOUT) -> RouterStatus:
        """What runs: each active persona's activity (those that answer within
        ``timeout``), the connectors and their waiting messages."""
        names = sorted(self._actors)

        async def one(name: str) -> PersonaStats | None:
            try:
                return await asyncio.wait_for(self.host.activity(self._actors[name]), timeout)
            except (TimeoutError, CoterieError):
                return None

        found = await asyncio.gather(*(one(n) for n in names))
        return RouterStatus(
            registered=len(self.roster),
            active=[s for s in found if s is not None],
            unresponsive=[n for n, s in zip(names, found, strict=True) if s is None],
            activating=sorted(self._activating),
            waiting_to_start=sorted(self._waiting),
            start_limit=self.start_limit,
            connectors=self.outbox.connectors(),
            outbound_waiting=self.outbox.waiting(),
        )

    async def flush_all(self) -> int:
        """Flush every active persona's audit buffer; returns how many were asked."""
        handles = list(self._actors.values())
        await asyncio.gather(*(self.host.flush(h) for h in handles), return_exceptions=True)
        return len(handles)

    async def stop(self, name: str) -> bool:
        """Shut down and stop persona ``name``'s actor (its definition changed,
        or it is gone): its next message starts it anew. A start under way is
        waited for and stopped too (it may have read the old definition).
        False when none runs."""
        task = self._activating.get(name)
        if task is not None:
            try:
                await asyncio.shield(task)
            except Exception:  # boundary: a start that failed left nothing to stop
                pass
        handle = self._actors.pop(name, None)
        self._changed()
        if handle is None:
            return False
        try:
            await self.host.shutdown(handle)
        except CoterieError:
            pass  # already gone: stopping it is what was asked
        self._remember_passivated(self.host.actor_id(handle))
        self.host.stop(handle)
        return True

    async def stop_all(self, others: dict[str, H] | None = None) -> int:
        """Shut down and stop every active persona actor, and ``others`` (actors
        this router did not start, found by the caller); returns how many."""
        handles = {**(others or {}), **self._actors}
        await asyncio.gather(
            *(self.host.shutdown(h) for h in handles.values()), return_exceptions=True
        )
        for handle in handles.values():
            self.host.stop(handle)
        self._actors.clear()
        self._changed()
        return len(handles)


__all__ = [
    "PASSIVATED_CAP",
    "STATS_TIMEOUT",
    "PersonaHost",
    "PersonaInfo",
    "Router",
    "RouterStatus",
]
