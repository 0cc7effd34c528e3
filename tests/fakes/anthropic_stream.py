"""A local server speaking the Anthropic Messages API, streaming included,
scripted by rules: enough of the API for a real coding agent (Claude Code
behind ``claude-agent-acp``) to run whole turns against it.

Where :mod:`tests.fakes.servers` answers from a queue (one SDK client,
known call order), an agent sends requests of its own choosing (its loop,
side requests without tools, retries), so this server answers by *rules*:
the first rule whose ``when`` holds answers, at most ``times`` times; the
``default`` reply answers the rest::

    async with AnthropicStreamServer() as srv:
        srv.add(When(contains="TASK-1", step=1),
                Reply(tool_calls=[ToolUse(name="Write", input={"file_path": p, "content": "hi"})]))
        srv.add(When(contains="TASK-1", step=2), Reply(text="Wrote it."))
        env = {"ANTHROPIC_BASE_URL": srv.base_url, ...}

Served:

- ``POST /v1/messages``: with ``"stream": true`` the SSE sequence
  ``message_start``, ``content_block_start``/``content_block_delta``
  (``text_delta``, ``thinking_delta`` + ``signature_delta``,
  ``input_json_delta``)/``content_block_stop`` per block,
  ``message_delta`` (stop reason, usage), ``message_stop``; without it one
  JSON message. ``Reply.stall`` holds a stream open after ``message_start``
  (a slow model, for cancellation tests).
- ``POST /v1/messages/count_tokens``: a rough count (characters / 4).
- ``GET /v1/models`` and ``GET /v1/models/{id}``: a small fixed listing.
- ``HEAD``/``GET /``: 200 (connectivity probes).
- anything else: 404 in the API's error shape. Every request is recorded in
  :attr:`AnthropicStreamServer.requests` whatever its route.

:func:`message_events` is that event sequence for any message, so that the
queue-scripted ``FakeAnthropicServer`` streams exactly the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from tests.fakes._http import LocalHttpServer

__all__ = [
    "AnthropicStreamServer",
    "RecordedRequest",
    "Reply",
    "Rule",
    "ToolUse",
    "When",
    "last_tool_results",
    "message_events",
    "pieces",
    "sse",
    "user_text",
]

MODELS = ("claude-sonnet-4-6", "claude-opus-4-6", "claude-haiku-4-5")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolUse(_Strict):
    """One ``tool_use`` block of a scripted reply."""

    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class When(_Strict):
    """Conditions of a rule; every one given must hold."""

    contains: str | None = Field(
        default=None, description="in a user text block (not tool results), case-insensitive"
    )
    step: int | None = Field(
        default=None, ge=1, description="model call of the conversation: assistant messages + 1"
    )
    tool_result_contains: str | None = Field(
        default=None, description="in a tool_result of the newest user message"
    )
    after_tool_result: bool | None = Field(
        default=None, description="whether the newest user message carries a tool_result"
    )
    has_tools: bool | None = Field(
        default=None, description="whether the request offers tools (side requests do not)"
    )
    stream: bool | None = None


class Reply(_Strict):
    """What a rule answers."""

    text: str | None = None
    tool_calls: list[ToolUse] = Field(default_factory=list)
    stop_reason: str | None = Field(default=None, description="default: tool_use or end_turn")
    status: int = Field(default=200, description="an error status answers with error_message")
    error_message: str = "scripted error"
    delay: float = Field(default=0.0, ge=0, description="seconds before answering")
    stall: float = Field(
        default=0.0, ge=0, description="streaming: seconds held open after message_start"
    )
    chunk_delay: float = Field(default=0.0, ge=0, description="seconds between stream events")


class Rule(_Strict):
    when: When = Field(default_factory=When)
    reply: Reply
    times: int | None = Field(default=None, ge=1, description="fires at most this often")
    name: str = ""


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    rule: str | None = None  # the rule that answered a /v1/messages request
    extra: dict[str, Any] = field(default_factory=dict)


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _result_text(block: dict[str, Any]) -> str:
    inner = block.get("content", "")
    if isinstance(inner, str):
        return inner
    if isinstance(inner, list):
        return " ".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
    return ""


def user_text(body: dict[str, Any]) -> str:
    """Every text block of every user message, joined (tool results left out)."""
    parts: list[str] = []
    for message in body.get("messages", []):
        if isinstance(message, dict) and message.get("role") == "user":
            parts.extend(str(b.get("text", "")) for b in _blocks(message) if b["type"] == "text")
    return "\n".join(parts)


def last_tool_results(body: dict[str, Any]) -> list[str]:
    """The tool results carried by the newest user message."""
    messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
    if not messages or messages[-1].get("role") != "user":
        return []
    return [_result_text(b) for b in _blocks(messages[-1]) if b.get("type") == "tool_result"]


def _step(body: dict[str, Any]) -> int:
    messages = body.get("messages", [])
    return 1 + sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def _matches(when: When, body: dict[str, Any]) -> bool:
    if when.step is not None and _step(body) != when.step:
        return False
    if when.stream is not None and bool(body.get("stream")) != when.stream:
        return False
    if when.has_tools is not None and bool(body.get("tools")) != when.has_tools:
        return False
    results = last_tool_results(body)
    if when.after_tool_result is not None and bool(results) != when.after_tool_result:
        return False
    if when.tool_result_contains is not None:
        needle = when.tool_result_contains.lower()
        if not any(needle in r.lower() for r in results):
            return False
    return when.contains is None or when.contains.lower() in user_text(body).lower()


def pieces(text: str, n: int = 3) -> list[str]:
    """``text`` in up to ``n`` pieces (none for ""): several deltas per block."""
    if not text:
        return []
    size = -(-len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event (``event:`` only when named, as OpenAI omits it)."""
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {body}\n\n".encode()


