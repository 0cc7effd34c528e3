"""Finding plugins: what ``runtime.yaml`` names and what installed
distributions announce, as :class:`PluginRef` s every process can load.

Discovery runs where the runtime starts (the driver). It resolves each entry
to a module name that imports the same way on every node — a home file
``./plugins/weather.py`` is the module ``weather``, a package folder is
its folder's name — and says whether its code must be shipped there
(:mod:`~coterie.runtime.plugins.shipping`): code outside the Python
installation (a home file, a folder on the driver's path, a distribution
installed into a folder of its own) is; installed distributions and coterie
itself are expected on every node.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config.plugins import PluginSettings

#: The entry point groups, and what each one's objects are.
GROUPS: dict[str, str] = {
    "coterie.tools": "tools",
    "coterie.models": "models",
    "coterie.scorers": "scorers",
    "coterie.datasets": "datasets",
}
Provides = Literal["tools", "models", "scorers", "datasets"]


class PluginProblem(BaseModel):
    """Why a plugin (or one name of it) could not be used."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plugin: str
    #: The tool, provider, scorer or dataset loader (None: the whole plugin).
    name: str | None = None
    cause: str

    def __str__(self) -> str:
        what = f" ({self.name})" if self.name else ""
        return f"plugin {self.plugin}{what}: {self.cause}"


class PluginRef(BaseModel):
    """One plugin, resolved: how it is named to people and how it imports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: How people name it: the runtime.yaml entry, or the distribution's entry point.
    label: str
    #: The module that imports it on every node.
    module: str
    #: An entry point's object inside ``module`` (``TOOLS``, ``EchoModel``); None: the module.
    attr: str | None = None
    #: An entry point's group (what its object is); None: the module says (TOOLS, MODELS…).
    provides: Provides | None = None
    #: An entry point's name: the provider, scorer or loader name it registers.
    name: str | None = None
    #: A home file or folder, loaded from this path where no shipped copy exists.
    path: str | None = None
    #: The file or folder sent to the other nodes (None: not shipped).
    ship: str | None = None


class Discovery(BaseModel):
    """What discovery found: the plugins, and the entries it could not resolve."""

    refs: list[PluginRef] = Field(default_factory=list)
    problems: list[PluginProblem] = Field(default_factory=list)


@functools.cache
def _installed_roots() -> list[Path]:
    """Where the Python installation keeps modules (not shipped)."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(Path(path).resolve())
    for prefix in (sys.prefix, sys.base_prefix):
        roots.add((Path(prefix) / "lib").resolve())
    return sorted(roots)


@functools.cache
def _coterie_roots() -> list[Path]:
    """The folders of coterie's own packages (found, not imported)."""
    roots = []
    for package in (
        "coterie",
        "coterie.runtime",
        "coterie.actors",
        "coterie.tools",
        "coterie.configs",
    ):
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            roots.append(Path(folder).resolve())
    return roots


def outside_installation(path: Path) -> bool:
    """Whether the code at ``path`` is neither coterie's nor the Python
    installation's: what the other nodes may not have."""
    path = path.resolve()
    if any(path.is_relative_to(root) for root in _coterie_roots()):
        return False  # coterie runs on every node already
    return not any(path.is_relative_to(root) for root in _installed_roots())


