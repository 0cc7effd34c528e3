"""Giving a quiet process's free heap back to the system.

A persona that answered many conversations at once holds, after the burst,
memory it no longer uses: the C allocator keeps the pages its requests,
bodies and buffers were freed into, and the process's private memory (USS)
stays at its high-water mark. With 100 conversations at once a persona
stayed ~12 MiB above one that took them one by one; glibc's
``malloc_trim(0)`` gives ~6.7 MiB of it back (``benchmarks/persona_memory.py``
measures both; the rest is Python's own arenas, which it frees only whole).

:class:`HeapTrimmer` trims once the process has had no turn running for a
moment, and not more often than every so often: no timer runs while the
process stays idle, and none while it is busy.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger("coterie.heap")

#: Seconds without a turn running before the heap is trimmed.
QUIET_FOR = 1.0
#: Seconds at least between two trims (a persona busy in short spurts trims
#: at most this often; what a later spurt freed waits for the next one).
TRIM_EVERY = 30.0


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` (1 when it gave memory back), or None where
    the C library has none (musl, macOS): there nothing is trimmed."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


class HeapTrimmer:
    """Trims the heap ``quiet_for`` seconds after :meth:`quiet`, unless
    :meth:`busy` comes first; never twice within ``every`` seconds."""

    def __init__(
        self,
        trim: Callable[[], object] | None,
        *,
        quiet_for: float = QUIET_FOR,
        every: float = TRIM_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trim = trim
        self.quiet_for = quiet_for
        self.every = every
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._last: float | None = None
        #: Trims done so far.
        self.trims = 0

    @property
    def pending(self) -> bool:
        """Whether a trim is scheduled."""
        return self._timer is not None

    def quiet(self) -> None:
        """The process's last running turn ended: trim once it stays quiet."""
        if self._trim is None or self._timer is not None:
            return
        delay = self.quiet_for
        if self._last is not None:
            delay = max(delay, self._last + self.every - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._run)

    def busy(self) -> None:
        """A turn started: no trim while it runs."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        self._timer = None
        self._last = self._clock()
        self.trims += 1
        assert self._trim is not None
        try:
            self._trim()
        except Exception:  # boundary: a trim that fails costs memory, never a turn
            log.exception("the heap could not be trimmed")


__all__ = ["QUIET_FOR", "TRIM_EVERY", "HeapTrimmer", "malloc_trim"]
