"""coterie's plain-Python core, importable and testable without Ray.

The turn core is flat: ``errors`` (the exception tree), ``messages`` (what
travels between actors and what the audit log stores), ``context`` (a
turn's context), ``services`` (the protocols tools reach the runtime
through), ``tool`` and ``runner`` (the tool contract and running calls),
``loop`` (the tool loop), ``prompt``, ``mcp_source`` (MCP tools as the model
sees them), ``frontdoor`` (the one facade every door asks through), ``hub``
(personas of one process talking without Ray), ``fires`` (the scheduler's
fires as personas' messages, and what happened to them as audit events),
``heap`` (a quiet process's free heap given back) and ``yaml_load``.

Each concern has its package: ``config`` (persona.yaml, runtime.yaml, the
home), ``persona`` (a persona's queues, turns and wiring), ``models``
(providers), ``memory``, ``audit``, ``shell``, ``routing``, ``delegation``
(subagents, coding agents and ``delegation.acp``), ``mcp`` (MCP client
sessions), ``eval``, ``serve`` (HTTP, OpenAI-compatible and MCP servers),
``connectors``, ``skills`` (SKILL.md folders, the prompt's listing),
``schedule`` (heartbeats, cron entries, reminders: the scheduler's logic,
its DuckDB ledger and an in-process scheduler) and ``testing`` (the
testing API: scripted models, ``turn_context``, ``LocalHub``). Heavy
modules (provider SDKs, DuckDB, Arrow, LanceDB, torch, the MCP and ACP SDKs)
load lazily where they are used.
"""

from __future__ import annotations

from coterie.runtime.config import (
    Persona,
    PersonaConfig,
    RuntimeSettings,
    install_personas,
    load_persona,
    persona_names,
    resolve_home,
)
from coterie.runtime.context import Conversation, TurnContext, TurnOutputs, TurnSettings
from coterie.runtime.errors import (
    AuditQueryError,
    ConfigError,
    CoterieError,
    DeliveryError,
    ErrorKind,
    MissingAPIKeyError,
    ModelError,
    ModelHTTPError,
    ModelTimeoutError,
    PersonaConfigError,
    ToolError,
    TurnFailedError,
    UnknownPersonaError,
)
from coterie.runtime.loop import TurnLoop, TurnResult
from coterie.runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    ModelRequest,
    ModelResponse,
    ReplyEnvelope,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models import FunctionModel, Model, RulesModel, ScriptedModel, build_model
from coterie.runtime.persona import Launchers, PersonaHost, PersonaRuntime
from coterie.runtime.runner import ToolRunner
from coterie.runtime.services import (
    AuditSink,
    MemoryService,
    Messenger,
    NullAudit,
    ProcessService,
    Services,
)
from coterie.runtime.tool import ToolRegistry, ToolSpec, tool

__all__ = [
    "AssistantMessage",
    "AuditQueryError",
    "AuditSink",
    "ConfigError",
    "Conversation",
    "CoterieError",
    "DeliveryError",
    "ErrorKind",
    "FunctionModel",
    "Launchers",
    "MemoryService",
    "MessageEnvelope",
    "Messenger",
    "MissingAPIKeyError",
    "Model",
    "ModelError",
    "ModelHTTPError",
    "ModelRequest",
    "ModelResponse",
    "ModelTimeoutError",
    "NullAudit",
    "Persona",
    "PersonaConfig",
    "PersonaConfigError",
    "PersonaHost",
    "PersonaRuntime",
    "ProcessService",
    "ReplyEnvelope",
    "RulesModel",
    "RuntimeSettings",
    "ScriptedModel",
    "Services",
    "ToolCall",
    "ToolError",
    "ToolRegistry",
    "ToolResultMessage",
    "ToolRunner",
    "ToolSpec",
    "TurnContext",
    "TurnFailedError",
    "TurnLoop",
    "TurnOutputs",
    "TurnResult",
    "TurnSettings",
    "UnknownPersonaError",
    "UserMessage",
    "build_model",
    "install_personas",
    "load_persona",
    "persona_names",
    "resolve_home",
    "tool",
]
