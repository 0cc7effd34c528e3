"""Calling a running ``coterie serve``: from the command line
(:class:`ServerClient`, synchronous, JSON and server-sent events over its
HTTP API) and as a :class:`~runtime.frontdoor.FrontDoor` (:class:`ServedDoor`,
what ``coterie mcp-serve`` uses when the home is served).

:func:`find_server` finds the server of a home through its state file
(:mod:`runtime.serve.discovery`) and checks it answers: the commands that
go through it start no Ray and answer well under a second. The client is
the standard library's urllib, so that they load nothing heavy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode

from coterie.runtime.audit.query import QueryResult
from coterie.runtime.errors import DeliveryError, ServeError
from coterie.runtime.frontdoor import ApprovalInfo, PersonaInfo
from coterie.runtime.memory.records import RecallHit
from coterie.runtime.messages import (
    API_ORIGIN,
    ChatMessage,
    MessageEnvelope,
    ReplyEnvelope,
    StreamItem,
    chat_history_adapter,
    stream_item_adapter,
)
from coterie.runtime.serve.discovery import ServerState, served_state

if TYPE_CHECKING:
    from coterie.runtime.schedule.records import ScheduleListing

#: Seconds the health check of a found server may take.
HEALTH_TIMEOUT = 2.0
#: Seconds past a message's own timeout that a client waits for the server to
#: answer it (the server applies the timeout and says so).
REPLY_GRACE = 30.0
T = TypeVar("T")


class ServerError(ServeError):
    """The server answered with an error (``kind`` and ``status`` from its body)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def find_server(home: Path) -> ServerClient | None:
    """A client of the server running for ``home``, or None when none answers
    (a state file a dead server left is removed on the way)."""
    state = served_state(home)
    if state is None:
        return None
    client = ServerClient(state)
    try:
        client.get("/v1/health", timeout=HEALTH_TIMEOUT)
    except (OSError, ServerError):
        return None
    return client