def _block_events(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block's opening and the deltas that rebuild it."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": ""}, [
            {"type": "text_delta", "text": p} for p in pieces(block["text"])
        ]
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block.get("signature") or ""})
        return {"type": "thinking", "thinking": "", "signature": ""}, deltas
    if kind == "tool_use":
        return {**block, "input": {}}, [
            {"type": "input_json_delta", "partial_json": p}
            for p in pieces(json.dumps(block["input"]))
        ]
    return block, []  # redacted thinking and the rest arrive whole


def message_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The streaming events ``(event, data)`` that rebuild a Messages API ``message``."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        opening, deltas = _block_events(block)
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")}
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": delta,
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


class AnthropicStreamServer(LocalHttpServer):
    """The rule-scripted Messages API server (see the module docstring)."""

    def __init__(
        self, *, rules: list[Rule] | None = None, default: Reply | None = None, model: str = ""
    ) -> None:
        super().__init__()
        self.rules: list[Rule] = list(rules or [])
        self.default = default or Reply(text="ok")
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.fired: dict[int, int] = {}
        #: Set when a reply with a ``stall`` has sent ``message_start`` and waits.
        self.stalling = asyncio.Event()
        self._ids = itertools.count(1)

    # -- scripting ---------------------------------------------------------

    def add(self, when: When, reply: Reply, *, times: int | None = None, name: str = "") -> Rule:
        """Append a rule (tried after the ones already there)."""
        rule = Rule(when=when, reply=reply, times=times, name=name or f"rule{len(self.rules) + 1}")
        self.rules.append(rule)
        return rule

    def _pick(self, body: dict[str, Any]) -> tuple[str | None, Reply]:
        for index, rule in enumerate(self.rules):
            if rule.times is not None and self.fired.get(index, 0) >= rule.times:
                continue
            if _matches(rule.when, body):
                self.fired[index] = self.fired.get(index, 0) + 1
                return rule.name or f"rule{index + 1}", rule.reply
        return None, self.default

    # -- inspection --------------------------------------------------------

    @property
    def message_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages`` requests, in arrival order."""
        return [r for r in self.requests if r.method == "POST" and r.path == "/v1/messages"]

    @property
    def unknown_requests(self) -> list[RecordedRequest]:
        """Requests to routes this server does not serve (answered 404)."""
        return [r for r in self.requests if r.extra.get("unknown")]

    # -- lifecycle ---------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._handle)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the value for ``ANTHROPIC_BASE_URL``."""
        return self.root_url

    # -- serving -----------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = raw.decode("utf-8", errors="replace")
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        self.requests.append(record)
        path = request.path.rstrip("/") or "/"
        if path == "/" and request.method in ("GET", "HEAD"):
            return web.Response(text="ok")
        if request.method == "GET" and path == "/v1/models":
            return web.json_response(self._models())
        if request.method == "GET" and path.startswith("/v1/models/"):
            return web.json_response(self._model_info(path.removeprefix("/v1/models/")))
        if request.method == "POST" and path == "/v1/messages/count_tokens":
            return web.json_response({"input_tokens": max(1, len(raw) // 4)})
        if request.method == "POST" and path == "/v1/messages" and isinstance(body, dict):
            record.rule, reply = self._pick(body)
            return await self._answer(request, body, reply)
        record.extra["unknown"] = True
        return web.json_response(_error("not_found_error", f"no route {path}"), status=404)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status >= 400:
            kind = "overloaded_error" if reply.status == 529 else "api_error"
            if reply.status < 500:
                kind = "invalid_request_error"
            return web.json_response(_error(kind, reply.error_message), status=reply.status)
        model = self.model or str(body.get("model") or MODELS[0])
        blocks = self._content(reply)
        stop = reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")
        usage = {"input_tokens": max(1, len(json.dumps(body)) // 4), "output_tokens": 5}
        message = {
            "id": f"msg_stream{next(self._ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(message)
        return await self._stream(request, message, reply)

    def _content(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.tool_calls:
            call_id = call.id or f"toolu_stream{next(self._ids):06d}"
            blocks.append(
                {"type": "tool_use", "id": call_id, "name": call.name, "input": call.input}
            )
        return blocks

    async def _stream(
        self, request: web.Request, message: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(sse(data, event))
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)

        for n, (event, data) in enumerate(message_events(message)):
            await send(event, data)
            if n == 0 and reply.stall:
                self.stalling.set()
                await send("ping", {"type": "ping"})
                await asyncio.sleep(reply.stall)
        await response.write_eof()
        return response

    def _models(self) -> dict[str, Any]:
        data = [self._model_info(m) for m in MODELS]
        return {"data": data, "has_more": False, "first_id": MODELS[0], "last_id": MODELS[-1]}

    @staticmethod
    def _model_info(model_id: str) -> dict[str, Any]:
        return {
            "type": "model",
            "id": model_id,
            "display_name": model_id,
            "created_at": "2025-01-01T00:00:00Z",
        }


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
