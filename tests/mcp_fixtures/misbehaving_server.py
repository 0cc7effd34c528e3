"""A small stdio MCP server that misbehaves on request (tests of ``runtime.mcp.session``).

Built on the SDK's own server side (``MCPServer``, v1's ``FastMCP``), so the
session is tested against an independent implementation of the protocol.
Run it as ``python -m tests.mcp_fixtures.misbehaving_server`` or by path.

Tools:

- ``ok`` answers at once, ``hang`` never answers, ``crash`` kills the
  process mid-call;
- ``fail`` raises (an ``isError`` result), ``refuse`` answers with a
  JSON-RPC error;
- ``add_tool`` registers a tool and sends ``notifications/tools/list_changed``;
- ``spawn_child`` leaves a child process behind; ``pid``, ``env`` and ``cwd``
  describe the process; ``trace_meta`` answers the request's ``_meta`` traceparent.

It writes :data:`STARTUP_STDERR` to stderr at startup. With ``--tools-only``
it is instead a lowlevel server with one tool (``only``) and neither the
resources nor the prompts capability.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

#: What the server writes to stderr when it starts (the tests look for it).
STARTUP_STDERR = "misbehaving server: starting up"

server = MCPServer("misbehaving", version="1.0.0")


@server.tool()
async def ok(text: str = "") -> str:
    """Answer at once."""
    return f"ok {text}".strip()


@server.tool()
async def hang() -> str:
    """Never answer."""
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
async def crash() -> str:
    """Exit the whole process in the middle of the call."""
    os._exit(1)


@server.tool()
async def fail() -> str:
    """Raise a tool error: the SDK turns it into an ``isError`` result."""
    raise ToolError("deliberate failure")


@server.tool()
async def refuse() -> str:
    """Answer with a JSON-RPC error instead of a result."""
    raise MCPError(code=types.INVALID_PARAMS, message="refused on purpose")


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register a tool called ``name`` and tell the client the list changed."""

    async def added() -> str:
        return f"{name} answers"

    server.add_tool(added, name=name, description=f"added at run time: {name}")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def spawn_child() -> int:
    """Start a long sleep (in the server's process group); its pid."""
    child = await asyncio.create_subprocess_exec("sleep", "600")
    return child.pid


@server.tool()
async def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def env(name: str) -> str:
    """An environment variable of the server ("<unset>" when it has none)."""
    return os.environ.get(name, "<unset>")


@server.tool()
async def trace_meta(ctx: Context) -> str:
    """The ``traceparent`` the request carried in its ``_meta`` (empty: none)."""
    meta = ctx.request_context.meta or {}
    return str(dict(meta).get("traceparent", ""))


@server.tool()
async def cwd() -> str:
    """The server's working directory."""
    return os.getcwd()


async def _serve_tools_only() -> None:
    """A lowlevel server: one tool, no resources or prompts capability."""
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    only = types.Tool(name="only", input_schema={"type": "object"})

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[only])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text="only")])

    bare: Server[Any] = Server("tools-only", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await bare.run(read, write, bare.create_initialization_options())


def main() -> None:
    print(STARTUP_STDERR, file=sys.stderr, flush=True)
    if "--tools-only" in sys.argv[1:]:
        asyncio.run(_serve_tools_only())
    else:
        server.run()


if __name__ == "__main__":
    main()
