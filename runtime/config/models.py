"""Model entries: the ``model:`` of a persona (and of a subagent or an eval).

``provider`` picks the entry: ``scripted`` (answers written in the YAML, no
API key), ``openai`` (Chat Completions or any compatible server),
``anthropic`` (the Messages API), or any other name: a provider a plugin
adds (``mypkg.models:EchoModel``, or the short name a plugin registered, see
:mod:`coterie.runtime.models.plugins`). :data:`ModelConfig` is their union.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from coterie.runtime.config._strict import Strict
from coterie.runtime.messages import TurnContextKind


class ScriptedWhen(Strict):
    """Conditions of a scripted rule; all given ones must hold."""

    turn: int | None = Field(default=None, ge=1)
    contains: str | None = None
    # The kind of turn: user, heartbeat, cron, subagent or eval.
    context: TurnContextKind | None = None
    # Whether the request ends with tool results (a call came back).
    tool_result: bool | None = None


class ScriptedToolCall(Strict):
    """A tool call a scripted rule answers with."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ScriptedRule(Strict):
    """One rule of a scripted model: when it matches, its text and calls answer."""

    when: ScriptedWhen = Field(default_factory=ScriptedWhen)
    text: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)


class _ModelBase(Strict):
    max_tokens: int = Field(default=4096, ge=1)
    timeout: float = Field(default=120.0, gt=0, description="seconds per request")
    context_window: int | None = Field(
        default=None,
        ge=1024,
        description="tokens the model reads at most (default: known per model family, see "
        "runtime.models.windows)",
    )


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
    """Anthropic Messages API.

    ``cache`` (on by default) puts prompt-caching breakpoints in every request
    (see :mod:`runtime.models.anthropic_messages`); cache reads cost a tenth
    of the input price, cache writes a quarter more.
    """

    provider: Literal["anthropic"]
    name: str
    base_url: str | None = None
    api_key_env: str = "ANTHROPIC_API_KEY"
    thinking_budget: int = Field(default=2048, ge=1024)
    cache: bool = Field(
        default=True,
        description="prompt caching: mark the tools, the system prompt and the newest history "
        "as cache breakpoints, so that each call reads the prefix the previous one wrote "
        "(false sends no cache_control)",
    )


#: A plugin provider: ``module.path:ClassName``, or a registered short name.
PLUGIN_PROVIDER_RE = re.compile(
    r"^(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*"
    r"|[a-z][a-z0-9_-]{0,62})$"
)
BUILTIN_PROVIDERS = ("scripted", "openai", "anthropic")

#: The short provider names the plugins loaded in this process registered
#: (name -> plugin), kept here so that a persona file naming an unknown one is
#: refused when it is read. :mod:`coterie.runtime.models.plugins` fills it.
_PROVIDER_NAMES: dict[str, str] = {}


def note_provider_name(name: str, plugin: str) -> None:
    """Accept ``provider: name`` in model entries read in this process."""
    _PROVIDER_NAMES[name] = plugin


def forget_provider_names() -> None:
    _PROVIDER_NAMES.clear()


def provider_names() -> dict[str, str]:
    """The plugin providers' short names accepted here, and their plugins."""
    return dict(sorted(_PROVIDER_NAMES.items()))


class PluginModelConfig(_ModelBase):
    """A provider a plugin adds: ``provider: mypkg.models:EchoModel`` (imported
    where the persona runs) or the short name a plugin registered
    (``coterie.models`` entry point, or ``MODELS`` in a plugin module).

    The class is built as ``cls(config)`` with this entry; ``options`` is the
    provider's own settings (validated by its ``options_model`` when it has
    one). ``timeout`` bounds every request, ``max_tokens`` and
    ``context_window`` apply as for any model.
    """

    provider: str
    name: str = Field(default="", description="the model's name (default: the provider)")
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        if not PLUGIN_PROVIDER_RE.match(value) or (
            ":" not in value and value not in _PROVIDER_NAMES
        ):
            loaded = ", ".join(_PROVIDER_NAMES) or "none"
            raise ValueError(
                f"expected one of {', '.join(BUILTIN_PROVIDERS)}, the name of a provider a "
                f"loaded plugin registers (loaded: {loaded}) or 'module:Class', got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _default_name(self) -> PluginModelConfig:
        if not self.name:
            self.name = self.provider
        return self


def _provider_tag(value: Any) -> str | None:
    provider = (
        value.get("provider") if isinstance(value, dict) else getattr(value, "provider", None)
    )
    if provider is None:
        return None  # pydantic then says that 'provider' is missing
    if provider in BUILTIN_PROVIDERS:
        return str(provider)
    return "plugin"


ModelConfig = Annotated[
    Annotated[ScriptedModelConfig, Tag("scripted")]
    | Annotated[OpenAIModelConfig, Tag("openai")]
    | Annotated[AnthropicModelConfig, Tag("anthropic")]
    | Annotated[PluginModelConfig, Tag("plugin")],
    Discriminator(_provider_tag),
]


__all__ = [
    "BUILTIN_PROVIDERS",
    "PLUGIN_PROVIDER_RE",
    "AnthropicModelConfig",
    "ModelConfig",
    "OpenAIModelConfig",
    "PluginModelConfig",
    "ScriptedModelConfig",
    "ScriptedRule",
    "ScriptedToolCall",
    "ScriptedWhen",
    "forget_provider_names",
    "note_provider_name",
    "provider_names",
]
