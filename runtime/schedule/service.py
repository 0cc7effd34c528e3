"""The scheduler as personas and the ``remind`` tool see it, and a whole
scheduler in one process.

:class:`SchedulerService` is the protocol (personas accept and finish fires;
the ``remind`` tool runs its actions; surfaces list). :class:`LocalScheduler`
implements it in-process: the engine, the store, a dispatch callback and an
asyncio loop driven by a :class:`~coterie.runtime.schedule.clock.Clock`. It
is what tests and a ``PersonaRuntime`` without Ray use, and what the
Scheduler actor wraps (its dispatch posts through the router).

The loop: recover claimed fires at start (a persona drops one it already
accepted), then tick — look at the files every ``reload_interval``, take what
is due, claim each fire in the ledger, then dispatch it; a fire whose
dispatch failed stays claimed and is dispatched again a minute later until
its grace runs out (then it fails, with its reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol, TypeVar, assert_never
from zoneinfo import ZoneInfo

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.messages import Origin, TurnStatus
from coterie.runtime.schedule._remind import RemindActions
from coterie.runtime.schedule.clock import Clock, SystemClock
from coterie.runtime.schedule.engine import Scheduler
from coterie.runtime.schedule.entries import DeliverTarget
from coterie.runtime.schedule.records import (
    Decision,
    Fire,
    FireReport,
    Outcome,
    RemindRequest,
    RemindResult,
    ScheduleListing,
)
from coterie.runtime.schedule.store import STORE_FILE, ScheduleStore

log = logging.getLogger("coterie.schedule")
T = TypeVar("T")

#: A claimed fire not accepted this long after its (last) dispatch is dispatched again.
REDISPATCH_AFTER = timedelta(seconds=60)
#: How often the ledger is pruned of rows older than ``history_days``.
PRUNE_EVERY = timedelta(hours=6)

Dispatch = Callable[[Fire], Awaitable[None]]
Report = Callable[[FireReport], None]


class SchedulerService(Protocol):
    """What personas, the ``remind`` tool and the surfaces ask the scheduler."""

    async def accept(self, fire_id: str) -> bool:
        """A persona takes a fire before starting its turn: True once; False
        for a fire already accepted (a second delivery: drop it) or unknown."""
        ...

    async def finish(self, fire_id: str, status: TurnStatus, *, reason: str | None = None) -> None:
        """The fired turn ended (``ok``, ``skipped``: nothing to do, ``failed``,
        ``error``); ``reason`` says why it failed (e.g. its deliver connector
        is not running)."""
        ...

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
        """Run one ``remind`` action for ``persona``. ``origin``: where the
        current turn's message came from (a reminder replies there);
        ``deliver``: the current turn's delivery target, the default of the
        reminders it sets; ``background``: the turn was started by the
        scheduler (heartbeat, cron, reminder), which bounds what it may
        create, counted by ``turn_id`` (required then). Bad input raises
        :class:`~coterie.runtime.errors.ToolError`; ``str(result)`` is the
        text for the model."""
        ...

    async def listing(self, persona: str | None = None) -> ScheduleListing:
        """Every entry and pending reminder (of one persona)."""
        ...


class LocalScheduler:
    """A whole scheduler in this process (see the module's docstring).

    Build it with :meth:`open`; :meth:`start` recovers and runs the loop,
    :meth:`tick` runs one pass (tests drive it by hand with a fake clock).
    """

    def __init__(
        self, engine: Scheduler, *, dispatch: Dispatch, report: Report | None = None
    ) -> None:
        self.engine = engine
        self._dispatch = dispatch
        self._report = report or (lambda _: None)
        self._actions = RemindActions(engine)
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_reload: datetime | None = None
        self._next_prune: datetime | None = None
        self._recovered = False
        #: Passes of the loop so far (tests wait on it).
        self.ticks = 0
        self.ticked = asyncio.Event()

    @classmethod
    def open(
        cls,
        home: Path,
        *,
        dispatch: Dispatch,
        report: Report | None = None,
        settings: ScheduleSettings | None = None,
        clock: Clock | None = None,
        personas: Callable[[], Iterable[str]] | None = None,
        tz: ZoneInfo | None = None,
    ) -> LocalScheduler:
        """Open ``<home>/schedule.duckdb`` and the engine over the home's personas."""
        store = ScheduleStore(home / STORE_FILE)
        engine = Scheduler(
            store,
            clock or SystemClock(),
            home=home,
            settings=settings,
            personas=personas,
            tz=tz,
        )
        return cls(engine, dispatch=dispatch, report=report)

    @property
    def clock(self) -> Clock:
        return self.engine.clock

    @property
    def store(self) -> ScheduleStore:
        return self.engine.store

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        """Engine and store work: one at a time, off the event loop. A caller
        cancelled meanwhile still waits for the thread's call to end (so that
        nothing closes the store under it)."""
        async with self._lock:
            work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await work
                raise

    # -- the loop ------------------------------------------------------------

    async def start(self) -> None:
        """Recover what a restart left claimed, then run the loop."""
        if self._task is None:
            await self.recover()
            self._task = asyncio.create_task(self._run(), name="coterie-scheduler")

    async def stop(self) -> None:
        """Stop the loop (a fire being dispatched finishes first) and close the store."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        async with self._lock:
            self.engine.store.close()

    def kick(self) -> None:
        """Look again now (something changed: a reminder, a resumed queue)."""
        self._wake.set()

    async def recover(self) -> list[Fire]:
        """Dispatch again every fire claimed but never accepted (at start)."""
        now = self.clock.now()
        fires = await self._call(self.engine.recover, now)
        self._recovered = True
        await self._send(fires, now, again=True)
        self._drain()
        return fires

    async def tick(self) -> list[Decision]:
        """One pass: reload the files when due, take what is due, claim and
        dispatch the fires, dispatch again stale claims, prune. Returns the
        decisions (for tests and logs)."""
        now = self.clock.now()
        if self._next_reload is None or now >= self._next_reload:
            errors = await self._call(self.engine.reload, now)
            for err in errors:
                log.warning(
                    "%s: %s: %s: %s (the previous schedule stays in force)",
                    err.path,
                    err.entry,
                    err.field,
                    err.message,
                )
            self._next_reload = now + timedelta(seconds=self.engine.settings.reload_interval)
        decisions = await self._call(self.engine.due, now)
        fires = [d for d in decisions if isinstance(d, Fire)]
        for decision in decisions:
            if not isinstance(decision, Fire):
                self._report(_report_of(decision))
        if fires:
            claimed = await self._call(self.engine.claim, fires, now)
            await self._send([f for f, ok in zip(fires, claimed, strict=True) if ok], now)
        stale = await self._call(
            lambda: self.engine.recover(now, dispatched_before=now - REDISPATCH_AFTER)
        )
        await self._send(stale, now, again=True)
        if self._next_prune is None or now >= self._next_prune:
            cut = now - timedelta(days=self.engine.settings.history_days)
            await self._call(self.engine.store.prune, cut)
            self._next_prune = now + PRUNE_EVERY
        self._drain()
        self.ticks += 1
        self.ticked.set()
        return decisions

    def _drain(self) -> None:
        for report in self.engine.take_reports():
            self._report(report)

    async def _send(self, fires: list[Fire], now: datetime, *, again: bool = False) -> None:
        """Dispatch claimed fires at once (concurrently); a failure leaves the
        fire claimed, to be dispatched again."""
        if not fires:
            return
        if again:
            for fire in fires:
                await self._call(self.engine.store.mark_dispatched, fire.fire_id, now)
        results = await asyncio.gather(*(self._dispatch(f) for f in fires), return_exceptions=True)
        for fire, result in zip(fires, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.warning(
                    "dispatching %s of %s (%s) failed: %s; it stays claimed and is sent again",
                    fire.fire_id,
                    fire.persona,
                    fire.label,
                    result,
                )
                continue
            if not again:
                outcome: Outcome = "late" if fire.late else "fired"
                self._report(
                    FireReport(
                        persona=fire.persona,
                        kind=fire.kind,
                        name=fire.label,
                        instant=fire.instant,
                        fire_id=fire.fire_id,
                        outcome=outcome,
                        reason="run_now" if fire.manual else None,
                    )
                )

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop outlives a bad pass: log it, look again later
                log.exception("the scheduler's pass failed")
            now = self.clock.now()
            wake = await self._call(self.engine.next_wake, now)
            soonest = min(
                t
                for t in (
                    wake,
                    self._next_reload,
                    now + REDISPATCH_AFTER,
                )
                if t is not None
            )
            self._wake.clear()
            sleeper = asyncio.ensure_future(self.clock.sleep_until(soonest))
            kicked = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({sleeper, kicked}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                kicked.cancel()

    # -- the service ---------------------------------------------------------

    async def accept(self, fire_id: str) -> bool:
        now = self.clock.now()
        return await self._call(lambda: self.engine.store.accept(fire_id, at=now))

    async def finish(self, fire_id: str, status: TurnStatus, *, reason: str | None = None) -> None:
        now = self.clock.now()

        def run() -> None:
            self.engine.store.finish(fire_id, status, reason=reason, at=now)
            self.engine.invalidate()  # an acknowledged checklist

        await self._call(run)

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
        now = self.clock.now()
        actions = self._actions
        fire: Fire | None = None
        match request.action:
            case "list":
                result = await self._call(actions.list, persona, now)
            case "add":
                result = await self._call(actions.add, persona, request, now, background, turn_id)
            case "update":
                result = await self._call(actions.update, persona, request, now)
            case "remove":
                result = await self._call(actions.remove, persona, request, now)
            case "run_now":
                result, fire = await self._call(actions.run_now, persona, request, now)
            case "remind":
                result = await self._call(
                    lambda: actions.remind(
                        persona,
                        request,
                        now,
                        origin=origin,
                        deliver=deliver,
                        background=background,
                        turn_id=turn_id,
                    )
                )
            case "cancel_reminder":
                result = await self._call(actions.cancel, persona, request, now)
            case "pause" | "resume":
                resume = request.action == "resume"
                result = await self._call(
                    lambda: actions.pause(persona, request, now, resume=resume)
                )
            case _:
                assert_never(request.action)
        if fire is not None:
            await self._send([fire], now)
        if request.action != "list":
            self.kick()
        return result

    async def listing(self, persona: str | None = None) -> ScheduleListing:
        now = self.clock.now()
        return await self._call(self.engine.listing, persona, now)


def _report_of(decision: Decision) -> FireReport:
    if isinstance(decision, Fire):  # pragma: no cover - fires are reported once dispatched
        raise TypeError("a fire is reported when dispatched")
    if decision.decision == "skip":
        return FireReport(
            persona=decision.persona,
            kind=decision.kind,
            name=decision.label or decision.name,
            instant=decision.instant,
            fire_id=decision.fire_id,
            outcome="skipped",
            reason=decision.reason,
        )
    return FireReport(
        persona=decision.persona,
        kind=decision.kind,
        name=decision.label or decision.name,
        instant=decision.last,
        fire_id=decision.fire_id,
        outcome="missed",
        reason=decision.reason,
    )


def read_listing(
    home: Path,
    persona: str | None = None,
    *,
    settings: ScheduleSettings | None = None,
    tz: ZoneInfo | None = None,
) -> ScheduleListing:
    """The listing with no runtime running: the files as they are and the
    store opened read-only (``coterie schedules``). Raises
    :class:`~coterie.runtime.errors.ScheduleStoreError` when a runtime holds
    the store (ask it instead)."""
    with ScheduleStore.read_only(home / STORE_FILE) as store:
        engine = Scheduler(store, SystemClock(), home=home, settings=settings, tz=tz)
        return engine.listing(persona)


__all__ = [
    "PRUNE_EVERY",
    "REDISPATCH_AFTER",
    "Dispatch",
    "LocalScheduler",
    "Report",
    "SchedulerService",
    "read_listing",
]
