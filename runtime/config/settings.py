"""``<home>/runtime.yaml`` and its sections: the settings of the whole runtime.

Every field is optional. Sections: ``memory`` (long-term recall), ``web``
(``web_fetch`` and ``web_search``), ``serve`` (the front door),
``connectors`` (chat apps), ``schedule`` (heartbeats, cron entries and
reminders), ``skills`` (the prompt's list of skills), ``placement`` (the
runtime's own actors), ``permissions`` (every persona's default rules, see
:mod:`~coterie.runtime.config.permissions`), ``plugins`` (see
:mod:`~coterie.runtime.config.plugins`), ``tracing`` (see
:mod:`~coterie.runtime.tracing.settings`), and ``compaction``, ``budget``
and ``prices`` (see :mod:`~coterie.runtime.config.usage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from coterie.runtime.config._strict import Strict, describe_error
from coterie.runtime.config.connectors import ConnectorSettings
from coterie.runtime.config.permissions import PermissionSettings
from coterie.runtime.config.placement import RuntimePlacement
from coterie.runtime.config.plugins import PluginSettings
from coterie.runtime.config.usage import BudgetSettings, CompactionSettings, ModelPrice
from coterie.runtime.errors import ConfigError
from coterie.runtime.tracing.settings import TracingSettings


class MemorySettings(Strict):
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


class WebSettings(Strict):
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


class ServeSettings(Strict):
    """The front door, ``coterie serve``: ``serve:`` in ``runtime.yaml``."""

    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8765, ge=0, le=65535, description="its port (0: any free one)")
    token_env: str = Field(
        default="COTERIE_SERVE_TOKEN",
        description="environment variable holding the bearer token (unset: the one kept in "
        "<home>/serve.token, made at the first start; both readable by this user only)",
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


class ScheduleSettings(Strict):
    """The scheduler: ``schedule:`` in ``runtime.yaml`` (see the guide's
    "Schedules and reminders" page)."""

    max_background_turns_per_day: int = Field(
        default=24,
        ge=0,
        description="heartbeat and cron turns one persona may start a day (in the runtime's "
        "time zone); more are skipped without a model call (reminders a person asked for are "
        "not counted)",
    )
    min_interval: float = Field(
        default=60.0,
        gt=0,
        description="seconds: the shortest heartbeat interval, cron period or reminder "
        "recurrence accepted",
    )
    reload_interval: float = Field(
        default=2.0,
        gt=0,
        description="seconds between looks at the personas' schedules.yaml and HEARTBEAT.md "
        "(an edit applies within this long)",
    )
    max_reminders_per_background_turn: int = Field(
        default=3,
        ge=0,
        description="reminders and entries one heartbeat, cron or reminder turn may create",
    )
    max_pending_reminders: int = Field(
        default=100, ge=1, description="reminders one persona may have pending at once"
    )
    history_days: float = Field(
        default=30.0,
        gt=0,
        description="days the fire ledger keeps a fire (and a finished reminder) before it is "
        "deleted",
    )


class SkillSettings(Strict):
    """Skills in the system prompt: ``skills:`` in ``runtime.yaml`` (see the
    guide's "Skills" page)."""

    prompt_budget: int = Field(
        default=2000,
        ge=0,
        description="estimated tokens (characters / 4) the prompt's list of skill names and "
        "descriptions may take; the skills that do not fit are named in a warning and the "
        "audit log, and the model is told how to see them",
    )


class RuntimeSettings(Strict):
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
    schedule: ScheduleSettings = Field(default_factory=lambda: ScheduleSettings())
    skills: SkillSettings = Field(default_factory=lambda: SkillSettings())
    placement: RuntimePlacement = Field(default_factory=lambda: RuntimePlacement())
    compaction: CompactionSettings = Field(
        default_factory=lambda: CompactionSettings(),
        description="every persona's compaction settings (a persona's own fields win)",
    )
    budget: BudgetSettings = Field(
        default_factory=lambda: BudgetSettings(),
        description="what the model calls of the whole runtime may cost",
    )
    permissions: PermissionSettings = Field(
        default_factory=lambda: PermissionSettings(),
        description="every persona's permission rules, after its own (see the guide's "
        "Permissions and approvals)",
    )
    plugins: PluginSettings = Field(
        default_factory=lambda: PluginSettings(),
        description="the user's own tools, scorers, dataset loaders and model providers (see "
        "the guide's Your own tools)",
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description="US dollars per million tokens by model name or pattern (``*``, ``?``); "
        "these win over the defaults",
    )
    tracing: TracingSettings = Field(
        default_factory=lambda: TracingSettings(),
        description="OpenTelemetry traces over OTLP (see the guide's Watching it run)",
    )

    @field_validator("prices")
    @classmethod
    def _price_patterns(cls, value: dict[str, ModelPrice]) -> dict[str, ModelPrice]:
        for key in value:
            if not key.strip():
                raise ValueError("a model name or pattern is empty")
        return value


def with_tracing_resolved(settings: RuntimeSettings, environ: Mapping[str, str]) -> RuntimeSettings:
    """``settings`` with ``tracing`` resolved against ``environ`` (the
    starting process's): what every actor is handed. ConfigError names a
    standard variable whose value is not usable."""
    if settings.tracing.enabled is False:
        return settings
    try:
        tracing = settings.tracing.resolved(environ)
    except ValueError as exc:
        raise ConfigError(f"tracing: {exc}") from None
    return settings.model_copy(update={"tracing": tracing})


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
        problems = "; ".join(describe_error(e) for e in exc.errors())  # type: ignore[arg-type]
        raise ConfigError(f"{path}: {problems}") from None


__all__ = [
    "MemorySettings",
    "RuntimeSettings",
    "ScheduleSettings",
    "ServeSettings",
    "SkillSettings",
    "WebSettings",
    "load_settings",
    "with_tracing_resolved",
]
