"""Retrying idempotent actor calls through Ray's transient errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import ray

T = TypeVar("T")


async def idempotent_call(
    make_call: Callable[[], Awaitable[T]], *, attempts: int = 6, first_delay: float = 0.1
) -> T:
    """Await ``make_call()``, retrying while the target is temporarily unavailable.

    Only for reads: Ray's ``ActorUnavailableError`` (seen when many actors
    start at once and a connection is slow to come up) says the call may or
    may not have run.
    """
    delay = first_delay
    for attempt in range(attempts):
        try:
            return await make_call()
        except ray.exceptions.ActorUnavailableError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")
