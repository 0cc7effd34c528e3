"""``persona.yaml`` and its sections, and loading a persona directory.

A persona lives in ``<home>/personas/<name>/`` with ``persona.yaml`` (its
model, tools, access, network, subagents, coding agents, placement, skills,
permissions, team) and
``SOUL.md`` (its system prompt). Every field that is accepted is honoured;
unknown fields are errors naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from coterie.runtime.config._strict import Strict, describe_error
from coterie.runtime.config.home import check_persona_name, persona_exists, persona_names
from coterie.runtime.config.models import ModelConfig
from coterie.runtime.config.permissions import PermissionSettings
from coterie.runtime.config.placement import Placement
from coterie.runtime.config.usage import BudgetSettings, CompactionSettings
from coterie.runtime.errors import PersonaConfigError, UnknownPersonaError
from coterie.runtime.skills.format import skill_name_problem
from coterie.runtime.yaml_load import load_yaml

#: Above this many tools, ``catalogue: auto`` offers the core set and ``find_tools``.
CATALOGUE_AUTO_ABOVE = 20


class ToolFilter(Strict):
    """Allow and deny lists of tool names; ``*`` and ``?`` wildcards.

    ``catalogue``: ``on`` offers the model the full definitions of the
    ``core`` tools only, and ``find_tools`` to look up the others (found ones
    are offered from the next model call of the turn); ``off`` offers every
    allowed tool on every call; ``auto`` (the default) is ``on`` when more
    than ``CATALOGUE_AUTO_ABOVE`` tools are allowed. ``core`` (name patterns)
    replaces the default core set.
    """

    allow: list[str] = Field(default_factory=lambda: ["*"])
    deny: list[str] = Field(default_factory=list)
    catalogue: Literal["auto", "on", "off"] = "auto"
    core: list[str] | None = None

    @field_validator("catalogue", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        # YAML 1.1 reads bare on/off as booleans.
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


ThinkingMode = Literal["on", "off", "auto"]


AccessLevel = Literal["full", "workspace", "readonly"]


class NetworkSettings(Strict):
    """What a persona's tools may reach on the network.

    By default ``web_fetch`` reaches public addresses only: loopback,
    link-local (cloud metadata included), private and other non-public ranges
    and the Ray cluster's own nodes are refused unless listed in ``allow``
    (IP addresses, CIDR ranges such as ``10.1.0.0/16``, or host names).
    Shell commands inside bubblewrap get no network unless ``shell`` is true.
    """

    allow: list[str] = Field(default_factory=list)
    shell: bool = False


class SubagentSettings(Strict):
    """What ``spawn_subagent`` may start (``subagents:`` in persona.yaml).

    A subagent runs the persona's own model unless the call names one of
    ``models``; ``timeout_s`` applies when the call gives none, and no call
    may ask for more than ``max_timeout_s``. At most ``max_running`` run at
    once per persona; each has at most ``max_steps`` model calls.
    """

    models: dict[str, ModelConfig] = Field(default_factory=dict)
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)
    max_timeout_s: float = Field(default=1_800.0, gt=0, le=86_400)
    max_running: int = Field(default=4, ge=1, le=256)
    max_steps: int = Field(default=12, ge=1, le=200)

    @model_validator(mode="after")
    def _timeouts(self) -> SubagentSettings:
        if self.timeout_s > self.max_timeout_s:
            raise ValueError(
                f"timeout_s ({self.timeout_s:g}) is above max_timeout_s ({self.max_timeout_s:g})"
            )
        return self


class CodingAgentSettings(Strict):
    """``coding_agents:`` in persona.yaml (the agents themselves are in
    ``<home>/acp.json``): at most ``max_running`` delegations at once."""

    max_running: int = Field(default=2, ge=1, le=64)


class PersonaConfig(Strict):
    """The contents of ``persona.yaml``."""

    model: ModelConfig
    description: str = ""
    # full: files anywhere in the allowed roots and shell; workspace: writes
    # only inside the workspace; readonly: no writes, no shell writes.
    access: AccessLevel = "workspace"
    tools: ToolFilter = Field(default_factory=ToolFilter)
    thinking: ThinkingMode = "auto"
    max_steps: int = Field(default=12, ge=1, le=200)
    tool_timeout: float | None = Field(default=None, gt=0)
    output_cap: int = Field(default=16_000, ge=1_000)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    subagents: SubagentSettings = Field(default_factory=SubagentSettings)
    coding_agents: CodingAgentSettings = Field(default_factory=CodingAgentSettings)
    placement: Placement = Field(default_factory=lambda: Placement())
    # One `mcp` tool for every MCP server instead of each server's tools.
    mcp_gateway: bool = False
    # The skills this persona sees, in order of priority (None: every skill of
    # its own skills/ and of <home>/skills; []: none). A name no folder holds
    # is reported when the persona's turns look for it (runtime.skills).
    skills: list[str] | None = None
    # Summaries of older turns as the window fills (runtime.yaml's compaction:
    # gives the defaults; the fields set here win).
    compaction: CompactionSettings | None = None
    # What this persona's model calls may cost (and the work it delegates).
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    # Rules on what its tool calls do: allow, ask a person, or deny (the
    # runtime.yaml rules come after these).
    permissions: PermissionSettings | None = None
    # Whom it may message (ask_persona, send_to_persona): names or patterns
    # (None: every persona).
    team: list[str] | None = None

    @field_validator("team")
    @classmethod
    def _team(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for i, name in enumerate(value):
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"entry {i}: a name or pattern is empty")
        return value

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for i, name in enumerate(value):
            why = skill_name_problem(name)
            if why is not None:
                raise ValueError(f"entry {i}: {why}")
        repeated = sorted({n for n in value if value.count(n) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value

    @field_validator("thinking", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        # YAML 1.1 reads bare on/off as booleans.
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


class Persona(BaseModel):
    """A loaded persona: its name, directory, config and SOUL."""

    name: str
    path: Path
    config: PersonaConfig
    soul: str

    @property
    def workspace(self) -> Path:
        return self.path / "workspace"


def parse_persona_config(yaml_path: str, data: bytes) -> PersonaConfig:
    """Validate the bytes of one ``persona.yaml``; raises :class:`PersonaConfigError`."""
    try:
        raw = load_yaml(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PersonaConfigError(yaml_path, [f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise PersonaConfigError(yaml_path, ["(top level): expected a mapping"])
    try:
        return PersonaConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [describe_error(e) for e in exc.errors()]  # type: ignore[arg-type]
        raise PersonaConfigError(yaml_path, problems) from None


def load_persona_dir(path: Path, name: str | None = None) -> Persona:
    """Load one persona directory; raises :class:`PersonaConfigError`."""
    name = name or path.name
    check_persona_name(path, name)
    yaml_path = path / "persona.yaml"
    try:
        data = yaml_path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise PersonaConfigError(str(yaml_path), ["file not found"]) from None
    except OSError as exc:
        raise PersonaConfigError(str(yaml_path), [f"cannot read: {exc.strerror}"]) from None
    config = parse_persona_config(str(yaml_path), data)
    soul_path = path / "SOUL.md"
    soul = soul_path.read_text(encoding="utf-8") if soul_path.is_file() else ""
    return Persona(name=name, path=path, config=config, soul=soul)


def load_persona(home: Path, name: str) -> Persona:
    """Load ``<home>/personas/<name>``; unknown names raise with the roster."""
    path = home / "personas" / name
    if not persona_exists(home, name):
        raise UnknownPersonaError(name, persona_names(home))
    return load_persona_dir(path, name)


__all__ = [
    "AccessLevel",
    "CodingAgentSettings",
    "NetworkSettings",
    "Persona",
    "PersonaConfig",
    "SubagentSettings",
    "ThinkingMode",
    "ToolFilter",
    "load_persona",
    "load_persona_dir",
    "parse_persona_config",
]
