"""A persona's MCP servers: their sessions, their tool lists, their calls.

:class:`McpHub` is what a persona's tools reach MCP through
(``ctx.services.mcp``). It reads the persona's ``mcp.json`` files
(:mod:`runtime.mcp.config`), holds one :class:`McpClient` per server — a
session in this process (:class:`LocalMcpClient`, tests and in-process runs)
or in its own Ray actor (``actors.mcp``), built by the factory it is given —
and keeps a snapshot of every server's tools for the turn loop.

:meth:`McpHub.refresh` runs before each model call: it rereads changed
config files, starts sessions not started yet (the first turn waits at most
each server's ``startup_timeout``; persona activation never does), picks up
changed tool lists (``notifications/tools/list_changed`` bumps a session's
``tools_version``), and starts again a server whose start failed, with
backoff. A server that is down never blocks a turn: its calls fail at once
with a readable error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from coterie.runtime.errors import ToolError
from coterie.runtime.mcp.config import CONFIG_FILE, ConfiguredServer, launch_for, load_servers
from coterie.runtime.mcp.records import (
    McpCallResult,
    McpContent,
    McpLaunch,
    McpPromptInfo,
    McpPromptResult,
    McpResourceInfo,
    McpServerStatus,
    McpToolInfo,
)
from coterie.runtime.tracing.spans import finish_mcp, start_mcp

log = logging.getLogger("coterie.mcp")

#: Seconds before a server whose start failed is tried again (doubling).
RETRY_FIRST, RETRY_MAX = 5.0, 300.0


class McpClient(Protocol):
    """One server's session, wherever it runs."""

    async def start(self) -> McpServerStatus: ...

    async def status(self) -> McpServerStatus: ...

    async def tools(self) -> list[McpToolInfo]: ...

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> McpCallResult: ...

    async def list_resources(self) -> list[McpResourceInfo]: ...

    async def read_resource(self, uri: str) -> list[McpContent]: ...

    async def list_prompts(self) -> list[McpPromptInfo]: ...

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> McpPromptResult: ...

    async def close(self) -> None: ...


#: Builds the client of one server: ``(launch, shared)``.
ClientFactory = Callable[[McpLaunch, bool], McpClient]


class LocalMcpClient:
    """An :class:`~runtime.mcp.session.McpSession` in this process."""

    def __init__(self, launch: McpLaunch) -> None:
        from coterie.runtime.mcp.session import McpSession  # the SDK: only when a server is used

        self.session = McpSession(launch)

    async def start(self) -> McpServerStatus:
        return await self.session.start()

    async def status(self) -> McpServerStatus:
        return self.session.status()

    async def tools(self) -> list[McpToolInfo]:
        return await self.session.tools()

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> McpCallResult:
        return await self.session.call_tool(name, arguments, timeout, trace)

    async def list_resources(self) -> list[McpResourceInfo]:
        return await self.session.list_resources()

    async def read_resource(self, uri: str) -> list[McpContent]:
        return await self.session.read_resource(uri)

    async def list_prompts(self) -> list[McpPromptInfo]:
        return await self.session.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> McpPromptResult:
        return await self.session.get_prompt(name, arguments)

    async def close(self) -> None:
        await self.session.close()


def local_clients(launch: McpLaunch, shared: bool) -> McpClient:
    """The in-process factory: every server (shared or not) in this process."""
    return LocalMcpClient(launch)


@dataclass
class ServerView:
    """One configured server as the tools see it."""

    name: str
    description: str
    shared: bool
    status: McpServerStatus
    tools: list[McpToolInfo] = field(default_factory=list)


@dataclass
class _Entry:
    server: ConfiguredServer
    client: McpClient | None = None
    status: McpServerStatus | None = None
    tools: list[McpToolInfo] = field(default_factory=list)
    retry_at: float = 0.0
    retry_delay: float = RETRY_FIRST

    def view(self) -> ServerView:
        status = self.status or McpServerStatus(name=self.server.name, state="starting")
        cfg = self.server.config
        return ServerView(self.server.name, cfg.description, cfg.shared, status, list(self.tools))


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime, st.st_size)


