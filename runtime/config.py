"""Persona directories and their ``persona.yaml``; the runtime's ``runtime.yaml``.

A persona lives in ``<home>/personas/<name>/`` with ``persona.yaml`` and
``SOUL.md``. ``<home>`` is ``--home``, else ``$COTERIE_HOME``, else
``~/.coterie``. Every field that is accepted is honoured; unknown fields are
errors naming the file and the field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from coterie.runtime.connectors.telegram import TelegramSettings
from coterie.runtime.errors import ConfigError, PersonaConfigError, UnknownPersonaError
from coterie.runtime.messages import TurnContextKind
from coterie.runtime.yaml_load import load_yaml

PERSONA_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def runtime_timezone() -> ZoneInfo:
    """``$COTERIE_TIMEZONE`` (an IANA name, e.g. ``Europe/Paris``), default UTC.

    The one zone of the runtime: the ``clock`` tool and the date in every
    system prompt use it. An unknown name falls back to UTC.
    """
    name = os.environ.get("COTERIE_TIMEZONE", "UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """``--home`` beats ``$COTERIE_HOME`` beats ``~/.coterie``."""
    if home is not None:
        return Path(home).expanduser().resolve()
    env = os.environ.get("COTERIE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".coterie").resolve()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptedWhen(_Strict):
    """Conditions of a scripted rule; all given ones must hold."""

    turn: int | None = Field(default=None, ge=1)
    contains: str | None = None
    # The kind of turn: user, heartbeat, cron, subagent or eval.
    context: TurnContextKind | None = None


class ScriptedToolCall(_Strict):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ScriptedRule(_Strict):
    when: ScriptedWhen = Field(default_factory=ScriptedWhen)
    text: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)


class _ModelBase(_Strict):
    max_tokens: int = Field(default=4096, ge=1)
    timeout: float = Field(default=120.0, gt=0, description="seconds per request")


class _NetworkModelBase(_ModelBase):
    max_retries: int = Field(default=3, ge=0, le=10)


class ScriptedModelConfig(_ModelBase):
    """A model whose answers are written in persona.yaml (no API key).

    ``timeout`` applies to ``latency_ms`` (a slower answer times out) and
    ``max_tokens`` cuts a longer text, as a real model would. Streamed, the
    (cut) text comes out in pieces of ``stream_chunk_chars`` characters with
    ``stream_delay_ms`` between them, so that streaming clients and demos
    see text arrive as from a real model.
    """

    provider: Literal["scripted"]
    name: str = "scripted"
    rules: list[ScriptedRule] = Field(default_factory=list)
    default: str = "I can't help with that."
    latency_ms: float = Field(default=0.0, ge=0)
    stream_chunk_chars: int = Field(default=8, ge=1)
    stream_delay_ms: float = Field(default=0, ge=0)


class OpenAIModelConfig(_NetworkModelBase):
    """OpenAI Chat Completions or any compatible server (``base_url``)."""

    provider: Literal["openai"]
    name: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    # Reasoning providers (DeepSeek-R1, Kimi…) reject assistant tool-call
    # messages without ``reasoning_content`` once thinking is on.
    reasoning_content: bool = False


class AnthropicModelConfig(_NetworkModelBase):
    """Anthropic Messages API."""

    provider: Literal["anthropic"]
    name: str
    base_url: str | None = None
    api_key_env: str = "ANTHROPIC_API_KEY"
    thinking_budget: int = Field(default=2048, ge=1024)


ModelConfig = Annotated[
    ScriptedModelConfig | OpenAIModelConfig | AnthropicModelConfig,
    Field(discriminator="provider"),
]


class ToolFilter(_Strict):
    """Allow and deny lists of tool names; ``*`` and ``?`` wildcards."""

    allow: list[str] = Field(default_factory=lambda: ["*"])
    deny: list[str] = Field(default_factory=list)


ThinkingMode = Literal["on", "off", "auto"]


AccessLevel = Literal["full", "workspace", "readonly"]


class NetworkSettings(_Strict):
    """What a persona's tools may reach on the network.

    By default ``web_fetch`` reaches public addresses only: loopback,
    link-local (cloud metadata included), private and other non-public ranges
    and the Ray cluster's own nodes are refused unless listed in ``allow``
    (IP addresses, CIDR ranges such as ``10.1.0.0/16``, or host names).
    Shell commands inside bubblewrap get no network unless ``shell`` is true.
    """

    allow: list[str] = Field(default_factory=list)
    shell: bool = False


class SubagentSettings(_Strict):
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


class CodingAgentSettings(_Strict):
    """``coding_agents:`` in persona.yaml (the agents themselves are in
    ``<home>/acp.json``): at most ``max_running`` delegations at once."""

    max_running: int = Field(default=2, ge=1, le=64)


#: Kubernetes label syntax, as Ray checks it: an optional DNS-subdomain prefix
#: and ``/``, then a name (and values) of at most 63 characters.
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"^({_LABEL_NAME}(\.{_LABEL_NAME})*/)?{_LABEL_NAME}$")
_LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")


class Placement(_Strict):
    """Which Ray nodes an actor may run on (``placement:``).

    ``resources`` are custom Ray resources the actor holds while it lives
    (actors take no CPU, so a fraction such as 0.01 lets many share a node);
    ``node_labels`` must equal the node's labels (``ray start --labels``).
    Checked against the alive nodes before the actor is created, so a
    placement no node offers is an error, not an actor pending forever.
    """

    resources: dict[str, float] = Field(default_factory=dict)
    node_labels: dict[str, str] = Field(default_factory=dict)
    start_timeout: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="seconds the actor may take to start (a matching node that is full "
        "leaves it pending); a persona's start is bounded only when it asks for resources "
        "or labels (else a slow start is load, not placement)",
    )

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU") or not name or name.startswith("node:"):
                raise ValueError(f"{name!r}: not a custom resource (name one the nodes declare)")
            # Ray counts resources in units of 0.0001.
            if amount < 0.0001:
                raise ValueError(f"{name}: the amount must be at least 0.0001, got {amount:g}")
        return value

    @field_validator("node_labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for key, label in value.items():
            if not isinstance(key, str) or not _LABEL_KEY_RE.match(key):
                raise ValueError(f"{key!r}: not a valid label key")
            # YAML reads bare true/1 as non-strings; labels are strings on the nodes.
            if isinstance(label, bool | int | float):
                raise ValueError(f"{key}: quote the value ({label!r} is not a string)")
            if not isinstance(label, str) or not _LABEL_VALUE_RE.match(label):
                raise ValueError(
                    f"{key}: {label!r} is not a valid label value (an exact value: "
                    "letters, digits, '-', '_', '.')"
                )
        return value

    @property
    def pinned(self) -> bool:
        """Whether it asks for anything (an empty placement fits any node)."""
        return bool(self.resources or self.node_labels)


class RuntimePlacement(_Strict):
    """``placement:`` in ``runtime.yaml``: where the runtime's own actors run."""

    router: Placement = Field(default_factory=lambda: Placement())
    audit: Placement = Field(default_factory=lambda: Placement())
    memory: Placement = Field(default_factory=lambda: Placement())


