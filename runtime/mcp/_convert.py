"""The ``mcp`` SDK's types turned into the records of :mod:`runtime.mcp.records`,
and the pure helpers that word an error of :mod:`runtime.mcp.session`.

The converters cover tools, content blocks, tool results, resources and
prompts; nothing here does I/O or keeps state. The error helpers put an
exception on one short line, name a process's exit, find the real error in an
exception group, tell a lost connection from another JSON-RPC error, and strip
a URL of what may be secret.
"""

from __future__ import annotations

import asyncio
import signal
from typing import assert_never
from urllib.parse import urlsplit

from mcp import types as mt
from mcp.shared.exceptions import MCPError

from coterie.runtime.mcp.records import (
    McpCallResult,
    McpContent,
    McpPromptArgument,
    McpPromptInfo,
    McpPromptMessage,
    McpPromptResult,
    McpResourceInfo,
    McpToolInfo,
)

#: Characters of the server's stderr (or of an exception's text) quoted in an error.
STDERR_HINT_CHARS = 300


# -- SDK types to records --------------------------------------------------------


def tool_info(tool: mt.Tool) -> McpToolInfo:
    """One listed tool; its schemas unchanged, its hints snake_case."""
    return McpToolInfo(
        name=tool.name,
        title=tool.title,
        description=tool.description or "",
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        annotations=tool.annotations.model_dump(exclude_none=True) if tool.annotations else {},
    )


def resource_info(resource: mt.Resource) -> McpResourceInfo:
    """One listed resource."""
    return McpResourceInfo(
        uri=resource.uri,
        name=resource.name,
        title=resource.title,
        description=resource.description,
        mime_type=resource.mime_type,
    )


def prompt_info(prompt: mt.Prompt) -> McpPromptInfo:
    """One listed prompt and its arguments."""
    return McpPromptInfo(
        name=prompt.name,
        title=prompt.title,
        description=prompt.description,
        arguments=[
            McpPromptArgument(name=a.name, description=a.description, required=bool(a.required))
            for a in prompt.arguments or []
        ],
    )


def resource_contents(
    contents: mt.TextResourceContents | mt.BlobResourceContents,
) -> McpContent:
    """A resource's text or blob as a ``resource`` content block."""
    if isinstance(contents, mt.TextResourceContents):
        return McpContent(
            type="resource", uri=contents.uri, mime_type=contents.mime_type, text=contents.text
        )
    return McpContent(
        type="resource", uri=contents.uri, mime_type=contents.mime_type, data=contents.blob
    )


def content_block(block: mt.ContentBlock) -> McpContent:
    """One content block of a result or a prompt message."""
    match block:
        case mt.TextContent():
            return McpContent(type="text", text=block.text)
        case mt.ImageContent():
            return McpContent(type="image", data=block.data, mime_type=block.mime_type)
        case mt.AudioContent():
            return McpContent(type="audio", data=block.data, mime_type=block.mime_type)
        case mt.ResourceLink():
            return McpContent(
                type="resource_link", uri=block.uri, name=block.name, mime_type=block.mime_type
            )
        case mt.EmbeddedResource():
            return resource_contents(block.resource)
        case _:
            assert_never(block)


def call_result(result: mt.CallToolResult) -> McpCallResult:
    """A ``tools/call`` result; structured content is always an object."""
    structured = result.structured_content
    if structured is not None and not isinstance(structured, dict):
        # Only a 2026-07-28 session may carry a non-object; we speak 2025-11-25.
        structured = {"value": structured}
    return McpCallResult(
        content=[content_block(block) for block in result.content],
        structured=structured,
        is_error=result.is_error,
    )


def prompt_result(result: mt.GetPromptResult) -> McpPromptResult:
    """A ``prompts/get`` result: the filled-in prompt's messages."""
    return McpPromptResult(
        description=result.description,
        messages=[
            McpPromptMessage(role=m.role, content=content_block(m.content)) for m in result.messages
        ],
    )


# -- error text ------------------------------------------------------------------


def connection_lost(exc: MCPError) -> bool:
    """Whether ``exc`` says the connection is gone rather than the request failed."""
    # stdio EOF and a dropped HTTP stream are CONNECTION_CLOSED; an HTTP
    # server that restarted has forgotten our session id.
    return exc.code == mt.CONNECTION_CLOSED or (
        exc.code == mt.INVALID_REQUEST and exc.message == "Session terminated"
    )


def exit_phrase(status: int) -> str:
    """How a process ended, from its return code: "exited with status 1"."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def leaf(exc: BaseException | None) -> BaseException | None:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = next(
            (e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)),
            exc.exceptions[0],
        )
    return exc


def one_line(exc: BaseException) -> str:
    """``exc``'s text on one line, cut short (its type's name when it has none)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:STDERR_HINT_CHARS]


def safe_url(url: str) -> str:
    """``url`` without credentials, query or fragment (they may hold secrets)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


__all__ = [
    "STDERR_HINT_CHARS",
    "call_result",
    "connection_lost",
    "content_block",
    "exit_phrase",
    "leaf",
    "one_line",
    "prompt_info",
    "prompt_result",
    "resource_contents",
    "resource_info",
    "safe_url",
    "tool_info",
]
