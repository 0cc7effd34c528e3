"""coterie's plain-Python core, importable and testable without Ray.

The turn core is flat — ``errors``, ``messages``, ``config``, ``context``,
``services``, ``tool``, ``runner``, ``loop``, ``mcp_source``, ``prompt``,
``hub`` — beside the ``persona`` package (a persona's queues, turns and
wiring), and each concern has its subpackage: ``models`` (providers),
``memory``, ``audit``, ``shell``, ``routing``, and ``testing`` (helpers the
tests, benchmarks and demo share). Heavy modules (provider SDKs, DuckDB,
Arrow, LanceDB, torch) load lazily where they are used.
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
