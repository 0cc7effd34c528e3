"""Retries with exponential backoff, shared by the network providers.

The SDK clients are built with ``max_retries=0`` so that this one policy
applies to every provider: retry HTTP 429, 5xx, connection errors and
timeouts; honour ``Retry-After``; never retry other 4xx. The helper knows no
SDK: each provider passes small callbacks that classify its exceptions and
translate them into :mod:`runtime.errors` types, so SDK exceptions never
escape a provider.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from coterie.runtime.errors import ModelError

T = TypeVar("T")

__all__ = [
    "backoff_delay",
    "is_context_length_error",
    "parse_retry_after",
    "sdk_error_message",
    "sdk_retry_after",
    "status_is_retryable",
    "with_retries",
]


def status_is_retryable(status: int | None) -> bool:
    """429, 5xx and "no status" (the connection failed) are worth retrying."""
    return status is None or status == 429 or status >= 500


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``retry-after`` (seconds or HTTP date)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return value if math.isfinite(value) and value >= 0 else None


def sdk_retry_after(exc: Exception) -> float | None:
    """Retry-After of a status error from a Stainless-generated SDK (openai, anthropic)."""
    response = getattr(exc, "response", None)
    return parse_retry_after(getattr(response, "headers", None))


def sdk_error_message(exc: Exception) -> str:
    """The server's own error message from an SDK status error, else its text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        # Both SDKs unwrap ``{"error": {...}}``; accept either shape anyway.
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(getattr(exc, "message", exc))


#: What the providers (and the common compatible servers) say when a request
#: is longer than the model's window.
_TOO_LONG = re.compile(
    r"prompt is too long|context[ _-]length|context window|maximum context|"
    r"too many (input )?tokens|input is too long|exceeds the (model's )?(maximum|context)",
    re.IGNORECASE,
)


def is_context_length_error(status: int | None, exc: Exception) -> bool:
    """Whether a status error says the request did not fit the model's window:
    OpenAI's code ``context_length_exceeded``, Anthropic's "prompt is too long",
    or the same words from a compatible server (400 or 413)."""
    if status not in (400, 413):
        return False
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
        return True
    return bool(_TOO_LONG.search(sdk_error_message(exc)))


def backoff_delay(
    attempt: int,
    *,
    base_delay: float,
    max_delay: float,
    retry_after: float | None = None,
) -> float:
    """Delay before retry number ``attempt + 1`` (``attempt`` counts from 0).

    A server-given ``retry_after`` wins (capped at ``max_delay``); otherwise
    exponential backoff with "equal jitter" so that many clients throttled
    together do not come back in lockstep.
    """
    if retry_after is not None:
        return min(max_delay, max(0.0, retry_after))
    ceiling = min(max_delay, base_delay * (2**attempt))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


async def with_retries(
    fn: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    is_retryable: Callable[[Exception], bool],
    to_error: Callable[[Exception], ModelError | None],
    retry_after: Callable[[Exception], float | None] | None = None,
    base_delay: float = 0.5,
    max_delay: float = 8.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Call ``fn`` up to ``max_retries + 1`` times.

    ``to_error`` translates a provider exception into the
    :class:`~runtime.errors.ModelError` to raise (``None`` means "not a
    provider failure": it propagates untouched and is never retried, so
    programming errors surface immediately). ``is_retryable`` decides
    whether a provider failure is worth another attempt and ``retry_after``
    extracts a server-requested delay in seconds.
    """
    attempt = 0
    while True:
        try:
            return await fn()
        except Exception as exc:
            error = to_error(exc)
            if error is None:
                raise
            if attempt >= max_retries or not is_retryable(exc):
                raise error from exc
            hint = retry_after(exc) if retry_after is not None else None
        await sleep(
            backoff_delay(attempt, base_delay=base_delay, max_delay=max_delay, retry_after=hint)
        )
        attempt += 1