def _code_of(top: str) -> Path | None:
    """The file or package folder of top-level module ``top`` (found, not imported)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if len(locations) == 1:
        return Path(locations[0])
    if spec.origin and spec.origin not in ("built-in", "frozen") and not locations:
        return Path(spec.origin)
    return None  # a namespace package over several folders, or built in


def _ship_of(module: str, ship: bool) -> str | None:
    if not ship:
        return None
    code = _code_of(module.partition(".")[0])
    if code is None or not outside_installation(code):
        return None
    return str(code)


def _is_path(entry: str) -> bool:
    return entry.startswith((".", "/", "~")) or entry.endswith(".py") or os.sep in entry


def _home_entry(entry: str, home: Path, ship: bool) -> PluginRef | PluginProblem:
    path = Path(entry).expanduser()
    if not path.is_absolute():
        path = home / path
    path = path.resolve()
    if path.is_dir():
        if not (path / "__init__.py").is_file():
            return PluginProblem(
                plugin=entry, cause=f"{path} is a folder without __init__.py (not a package)"
            )
        module = path.name
    elif path.is_file():
        if path.suffix != ".py":
            return PluginProblem(plugin=entry, cause=f"{path} is not a .py file")
        module = path.stem
    else:
        return PluginProblem(plugin=entry, cause=f"no file or folder {path}")
    if not module.isidentifier():
        return PluginProblem(
            plugin=entry,
            cause=f"{path.name} cannot be a module name ({module!r} is not an identifier)",
        )
    other = _code_of(module)
    if other is not None and other.resolve() != path:
        return PluginProblem(
            plugin=entry,
            cause=f"its module name {module!r} is taken by {other}; rename the file or folder",
        )
    return PluginRef(label=entry, module=module, path=str(path), ship=str(path) if ship else None)


def _module_entry(entry: str, ship: bool) -> PluginRef | PluginProblem:
    if not all(part.isidentifier() for part in entry.split(".")):
        return PluginProblem(plugin=entry, cause="expected a module name (mypkg.tools) or a path")
    if _code_of(entry.partition(".")[0]) is None:
        return PluginProblem(plugin=entry, cause=f"no module named {entry.partition('.')[0]!r}")
    return PluginRef(label=entry, module=entry, ship=_ship_of(entry, ship))


def entry_point_refs(ship: bool) -> Discovery:
    """The plugins installed distributions announce, by distribution and name."""
    found = Discovery()
    for group, provides in GROUPS.items():
        points = sorted(
            importlib.metadata.entry_points(group=group),
            key=lambda ep: (ep.dist.name if ep.dist else "", ep.name),
        )
        for ep in points:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "?"
            label = f"{dist} ({group}: {ep.name})"
            module, _, attr = ep.value.partition(":")
            module = module.strip()
            if not module or not all(p.isidentifier() for p in module.split(".")):
                found.problems.append(
                    PluginProblem(
                        plugin=label, cause=f"entry point value {ep.value!r} is not module:object"
                    )
                )
                continue
            found.refs.append(
                PluginRef(
                    label=label,
                    module=module,
                    attr=attr.strip() or None,
                    provides=provides,  # type: ignore[arg-type]
                    name=ep.name,
                    ship=_ship_of(module, ship),
                )
            )
    return found


def discover(home: Path, settings: PluginSettings) -> Discovery:
    """Every plugin of a runtime: ``load`` in its order, then the entry points."""
    found = Discovery()
    for entry in settings.load:
        ref = (
            _home_entry(entry, home, settings.ship)
            if _is_path(entry)
            else _module_entry(entry, settings.ship)
        )
        if isinstance(ref, PluginProblem):
            found.problems.append(ref)
        else:
            found.refs.append(ref)
    if settings.entry_points:
        points = entry_point_refs(settings.ship)
        found.refs += points.refs
        found.problems += points.problems
    modules: dict[str, PluginRef] = {}
    kept = []
    for ref in found.refs:
        other = modules.get(ref.module)
        if other is not None and other.path != ref.path:
            found.problems.append(
                PluginProblem(
                    plugin=ref.label,
                    cause=f"its module name {ref.module!r} is taken by plugin {other.label}",
                )
            )
            continue
        modules.setdefault(ref.module, ref)
        kept.append(ref)
    found.refs = kept
    return found


__all__ = [
    "GROUPS",
    "Discovery",
    "PluginProblem",
    "PluginRef",
    "Provides",
    "discover",
    "entry_point_refs",
    "outside_installation",
]