class ServerClient:
    """Calls the server's HTTP API (JSON in and out, SSE for streams)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def _request(self, method: str, path: str, body: Any = None, *, accept: str = "") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.state.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.state.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if accept:
            request.add_header("Accept", accept)
        return request

    def _open(self, request: urllib.request.Request, timeout: float | None) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read() or b"{}").get("error", {})
            except ValueError:
                error = {}
            raise ServerError(
                exc.code, str(error.get("type", "http_error")), str(error.get("message", exc))
            ) from None

    def get(self, path: str, *, timeout: float | None = 30.0) -> Any:
        with self._open(self._request("GET", path), timeout) as response:
            return json.loads(response.read())

    def post(self, path: str, body: Any, *, timeout: float | None = None) -> Any:
        with self._open(self._request("POST", path, body), timeout) as response:
            return json.loads(response.read())

    def stream(self, path: str, body: Any) -> Generator[tuple[str, Any], None, None]:
        """POST ``body`` and yield each server-sent event as ``(event, data)``."""
        request = self._request("POST", path, body, accept="text/event-stream")
        with self._open(request, None) as response:
            event, data = "message", ""
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, json.loads(data)
                    event, data = "message", ""
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()


def schedules_path(persona: str | None = None) -> str:
    """``GET /v1/schedules`` (of one persona)."""
    return "/v1/schedules" + (f"?{urlencode({'persona': persona})}" if persona else "")


def _persona_path(persona: str, tail: str) -> str:
    return f"/v1/personas/{quote(persona, safe='')}/{tail}"


def _message_body(envelope: MessageEnvelope, *, wait: bool) -> dict[str, Any]:
    """What the API's ``POST …/messages`` takes of ``envelope``; a
    :class:`ServeError` for what it could not carry (a person's message
    it is, from the API, the web page or the CLI)."""
    origin = envelope.origin
    cannot = [
        what
        for what, bad in (
            (f"sender {envelope.sender!r}", envelope.sender != "user"),
            (f"context {envelope.context!r}", envelope.context != "user"),
            (f"source {envelope.source_kind!r}", envelope.source_kind != "user"),
            ("an ask path", bool(envelope.ask_path)),
            (
                f"reply mode {envelope.reply_mode!r}",
                envelope.reply_mode != ("return" if wait else "none"),
            ),
            (
                f"origin {origin.connector!r}",
                origin.connector not in ("web", "cli")
                and (origin.connector != API_ORIGIN or origin.destination is not None),
            ),
        )
        if bad
    ]
    if cannot:
        raise ServeError(
            f"a message through coterie serve's API cannot carry {', '.join(cannot)}: "
            "it carries a person's text, conversation and web or cli session"
        )
    body: dict[str, Any] = {"text": envelope.text, "conversation_id": envelope.conversation_id}
    if origin.connector in ("web", "cli") and origin.destination:
        body.update(session=origin.destination, connector=origin.connector)
    if not wait:
        body["wait"] = False
    return body


class ServedDoor:
    """A :class:`~runtime.frontdoor.FrontDoor` onto a running ``coterie serve``,
    over its HTTP API. The client is synchronous: each call runs in a thread.
    Errors the server answers raise :class:`ServerError` (its message is the
    runtime's own); a server that does not answer, :class:`DeliveryError`."""

    def __init__(self, client: ServerClient) -> None:
        self.client = client
        self.where = f"coterie serve at {client.state.url}"

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except OSError as exc:
            raise DeliveryError(f"{self.where} did not answer: {exc}") from None

    async def personas_async(self, offset: int = 0, limit: int | None = None) -> list[PersonaInfo]:
        listed: list[PersonaInfo] = []
        while limit is None or len(listed) < limit:  # the API pages the roster
            page_limit = "" if limit is None else f"&limit={min(limit - len(listed), 1000)}"
            page = await self._call(
                self.client.get, f"/v1/personas?offset={offset + len(listed)}{page_limit}"
            )
            listed += [PersonaInfo.model_validate(p) for p in page["personas"]]
            if not page["personas"] or offset + len(listed) >= page["total"]:
                break
        return listed

    async def persona_count_async(self) -> int:
        page = await self._call(self.client.get, "/v1/personas?limit=0")
        return int(page["total"])

    async def deliver_async(self, envelope: MessageEnvelope, *, timeout: float) -> ReplyEnvelope:
        body = _message_body(envelope, wait=True)
        path = _persona_path(envelope.recipient, "messages")
        data = await self._call(self.client.post, path, body, timeout=timeout + REPLY_GRACE)
        return ReplyEnvelope.model_validate(data["reply"])

    async def post_async(self, envelope: MessageEnvelope) -> None:
        body = _message_body(envelope, wait=False)
        await self._call(self.client.post, _persona_path(envelope.recipient, "messages"), body)

    async def stream_async(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]:
        body = {**_message_body(envelope, wait=True), "stream": True}
        events = self.client.stream(_persona_path(envelope.recipient, "messages"), body)

        def pull() -> tuple[str, Any] | None:
            return next(events, None)

        try:
            while (found := await self._call(pull)) is not None:
                kind, data = found
                if kind == "error":  # the turn failed after the response began: no status
                    error = data["error"]
                    raise ServerError(502, str(error["type"]), str(error["message"]))
                yield stream_item_adapter.validate_python(data)
        finally:
            # Stops listening (the turn goes on). A pull still running in its
            # thread when the caller left keeps the generator busy: the
            # connection then closes with it.
            with contextlib.suppress(ValueError):
                await asyncio.to_thread(events.close)

    async def recall_async(
        self, persona: str, query: str = "", *, limit: int = 8
    ) -> list[RecallHit]:
        path = _persona_path(persona, "recall?" + urlencode({"query": query, "limit": limit}))
        data = await self._call(self.client.get, path)
        return [RecallHit.model_validate(h) for h in data["hits"]]

    async def history_async(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        path = _persona_path(persona, f"conversations/{quote(conversation_id, safe=':@')}")
        try:
            data = await self._call(self.client.get, path)
        except ServerError as exc:
            if exc.kind == "unknown_conversation":
                return []
            raise
        return chat_history_adapter.validate_python(data["messages"])

    async def query_async(self, sql: str) -> QueryResult:
        data = await self._call(self.client.post, "/v1/audit/query", {"sql": sql})
        return QueryResult(columns=data["columns"], rows=[tuple(r) for r in data["rows"]])

    async def status_async(self) -> dict[str, Any]:
        status: dict[str, Any] = await self._call(self.client.get, "/v1/status")
        return status

    async def plugins_async(self) -> dict[str, Any]:
        plugins: dict[str, Any] = (await self.status_async()).get("plugins", {})
        return plugins

    async def schedules_async(self, persona: str | None = None) -> ScheduleListing:
        # Here, not at the top: the scheduler's package loads croniter.
        from coterie.runtime.schedule.records import ScheduleListing

        data = await self._call(self.client.get, schedules_path(persona))
        return ScheduleListing.model_validate(data)

    async def approvals_async(
        self, persona: str | None = None, state: str | None = "pending"
    ) -> list[ApprovalInfo]:
        query = {"state": state or "all"}
        if persona is not None:
            query["persona"] = persona
        data = await self._call(self.client.get, f"/v1/approvals?{urlencode(query)}")
        return [ApprovalInfo.model_validate(a) for a in data["approvals"]]

    async def decide_approval_async(
        self, approval_id: str, answer: str, *, by: str | None = None, via: str = "http"
    ) -> ApprovalInfo:
        body: dict[str, Any] = {"decision": answer, "via": via}
        if by is not None:
            body["by"] = by
        path = f"/v1/approvals/{quote(approval_id, safe='')}"
        data = await self._call(self.client.post, path, body)
        return ApprovalInfo.model_validate(data["approval"])


__all__ = ["ServedDoor", "ServerClient", "ServerError", "find_server", "schedules_path"]
