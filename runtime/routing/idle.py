"""IdleWatcher: asks for passivation once a persona has been idle long enough."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("coterie.routing")

#: The longest pause between two looks, whatever the idle timeout.
MAX_TICK = 5.0


class IdleWatcher:
    """Calls ``on_idle()`` whenever ``idle_for()`` reaches ``idle_timeout``.

    It looks every ``idle_timeout / 4`` seconds (at most :data:`MAX_TICK`) and
    stops once ``stopped()`` is true. A failing ``on_idle`` (the router may be
    restarting) is logged and tried again at the next look.
    """

    def __init__(
        self,
        *,
        idle_for: Callable[[], float],
        on_idle: Callable[[], Awaitable[object]],
        idle_timeout: float,
        stopped: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        self.idle_timeout = idle_timeout
        self.tick = min(idle_timeout / 4, MAX_TICK)
        self._idle_for = idle_for
        self._on_idle = on_idle
        self._stopped = stopped
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self.requests = 0
        self.failures = 0

    def start(self) -> None:
        """Start watching on the running loop (once; later calls do nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while not self._stopped():
            await self._sleep(self.tick)
            if self._stopped() or self._idle_for() < self.idle_timeout:
                continue
            self.requests += 1
            try:
                await self._on_idle()
            except Exception as exc:  # a background loop: log it, keep watching
                self.failures += 1
                log.warning(
                    "passivation request failed (trying again later): %s: %s",
                    type(exc).__name__,
                    exc,
                )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


__all__ = ["MAX_TICK", "IdleWatcher"]
