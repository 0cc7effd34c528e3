"""Plugins in the actors: loading them in this process, shipping them with
the actors this one starts."""

from __future__ import annotations

from typing import Any

from coterie.runtime.plugins import Plugins, PluginSet, plugins_here


def builtin_names() -> list[str]:
    from coterie.tools import builtin_registry

    return builtin_registry().names()


def load_here(plugins: PluginSet | None) -> Plugins:
    """What ``plugins`` provides in this process, loaded once (its model
    providers registered, so that persona files naming them are read)."""
    if plugins is None or not plugins.refs:
        return Plugins()
    return plugins_here(plugins, plugins.builtin_tools)


def env_options(plugins: PluginSet | None) -> dict[str, Any]:
    """The ``.options()`` that ship ``plugins`` with an actor (nothing when
    there is nothing to ship: the actor starts as it always did)."""
    if plugins is None or not plugins.runtime_env:
        return {}
    return {"runtime_env": plugins.runtime_env}


__all__ = ["builtin_names", "env_options", "load_here"]