class PersonaConfig(_Strict):
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


class MemorySettings(_Strict):
    """Where long-term memory lives and how it is embedded."""

    uri: str | None = Field(
        default=None,
        description="LanceDB directory or object-store URI (default <home>/memory)",
    )
    storage_options: dict[str, str] = Field(default_factory=dict)
    # auto: the store's own embedder if it can run, else the local model if
    # installed, else the embeddings API if its key is set, else none (see
    # runtime.memory.choice.choose_embedder). minilm: all-MiniLM-L6-v2,
    # offline (coterie[local]); openai: the embeddings API; hashing: a tiny
    # deterministic embedder meant for tests only; none: full-text recall only.
    embedder: Literal["auto", "minilm", "openai", "hashing", "none"] = "auto"
    openai_model: str = "text-embedding-3-small"
    openai_base_url: str | None = None
    openai_api_key_env: str = "OPENAI_API_KEY"
    openai_dim: int = Field(default=1536, ge=8)
    optimize_interval: float = Field(
        default=60.0, gt=0, description="seconds between background index maintenance runs"
    )
    embed_threads: int | None = Field(
        default=1,
        ge=1,
        description="threads of the process that runs the local embedder (null: one a core)",
    )


class WebSettings(_Strict):
    """Limits of ``web_fetch`` and ``web_search``."""

    fetch_timeout: float = Field(
        default=25.0, gt=0, description="seconds for a whole fetch, redirects included"
    )
    connect_timeout: float = Field(default=10.0, gt=0, description="seconds to connect")
    max_redirects: int = Field(default=5, ge=0, le=20)
    max_bytes: int = Field(
        default=2_000_000, ge=1_000, description="body bytes read before the rest is dropped"
    )
    search_timeout: float = Field(default=20.0, gt=0, description="seconds per search request")


