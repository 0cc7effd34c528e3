"""MCP servers for personas: the records that cross boundaries, and (loaded when
a server is used, as it imports the ``mcp`` SDK) :mod:`runtime.mcp.session`,
one supervised client session to one server.
"""

from __future__ import annotations

from coterie.runtime.mcp.records import (
    McpCallResult,
    McpContent,
    McpLaunch,
    McpPromptArgument,
    McpPromptInfo,
    McpPromptMessage,
    McpPromptResult,
    McpResourceInfo,
    McpServerStatus,
    McpToolInfo,
    ServerState,
    Transport,
)

__all__ = [
    "McpCallResult",
    "McpContent",
    "McpLaunch",
    "McpPromptArgument",
    "McpPromptInfo",
    "McpPromptMessage",
    "McpPromptResult",
    "McpResourceInfo",
    "McpServerStatus",
    "McpToolInfo",
    "ServerState",
    "Transport",
]
