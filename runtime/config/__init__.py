"""Configuration: ``persona.yaml``, ``runtime.yaml`` and the home they live in.

One module per part of the files, each a set of strict pydantic models (an
unknown field is an error naming the file and the field; every accepted
field is honoured):

- :mod:`~coterie.runtime.config.home`: ``<home>`` (``--home``, else
  ``$COTERIE_HOME``, else ``~/.coterie``), the runtime's time zone, persona
  names and the persona directories under ``<home>/personas``;
- :mod:`~coterie.runtime.config.models`: a ``model:`` entry (scripted,
  OpenAI-compatible, Anthropic);
- :mod:`~coterie.runtime.config.persona`: ``persona.yaml`` and its sections
  (tools, access, network, subagents, coding agents) and loading a persona;
- :mod:`~coterie.runtime.config.permissions`: ``permissions:`` (rules on
  what tool calls do, and approvals);
- :mod:`~coterie.runtime.config.placement`: ``placement:`` of a persona and
  of the runtime's own actors;
- :mod:`~coterie.runtime.config.plugins`: ``plugins:`` (the user's own
  tools, scorers, dataset loaders and model providers);
- :mod:`~coterie.runtime.config.settings`: ``runtime.yaml`` and its sections
  (memory, web, serve, schedule, skills, and the sections below);
- :mod:`~coterie.runtime.config.usage`: ``compaction:``, ``budget:`` and
  ``prices:`` (conversations near their window, and what model calls cost);
- :mod:`~coterie.runtime.config.connectors`: its ``connectors:`` section (a
  leaf: the connectors import their settings from it, never the reverse);
- :mod:`~coterie.runtime.config.json_files`: what ``acp.json`` and
  ``mcp.json`` share (reading, naming an entry's errors).
"""

from __future__ import annotations

from coterie.runtime.config.connectors import ConnectorSettings, TelegramSettings
from coterie.runtime.config.home import (
    PERSONA_NAME_RE,
    check_persona_name,
    install_personas,
    persona_exists,
    persona_names,
    resolve_home,
    runtime_timezone,
)
from coterie.runtime.config.json_files import describe_entry_error, read_json_config
from coterie.runtime.config.models import (
    AnthropicModelConfig,
    ModelConfig,
    OpenAIModelConfig,
    PluginModelConfig,
    ScriptedModelConfig,
    ScriptedRule,
    ScriptedToolCall,
    ScriptedWhen,
)
from coterie.runtime.config.permissions import (
    PermissionAction,
    PermissionRule,
    PermissionSettings,
)
from coterie.runtime.config.persona import (
    AccessLevel,
    CodingAgentSettings,
    NetworkSettings,
    Persona,
    PersonaConfig,
    SubagentSettings,
    ThinkingMode,
    ToolFilter,
    load_persona,
    load_persona_dir,
    parse_persona_config,
)
from coterie.runtime.config.placement import Placement, RuntimePlacement
from coterie.runtime.config.plugins import PluginSettings
from coterie.runtime.config.settings import (
    MemorySettings,
    RuntimeSettings,
    ScheduleSettings,
    ServeSettings,
    SkillSettings,
    WebSettings,
    load_settings,
    with_tracing_resolved,
)
from coterie.runtime.config.usage import (
    BudgetSettings,
    CompactionSettings,
    ModelPrice,
    merged_compaction,
)
from coterie.runtime.tracing.settings import TracingSettings

__all__ = [
    "PERSONA_NAME_RE",
    "AccessLevel",
    "AnthropicModelConfig",
    "BudgetSettings",
    "CodingAgentSettings",
    "CompactionSettings",
    "ConnectorSettings",
    "MemorySettings",
    "ModelConfig",
    "ModelPrice",
    "NetworkSettings",
    "OpenAIModelConfig",
    "PermissionAction",
    "PermissionRule",
    "PermissionSettings",
    "Persona",
    "PersonaConfig",
    "Placement",
    "PluginModelConfig",
    "PluginSettings",
    "RuntimePlacement",
    "RuntimeSettings",
    "ScheduleSettings",
    "ScriptedModelConfig",
    "ScriptedRule",
    "ScriptedToolCall",
    "ScriptedWhen",
    "ServeSettings",
    "SkillSettings",
    "SubagentSettings",
    "TelegramSettings",
    "ThinkingMode",
    "ToolFilter",
    "TracingSettings",
    "WebSettings",
    "check_persona_name",
    "describe_entry_error",
    "install_personas",
    "load_persona",
    "load_persona_dir",
    "load_settings",
    "merged_compaction",
    "parse_persona_config",
    "persona_exists",
    "persona_names",
    "read_json_config",
    "resolve_home",
    "runtime_timezone",
    "with_tracing_resolved",
]
