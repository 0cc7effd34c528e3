"""MCP tools as the model sees them: ``<server>__<tool>`` specs and result text.

It sits beside the loop and the tool registry, not in :mod:`runtime.mcp`:
the MCP client side (sessions, the hub, their records) knows nothing of
turns and tools, and this module turns it into tools.

:class:`McpToolSource` is the :class:`~runtime.tool.ToolSource` of a persona's
:class:`~runtime.mcp.hub.McpHub`: each tool of each server becomes a
:class:`~runtime.tool.ToolSpec` named ``<server>__<tool>`` with the server's
own input schema (passed through) and annotations; the persona's allow/deny
patterns then apply to those names like to any tool's.

Results become text the model reads: text blocks as they are, images and
audio saved next to the turn's spilled output and referenced by path,
resource links and embedded resources by URI, structured content as JSON
(once, when no text block already says it). A result the server flagged
``isError`` is a ``tool_error``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.mcp.config import SEPARATOR
from coterie.runtime.mcp.hub import McpHub
from coterie.runtime.mcp.records import McpCallResult, McpContent, McpToolInfo
from coterie.runtime.runner import safe_name
from coterie.runtime.tool import PassThrough, ToolSpec

#: What a tool name sent to a provider may hold (OpenAI: ^[a-zA-Z0-9_-]{1,64}$).
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64
#: The runner's own bound sits above the session's: the session answers first.
TIMEOUT_MARGIN = 10.0
_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "audio/wav": ".wav",
    "audio/mpeg": ".mp3",
}


def tool_name(server: str, tool_: str) -> str:
    """``<server>__<tool>``, made safe for every provider (at most 64 characters)."""
    return _NAME_UNSAFE.sub("_", f"{server}{SEPARATOR}{tool_}")[:MAX_NAME]


# -- results -------------------------------------------------------------------


def _save(ctx: TurnContext, block: McpContent, index: int, label: str) -> str:
    """Write a base64 block next to the turn's spills; a line referencing it."""
    try:
        raw = base64.b64decode(block.data or "", validate=True)
    except (binascii.Error, ValueError):
        return f"[{label} {block.mime_type or '?'}: the server sent invalid base64]"
    folder = ctx.settings.spill_dir / safe_name(ctx.turn_id)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = _EXTENSIONS.get(block.mime_type or "", ".bin")
    path = folder / f"mcp-{index}{suffix}"
    while path.exists():
        index += 1
        path = folder / f"mcp-{index}{suffix}"
    path.write_bytes(raw)
    return f"[{label} {block.mime_type or 'application/octet-stream'}, {len(raw)} bytes: {path}]"


def render_blocks(ctx: TurnContext, blocks: list[McpContent]) -> list[str]:
    """Each content block as the text the model reads."""
    parts: list[str] = []
    for i, block in enumerate(blocks):
        if block.type == "text":
            parts.append(block.text or "")
        elif block.type in ("image", "audio"):
            parts.append(_save(ctx, block, i, block.type))
        elif block.type == "resource_link":
            extra = ", ".join(x for x in (block.name, block.mime_type) if x)
            parts.append(f"[resource {block.uri}{f' ({extra})' if extra else ''}]")
        elif block.text is not None:  # an embedded text resource
            parts.append(f"[resource {block.uri}]\n{block.text}")
        else:  # an embedded binary resource
            parts.append(f"[resource {block.uri}] " + _save(ctx, block, i, "resource"))
    return parts


def render_result(ctx: TurnContext, result: McpCallResult) -> str:
    """A call's result as text; raises ``tool_error`` when the server said isError."""
    parts = render_blocks(ctx, result.content)
    if result.structured is not None:
        encoded = json.dumps(result.structured, ensure_ascii=False)
        # Servers usually repeat structured content as a text block: once is enough.
        if not any(_same_json(p, result.structured) for p in parts):
            parts.append(encoded)
    text = "\n".join(parts) if parts else "(no content)"
    if result.is_error:
        raise ToolError("tool_error", text)
    return text


def _same_json(text: str, value: Any) -> bool:
    """Whether ``text`` already says ``value`` (also as a server SDK's
    ``{"result": …}`` wrapping of a plain return value)."""
    try:
        said = json.loads(text)
    except (ValueError, TypeError):
        said = text
    return bool(said == value or (isinstance(value, dict) and value == {"result": said}))


# -- one tool per server tool ----------------------------------------------------


def _describe(server: str, info: McpToolInfo) -> str:
    hints = info.annotations
    flags = [
        label
        for key, label in (
            ("read_only_hint", "read-only"),
            ("destructive_hint", "destructive"),
            ("idempotent_hint", "idempotent"),
            ("open_world_hint", "reaches outside systems"),
        )
        if hints.get(key)
    ]
    title = info.title or hints.get("title")
    head = (
        f"[MCP {server}{': ' + title if title else ''}{'; ' + ', '.join(flags) if flags else ''}]"
    )
    return f"{head} {info.description}".strip()


def _server_tool_spec(hub: McpHub, server: str, info: McpToolInfo, timeout: float) -> ToolSpec:
    async def call(args: PassThrough, ctx: TurnContext) -> str:
        result = await hub.call(server, info.name, args.arguments())
        return render_result(ctx, result)

    schema: dict[str, Any] = dict(info.input_schema) if info.input_schema else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return ToolSpec(
        name=tool_name(server, info.name),
        description=_describe(server, info),
        args_model=PassThrough,
        fn=call,
        timeout=timeout + TIMEOUT_MARGIN,
        parameters=schema,
        annotations=dict(info.annotations),
    )


class McpToolSource:
    """The :class:`~runtime.tool.ToolSource` of a persona's MCP servers.

    Offers nothing in gateway mode (the ``mcp`` tool does the work then).
    Specs are rebuilt only when a tool list changed.
    """

    def __init__(self, hub: McpHub) -> None:
        self.hub = hub
        self._built_at = -1
        self._specs: list[ToolSpec] = []

    async def refresh(self) -> None:
        await self.hub.refresh()

    def specs(self) -> list[ToolSpec]:
        if self.hub.gateway:
            return []
        if self._built_at != self.hub.version:
            specs: dict[str, ToolSpec] = {}
            for view in self.hub.servers():
                timeout = self.hub.call_timeout(view.name)
                for info in view.tools:
                    spec = _server_tool_spec(self.hub, view.name, info, timeout)
                    specs.setdefault(spec.name, spec)  # two names made alike: the first wins
            self._specs, self._built_at = list(specs.values()), self.hub.version
        return self._specs


__all__ = ["TIMEOUT_MARGIN", "McpToolSource", "render_blocks", "render_result", "tool_name"]
