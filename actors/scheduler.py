"""The Scheduler actor: a :class:`~coterie.runtime.schedule.LocalScheduler` on Ray.

One per runtime, named ``coterie:<rid>:scheduler``, restarted by Ray when
its process dies. It owns ``<home>/schedule.duckdb`` (the ledger, cursors,
reminders) and is a thin shell: the decisions are the engine's, dispatching
and reporting are :class:`~coterie.runtime.fires.FireDispatcher`'s. Its loop
sleeps until the next due instant, the next look at the personas' files
(``schedule.reload_interval``) or the next redispatch of a claim nobody
accepted, whichever comes first — never a busy loop.

- a fire is claimed in the ledger, then posted through the router's
  directory to its persona (started if passivated), which accepts it before
  queuing it;
- skips, misses and fires are ``schedule`` events in the audit log (through
  the actor's own audit buffer, spooled on local disk);
- at start (a restart included) every fire claimed and never accepted is
  dispatched again; a persona drops one it had already accepted.

:class:`HoldPoints` is a test hook: armed at a named step of a fire
(``before_claim``, ``after_claim``, ``after_dispatch``), the actor stops
there for good, so a test can kill its process at exactly that step.
Personas reach the actor through :func:`~coterie.actors._ray.scheduler_service`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

import ray

from coterie.actors._plugins import env_options, load_here
from coterie.actors._ray import RayPersonaLink, audit_buffer_for
from coterie.runtime import tracing
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.connectors import ConnectorInfo
from coterie.runtime.fires import FireDispatcher, SchedulerStats
from coterie.runtime.messages import Origin, TurnStatus
from coterie.runtime.plugins import PluginSet
from coterie.runtime.routing import Directory
from coterie.runtime.schedule import (
    STORE_FILE,
    DeliverTarget,
    Fire,
    LocalScheduler,
    RemindRequest,
    RemindResult,
    ScheduleListing,
    Scheduler,
    ScheduleStore,
    SystemClock,
)

log = logging.getLogger("coterie.schedule")

#: The steps of a fire a test may stop the actor at.
HoldPoint = Literal["before_claim", "after_claim", "after_dispatch"]
HOLD_POINTS: tuple[str, ...] = get_args(HoldPoint)


class HoldPoints:
    """A test hook: once :meth:`arm`-ed, the first fire to reach that step
    stops there for good (the test then kills the process)."""

    def __init__(self) -> None:
        self.armed: str | None = None
        #: The step a fire stopped at, once one did.
        self.held: str | None = None
        self._never = threading.Event()

    def arm(self, point: str) -> None:
        if point not in HOLD_POINTS:
            raise ValueError(f"unknown hold point {point!r}; one of {', '.join(HOLD_POINTS)}")
        self.armed = point

    def reach(self, point: str) -> None:
        """In the engine's thread: stop here if armed for it."""
        if self.armed == point:
            self.held = point
            log.warning("scheduler held at %s (a test hook)", point)
            self._never.wait()

    async def areach(self, point: str) -> None:
        """On the event loop: stop here if armed for it."""
        if self.armed == point:
            self.held = point
            log.warning("scheduler held at %s (a test hook)", point)
            await asyncio.Event().wait()


