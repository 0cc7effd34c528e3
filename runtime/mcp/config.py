"""Which MCP servers a persona uses: ``mcp.json`` in the home and in the persona.

Both files have the shape most MCP clients read (``mcpServers``)::

    {
      "mcpServers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "git": {
          "command": "mcp-server-git",
          "args": ["--repository", "."],
          "cwd": "workspace",
          "timeout": 30
        },
        "tracker": {
          "url": "http://127.0.0.1:9000/mcp",
          "headers": {"Authorization": "Bearer ${secret:TRACKER_TOKEN}"}
        }
      }
    }

``<home>/mcp.json`` gives every persona its servers; ``<home>/personas/<name>/mcp.json``
adds the persona's own (an entry of the same name replaces the home's).

Fields of a server (every other field is an error naming the file, the server
and the field):

``command``, ``args``, ``env``, ``cwd``
    A stdio server: the program (a name looked up on :data:`~runtime.shell.SAFE_PATH`
    plus the runtime's own ``bin`` directory, or a path; ``~`` expanded, a
    relative path with a ``/`` taken from the file's directory), its
    arguments, extra environment variables and its working directory. The
    server gets a scrubbed environment (none of the runtime's variables, in
    particular none of its API keys) plus ``env``, whose values may hold
    ``${secret:NAME}`` (from the persona's ``.env``) or ``${env:NAME}`` (from
    the runtime's environment). ``cwd``: ``"workspace"`` (default, the
    persona's workspace), or a path (relative to the file's directory).
``url``, ``headers``
    A streamable-HTTP server; header values may hold the same references.
``type``
    Optional: ``"stdio"`` or ``"http"`` (also spelled ``"streamable-http"``);
    inferred from ``command``/``url``. ``"sse"`` (the old transport) is refused.
``timeout``
    Seconds one call may take (default 60): then the call returns
    ``{"error": "timeout"}`` and the session is recycled.
``startup_timeout``
    Seconds until the server must have answered ``initialize`` (default 30).
``shared``
    ``true`` (home file only): one session for every persona instead of one
    per persona. A shared server may not use ``${secret:…}`` (whose persona?).
``disabled``
    ``true``: the entry is ignored.
``description``
    One line shown to the persona in gateway mode.

Server names are letters, digits, ``-`` and ``_`` (no ``__``: tools are named
``<server>__<tool>``). A missing file means no servers.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from coterie.runtime.config import describe_entry_error, read_json_config
from coterie.runtime.errors import ConfigError, PersonaConfigError
from coterie.runtime.mcp.records import McpLaunch
from coterie.runtime.shell.env import (
    SAFE_PATH,
    check_env_entry,
    check_references,
    fill_references,
    has_secret_reference,
    scrubbed_env,
)

CONFIG_FILE = "mcp.json"
SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")
#: How a server's tools are named for the model.
SEPARATOR = "__"
HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


class McpConfigError(PersonaConfigError):
    """An ``mcp.json`` is invalid; the message names the file, the server and the field.

    A persona file error (it is part of the persona's configuration): a persona
    whose ``mcp.json`` is wrong does not start, and says why.
    """

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        ConfigError.__init__(self, f"invalid MCP configuration {path}:\n{lines}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        return (type(self), (self.path, self.problems))


class McpServerConfig(BaseModel):
    """One entry of ``mcpServers`` (see the module docstring for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["stdio", "http"] | None = None
    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = "workspace"
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=60.0, gt=0, le=3600)
    startup_timeout: float = Field(default=30.0, gt=0, le=600)
    shared: bool = False
    disabled: bool = False
    description: str = ""

    @field_validator("type", mode="before")
    @classmethod
    def _type_spelling(cls, value: Any) -> Any:
        if value in HTTP_TYPES:
            return "http"
        if value == "sse":
            raise ValueError(
                "the SSE transport is not supported: use the server's streamable HTTP endpoint"
            )
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            check_env_entry(key, value)
        return env

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for key, value in headers.items():
            if not key or any(c in key for c in ":\r\n ") or "\n" in value or "\r" in value:
                raise ValueError(f"{key!r} is not a valid header")
            check_references(key, value)
        return headers

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        kind = self.type or ("http" if self.url is not None else "stdio")
        if kind == "stdio":
            if self.command is None:
                raise ValueError("a stdio server needs 'command' (or give 'url' for HTTP)")
            if self.url is not None or self.headers:
                raise ValueError("'url' and 'headers' belong to HTTP servers, not stdio ones")
        else:
            if self.url is None:
                raise ValueError("an HTTP server needs 'url'")
            if self.command is not None or self.args or self.env:
                raise ValueError("'command', 'args' and 'env' belong to stdio servers")
        if self.shared and has_secret_reference([*self.env.values(), *self.headers.values()]):
            raise ValueError(
                "a shared server cannot use ${secret:…} (it serves every persona): use ${env:…}"
            )
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return self.type or ("http" if self.url is not None else "stdio")


class McpConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mcpServers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("mcpServers")
    @classmethod
    def _names(cls, servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in servers:
            if not SERVER_NAME_RE.match(name) or SEPARATOR in name:
                raise ValueError(
                    f"server name {name!r}: expected letters, digits, '-' or '_' "
                    f"(at most 48, no {SEPARATOR!r})"
                )
        return servers


@dataclass(frozen=True)
class ConfiguredServer:
    """A server entry and the file (and its directory) it came from."""

    name: str
    config: McpServerConfig
    source: Path

    @property
    def base(self) -> Path:
        return self.source.parent


def parse_mcp_config(raw: Any, *, path: Path) -> McpConfigFile:
    """Validate an already-decoded ``mcp.json``."""
    if not isinstance(raw, dict):
        raise McpConfigError(str(path), ["(top level): expected a JSON object"])
    try:
        return McpConfigFile.model_validate(raw)
    except ValidationError as exc:
        problems = [
            describe_entry_error(
                e, section="mcpServers", label="server", top_hint="servers go under 'mcpServers'"
            )
            for e in exc.errors()
        ]
        raise McpConfigError(str(path), problems) from None


def read_mcp_file(path: Path) -> McpConfigFile:
    """One ``mcp.json``; a missing file has no servers. Synchronous (small file)."""
    raw = read_json_config(path, McpConfigError)
    return McpConfigFile() if raw is None else parse_mcp_config(raw, path=path)


def load_servers(home: Path, persona_dir: Path | None) -> dict[str, ConfiguredServer]:
    """The servers a persona uses: the home's, then its own (same name: its own wins).

    Disabled entries are left out; ``shared`` in a persona's file is an error.
    """
    servers: dict[str, ConfiguredServer] = {}
    home_file = home / CONFIG_FILE
    for name, cfg in read_mcp_file(home_file).mcpServers.items():
        servers[name] = ConfiguredServer(name, cfg, home_file)
    if persona_dir is not None:
        own_file = persona_dir / CONFIG_FILE
        for name, cfg in read_mcp_file(own_file).mcpServers.items():
            if cfg.shared:
                raise McpConfigError(
                    str(own_file),
                    [f"server {name!r}, field 'shared': shared servers belong in {home_file}"],
                )
            servers[name] = ConfiguredServer(name, cfg, own_file)
    return {n: s for n, s in servers.items() if not s.config.disabled}


def _find_program(command: str, base: Path) -> str:
    command = os.path.expanduser(command)
    if os.path.isabs(command):
        return command
    if "/" in command:
        return str((base / command).resolve())
    # The runtime's own bin directory first: servers installed with pip next to coterie.
    for folder in [str(Path(sys.executable).parent), *SAFE_PATH.split(":")]:
        candidate = os.path.join(folder, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return command  # not found: the session says so when it starts


def launch_for(
    server: ConfiguredServer,
    *,
    persona_dir: Path | None,
    workspace: Path | None,
    logs: Path,
    environ: Mapping[str, str] | None = None,
) -> McpLaunch:
    """What a session needs to start ``server`` for one persona (or shared).

    Fills in the secrets: raises ``ToolError("missing_secret")`` naming a
    reference that is not set. ``logs`` is the folder for the server's stderr.
    """
    cfg = server.config
    what = f"MCP server {server.name!r}"
    stderr_log = str(logs / f"{server.name}.stderr.log")
    if cfg.transport == "http":
        headers = fill_references(cfg.headers, persona_dir=persona_dir, environ=environ, what=what)
        return McpLaunch(
            name=server.name,
            transport="http",
            url=cfg.url or "",
            headers=headers,
            call_timeout=cfg.timeout,
            startup_timeout=cfg.startup_timeout,
        )
    extra = fill_references(cfg.env, persona_dir=persona_dir, environ=environ, what=what)
    if cfg.cwd == "workspace":
        cwd = workspace if workspace is not None else server.base
    else:
        cwd = (server.base / os.path.expanduser(cfg.cwd)).resolve()
    own_home = workspace if workspace is not None else server.base
    env = scrubbed_env(home=own_home, extra=extra, parent=environ)
    # The runtime's bin directory stays reachable (pip-installed servers, node).
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return McpLaunch(
        name=server.name,
        transport="stdio",
        command=_find_program(cfg.command or "", server.base),
        args=list(cfg.args),
        env=env,
        cwd=str(cwd),
        call_timeout=cfg.timeout,
        startup_timeout=cfg.startup_timeout,
        stderr_log=stderr_log,
    )


__all__ = [
    "CONFIG_FILE",
    "SEPARATOR",
    "ConfiguredServer",
    "McpConfigError",
    "McpConfigFile",
    "McpServerConfig",
    "launch_for",
    "load_servers",
    "parse_mcp_config",
    "read_mcp_file",
]
