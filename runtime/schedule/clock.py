"""The scheduler's clock: real time in production, a hand-moved one in tests.

Everything of the scheduler that asks what time it is, or waits for a time,
goes through a :class:`Clock`; so a test moves :class:`FakeClock` a week
ahead and nothing waits for real time.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Now, and waiting for a later instant (aware datetimes)."""

    def now(self) -> datetime:
        """The current instant, timezone-aware (UTC)."""
        ...

    async def sleep_until(self, when: datetime) -> None:
        """Return at ``when`` (at once if it has passed)."""
        ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        delay = (when - self.now()).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)


class FakeClock:
    """A clock that moves only when told (:meth:`advance`, :meth:`set`).

    Sleepers whose instant has come are woken at once; nothing waits for
    real time.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = (start or datetime(2025, 1, 6, 9, 0, tzinfo=UTC)).astimezone(UTC)
        self._sleepers: list[tuple[datetime, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    def set(self, when: datetime) -> None:
        """Move to ``when`` (never backwards) and wake whoever it concerns."""
        when = when.astimezone(UTC)
        if when < self._now:
            raise ValueError(f"a FakeClock does not go back ({when} < {self._now})")
        self._now = when
        waiting = []
        for at, future in self._sleepers:
            if at <= when:
                if not future.done():
                    future.set_result(None)
            elif not future.done():
                waiting.append((at, future))
        self._sleepers = waiting

    def advance(self, delta: timedelta | float) -> datetime:
        """Move ahead by ``delta`` (seconds or a timedelta); returns the new now."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        self.set(self._now + step)
        return self._now

    async def sleep_until(self, when: datetime) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((when, future))
        await future


__all__ = ["Clock", "FakeClock", "SystemClock"]