class ServeSettings(_Strict):
    """The front door, ``coterie serve``: ``serve:`` in ``runtime.yaml``."""

    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8765, ge=0, le=65535, description="its port (0: any free one)")
    token_env: str = Field(
        default="COTERIE_SERVE_TOKEN",
        description="environment variable holding the bearer token (unset: a random one "
        "is made at start and written to <home>/serve.json, readable by this user only)",
    )
    loopback_without_token: bool = Field(
        default=False, description="requests from 127.0.0.1/::1 need no token"
    )
    max_body_bytes: int = Field(
        default=1_000_000, ge=1024, description="larger request bodies get 413"
    )
    rate_per_minute: int = Field(
        default=600, ge=1, description="requests a client (token or address) may make a minute"
    )
    max_in_flight: int = Field(
        default=8,
        ge=1,
        description="messages one conversation may have waiting through the API (more: 409)",
    )
    ask_timeout: float = Field(
        default=600.0, gt=0, description="seconds a non-streaming message waits for its reply"
    )


class ConnectorSettings(_Strict):
    """Chat-app connectors of ``coterie serve`` (``connectors:`` in
    ``runtime.yaml``); each runs only when its token is in the environment."""

    telegram: TelegramSettings | None = None


class RuntimeSettings(_Strict):
    """Runtime-wide settings: ``<home>/runtime.yaml`` (all optional)."""

    idle_timeout: float | None = Field(
        default=300.0,
        gt=0,
        description="seconds a persona actor may stay idle before it is passivated (null: never)",
    )
    max_queue: int = Field(
        default=256, ge=1, description="persona-sourced messages waiting per conversation"
    )
    memory: MemorySettings = Field(default_factory=lambda: MemorySettings())
    web: WebSettings = Field(default_factory=lambda: WebSettings())
    unsandboxed_shell: Literal["deny", "allow"] = Field(
        default="deny",
        description="without bubblewrap, whether workspace personas get a shell",
    )
    max_conversations: int = Field(
        default=1000,
        ge=1,
        description="conversations a persona actor keeps in memory (idle ones beyond it are "
        "dropped and rebuilt from the audit log on their next message)",
    )
    max_history_messages: int = Field(
        default=2000,
        ge=10,
        description="messages of one conversation kept for the model (older ones stay in the "
        "audit log)",
    )
    max_background_processes: int = Field(
        default=16, ge=1, description="shell processes a persona may hold at once"
    )
    max_starting_personas: int | None = Field(
        default=None,
        ge=1,
        description="persona actors the router starts at a time (the others wait their "
        "turn; pinned personas do not wait); null: the cluster's CPUs when the router "
        "starts, at least 2",
    )
    spill_retention_days: float = Field(
        default=7.0,
        gt=0,
        description="days the full text of a cut tool result stays in the persona's .spill",
    )
    serve: ServeSettings = Field(default_factory=lambda: ServeSettings())
    connectors: ConnectorSettings = Field(default_factory=lambda: ConnectorSettings())
    placement: RuntimePlacement = Field(default_factory=lambda: RuntimePlacement())


def load_settings(home: Path) -> RuntimeSettings:
    """``<home>/runtime.yaml`` if present, else the defaults."""
    path = home / "runtime.yaml"
    if not path.is_file():
        return RuntimeSettings()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return RuntimeSettings.model_validate(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())  # type: ignore[arg-type]
        raise ConfigError(f"{path}: {problems}") from None


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "union_tag_invalid":
        ctx = err.get("ctx", {})
        msg = f"expected one of {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    elif err["type"] == "union_tag_not_found":
        msg = "missing 'provider' (expected 'openai', 'anthropic' or 'scripted')"
    elif err["type"] == "extra_forbidden":
        msg = "unknown field"
    return f"{loc}: {msg}"


