"""The roster of coding agents a persona may delegate to: ``<home>/acp.json``.

Each entry names an external program that speaks the Agent Client Protocol
over stdio (Claude Code through ``claude-agent-acp``, Gemini CLI, Codex…)::

    {
      "agents": {
        "claude": {
          "description": "Claude Code over ACP",
          "command": "node",
          "args": ["${home}/agents/claude-agent-acp/dist/index.js"],
          "env": {
            "ANTHROPIC_API_KEY": "${secret:ANTHROPIC_API_KEY}",
            "IS_SANDBOX": "1"
          },
          "cwd": "workspace",
          "permissions": "workspace",
          "startup_timeout": 60,
          "prompt_timeout": 1800,
          "default": true
        }
      }
    }

Fields of an agent (every other field is an error):

``description``
    One line shown to the persona (optional).
``command``
    The program: a name looked up on the agent's ``PATH``
    (:data:`runtime.shell.SAFE_PATH`), or an absolute path. ``~`` and
    ``${home}`` (the coterie home holding this file) are expanded; a relative
    path with a ``/`` is taken relative to the home.
``args``
    Its arguments, verbatim except for ``${home}``.
``env``
    Extra environment variables. The agent gets a scrubbed environment
    (:func:`runtime.shell.scrubbed_env`): nothing of the runtime's own, in
    particular none of its API keys, unless listed here. A value may be
    literal, or hold ``${secret:NAME}`` (``NAME`` from the delegating
    persona's ``.env``) or ``${env:NAME}`` (``NAME`` from the runtime's own
    environment: the way to hand the agent the runtime's key on purpose).
    ``PATH``, ``HOME``, ``LD_*`` and ``DYLD_*`` cannot be set.
``cwd``
    ``"workspace"`` (default): the session runs in the persona's workspace.
    ``"any-in-rails"``: the delegating tool may name another directory, as
    long as the persona's path rails allow it (checked by the tool).
``permissions``
    How the agent's ``session/request_permission`` calls are answered:
    ``"workspace"`` (default) allows once when every path the request touches
    resolves inside the session's root, and denies anything else (commands,
    network fetches, paths outside); ``"deny"`` denies every request;
    ``"allow"`` allows every request once; ``"ask"`` puts each request to the
    delegating persona's permission rules (tool ``coding_agent``: its
    command, its paths) and, where no rule allows or denies it, to a person
    as an approval.
``startup_timeout``
    Seconds from spawning the agent until its session exists (default 60;
    cold adapters take 5–60 s).
``prompt_timeout``
    Seconds one delegated task may run before it is cancelled (default 1800).
``default``
    The agent used when the persona names none (at most one may say so; a
    roster of one agent needs no ``default``).

A missing file is an empty roster. A wrong one raises :class:`AcpRosterError`
(a :class:`runtime.errors.ConfigError`) naming the file, the agent and the
field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from coterie.runtime.config import describe_entry_error, read_json_config
from coterie.runtime.errors import ConfigError
from coterie.runtime.shell.env import check_env_entry, fill_references

ROSTER_FILE = "acp.json"
AGENT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_HOME_REF = "${home}"

CwdPolicy = Literal["workspace", "any-in-rails"]
PermissionPolicy = Literal["workspace", "deny", "allow", "ask"]


class AcpRosterError(ConfigError):
    """``acp.json`` is invalid; the message names the file, the agent and the field."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid ACP roster {path}:\n{lines}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        return (type(self), (self.path, self.problems))


class AgentSpec(BaseModel):
    """One coding agent of the roster (see the module docstring for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: CwdPolicy = "workspace"
    permissions: PermissionPolicy = "workspace"
    startup_timeout: float = Field(default=60.0, gt=0, le=600)
    prompt_timeout: float = Field(default=1800.0, gt=0, le=86400)
    default: bool = False

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            check_env_entry(key, value)
        return env


class AcpRoster(BaseModel):
    """Every agent of ``acp.json``, by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: dict[str, AgentSpec] = Field(default_factory=dict)

    @field_validator("agents")
    @classmethod
    def _check_agents(cls, agents: dict[str, AgentSpec]) -> dict[str, AgentSpec]:
        bad = [n for n in agents if not AGENT_NAME_RE.match(n)]
        if bad:
            raise ValueError(
                f"agent name {bad[0]!r}: expected lowercase letters, digits, '-' or '_'"
            )
        defaults = [n for n, a in agents.items() if a.default]
        if len(defaults) > 1:
            raise ValueError(f"more than one default agent: {', '.join(defaults)}")
        return agents

    def get(self, name: str) -> AgentSpec | None:
        """The agent called ``name``, if any."""
        return self.agents.get(name)

    def default_name(self) -> str | None:
        """The agent marked ``default``, else the only agent, else ``None``."""
        for name, agent in self.agents.items():
            if agent.default:
                return name
        if len(self.agents) == 1:
            return next(iter(self.agents))
        return None

    def names(self) -> list[str]:
        return sorted(self.agents)


