"""``/v1/chat/completions`` and ``/v1/models``: personas behind the OpenAI
Chat Completions protocol, for any client that speaks it.

The model name is the persona's name. The persona answers with its own
SOUL, tools and memory, on its own conversation: the client sends the new
user message (the last one of ``messages``; earlier ones are the client's
copy of what the persona already holds). The conversation is the
``X-Coterie-Conversation`` header, else one per ``user`` field, else a new
one — its id comes back in the same header. Tool calls stay inside the
persona; the client sees the text (streamed as ``chat.completion.chunk``
deltas with ``"stream": true``) and the tokens of every model call of the
turn as ``usage``.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.errors import CoterieError
from coterie.runtime.messages import MessageEnvelope, ModelCalled, ReplyEnvelope, TextDelta, new_id
from coterie.runtime.serve.http import (
    ID_PATTERN,
    STATE,
    ApiError,
    InFlight,
    backend_of,
    close_stream,
    error_for,
    known_persona_name,
    open_sse,
    read_body,
    valid_id,
)

CONVERSATION_HEADER = "X-Coterie-Conversation"


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class CompletionRequest(BaseModel):
    # Sampling fields the persona's own model settings decide are accepted
    # and not used: the persona answers as configured.
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, pattern=ID_PATTERN)


def user_text(request: CompletionRequest) -> str:
    """The text of the last message, which must be the user's."""
    last = request.messages[-1]
    if last.role != "user":
        raise ApiError(
            400, "invalid_body", "the last message must be the user's (role user)", "messages"
        )
    content = last.content
    if isinstance(content, list):
        content = "".join(
            str(part.get("text", "")) for part in content if part.get("type") == "text"
        )
    if not content:
        raise ApiError(400, "invalid_body", "the last user message has no text", "messages")
    return content


def conversation_for(request: web.Request, body: CompletionRequest) -> str:
    header = request.headers.get(CONVERSATION_HEADER)
    if header:
        return valid_id(header, "conversation_id")
    if body.user:
        return f"{body.model}:user:{body.user}"
    return f"{body.model}:openai:{new_id()}"


def _usage(calls: list[ModelCalled]) -> dict[str, int]:
    prompt = sum(c.input_tokens for c in calls)
    completion = sum(c.output_tokens for c in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _failed(reply: ReplyEnvelope) -> ApiError:
    return ApiError(502, "turn_error", reply.error or "the persona's turn failed")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body: CompletionRequest = await read_body(request, CompletionRequest)
    persona = known_persona_name(request, body.model, field="model")
    text = user_text(body)
    conversation_id = conversation_for(request, body)
    envelope = MessageEnvelope(recipient=persona, conversation_id=conversation_id, text=text)
    completion_id = f"chatcmpl-{new_id()}"
    created = int(time.time())
    headers = {CONVERSATION_HEADER: conversation_id}
    door = backend_of(request)
    calls: list[ModelCalled] = []
    with InFlight(request.app[STATE], (persona, conversation_id)):
        if not body.stream:
            reply: ReplyEnvelope | None = None
            async for item in door.stream_async(envelope):
                if isinstance(item, ModelCalled):
                    calls.append(item)
                elif isinstance(item, ReplyEnvelope):
                    reply = item
            if reply is None or reply.status == "error":
                raise _failed(reply) if reply else ApiError(502, "turn_error", "no reply")
            return web.json_response(
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": persona,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply.text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": _usage(calls),
                },
                headers=headers,
            )

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": persona,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        response = await open_sse(request)
        for name, value in headers.items():
            response.headers[name] = value

        async def send(data: dict[str, Any]) -> None:
            await response.write(f"data: {json.dumps(data)}\n\n".encode())

        await send(chunk({"role": "assistant", "content": ""}))
        streamed = ""
        items = door.stream_async(envelope)
        try:
            async for item in items:
                if isinstance(item, TextDelta):
                    streamed += item.text
                    await send(chunk({"content": item.text}))
                elif isinstance(item, ModelCalled):
                    calls.append(item)
                    # A step that called tools: its text is not the answer's
                    # end; the next text starts on a new line.
                    if item.tool_calls and streamed and not streamed.endswith("\n"):
                        streamed += "\n"
                        await send(chunk({"content": "\n"}))
                elif isinstance(item, ReplyEnvelope):
                    if item.status == "error":
                        err = _failed(item)
                        await send({"error": {"message": str(err), "type": err.kind}})
                        break
                    if not streamed and item.text:
                        # A model that cannot stream: the whole text at once.
                        await send(chunk({"content": item.text}))
                    await send(chunk({}, "stop"))
                    if body.stream_options and body.stream_options.include_usage:
                        usage = chunk({})
                        usage["choices"] = []
                        usage["usage"] = _usage(calls)
                        await send(usage)
        except CoterieError as exc:
            err = error_for(exc)
            await send({"error": {"message": str(err), "type": err.kind}})
        finally:
            await close_stream(items)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def list_models(request: web.Request) -> web.Response:
    infos = await backend_of(request).personas_async()
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"id": i.name, "object": "model", "created": 0, "owned_by": "coterie"}
                for i in infos
            ],
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)


__all__ = ["CONVERSATION_HEADER", "add_routes"]
