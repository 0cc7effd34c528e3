"""Plugins: the user's own tools, eval scorers, dataset loaders and model
providers, without touching coterie's source.

- :mod:`~coterie.runtime.plugins.refs` finds them (``runtime.yaml``'s
  ``plugins:`` and installed distributions' entry points), where the runtime
  starts;
- :mod:`~coterie.runtime.plugins.loader` imports them in each process that
  needs them (each failure contained and named);
- :mod:`~coterie.runtime.plugins.shipping` says what Ray must carry to the
  other nodes;
- :mod:`~coterie.runtime.plugins.report` says what a persona gets from them
  and what it names that nobody provides;
- :mod:`~coterie.runtime.plugins.code` writes personas defined in code.

A :class:`PluginSet` is what crosses from the driver to the actors: the
resolved plugins, the runtime environment that carries them, and what the
driver found wrong. Each process loads it once (:func:`plugins_here`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config.plugins import PluginSettings
from coterie.runtime.plugins.loader import Plugins, load_plugins
from coterie.runtime.plugins.refs import Discovery, PluginProblem, PluginRef, discover
from coterie.runtime.plugins.shipping import runtime_env_for


class PluginSet(BaseModel):
    """The plugins of a runtime, as every actor of it is given them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    refs: list[PluginRef] = Field(default_factory=list)
    strict: bool = False
    #: The built-in tools' names (what plugin tools may not be named).
    builtin_tools: list[str] = Field(default_factory=list)
    #: What discovery and the driver's own load found wrong.
    problems: list[PluginProblem] = Field(default_factory=list)
    #: Tool name -> plugin label, as the driver loaded them.
    tool_plugins: dict[str, str] = Field(default_factory=dict)
    #: Provider name -> plugin label, likewise.
    model_plugins: dict[str, str] = Field(default_factory=dict)
    #: Scorer and dataset loader names -> plugin label.
    scorer_plugins: dict[str, str] = Field(default_factory=dict)
    dataset_plugins: dict[str, str] = Field(default_factory=dict)
    #: The runtime environment of the actors (None: nothing to ship).
    runtime_env: dict[str, Any] | None = None


def plugin_set(
    home: Path, settings: PluginSettings, *, taken: list[str]
) -> tuple[PluginSet, Plugins, dict[str, Any] | None]:
    """Discover and load the plugins of ``home`` here (the driver): the set
    for the actors (without its runtime environment, which must be
    uploaded first), what loaded, and the environment to upload."""
    found: Discovery = discover(home, settings)
    plugins = plugins_for(found.refs, taken)
    problems = [*found.problems, *plugins.problems]
    described = PluginSet(
        refs=found.refs,
        strict=settings.strict,
        builtin_tools=list(taken),
        problems=problems,
        tool_plugins=dict(plugins.tool_plugins),
        model_plugins=dict(plugins.models),
        scorer_plugins={n: label for n, (_, label) in plugins.scorers.items()},
        dataset_plugins={n: label for n, (_, label) in plugins.datasets.items()},
    )
    return described, plugins, runtime_env_for(found.refs, plugins.requires, settings)


_loaded: dict[str, Plugins] = {}
_lock = threading.Lock()


def plugins_for(refs: list[PluginRef], taken: list[str]) -> Plugins:
    """The plugins of ``refs``, loaded once per process (a second load of
    the same set, from another actor method or a spare, reuses the first)."""
    key = "\n".join(ref.model_dump_json() for ref in refs) + "|" + ",".join(sorted(taken))
    with _lock:
        found = _loaded.get(key)
        if found is None:
            found = _loaded[key] = load_plugins(refs, taken=taken)
        return found


def plugins_here(plugins: PluginSet | None, taken: list[str]) -> Plugins:
    """What ``plugins`` provides in this process (empty for None)."""
    if plugins is None or not plugins.refs:
        return Plugins()
    return plugins_for(plugins.refs, taken)


__all__ = [
    "PluginProblem",
    "PluginRef",
    "PluginSet",
    "Plugins",
    "plugin_set",
    "plugins_for",
    "plugins_here",
]