def _expand_home(value: str, home: Path) -> str:
    return value.replace(_HOME_REF, str(home))


def _expand_command(command: str, home: Path) -> str:
    command = os.path.expanduser(_expand_home(command, home))
    if "/" in command and not os.path.isabs(command):
        command = str(home / command)
    return command


def parse_acp_roster(raw: Any, *, path: Path, home: Path) -> AcpRoster:
    """Validate an already-decoded ``acp.json`` and expand ``${home}``."""
    if not isinstance(raw, dict):
        raise AcpRosterError(str(path), ["(top level): expected a JSON object"])
    try:
        roster = AcpRoster.model_validate(raw)
    except ValidationError as exc:
        problems = [describe_entry_error(e, section="agents", label="agent") for e in exc.errors()]
        raise AcpRosterError(str(path), problems) from None
    agents = {
        name: spec.model_copy(
            update={
                "command": _expand_command(spec.command, home),
                "args": [_expand_home(a, home) for a in spec.args],
            }
        )
        for name, spec in roster.agents.items()
    }
    return AcpRoster(agents=agents)


def load_acp_roster(home: Path) -> AcpRoster:
    """``<home>/acp.json``; a missing file is an empty roster.

    Synchronous (a small file): call it through ``asyncio.to_thread`` from an
    event loop.
    """
    path = home / ROSTER_FILE
    raw = read_json_config(path, AcpRosterError)
    if raw is None:
        return AcpRoster()
    return parse_acp_roster(raw, path=path, home=home)


def resolve_agent_env(
    spec: AgentSpec,
    *,
    persona_dir: Path | None,
    environ: Mapping[str, str] | None = None,
    agent: str = "agent",
) -> dict[str, str]:
    """``spec.env`` with every ``${secret:NAME}`` and ``${env:NAME}`` filled in.

    Secrets come from ``persona_dir/.env``, ``${env:…}`` from ``environ``
    (default ``os.environ``). A reference that is not set raises
    ``ToolError("missing_secret")`` naming it (the persona can read that).
    Synchronous: it reads the ``.env`` file.
    """
    return fill_references(
        spec.env, persona_dir=persona_dir, environ=environ, what=f"coding agent {agent!r}"
    )


class RosterFile:
    """``<home>/acp.json``, read again whenever the file changes."""

    def __init__(self, home: Path) -> None:
        self.path = home / ROSTER_FILE
        self.home = home
        self._seen: tuple[float, int] | None = None
        self._roster: AcpRoster | None = None
        self._error: AcpRosterError | None = None

    def _stamp(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def exists(self) -> bool:
        """Whether there is a roster file (an invalid one counts)."""
        return self._stamp() is not None

    def get(self) -> AcpRoster:
        """The roster; raises :class:`AcpRosterError` when the file is wrong."""
        stamp = self._stamp()
        if stamp != self._seen or (self._roster is None and self._error is None):
            self._seen = stamp
            try:
                self._roster, self._error = load_acp_roster(self.home), None
            except AcpRosterError as exc:
                self._roster, self._error = None, exc
        if self._error is not None:
            raise self._error
        assert self._roster is not None
        return self._roster

    def offered(self) -> bool:
        """Whether the coding agent tools are shown: a roster with agents, or a
        wrong file (so that a call can say what is wrong with it)."""
        if not self.exists():
            return False
        try:
            return bool(self.get().agents)
        except AcpRosterError:
            return True


__all__ = [
    "AGENT_NAME_RE",
    "ROSTER_FILE",
    "AcpRoster",
    "AcpRosterError",
    "AgentSpec",
    "CwdPolicy",
    "PermissionPolicy",
    "RosterFile",
    "load_acp_roster",
    "parse_acp_roster",
    "resolve_agent_env",
]
