"""Per-sample limits and the adaptive connection gate of an eval worker.

:class:`LimitedModel` wraps the solver's model for one sample. Before each
call it checks the sample's limits — model calls, tokens (input + output so
far), tool calls (counted from the model's replies, checked *before* the
calls would run) — and raises :class:`SampleLimitReached` naming the one
that was hit; the turn ends there and the sample is still scored on what it
had said (status ``limit``). The time limit is the worker's (a timeout
around the turn).

:class:`AdaptiveGate` bounds the model calls in flight of one worker (its
share of the task's ``max_connections`` per provider). A 429 from the
provider (after the SDK's own retries) halves the gate's capacity and the
call is tried again after a backoff; each run of successes as long as the
capacity grows it back by one, up to the limit (additive increase,
multiplicative decrease).
"""

from __future__ import annotations

import asyncio
import random
from types import TracebackType

from coterie.runtime.errors import CoterieError, ModelHTTPError
from coterie.runtime.eval.task import SampleLimits
from coterie.runtime.messages import ModelRequest, ModelResponse
from coterie.runtime.models.base import Model

#: Attempts of one model call that keeps getting 429.
THROTTLE_ATTEMPTS = 6
#: First backoff after a 429, in seconds (doubled each time, with jitter).
THROTTLE_BACKOFF_S = 0.5


class SampleLimitReached(CoterieError):
    """A per-sample limit ended the sample; ``limit`` names it."""

    def __init__(self, limit: str, detail: str) -> None:
        self.limit = limit
        self.detail = detail
        super().__init__(f"sample limit reached: {limit} ({detail})")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.limit, self.detail))


class AdaptiveGate:
    """At most ``capacity`` holders at once; the capacity adapts to 429s."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the gate's limit must be at least 1")
        self.limit = limit
        self.capacity = limit
        self.in_use = 0
        self.throttled = 0
        self._successes = 0
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> AdaptiveGate:
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_use < self.capacity)
            self.in_use += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        async with self._changed:
            self.in_use -= 1
            self._changed.notify_all()

    def on_throttled(self) -> None:
        self.throttled += 1
        self.capacity = max(1, self.capacity // 2)
        self._successes = 0

    def on_success(self) -> None:
        if self.capacity >= self.limit:
            return
        self._successes += 1
        if self._successes >= self.capacity:
            self.capacity += 1
            self._successes = 0


class LimitedModel:
    """``inner`` under one sample's limits and a worker's gate; counts usage."""

    def __init__(self, inner: Model, limits: SampleLimits, gate: AdaptiveGate | None) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.name = inner.name
        self.limits = limits
        self.gate = gate
        self.model_calls = 0
        self.tool_calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.hit: SampleLimitReached | None = None

    def _check(self) -> None:
        lim = self.limits
        if lim.model_calls is not None and self.model_calls >= lim.model_calls:
            self._stop("model_calls", f"{self.model_calls} model calls of {lim.model_calls}")
        tokens = self.input_tokens + self.output_tokens
        if lim.tokens is not None and tokens >= lim.tokens:
            self._stop("tokens", f"{tokens} tokens of {lim.tokens}")

    def _stop(self, limit: str, detail: str) -> None:
        self.hit = SampleLimitReached(limit, detail)
        raise self.hit

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self.hit is not None:
            raise self.hit
        self._check()
        response = await self._call(request)
        self.model_calls += 1
        self.input_tokens += response.usage.input_tokens
        self.output_tokens += response.usage.output_tokens
        calls = len(response.message.tool_calls)
        lim = self.limits.tool_calls
        if calls and lim is not None and self.tool_calls + calls > lim:
            self._stop("tool_calls", f"{self.tool_calls + calls} tool calls of {lim}")
        self.tool_calls += calls
        return response

    async def _call(self, request: ModelRequest) -> ModelResponse:
        if self.gate is None:
            return await self.inner.request(request)
        delay = THROTTLE_BACKOFF_S
        for attempt in range(1, THROTTLE_ATTEMPTS + 1):
            async with self.gate:
                try:
                    response = await self.inner.request(request)
                except ModelHTTPError as exc:
                    if exc.status != 429 or attempt == THROTTLE_ATTEMPTS:
                        raise
                    self.gate.on_throttled()
                else:
                    self.gate.on_success()
                    return response
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        return None  # the inner model is the worker's, shared by its samples


__all__ = ["AdaptiveGate", "LimitedModel", "SampleLimitReached"]
