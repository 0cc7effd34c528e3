"""Loading plugins: importing each :class:`PluginRef` and collecting what it
provides, each failure contained and named.

A plugin module declares what it provides in module-level names:

- ``TOOLS``: a list of tools (``@tool`` functions);
- ``MODELS``: ``{name: ProviderClass}``, model providers (``provider: name``);
- ``SCORERS``: ``{name: func}``, eval scorers (``type: plugin``, ``scorer: name``),
  ``func(sample, output) -> bool | float | Score``, sync or async;
- ``DATASETS``: ``{name: func}``, dataset loaders (``dataset: {loader: name}``),
  ``func() -> iterable of rows``;
- ``REQUIRES``: requirement strings Ray installs on every node when
  ``plugins.pip`` is on.

An entry point names one object of its group instead (a tool, a list of
tools, or a module for ``coterie.tools``; a class for ``coterie.models``; a
function for the other two, registered under the entry point's name).

A plugin that fails to import, a name already taken (by a built-in or an
earlier plugin) and a tool that is not valid become :class:`PluginProblem` s;
the rest of the plugin, and every other plugin, still load.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from coterie.runtime.models.plugins import check_provider_class, register_provider
from coterie.runtime.plugins.refs import PluginProblem, PluginRef
from coterie.runtime.tool import ToolDefinitionError, ToolSpec, check_spec

log = logging.getLogger("coterie.plugins")

_DECLARED = ("TOOLS", "MODELS", "SCORERS", "DATASETS")


@dataclass
class Plugins:
    """What the plugins of one process provide, and what went wrong."""

    refs: list[PluginRef] = field(default_factory=list)
    #: Tool name -> spec, and -> the plugin's label.
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    tool_plugins: dict[str, str] = field(default_factory=dict)
    #: Provider name -> the plugin's label (the classes are registered with
    #: :func:`~coterie.runtime.models.plugins.register_provider`).
    models: dict[str, str] = field(default_factory=dict)
    scorers: dict[str, tuple[Callable[..., Any], str]] = field(default_factory=dict)
    datasets: dict[str, tuple[Callable[..., Any], str]] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)
    problems: list[PluginProblem] = field(default_factory=list)

    def problem(self, ref: PluginRef, cause: str, name: str | None = None) -> None:
        found = PluginProblem(plugin=ref.label, name=name, cause=cause)
        log.warning("%s", found)
        self.problems.append(found)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _load_path(ref: PluginRef) -> ModuleType:
    """Import a home file or package folder as module ``ref.module``."""
    path = Path(ref.path or "")
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            ref.module, path / "__init__.py", submodule_search_locations=[str(path)]
        )
    else:
        spec = importlib.util.spec_from_file_location(ref.module, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[ref.module] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[ref.module]
        raise
    return module


def import_plugin(ref: PluginRef) -> ModuleType:
    """The plugin's module. A home file or folder imports by its module name
    where a copy was shipped (Ray puts it on the path) and from its path
    elsewhere; discovery made sure no other module has that name."""
    if ref.path is not None and ref.module not in sys.modules:
        try:
            spec = importlib.util.find_spec(ref.module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return _load_path(ref)
    return importlib.import_module(ref.module)


def _resolve(module: ModuleType, attr: str) -> Any:
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise AttributeError(f"{module.__name__} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


class _Collector:
    """Adds one plugin's objects to :class:`Plugins`, checking each."""

    def __init__(self, plugins: Plugins, taken: dict[str, str]) -> None:
        self.plugins = plugins
        self.taken = taken  # tool name -> who has it ("coterie" for built-ins)

    def tools(self, ref: PluginRef, objects: Iterable[Any]) -> None:
        for obj in objects:
            try:
                spec = check_spec(obj)
            except ToolDefinitionError as exc:
                self.plugins.problem(ref, exc.problem, exc.tool_name)
                continue
            owner = self.taken.get(spec.name)
            if owner is not None:
                self.plugins.problem(
                    ref, f"a tool named {spec.name!r} is already registered by {owner}", spec.name
                )
                continue
            self.taken[spec.name] = f"plugin {ref.label}"
            self.plugins.tools[spec.name] = spec
            self.plugins.tool_plugins[spec.name] = ref.label

    def models(self, ref: PluginRef, objects: dict[str, Any]) -> None:
        for name, cls in objects.items():
            try:
                if not isinstance(cls, type):
                    raise ValueError(f"{cls!r} is not a class")
                check_provider_class(cls)
                register_provider(name, cls, f"plugin {ref.label}")
            except ValueError as exc:
                self.plugins.problem(ref, str(exc), name)
                continue
            self.plugins.models[name] = ref.label

    def functions(self, ref: PluginRef, kind: str, objects: dict[str, Any]) -> None:
        table = self.plugins.scorers if kind == "scorers" else self.plugins.datasets
        for name, fn in objects.items():
            if not callable(fn):
                self.plugins.problem(ref, f"{fn!r} is not a function", name)
            elif name in table:
                self.plugins.problem(
                    ref,
                    f"a {kind[:-1]} named {name!r} is already registered by {table[name][1]}",
                    name,
                )
            else:
                table[name] = (fn, ref.label)

    def module(self, ref: PluginRef, module: ModuleType) -> None:
        declared = [n for n in _DECLARED if hasattr(module, n)]
        if not declared:
            self.plugins.problem(
                ref, f"it declares none of {', '.join(_DECLARED)} (see the guide's Your own tools)"
            )
            return
        for name in declared:
            value = getattr(module, name)
            if name == "TOOLS":
                if not isinstance(value, list | tuple):
                    self.plugins.problem(ref, "TOOLS is not a list of tools")
                else:
                    self.tools(ref, value)
            elif not isinstance(value, dict):
                self.plugins.problem(ref, f"{name} is not a mapping of names")
            elif name == "MODELS":
                self.models(ref, value)
            else:
                self.functions(ref, name.lower(), value)
        requires = getattr(module, "REQUIRES", [])
        if isinstance(requires, list | tuple) and all(isinstance(r, str) for r in requires):
            self.plugins.requires += [r for r in requires if r not in self.plugins.requires]
        else:
            self.plugins.problem(ref, "REQUIRES is not a list of requirement strings")

    def entry(self, ref: PluginRef, module: ModuleType) -> None:
        target = _resolve(module, ref.attr) if ref.attr else module
        name = ref.name or ""
        if ref.provides == "tools":
            if isinstance(target, ModuleType):
                self.tools(ref, getattr(target, "TOOLS", []) or [])
            elif isinstance(target, list | tuple):
                self.tools(ref, target)
            else:
                self.tools(ref, [target])
        elif ref.provides == "models":
            self.models(ref, {name: target})
        elif ref.provides in ("scorers", "datasets"):
            self.functions(ref, ref.provides, {name: target})


def load_plugins(refs: Iterable[PluginRef], *, taken: Iterable[str] = ()) -> Plugins:
    """Import every plugin and collect its tools, providers, scorers and
    loaders; ``taken`` are the tool names already used (the built-ins)."""
    plugins = Plugins(refs=list(refs))
    collect = _Collector(plugins, {name: "coterie (a built-in tool)" for name in taken})
    for ref in plugins.refs:
        try:
            module = import_plugin(ref)
            if ref.provides is None:
                collect.module(ref, module)
            else:
                collect.entry(ref, module)
        except ToolDefinitionError as exc:  # @tool refused a function at import
            plugins.problem(ref, f"failed to import: {exc.problem}", exc.tool_name)
        except Exception as exc:  # the user's code: contained, named, logged
            plugins.problem(ref, f"failed to import: {_describe(exc)}")
        except SystemExit as exc:
            plugins.problem(ref, f"failed to import: it called exit({exc.code})")
    return plugins


__all__ = ["Plugins", "import_plugin", "load_plugins"]
