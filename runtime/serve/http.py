"""The HTTP pieces the front door's routes share: the error type and its
JSON shape, body parsing, the auth / rate-limit / readiness middleware, the
per-conversation in-flight cap and server-sent events."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from coterie.runtime.config import ServeSettings, persona_exists, persona_names
from coterie.runtime.connectors.mailbox import MailboxConnector
from coterie.runtime.errors import (
    ApprovalClosedError,
    ApprovalError,
    AuditQueryError,
    CoterieError,
    PersonaConfigError,
    PlacementError,
    QueueFullError,
    ServeError,
    UnknownApprovalError,
    UnknownPersonaError,
)
from coterie.runtime.frontdoor import FrontDoor
from coterie.runtime.serve.auth import request_authorized
from coterie.runtime.tracing import active, incoming, tracer
from coterie.runtime.tracing.spans import finish_request, start_request

log = logging.getLogger("coterie.serve")


#: Conversation ids and session ids the API accepts.
ID_PATTERN = r"^[A-Za-z0-9_.:@-]{1,200}$"
_ID = re.compile(ID_PATTERN)


class ApiError(ServeError):
    """An error answered as ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, kind: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.field = field

    def response(self) -> web.Response:
        body: dict[str, Any] = {"type": self.kind, "message": str(self)}
        if self.field is not None:
            body["field"] = self.field
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return web.json_response({"error": body}, status=self.status, headers=headers)


def error_for(exc: CoterieError) -> ApiError:
    """The HTTP error for a runtime error."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownPersonaError):
        return ApiError(404, "unknown_persona", str(exc))
    if isinstance(exc, QueueFullError):
        return ApiError(409, "queue_full", str(exc))
    if isinstance(exc, AuditQueryError):
        return ApiError(400, "invalid_query", str(exc), "sql")
    if isinstance(exc, UnknownApprovalError):
        return ApiError(404, "unknown_approval", str(exc))
    if isinstance(exc, ApprovalClosedError):
        return ApiError(409, "approval_closed", str(exc))
    if isinstance(exc, ApprovalError):
        return ApiError(400, "invalid_body", str(exc), "decision")
    if isinstance(exc, PlacementError):
        return ApiError(503, "placement", str(exc))
    if isinstance(exc, PersonaConfigError):
        return ApiError(500, "persona_config", str(exc))
    return ApiError(502, "runtime_error", str(exc))


class TokenBucket:
    """``rate`` requests a minute per client, in bursts of up to ``rate``."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, client: str) -> float:
        """0 when allowed, else the seconds until the next request would be."""
        now = self.clock()
        tokens, last = self._buckets.get(client, (float(self.rate), now))
        tokens = min(float(self.rate), tokens + (now - last) * self.rate / 60)
        if tokens < 1:
            self._buckets[client] = (tokens, now)
            return (1 - tokens) * 60 / self.rate
        self._buckets[client] = (tokens - 1, now)
        if len(self._buckets) > 10_000:  # forget the quietest clients
            self._buckets = dict(list(self._buckets.items())[-5_000:])
        return 0.0


class ServerState:
    """What the app holds besides its backend."""

    def __init__(
        self,
        home: Path,
        settings: ServeSettings,
        token: str,
        mailboxes: dict[str, MailboxConnector],
    ) -> None:
        self.home = home
        self.settings = settings
        self.token = token
        self.mailboxes = mailboxes
        self.limiter = TokenBucket(settings.rate_per_minute)
        self.in_flight: Counter[tuple[str, str]] = Counter()
        self.started = time.time()
        self.starting_error: str | None = None
        # The runtime, once it is up (until then /v1 answers 503). Held here,
        # not under an app key of its own: it arrives after the server has
        # started, and aiohttp deprecates changing a started app's keys.
        self.backend: FrontDoor | None = None


STATE = web.AppKey("state", ServerState)


def backend_of(request: web.Request) -> FrontDoor:
    """The runtime behind the app; a 503 while it is not up."""
    state = request.app[STATE]
    if state.backend is None:
        detail = state.starting_error or "the runtime is starting; retry shortly"
        raise ApiError(503, "starting", detail)
    return state.backend