class _HeldScheduler(Scheduler):
    """The engine, with the ledger write between two hold points."""

    def __init__(self, *args: Any, hold: HoldPoints, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold = hold

    def claim(self, fires: list[Fire], now: datetime | None = None) -> list[bool]:
        self.hold.reach("before_claim")
        claimed = super().claim(fires, now)
        self.hold.reach("after_claim")
        return claimed


class SchedulerActor:
    """Heartbeats, cron entries and reminders of one runtime (see the module)."""

    def __init__(
        self,
        home: str,
        *,
        audit_actor: str,
        router_actor: str,
        namespace: str,
        settings: RuntimeSettings,
        plugins: PluginSet | None = None,
    ) -> None:
        load_here(plugins)  # first: a heartbeat may name a plugin's model provider
        # Once per process; a no-op tracer (no SDK imported) unless tracing is on.
        tracing.setup(settings.tracing, process="scheduler")
        path = Path(home)
        audit = ray.get_actor(audit_actor, namespace=namespace)
        # A spool on local disk: a restarted scheduler resends what it recorded.
        self.buffer = audit_buffer_for(audit, spool_path=path / "spool" / "scheduler.audit.jsonl")
        self.directory: Directory[Any] = Directory(RayPersonaLink(router_actor, namespace))
        self.dispatcher = FireDispatcher(self.directory, self.buffer, connectors=self._connectors)
        self.hold = HoldPoints()
        # Opened here: another process holding the file fails the start, at once.
        store = ScheduleStore(path / STORE_FILE)
        engine = _HeldScheduler(
            store, SystemClock(), home=path, settings=settings.schedule, hold=self.hold
        )
        self.scheduler = LocalScheduler(
            engine, dispatch=self._dispatch, report=self.dispatcher.report
        )
        self.dispatcher.bind(self.scheduler)
        # Recover and run the loop once up (on the actor's loop, which
        # __init__ does not run on).
        ray.get_runtime_context().current_actor.start.remote()

    async def _connectors(self) -> list[ConnectorInfo]:
        infos: list[ConnectorInfo] = await self.directory.call_router("connectors")
        return infos

    async def _dispatch(self, fire: Fire) -> None:
        await self.dispatcher.dispatch(fire)
        await self.hold.areach("after_dispatch")

    async def start(self) -> None:
        """Deliver what the spool kept, dispatch again what a restart left
        claimed, then run the loop."""
        await self.buffer.flush()
        await self.scheduler.start()

    # -- the service (personas, the remind tool, the surfaces) ---------------

    async def accept(self, fire_id: str) -> bool:
        return await self.scheduler.accept(fire_id)

    async def finish(self, fire_id: str, status: TurnStatus, *, reason: str | None = None) -> None:
        await self.scheduler.finish(fire_id, status, reason=reason)

    async def remind(
        self,
        persona: str,
        request: RemindRequest,
        *,
        origin: Origin | None,
        background: bool,
        deliver: DeliverTarget | None = None,
        turn_id: str | None = None,
    ) -> RemindResult:
        return await self.scheduler.remind(
            persona,
            request,
            origin=origin,
            background=background,
            deliver=deliver,
            turn_id=turn_id,
        )

    async def listing(self, persona: str | None = None) -> ScheduleListing:
        return await self.scheduler.listing(persona)

    async def stats(self) -> SchedulerStats:
        """The counters ``coterie status`` shows."""
        listing = await self.scheduler.listing()
        wake = await asyncio.to_thread(self.scheduler.engine.next_wake)
        reminders = sum(e.kind == "reminder" for e in listing.entries)
        return SchedulerStats(
            entries=len(listing.entries) - reminders,
            reminders=reminders,
            file_errors=len(listing.errors),
            paused=len(listing.paused),
            next_wake=wake,
            ticks=self.scheduler.ticks,
            dispatched=self.dispatcher.dispatched,
            undelivered=self.dispatcher.undelivered,
            outcomes=dict(self.dispatcher.outcomes),
        )

    # -- lifecycle and the test hook -----------------------------------------

    async def hold_at(self, point: str) -> None:
        """Test hook: stop for good at ``point`` of the next fire."""
        self.hold.arm(point)

    async def held(self) -> str | None:
        """Test hook: the step a fire stopped at, if one did."""
        return self.hold.held

    async def pid(self) -> int:
        return os.getpid()

    async def ping(self) -> str:
        return "scheduler"

    async def flush(self) -> None:
        await self.buffer.flush()
        traced = tracing.tracer()
        if traced.enabled:  # its spans too (on a thread: the export blocks)
            await asyncio.to_thread(traced.flush)

    async def shutdown(self) -> None:
        """Stop the loop, close the store (letting go of its file) and flush
        the audit buffer and the spans."""
        await self.scheduler.stop()
        await self.buffer.aclose()
        await asyncio.to_thread(tracing.tracer().shutdown)


SchedulerActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(SchedulerActor)


def get_or_create_scheduler(
    home: str,
    settings: RuntimeSettings,
    *,
    name: str,
    namespace: str,
    audit_actor: str,
    router_actor: str,
    detached: bool,
    options: dict[str, Any] | None = None,
    plugins: PluginSet | None = None,
) -> Any:
    """The named Scheduler actor, created on first use; ``options`` are more
    Ray actor options (where it runs: beside the home's files)."""
    return SchedulerActorRemote.options(  # type: ignore[attr-defined]
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        **(options or {}),
        **env_options(plugins),
    ).remote(
        home,
        audit_actor=audit_actor,
        router_actor=router_actor,
        namespace=namespace,
        settings=settings,
        plugins=plugins,
    )


__all__ = [
    "HOLD_POINTS",
    "HoldPoint",
    "HoldPoints",
    "SchedulerActor",
    "SchedulerActorRemote",
    "get_or_create_scheduler",
]
