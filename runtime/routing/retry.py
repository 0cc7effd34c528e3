"""Retrying a call that is safe to repeat through transient failures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def retry_transient(
    make_call: Callable[[], Awaitable[T]],
    *,
    transient: tuple[type[BaseException], ...],
    attempts: int = 6,
    first_delay: float = 0.1,
    max_delay: float = 2.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await ``make_call()``, again after a doubling delay while it raises a
    ``transient`` error; the last attempt's error is raised.

    Only for calls that may run twice (reads): a transient error may mean the
    call ran, or did not.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    delay = first_delay
    for attempt in range(attempts):
        try:
            return await make_call()
        except transient:
            if attempt == attempts - 1:
                raise
        await sleep(delay)
        delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")


__all__ = ["retry_transient"]
