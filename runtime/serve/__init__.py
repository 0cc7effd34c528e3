"""The front doors of a home: the HTTP API, its OpenAI-compatible route and
the chat page of ``coterie serve`` (aiohttp), and the MCP server of
``coterie mcp-serve`` — side by side, all over one
:class:`~runtime.frontdoor.FrontDoor`, and checking their callers by the
rules of :mod:`.auth`.

Importing this package loads neither aiohttp nor the MCP SDK: the token
rules, the state file and the client (what a command going through a
running server needs) load with it; the servers on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from coterie.runtime.serve.auth import DoorAuth, door_auth
from coterie.runtime.serve.client import ServedDoor, ServerClient, ServerError, find_server
from coterie.runtime.serve.discovery import ServeLock, ServerState, read_state, served_state

if TYPE_CHECKING:
    from coterie.runtime.serve.app import build_app, set_backend, set_starting_error
    from coterie.runtime.serve.http import ApiError
    from coterie.runtime.serve.mcp import DoorStarter, build_server
    from coterie.runtime.serve.mcp_transport import BearerAuth, http_auth, mcp_serve
    from coterie.runtime.serve.server import StartedRuntime, chat_app_connectors, run_server

#: Names loaded on first use, and the module each comes from.
_LAZY = {
    "build_app": "app",
    "set_backend": "app",
    "set_starting_error": "app",
    "ApiError": "http",
    "DoorStarter": "mcp",
    "build_server": "mcp",
    "BearerAuth": "mcp_transport",
    "http_auth": "mcp_transport",
    "mcp_serve": "mcp_transport",
    "StartedRuntime": "server",
    "chat_app_connectors": "server",
    "run_server": "server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ApiError",
    "BearerAuth",
    "DoorAuth",
    "DoorStarter",
    "ServeLock",
    "ServedDoor",
    "ServerClient",
    "ServerError",
    "ServerState",
    "StartedRuntime",
    "build_app",
    "build_server",
    "chat_app_connectors",
    "door_auth",
    "find_server",
    "http_auth",
    "mcp_serve",
    "read_state",
    "run_server",
    "served_state",
    "set_backend",
    "set_starting_error",
]