async def read_body(request: web.Request, model: type[BaseModel]) -> Any:
    """The request's JSON body as ``model``, or a 400 naming the field."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(request) from None
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise ApiError(400, "invalid_body", f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_body", "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, "invalid_body", f"{field}: {first['msg']}", field) from None


def too_large(request: web.Request) -> ApiError:
    limit = request.app[STATE].settings.max_body_bytes
    return ApiError(413, "too_large", f"the body is larger than {limit} bytes")


def valid_id(value: str, what: str) -> str:
    if not _ID.match(value):
        raise ApiError(400, "invalid_id", f"{what} {value!r} is not a valid id", what)
    return value


def known_persona(request: web.Request) -> str:
    """The persona the route names (404 if the home has none of that name)."""
    return known_persona_name(request, request.match_info["name"])


def known_persona_name(request: web.Request, name: str, *, field: str | None = None) -> str:
    """``name``, or a 404 naming the personas there are (listed only then:
    every message passes here, and a home may hold thousands)."""
    home = request.app[STATE].home
    if not persona_exists(home, name):
        error = UnknownPersonaError(name, persona_names(home))
        raise ApiError(404, "unknown_persona", str(error), field)
    return name


# -- middleware ---------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _authorized(request: web.Request, state: ServerState) -> bool:
    return request_authorized(
        request.headers.get("Authorization", ""),
        request.remote,
        state.token,
        loopback_without_token=state.settings.loopback_without_token,
    )


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Auth, rate limit and readiness for ``/v1``; every error as JSON."""
    state = request.app[STATE]
    try:
        if request.path.startswith("/v1/"):
            if not _authorized(request, state):
                raise ApiError(401, "unauthorized", "a valid bearer token is required")
            client = request.headers.get("Authorization") or request.remote or "?"
            wait = state.limiter.take(client)
            if wait:
                raise ApiError(429, "rate_limited", f"too many requests; retry in {wait:.1f} s")
            backend_of(request)  # a 503 until the runtime is up
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except CoterieError as exc:
        return error_for(exc).response()
    except web.HTTPRequestEntityTooLarge:
        return too_large(request).response()
    except web.HTTPException as exc:
        kind = "not_found" if exc.status == 404 else "http_error"
        return ApiError(exc.status, kind, exc.reason).response()
    except Exception as exc:  # a bug of ours: logged, answered in the usual shape
        log.exception("%s %s failed", request.method, request.path)
        return ApiError(500, "internal", f"{type(exc).__name__}: {exc}").response()


@web.middleware
async def trace_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A server span for each ``POST /v1/...`` (what asks a persona or
    decides for one), a child of the caller's ``traceparent``; the turns it
    starts are its children. Nothing when this process does not trace."""
    if not (tracer().enabled and request.method == "POST" and request.path.startswith("/v1/")):
        return await handler(request)
    resource = request.match_info.route.resource
    # No route matched: no route in the span's name either (a caller's path
    # must not make span names without end).
    route = resource.canonical if resource is not None else None
    span = start_request(
        method=request.method, route=route, path=request.path, parent=incoming(request.headers)
    )
    status = 500
    try:
        with active(span):
            response = await handler(request)
        status = response.status
        return response
    finally:
        finish_request(span, status=status)


class InFlight:
    """Counts a conversation's messages waiting through the API (409 beyond the cap)."""

    def __init__(self, state: ServerState, key: tuple[str, str]) -> None:
        self.state = state
        self.key = key

    def __enter__(self) -> InFlight:
        cap = self.state.settings.max_in_flight
        if self.state.in_flight[self.key] >= cap:
            raise ApiError(
                409,
                "queue_full",
                f"conversation {self.key[1]!r} already has {cap} messages waiting for "
                f"{self.key[0]}; wait for a reply",
            )
        self.state.in_flight[self.key] += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.in_flight[self.key] -= 1
        if self.state.in_flight[self.key] <= 0:
            del self.state.in_flight[self.key]


async def open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


async def sse_event(response: web.StreamResponse, kind: str, data: str) -> None:
    await response.write(f"event: {kind}\ndata: {data}\n\n".encode())


async def close_stream(items: AsyncIterator[Any]) -> None:
    """Stop listening to a stream of turn items (the turn itself goes on)."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


__all__ = [
    "ID_PATTERN",
    "STATE",
    "ApiError",
    "InFlight",
    "ServerState",
    "TokenBucket",
    "api_middleware",
    "backend_of",
    "close_stream",
    "error_for",
    "known_persona",
    "known_persona_name",
    "open_sse",
    "read_body",
    "sse_event",
    "trace_middleware",
    "valid_id",
]
