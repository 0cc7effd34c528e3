"""Local fake model servers that speak the OpenAI and Anthropic wire formats.

Used by the provider wire tests and the benchmarks: the real SDK clients talk
to an :mod:`aiohttp` server on ``127.0.0.1`` with an ephemeral port. Each
server records every JSON request body (``requests``) and its headers
(``headers``) unless started with ``record=False``, and answers from a queue
of scripted replies, falling back to a default text reply when the queue is
empty::

    async with FakeOpenAIServer() as srv:
        srv.enqueue_error(429, headers={"retry-after": "0"})
        srv.enqueue_text("hi")
        model = OpenAIChatModel(config.model_copy(update={"base_url": srv.base_url}))

A request with ``"stream": true`` gets the same queued reply as server-sent
events in the provider's streaming format (errors stay plain HTTP errors);
``cut_after`` drops the connection after that many events, for failures in
the middle of a stream.

Usage is the provider's own shape: ``usage=(input, output)`` and the prompt
cache's figures ``cache_read=`` (both servers) and ``cache_write=``
(Anthropic; OpenAI reports no cache writes). OpenAI's ``prompt_tokens`` (the
``input``) counts the cached tokens too, its
``prompt_tokens_details.cached_tokens`` is the cache read; Anthropic's
``input_tokens`` (the ``input``) is the uncached part only, beside
``cache_read_input_tokens`` and ``cache_creation_input_tokens``. Streamed,
the figures come as the providers send them: OpenAI's in the last chunk,
Anthropic's input and cache counts in ``message_start`` and the output
count in ``message_delta``.

``context_limit_chars`` (constructor argument or attribute) stands in for a
model's context window: a request whose ``messages`` (and, for Anthropic,
``system``) take more characters than that as JSON (:meth:`context_chars`)
is refused with HTTP 400 in the provider's context-length error shape,
without consuming a queued reply; the request is still recorded and counted
in ``context_rejections``.

Latency is an ``asyncio.sleep`` per response, so thousands of concurrent
requests overlap instead of queueing behind each other.

``with FakeOpenAIServer() as srv:`` (no ``async``) serves from a background
thread with its own event loop instead, for callers that block their own loop
(a Ray driver calling ``ray.get``) while other processes hit the server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from tests.fakes._http import LocalHttpServer
from tests.fakes.anthropic_stream import message_events, pieces, sse

__all__ = ["FakeAnthropicServer", "FakeModelServer", "FakeOpenAIServer", "ScriptedReply"]


@dataclass
class ScriptedReply:
    """One queued answer: an HTTP status, a JSON (or text) body and headers.

    ``latency`` overrides the server-wide latency for this reply only;
    ``cut_after`` (streaming only) drops the connection after that many events.
    """

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    latency: float | None = None
    cut_after: int | None = None


class FakeModelServer(LocalHttpServer):
    """Shared machinery: lifecycle, recording, the reply queue, latency."""

    #: The POST route the SDK calls, relative to the server root.
    route: str = ""

    def __init__(
        self,
        *,
        latency: float = 0.0,
        default_text: str | None = "ok",
        model: str = "fake-model",
        backlog: int = 4096,
        record: bool = True,
        context_limit_chars: int | None = None,
    ) -> None:
        super().__init__()
        self.latency = latency
        #: Requests longer than this (:meth:`context_chars`) get the provider's
        #: context-length error; ``None`` takes any length.
        self.context_limit_chars = context_limit_chars
        #: How many requests the context limit refused.
        self.context_rejections = 0
        # ``record=False`` keeps no body or headers: a benchmark's server takes
        # thousands of requests and never reads them, and the parsed bodies it
        # would hold make each of its garbage collections longer.
        self.record = record
        # ``None`` makes an unscripted request fail loudly (HTTP 500).
        self.default_text = default_text
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._queue: deque[ScriptedReply] = deque()
        self._ids = itertools.count(1)
        # A large backlog keeps a burst of 1,000 connects from overflowing
        # the listen queue (which shows up as ~1 s SYN-retry stalls).
        self.backlog = backlog
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post(self.route, self._handle)

    def start_in_thread(self, timeout: float = 10.0) -> Self:
        """Serve from a daemon thread running its own event loop."""
        if self._thread is not None:
            raise RuntimeError("server is already running in a thread")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_forever, name=f"{type(self).__name__}-loop", daemon=True
        )
        thread.start()
        self._thread, self._thread_loop = thread, loop
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout)
        except BaseException:
            self.stop_thread()
            raise
        return self

    def stop_thread(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_in_thread`; idempotent."""
        loop, thread = self._thread_loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            loop.close()
            self._thread, self._thread_loop = None, None

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_thread()

    @property
    def base_url(self) -> str:
        """The ``base_url`` to hand to the SDK client."""
        return self.root_url

    # -- inspection --------------------------------------------------------

    def _recorded(self) -> None:
        # What is read from the records would be empty, not wrong, without
        # them: a check that no key was sent would pass for nothing.
        if not self.record:
            raise RuntimeError("this server was started with record=False: it keeps no requests")

    @property
    def last_request(self) -> dict[str, Any]:
        """The most recent JSON request body."""
        self._recorded()
        return self.requests[-1]

    @property
    def api_keys(self) -> list[str | None]:
        """The API key each request carried (``x-api-key`` or bearer token)."""
        self._recorded()
        keys: list[str | None] = []
        for headers in self.headers:
            key = headers.get("x-api-key")
            auth = headers.get("authorization", "")
            if key is None and auth.lower().startswith("bearer "):
                key = auth[len("bearer ") :]
            keys.append(key)
        return keys

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed."""
        return len(self._queue)

    # -- scripting ---------------------------------------------------------

    def enqueue_raw(
        self,
        body: Any,
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        latency: float | None = None,
        cut_after: int | None = None,
    ) -> None:
        """Queue a reply body sent verbatim (a dict is sent as JSON, or streamed;
        a string goes as it is, as JSON unless ``headers`` set ``content-type``)."""
        self._queue.append(ScriptedReply(status, body, dict(headers or {}), latency, cut_after))

    def enqueue_error(
        self,
        status: int,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        message: str | None = None,
        latency: float | None = None,
    ) -> None:
        """Queue an error status; the body defaults to the provider's error shape."""
        if body is None:
            body = self._error_body(status, message or f"scripted error {status}")
        self.enqueue_raw(body, status=status, headers=headers, latency=latency)

    def clear(self) -> None:
        """Forget recorded requests and drop unconsumed replies."""
        self.requests.clear()
        self.headers.clear()
        self._queue.clear()

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}"

    def context_chars(self, body: dict[str, Any]) -> int:
        """How long a request body is for ``context_limit_chars``: the
        characters of ``json.dumps`` (default settings) of its ``messages``."""
        return len(json.dumps(body.get("messages", [])))

    # -- provider-specific shapes (overridden) ------------------------------

    def _error_body(self, status: int, message: str) -> Any:
        raise NotImplementedError

    def _context_error_body(self, tokens: int, limit: int) -> Any:
        """The provider's answer to a request of ``tokens`` over a window of ``limit``."""
        raise NotImplementedError

    def _default_reply(self, request: dict[str, Any]) -> ScriptedReply:
        if self.default_text is None:
            return ScriptedReply(500, self._error_body(500, "no scripted reply queued"))
        return ScriptedReply(200, self._text_body(self.default_text, request))

    def _text_body(self, text: str, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _finish(self, body: Any, request: dict[str, Any]) -> Any:
        """Fill per-request fields (model echo) into a scripted success body."""
        return body

    def _events(
        self, body: dict[str, Any], request: dict[str, Any]
    ) -> list[tuple[str | None, dict[str, Any] | str]]:
        """The streaming events ``(event name, data)`` that carry ``body``."""
        raise NotImplementedError

    # -- serving -----------------------------------------------------------

    async def _handle(self, http_request: web.Request) -> web.StreamResponse:
        try:
            payload = await http_request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response(self._error_body(400, "body is not JSON"), status=400)
        if self.record:
            self.requests.append(payload)
            self.headers.append({k.lower(): v for k, v in http_request.headers.items()})
        limit = self.context_limit_chars
        if limit is not None and isinstance(payload, dict):
            chars = self.context_chars(payload)
            if chars > limit:
                # Refused before any reply is taken: the queue stays as it was.
                # Tokens as ~4 characters each, the request's rounded up.
                self.context_rejections += 1
                body = self._context_error_body(-(-chars // 4), limit // 4)
                return web.json_response(body, status=400)
        # Take the reply on arrival so concurrent requests consume in order.
        reply = self._queue.popleft() if self._queue else self._default_reply(payload)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.latency if reply.latency is None else reply.latency
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            self.in_flight -= 1
        body = reply.body
        if reply.status < 400 and isinstance(body, dict):
            body = self._finish(body, payload)
            if payload.get("stream"):
                return await self._stream(http_request, self._events(body, payload), reply)
        if isinstance(body, str | bytes):
            # Sent as JSON unless the scripted headers name another content type.
            headers = {k: v for k, v in reply.headers.items() if k.lower() != "content-type"}
            content_type = next(
                (v for k, v in reply.headers.items() if k.lower() == "content-type"),
                "application/json",
            )
            return web.Response(
                status=reply.status,
                body=body.encode() if isinstance(body, str) else body,
                headers=headers,
                content_type=content_type,
            )
        return web.json_response(body, status=reply.status, headers=reply.headers)

    async def _stream(
        self,
        http_request: web.Request,
        events: list[tuple[str | None, dict[str, Any] | str]],
        reply: ScriptedReply,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=reply.status,
            headers={
                **reply.headers,
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
            },
        )
        await response.prepare(http_request)
        for n, (event, data) in enumerate(events):
            if n == reply.cut_after:
                # Gone mid-body: the client sees an incomplete chunked response.
                assert http_request.transport is not None
                http_request.transport.close()
                return response
            await response.write(sse(data, event))
        await response.write_eof()
        return response


def _arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class FakeOpenAIServer(FakeModelServer):
    """Speaks ``POST /v1/chat/completions``, streaming ``chat.completion.chunk`` events."""

    route = "/v1/chat/completions"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            429: "rate_limit_exceeded",
        }.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def _context_error_body(self, tokens: int, limit: int) -> dict[str, Any]:
        return {
            "error": {
                "message": f"This model's maximum context length is {limit} tokens. "
                f"However, your messages resulted in {tokens} tokens. "
                "Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }

    def _completion(
        self,
        message: dict[str, Any],
        finish_reason: str,
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        cached_tokens: int = 0,
    ) -> dict[str, Any]:
        return {
            "id": self._next_id("chatcmpl-fake"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                # Cached tokens are counted in prompt_tokens too.
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            },
        }

    def _text_body(self, text: str, request: dict[str, Any]) -> dict[str, Any]:
        return self._finish(self._completion(_openai_message(text), "stop"), request)

    def _finish(self, body: Any, request: dict[str, Any]) -> Any:
        if body.get("object") == "chat.completion" and "model" in request:
            body = {**body, "model": request["model"]}
        return body

    def _events(
        self, body: dict[str, Any], request: dict[str, Any]
    ) -> list[tuple[str | None, dict[str, Any] | str]]:
        """The completion as chunks: text and arguments split, then finish, usage, [DONE]."""
        choice = body["choices"][0]
        message = choice["message"]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"reasoning_content": p} for p in pieces(message.get("reasoning_content") or "")]
        deltas += [{"content": p} for p in pieces(message.get("content") or "")]
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            opening = {"index": index, "id": call["id"], "type": "function"}
            deltas.append(
                {
                    "tool_calls": [
                        {**opening, "function": {"name": function["name"], "arguments": ""}}
                    ]
                }
            )
            deltas += [
                {"tool_calls": [{"index": index, "function": {"arguments": p}}]}
                for p in pieces(function["arguments"])
            ]
        head = {key: body[key] for key in ("id", "created", "model")}
        head["object"] = "chat.completion.chunk"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            entry = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**head, "choices": [entry]}

        chunks: list[dict[str, Any] | str] = [chunk(d) for d in deltas]
        chunks.append(chunk({}, choice["finish_reason"]))
        if (request.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": body.get("usage")})
        chunks.append("[DONE]")
        return [(None, c) for c in chunks]

    def enqueue_text(
        self,
        text: str,
        *,
        reasoning_content: str | None = None,
        finish_reason: str = "stop",
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        latency: float | None = None,
        cut_after: int | None = None,
    ) -> None:
        """Queue a plain assistant reply; ``usage`` is ``(prompt_tokens,
        completion_tokens)``, ``cache_read`` the part of the prompt tokens
        read from the cache."""
        message = _openai_message(text, reasoning_content=reasoning_content)
        body = self._completion(
            message,
            finish_reason,
            prompt_tokens=usage[0],
            completion_tokens=usage[1],
            cached_tokens=cache_read,
        )
        self.enqueue_raw(body, latency=latency, cut_after=cut_after)

    def enqueue_tool_call(
        self,
        name: str,
        arguments: dict[str, Any] | str,
        *,
        call_id: str | None = None,
        text: str | None = None,
        reasoning_content: str | None = None,
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        latency: float | None = None,
    ) -> None:
        """Queue one tool call; a ``str`` ``arguments`` is sent verbatim."""
        self.enqueue_tool_calls(
            [(name, arguments, call_id)],
            text=text,
            reasoning_content=reasoning_content,
            usage=usage,
            cache_read=cache_read,
            latency=latency,
        )

    def enqueue_tool_calls(
        self,
        calls: list[tuple[str, dict[str, Any] | str, str | None]],
        *,
        text: str | None = None,
        reasoning_content: str | None = None,
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        latency: float | None = None,
    ) -> None:
        """Queue several parallel tool calls ``(name, arguments, call_id)``
        (``usage`` and ``cache_read`` as for :meth:`enqueue_text`)."""
        tool_calls = [
            {
                "id": call_id or self._next_id("call_"),
                "type": "function",
                "function": {"name": name, "arguments": _arguments_text(arguments)},
            }
            for name, arguments, call_id in calls
        ]
        message = _openai_message(text, reasoning_content=reasoning_content)
        message["tool_calls"] = tool_calls
        body = self._completion(
            message,
            "tool_calls",
            prompt_tokens=usage[0],
            completion_tokens=usage[1],
            cached_tokens=cache_read,
        )
        self.enqueue_raw(body, latency=latency)


def _openai_message(text: str | None, *, reasoning_content: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    return message


class FakeAnthropicServer(FakeModelServer):
    """Speaks ``POST /v1/messages``, streaming as :class:`AnthropicStreamServer` does."""

    route = "/v1/messages"

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _context_error_body(self, tokens: int, limit: int) -> dict[str, Any]:
        message = f"prompt is too long: {tokens} tokens > {limit} maximum"
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}

    def context_chars(self, body: dict[str, Any]) -> int:
        """As for OpenAI, with the ``system`` prompt's JSON (when sent) added."""
        chars = super().context_chars(body)
        if "system" in body:
            chars += len(json.dumps(body["system"]))
        return chars

    def _message(
        self,
        content: list[dict[str, Any]],
        stop_reason: str,
        *,
        input_tokens: int = 10,
        output_tokens: int = 5,
        cache_read: int = 0,
        cache_write: int = 0,
    ) -> dict[str, Any]:
        return {
            "id": self._next_id("msg_fake"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            # input_tokens is the uncached part only.
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": cache_write,
                "cache_read_input_tokens": cache_read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": cache_write,
                    "ephemeral_1h_input_tokens": 0,
                },
                "output_tokens": output_tokens,
            },
        }

    def _text_body(self, text: str, request: dict[str, Any]) -> dict[str, Any]:
        body = self._message([{"type": "text", "text": text}], "end_turn")
        return self._finish(body, request)

    def _finish(self, body: Any, request: dict[str, Any]) -> Any:
        if body.get("type") == "message" and "model" in request:
            body = {**body, "model": request["model"]}
        return body

    def _events(
        self, body: dict[str, Any], request: dict[str, Any]
    ) -> list[tuple[str | None, dict[str, Any] | str]]:
        return list(message_events(body))

    @staticmethod
    def thinking_block(thinking: str, signature: str = "sig-fake") -> dict[str, Any]:
        """A ``thinking`` content block."""
        return {"type": "thinking", "thinking": thinking, "signature": signature}

    @staticmethod
    def redacted_thinking_block(data: str) -> dict[str, Any]:
        """A ``redacted_thinking`` content block."""
        return {"type": "redacted_thinking", "data": data}

    def tool_use_block(
        self, name: str, arguments: dict[str, Any] | str, call_id: str | None = None
    ) -> dict[str, Any]:
        """A ``tool_use`` block; a ``str`` ``arguments`` is sent verbatim as input."""
        return {
            "type": "tool_use",
            "id": call_id or self._next_id("toolu_fake"),
            "name": name,
            "input": arguments,
        }

    def enqueue_content(
        self,
        content: list[dict[str, Any]],
        *,
        stop_reason: str | None = None,
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        cache_write: int = 0,
        latency: float | None = None,
        cut_after: int | None = None,
    ) -> None:
        """Queue a message with these content blocks; ``usage`` is
        ``(input_tokens, output_tokens)``, the input being the uncached part,
        and ``cache_read`` / ``cache_write`` the cache's read and created
        input tokens."""
        if stop_reason is None:
            has_tool = any(block.get("type") == "tool_use" for block in content)
            stop_reason = "tool_use" if has_tool else "end_turn"
        body = self._message(
            content,
            stop_reason,
            input_tokens=usage[0],
            output_tokens=usage[1],
            cache_read=cache_read,
            cache_write=cache_write,
        )
        self.enqueue_raw(body, latency=latency, cut_after=cut_after)

    def enqueue_text(
        self,
        text: str,
        *,
        thinking: str | None = None,
        signature: str = "sig-fake",
        stop_reason: str = "end_turn",
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        cache_write: int = 0,
        latency: float | None = None,
        cut_after: int | None = None,
    ) -> None:
        """Queue a text reply, optionally preceded by a thinking block."""
        content = [] if thinking is None else [self.thinking_block(thinking, signature)]
        content.append({"type": "text", "text": text})
        self.enqueue_content(
            content,
            stop_reason=stop_reason,
            usage=usage,
            cache_read=cache_read,
            cache_write=cache_write,
            latency=latency,
            cut_after=cut_after,
        )

    def enqueue_tool_call(
        self,
        name: str,
        arguments: dict[str, Any] | str,
        *,
        call_id: str | None = None,
        text: str | None = None,
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        cache_write: int = 0,
        latency: float | None = None,
    ) -> None:
        """Queue one ``tool_use`` (optionally after some text)."""
        content = [] if not text else [{"type": "text", "text": text}]
        content.append(self.tool_use_block(name, arguments, call_id))
        self.enqueue_content(
            content, usage=usage, cache_read=cache_read, cache_write=cache_write, latency=latency
        )

    def enqueue_thinking_then_tool_call(
        self,
        thinking: str,
        name: str,
        arguments: dict[str, Any] | str,
        *,
        signature: str = "sig-fake",
        call_id: str | None = None,
        text: str | None = None,
        usage: tuple[int, int] = (10, 5),
        cache_read: int = 0,
        cache_write: int = 0,
        latency: float | None = None,
    ) -> None:
        """Queue ``thinking`` (with signature), optional text, then a ``tool_use``."""
        content = [self.thinking_block(thinking, signature)]
        if text:
            content.append({"type": "text", "text": text})
        content.append(self.tool_use_block(name, arguments, call_id))
        self.enqueue_content(
            content, usage=usage, cache_read=cache_read, cache_write=cache_write, latency=latency
        )
