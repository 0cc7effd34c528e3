"""What a persona gets from plugins, and the tools it names that nobody provides.

``tools.allow`` entries without wildcards name tools. One that no built-in,
plugin or code tool provides (an MCP server's ``server__tool`` names aside:
those come and go with their servers) is *missing*: the persona starts
without it and a warning names it and the plugin problems that may explain
it — or, under ``plugins.strict``, it does not start
(:class:`~coterie.runtime.errors.PluginError`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config.persona import ToolFilter
from coterie.runtime.errors import PluginError
from coterie.runtime.mcp.config import SEPARATOR
from coterie.runtime.plugins.code import CODE_PLUGIN, code_tool_names
from coterie.runtime.plugins.refs import PluginProblem
from coterie.runtime.tool import matches_any

log = logging.getLogger("coterie.plugins")

_WILDCARDS = frozenset("*?[")


class PersonaTools(BaseModel):
    """The tools a persona is offered from plugins, and those it misses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Tool name -> the plugin it comes from (``code`` for a persona's own).
    plugin_tools: dict[str, str] = Field(default_factory=dict)
    #: Tool name -> why it is not there.
    missing: dict[str, str] = Field(default_factory=dict)


def _why_missing(name: str, problems: list[PluginProblem]) -> str:
    named = [p for p in problems if p.name == name]
    if named:
        return "; ".join(str(p) for p in named)
    whole = [p for p in problems if p.name is None]
    if whole:
        return "no built-in tool or plugin provides it; failed: " + "; ".join(str(p) for p in whole)
    return "no built-in tool or plugin provides it"


def persona_tools(
    tools: ToolFilter,
    known: Iterable[str],
    plugin_tools: Mapping[str, str],
    problems: list[PluginProblem],
) -> PersonaTools:
    """What ``tools`` (a persona's filter) gets from ``plugin_tools`` and
    misses of what it names, given every ``known`` tool name."""
    names = set(known)
    offered = {
        name: plugin
        for name, plugin in sorted(plugin_tools.items())
        if matches_any(name, tools.allow) and not matches_any(name, tools.deny)
    }
    missing = {
        entry: _why_missing(entry, problems)
        for entry in tools.allow
        if not _WILDCARDS & set(entry) and SEPARATOR not in entry and entry not in names
    }
    return PersonaTools(plugin_tools=offered, missing=missing)


def tools_of_persona(
    tools: ToolFilter,
    directory: Path,
    *,
    builtin: Iterable[str],
    plugin_tools: Mapping[str, str],
    problems: list[PluginProblem],
) -> PersonaTools:
    """:func:`persona_tools` for the persona in ``directory``: its own tools
    (a persona defined in code) count as the plugin ``code``."""
    offered = {**plugin_tools, **dict.fromkeys(code_tool_names(directory), CODE_PLUGIN)}
    return persona_tools(tools, [*builtin, *offered], offered, problems)


def check_missing(persona: str, found: PersonaTools, *, strict: bool) -> None:
    """Warn about (or, ``strict``, refuse) the tools a persona misses."""
    if not found.missing:
        return
    lines = [f"{name}: {why}" for name, why in found.missing.items()]
    if strict:
        raise PluginError(
            f"persona {persona!r} names tools that are not there (plugins.strict is on): "
            + "; ".join(lines)
        )
    for line in lines:
        log.warning("%s starts without tool %s", persona, line)


__all__ = ["PersonaTools", "check_missing", "persona_tools", "tools_of_persona"]