def read_json_config(path: Path, error: Callable[[str, list[str]], Exception]) -> Any:
    """The decoded JSON file at ``path`` (``acp.json``, ``mcp.json``); ``None``
    when there is none. An unreadable or invalid file raises ``error(path,
    problems)``. Synchronous: a small file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(str(path), [f"unreadable: {exc}"]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(str(path), [f"not valid JSON: {exc}"]) from None


def describe_entry_error(
    err: Mapping[str, Any], *, section: str, label: str, top_hint: str | None = None
) -> str:
    """A pydantic error of a file whose ``section`` maps names to entries
    (``agents``, ``mcpServers``), naming the entry (``label`` 'name') and the
    field; ``top_hint`` is added to an unknown top-level field."""
    loc = [str(p) for p in err["loc"]]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    if len(loc) >= 3 and loc[0] == section:
        return f"{label} {loc[1]!r}, field {'.'.join(loc[2:])!r}: {msg}"
    if len(loc) == 2 and loc[0] == section:
        return f"{label} {loc[1]!r}: {msg}"
    if len(loc) == 1 and err["type"] == "extra_forbidden" and top_hint:
        return f"field {loc[0]!r}: unknown field ({top_hint})"
    return f"{'.'.join(loc) or '(top level)'}: {msg}"


def check_persona_name(path: Path | str, name: str) -> None:
    """Raise :class:`PersonaConfigError` (about ``path``) unless ``name`` is a
    valid persona name."""
    if not PERSONA_NAME_RE.match(name):
        raise PersonaConfigError(
            str(path), [f"name {name!r}: expected lowercase letters, digits, '-' or '_'"]
        )


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
        problems = [_describe(e) for e in exc.errors()]  # type: ignore[arg-type]
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


def persona_names(home: Path) -> list[str]:
    """Names of every persona directory under ``<home>/personas``."""
    root = home / "personas"
    try:
        entries = list(os.scandir(root))
    except OSError:  # no such directory (or not one)
        return []
    # The directory entry says what is a directory without a stat of its own.
    return sorted(
        e.name for e in entries if e.is_dir() and os.path.isfile(f"{e.path}/persona.yaml")
    )


def persona_exists(home: Path, name: str) -> bool:
    """Whether ``name`` is a persona of ``home`` (one stat, no listing)."""
    return (
        bool(PERSONA_NAME_RE.match(name)) and (home / "personas" / name / "persona.yaml").is_file()
    )


def load_persona(home: Path, name: str) -> Persona:
    """Load ``<home>/personas/<name>``; unknown names raise with the roster."""
    path = home / "personas" / name
    if not persona_exists(home, name):
        raise UnknownPersonaError(name, persona_names(home))
    return load_persona_dir(path, name)


def install_personas(home: Path, source: Path, *, overwrite: bool = False) -> list[str]:
    """Copy the persona directories under ``source`` into ``<home>/personas``.

    Existing personas are left alone unless ``overwrite``. Returns the names
    that were written.
    """
    import shutil

    written = []
    for src in sorted(source.iterdir()):
        if not (src / "persona.yaml").is_file():
            continue
        dst = home / "personas" / src.name
        if dst.exists() and not overwrite:
            continue
        shutil.copytree(src, dst, dirs_exist_ok=True)
        written.append(src.name)
    return written


__all__ = [
    "AccessLevel",
    "AnthropicModelConfig",
    "CodingAgentSettings",
    "MemorySettings",
    "ModelConfig",
    "NetworkSettings",
    "OpenAIModelConfig",
    "Persona",
    "PersonaConfig",
    "Placement",
    "RuntimePlacement",
    "RuntimeSettings",
    "ScriptedModelConfig",
    "ScriptedRule",
    "SubagentSettings",
    "ThinkingMode",
    "ToolFilter",
    "WebSettings",
    "check_persona_name",
    "describe_entry_error",
    "install_personas",
    "load_persona",
    "load_persona_dir",
    "load_settings",
    "parse_persona_config",
    "persona_exists",
    "persona_names",
    "read_json_config",
    "resolve_home",
    "runtime_timezone",
]