class McpHub:
    """The MCP servers of one persona (see the module docstring).

    Raises :class:`~runtime.mcp.config.McpConfigError` at construction (and
    from :meth:`refresh` after an edit) when an ``mcp.json`` is wrong.
    """

    def __init__(
        self,
        *,
        persona: str,
        home: Path,
        persona_dir: Path,
        workspace: Path,
        factory: ClientFactory = local_clients,
        gateway: bool = False,
        logs: Path | None = None,
    ) -> None:
        self.persona = persona
        self.home = home
        self.persona_dir = persona_dir
        self.workspace = workspace
        self.factory = factory
        self.gateway = gateway
        self.logs = logs or home / "logs" / "mcp"
        self._files = (home / CONFIG_FILE, persona_dir / CONFIG_FILE)
        self._stamps = self._file_stamps()
        self._entries = {n: _Entry(s) for n, s in load_servers(home, persona_dir).items()}
        self._lock = asyncio.Lock()
        #: Grows whenever any server's tool list (or the set of servers) changed.
        self.version = 0

    def _file_stamps(self) -> tuple[tuple[float, int] | None, ...]:
        return tuple(_stamp(p) for p in self._files)

    @property
    def configured(self) -> bool:
        """Whether the persona has any MCP server (or a config file to watch)."""
        return bool(self._entries) or any(s is not None for s in self._stamps)

    # -- keeping up to date ----------------------------------------------------

    async def refresh(self) -> None:
        """Bring the servers and their tool lists up to date (see the module docstring)."""
        if not self.configured and self._file_stamps() == self._stamps:
            return
        async with self._lock:
            await self._reload_config()
            due = [e for e in self._entries.values() if self._start_due(e)]
            if due:
                await asyncio.gather(*(self._start(e) for e in due))
            live = [e for e in self._entries.values() if e.client is not None and e not in due]
            if live:
                await asyncio.gather(*(self._poll(e) for e in live))

    async def _reload_config(self) -> None:
        stamps = self._file_stamps()
        if stamps == self._stamps:
            return
        servers = load_servers(self.home, self.persona_dir)  # raises on a wrong file
        self._stamps = stamps
        for name, entry in list(self._entries.items()):
            if servers.get(name) != entry.server:
                del self._entries[name]
                await self._close_entry(entry)
                self.version += 1
        for name, server in servers.items():
            if name not in self._entries:
                self._entries[name] = _Entry(server)
        log.info("%s: MCP configuration reloaded (%d servers)", self.persona, len(servers))

    def _start_due(self, entry: _Entry) -> bool:
        if entry.client is None:
            return time.monotonic() >= entry.retry_at
        return False

    def _launch(self, entry: _Entry) -> McpLaunch:
        server = entry.server
        if server.config.shared:
            return launch_for(server, persona_dir=None, workspace=None, logs=self.logs / "shared")
        return launch_for(
            server,
            persona_dir=self.persona_dir,
            workspace=self.workspace,
            logs=self.logs / self.persona,
        )

    async def _start(self, entry: _Entry) -> None:
        name = entry.server.name
        try:
            launch = await asyncio.to_thread(self._launch, entry)  # reads the .env
        except ToolError as exc:
            self._failed(entry, exc.detail)
            return
        client = self.factory(launch, entry.server.config.shared)
        try:
            status = await client.start()
            tools = await client.tools() if status.state == "ready" else []
        except Exception as exc:  # boundary: a broken client must not fail the turn
            await _quietly_close(client)
            self._failed(entry, f"server {name!r}: {type(exc).__name__}: {exc}")
            return
        if status.state != "ready":
            await _quietly_close(client)
            self._failed(entry, status.error or f"server {name!r} did not start")
            return
        entry.client, entry.status, entry.tools = client, status, tools
        entry.retry_delay = RETRY_FIRST
        self.version += 1
        log.info("%s: MCP server %s ready (%d tools)", self.persona, name, len(tools))

    def _failed(self, entry: _Entry, error: str) -> None:
        name = entry.server.name
        log.warning("%s: MCP server %s unavailable: %s", self.persona, name, error)
        entry.status = McpServerStatus(name=name, state="failed", error=error)
        entry.retry_at = time.monotonic() + entry.retry_delay
        entry.retry_delay = min(entry.retry_delay * 2, RETRY_MAX)

    async def _poll(self, entry: _Entry) -> None:
        assert entry.client is not None
        try:
            status = await entry.client.status()
            if entry.status is None or status.tools_version != entry.status.tools_version:
                entry.tools = await entry.client.tools()
                self.version += 1
            entry.status = status
        except Exception as exc:  # the client (its actor) is gone: start anew
            client, entry.client = entry.client, None
            await _quietly_close(client)
            self._failed(entry, f"server {entry.server.name!r}: {type(exc).__name__}: {exc}")

    async def _close_entry(self, entry: _Entry) -> None:
        if entry.client is not None:
            client, entry.client = entry.client, None
            await _quietly_close(client)

    # -- what the tools use ----------------------------------------------------

    def servers(self) -> list[ServerView]:
        """Every configured server, by name."""
        return [self._entries[n].view() for n in sorted(self._entries)]

    def call_timeout(self, server: str) -> float:
        """Seconds one call to ``server`` may take (its ``timeout``)."""
        entry = self._entries.get(server)
        return entry.server.config.timeout if entry is not None else 60.0

    def has_resources(self) -> bool:
        return any(e.status is not None and e.status.has_resources for e in self._entries.values())

    def has_prompts(self) -> bool:
        return any(e.status is not None and e.status.has_prompts for e in self._entries.values())

    def _client(self, server: str) -> McpClient:
        entry = self._entries.get(server)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            raise ToolError("not_found", f"no MCP server named {server!r}; configured: {known}")
        if entry.client is None:
            why = entry.status.error if entry.status is not None else "it has not started yet"
            raise ToolError("server_unavailable", f"MCP server {server!r} is unavailable: {why}")
        return entry.client

    async def call(self, server: str, tool: str, arguments: dict[str, Any]) -> McpCallResult:
        """Call ``tool`` of ``server``; raises :class:`~runtime.errors.ToolError`.

        A ``tools/call {tool}`` span; its trace context goes to the server
        in the request's ``_meta`` (``traceparent``), as MCP's conventions ask."""
        span = start_mcp(method="tools/call", target=tool, server=server)
        try:
            result = await self._client(server).call_tool(tool, arguments, trace=span.carrier())
        except BaseException as exc:
            finish_mcp(span, error=exc)
            raise
        finish_mcp(span, is_error=result.is_error)
        return result

    async def list_resources(self, server: str) -> list[McpResourceInfo]:
        return await self._client(server).list_resources()

    async def read_resource(self, server: str, uri: str) -> list[McpContent]:
        span = start_mcp(method="resources/read", target=uri, server=server)
        try:
            contents = await self._client(server).read_resource(uri)
        except BaseException as exc:
            finish_mcp(span, error=exc)
            raise
        finish_mcp(span)
        return contents

    async def list_prompts(self, server: str) -> list[McpPromptInfo]:
        return await self._client(server).list_prompts()

    async def get_prompt(
        self, server: str, name: str, arguments: dict[str, str]
    ) -> McpPromptResult:
        span = start_mcp(method="prompts/get", target=name, server=server)
        try:
            prompt = await self._client(server).get_prompt(name, arguments)
        except BaseException as exc:
            finish_mcp(span, error=exc)
            raise
        finish_mcp(span)
        return prompt

    async def aclose(self) -> None:
        """Stop every session this persona holds (shared ones stay up)."""
        async with self._lock:
            for entry in self._entries.values():
                await self._close_entry(entry)


async def _quietly_close(client: McpClient) -> None:
    try:
        await client.close()
    except Exception as exc:  # closing what already died
        log.debug("closing an MCP client failed: %s", exc)


__all__ = [
    "ClientFactory",
    "LocalMcpClient",
    "McpClient",
    "McpHub",
    "ServerView",
    "local_clients",
]
