"""Model providers behind one contract; SDK-backed ones load lazily."""

from __future__ import annotations

from typing import assert_never

from coterie.runtime.config import (
    AnthropicModelConfig,
    ModelConfig,
    OpenAIModelConfig,
    PluginModelConfig,
    ScriptedModelConfig,
)
from coterie.runtime.errors import ModelError
from coterie.runtime.models.base import Model, StreamingModel, TextSink
from coterie.runtime.models.scripted import FunctionModel, RulesModel, ScriptedModel, tool_call
from coterie.runtime.models.unavailable import UnavailableModel


def build_model(config: ModelConfig) -> Model:
    """The provider for a persona's ``model:`` block.

    The SDK modules are imported only for the provider actually used, so a
    scripted persona's process never loads ``openai`` or ``anthropic``.
    """
    if isinstance(config, ScriptedModelConfig):
        return RulesModel(config)
    if isinstance(config, OpenAIModelConfig):
        from coterie.runtime.models.openai_chat import OpenAIChatModel

        return OpenAIChatModel(config)
    if isinstance(config, AnthropicModelConfig):
        from coterie.runtime.models.anthropic_messages import AnthropicModel

        return AnthropicModel(config)
    if isinstance(config, PluginModelConfig):
        from coterie.runtime.models.plugins import build_plugin_model

        return build_plugin_model(config)
    assert_never(config)


def build_model_or_unavailable(config: ModelConfig) -> Model:
    """:func:`build_model`, or an :class:`UnavailableModel` carrying the reason
    it could not be built (each request then raises that error)."""
    try:
        return build_model(config)
    except ModelError as exc:
        return UnavailableModel.for_config(config, exc)


__all__ = [
    "FunctionModel",
    "Model",
    "RulesModel",
    "ScriptedModel",
    "StreamingModel",
    "TextSink",
    "UnavailableModel",
    "build_model",
    "build_model_or_unavailable",
    "tool_call",
]
