"""coterie's plain-Python core: messages, config, providers, tools, the loop.

Importable and testable without Ray. Heavy modules (provider SDKs, DuckDB,
Arrow) load lazily where they are used.
"""

from __future__ import annotations

from runtime.config import (
    Persona,
    PersonaConfig,
    install_bundled_personas,
    load_persona,
    persona_names,
    resolve_home,
)
from runtime.context import Conversation, NullAudit, Services, TurnContext
from runtime.errors import (
    AuditQueryError,
    ConfigError,
    CoterieError,
    DeliveryError,
    MissingAPIKeyError,
    ModelError,
    ModelHTTPError,
    ModelTimeoutError,
    PersonaConfigError,
    TurnFailedError,
    UnknownPersonaError,
)
from runtime.loop import TurnLoop, TurnResult
from runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    ModelRequest,
    ModelResponse,
    ReplyEnvelope,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from runtime.models import FunctionModel, Model, RulesModel, ScriptedModel, build_model
from runtime.persona import PersonaRuntime
from runtime.runner import ToolRunner
from runtime.tool import ToolRegistry, ToolSpec, tool

__all__ = [
    "AssistantMessage",
    "AuditQueryError",
    "ConfigError",
    "Conversation",
    "CoterieError",
    "DeliveryError",
    "FunctionModel",
    "MessageEnvelope",
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
    "PersonaRuntime",
    "ReplyEnvelope",
    "RulesModel",
    "ScriptedModel",
    "Services",
    "ToolCall",
    "ToolRegistry",
    "ToolResultMessage",
    "ToolRunner",
    "ToolSpec",
    "TurnContext",
    "TurnFailedError",
    "TurnLoop",
    "TurnResult",
    "UnknownPersonaError",
    "UserMessage",
    "build_model",
    "install_bundled_personas",
    "load_persona",
    "persona_names",
    "resolve_home",
    "tool",
]
