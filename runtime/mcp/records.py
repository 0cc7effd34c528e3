"""What crosses the boundary of an MCP session: plain pydantic records.

The session (:mod:`runtime.mcp.session`) turns the ``mcp`` SDK's types into
these, so that a persona, the tools and the Ray actors never handle SDK
objects (they pickle badly and change between SDK majors).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Transport = Literal["stdio", "http"]
ServerState = Literal["starting", "ready", "failed", "restarting", "closed"]


class McpLaunch(BaseModel):
    """Everything a session needs to reach one server, secrets already filled in.

    Built by :func:`runtime.mcp.config.launch_for` from a server's ``mcp.json``
    entry; never logged or audited (``env`` and ``headers`` may hold secrets).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    transport: Transport
    # stdio: the program, its arguments, its whole (scrubbed) environment, its cwd.
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    # streamable HTTP: the endpoint and its request headers.
    url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    # Seconds one tool call (or list/read request) may take.
    call_timeout: float = 60.0
    # Seconds from spawning/connecting until the session is initialized.
    startup_timeout: float = 30.0
    # Where a stdio server's stderr goes (appended); None: discarded.
    stderr_log: str | None = None


class McpToolInfo(BaseModel):
    """One tool as the server lists it (its schema passed through unchanged)."""

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    # The server's hints, snake_case: read_only_hint, destructive_hint,
    # idempotent_hint, open_world_hint, title.
    annotations: dict[str, Any] = Field(default_factory=dict)


class McpContent(BaseModel):
    """One content block of a result, resource or prompt message."""

    type: Literal["text", "image", "audio", "resource_link", "resource"]
    text: str | None = None
    # base64 for image/audio and binary embedded resources
    data: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    name: str | None = None


class McpCallResult(BaseModel):
    """A ``tools/call`` result: content blocks, structured content, ``isError``."""

    content: list[McpContent] = Field(default_factory=list)
    structured: dict[str, Any] | None = None
    is_error: bool = False


class McpResourceInfo(BaseModel):
    uri: str
    name: str = ""
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None


class McpPromptArgument(BaseModel):
    name: str
    description: str | None = None
    required: bool = False


class McpPromptInfo(BaseModel):
    name: str
    title: str | None = None
    description: str | None = None
    arguments: list[McpPromptArgument] = Field(default_factory=list)


class McpPromptMessage(BaseModel):
    role: str
    content: McpContent


class McpPromptResult(BaseModel):
    description: str | None = None
    messages: list[McpPromptMessage] = Field(default_factory=list)


class McpServerStatus(BaseModel):
    """How a session stands; ``tools_version`` grows whenever the list changed."""

    name: str
    state: ServerState
    # Why it is failed/restarting (a readable line, never a traceback).
    error: str | None = None
    tools_version: int = 0
    restarts: int = 0
    has_resources: bool = False
    has_prompts: bool = False
    # "name version" from the server's initialize result.
    server_info: str | None = None


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
