"""Model providers that plugins add (``provider: <name>`` in a ``model:``).

A provider is a class built as ``cls(config)`` from its
:class:`~coterie.runtime.config.PluginModelConfig`, with the contract of
:class:`~coterie.runtime.models.base.Model`: ``provider`` and ``name``, one
async ``request`` and ``aclose`` (plus ``stream`` to stream text, see
:class:`~coterie.runtime.models.base.StreamingModel`). A class may declare
``options_model``, a pydantic model the entry's ``options`` must fit.

Names come from the plugins loaded in this process (:func:`register_provider`,
called by :mod:`coterie.runtime.plugins`), or are ``module:Class`` imported
on demand. Whatever the plugin returns, each request is bounded by the
entry's ``timeout``.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from pydantic import BaseModel, ValidationError

from coterie.runtime.config import PluginModelConfig
from coterie.runtime.config._strict import describe_error
from coterie.runtime.config.models import (
    forget_provider_names,
    note_provider_name,
    provider_names,
)
from coterie.runtime.errors import ModelError, ModelTimeoutError
from coterie.runtime.messages import ModelRequest, ModelResponse
from coterie.runtime.models.base import Model, TextSink

#: Short name -> provider class (the plugin that registered each is noted
#: in the configuration's list of names, which persona files are read against).
_PROVIDERS: dict[str, type] = {}


def register_provider(name: str, cls: type, plugin: str) -> None:
    """Make ``provider: name`` build ``cls`` in this process; a name taken by
    another plugin raises ValueError naming it."""
    current = _PROVIDERS.get(name)
    if current is not None and current is not cls:
        owner = provider_names().get(name, "another plugin")
        raise ValueError(f"a model provider named {name!r} is already registered by {owner}")
    _PROVIDERS[name] = cls
    note_provider_name(name, plugin)


def registered_providers() -> dict[str, str]:
    """The short names registered in this process, and their plugins."""
    return provider_names()


def forget_providers() -> None:
    """Drop every registered name (tests)."""
    _PROVIDERS.clear()
    forget_provider_names()


def provider_class(provider: str) -> type:
    """The class of ``provider`` (a registered name, or ``module:Class``);
    :class:`ModelError` naming what is missing otherwise."""
    if ":" not in provider:
        found = _PROVIDERS.get(provider)
        if found is None:
            known = ", ".join(sorted(_PROVIDERS)) or "none"
            raise ModelError(
                f"no plugin provides the model provider {provider!r} (plugin providers loaded "
                f"here: {known}); name it in runtime.yaml's plugins, or write 'module:Class'"
            )
        return found
    module_name, _, attr = provider.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: its failure is the model's error
        raise ModelError(
            f"model provider {provider!r}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ModelError(f"model provider {provider!r}: {module_name} has no {attr!r}")
        target = getattr(target, part)
    if not isinstance(target, type):
        raise ModelError(f"model provider {provider!r} is not a class")
    return target


def check_provider_class(cls: type) -> None:
    """ValueError unless ``cls`` has the provider contract's methods."""
    missing = [m for m in ("request", "aclose") if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(
            f"{cls.__module__}.{cls.__qualname__} is not a model provider: it has no "
            f"{' or '.join(missing)} method"
        )
    for method in ("request", "stream"):
        fn = getattr(cls, method, None)
        if fn is not None and not asyncio.iscoroutinefunction(fn):
            raise ValueError(f"{cls.__qualname__}.{method} must be an async method")


class PluginModel:
    """A plugin's provider instance, with the entry's name and timeout."""

    def __init__(self, config: PluginModelConfig, inner: Any) -> None:
        self.config = config
        self.inner = inner
        self.provider = config.provider
        self.name = config.name
        window = getattr(inner, "context_window", None)
        if isinstance(window, int):
            self.context_window = window

    async def _bounded(self, call: Any) -> ModelResponse:
        try:
            response = await asyncio.wait_for(call, self.config.timeout)
        except TimeoutError:
            raise ModelTimeoutError(
                f"{self.provider}/{self.name}: no answer within {self.config.timeout:g}s"
            ) from None
        if not isinstance(response, ModelResponse):
            raise ModelError(
                f"model provider {self.provider!r} returned {type(response).__name__}, "
                "expected a ModelResponse"
            )
        return response

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self._bounded(self.inner.request(request))

    async def aclose(self) -> None:
        await self.inner.aclose()


class StreamingPluginModel(PluginModel):
    """:class:`PluginModel` of a provider that streams."""

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelResponse:
        return await self._bounded(self.inner.stream(request, on_text))


def build_plugin_model(config: PluginModelConfig) -> Model:
    """The plugin provider of ``config``, built; :class:`ModelError` naming the
    provider and the cause when it cannot be."""
    cls = provider_class(config.provider)
    try:
        check_provider_class(cls)
    except ValueError as exc:
        raise ModelError(f"model provider {config.provider!r}: {exc}") from None
    options_model = getattr(cls, "options_model", None)
    if isinstance(options_model, type) and issubclass(options_model, BaseModel):
        try:
            options_model.model_validate(config.options)
        except ValidationError as exc:
            problems = "; ".join(
                describe_error({**e, "loc": ("options", *e["loc"])})  # type: ignore[arg-type]
                for e in exc.errors()
            )
            raise ModelError(f"model provider {config.provider!r}: {problems}") from None
    try:
        inner = cls(config)
    except ModelError:
        raise
    except Exception as exc:  # the plugin's constructor: its failure is the model's error
        raise ModelError(
            f"model provider {config.provider!r} could not be built: {type(exc).__name__}: {exc}"
        ) from None
    wrapper = StreamingPluginModel if callable(getattr(inner, "stream", None)) else PluginModel
    return wrapper(config, inner)


__all__ = [
    "PluginModel",
    "StreamingPluginModel",
    "build_plugin_model",
    "check_provider_class",
    "forget_providers",
    "provider_class",
    "register_provider",
    "registered_providers",
]
