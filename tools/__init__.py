"""Built-in tools, one module per family."""

from __future__ import annotations

from collections.abc import Iterable

from coterie.runtime.tool import ToolRegistry, ToolSpec
from coterie.tools.calc import CALC_TOOLS
from coterie.tools.catalogue import CATALOGUE_TOOLS
from coterie.tools.connectors import CONNECTOR_TOOLS
from coterie.tools.control import CONTROL_TOOLS
from coterie.tools.delegation import DELEGATION_TOOLS
from coterie.tools.files import FILE_TOOLS
from coterie.tools.mcp import MCP_TOOLS
from coterie.tools.memory import MEMORY_TOOLS
from coterie.tools.personas import PERSONA_TOOLS
from coterie.tools.schedule import SCHEDULE_TOOLS
from coterie.tools.shell import SHELL_TOOLS
from coterie.tools.skills import SKILL_TOOLS
from coterie.tools.tasks import TASK_TOOLS
from coterie.tools.web import WEB_TOOLS


def builtin_registry() -> ToolRegistry:
    """A registry holding every built-in tool."""
    return ToolRegistry(
        [
            *CONTROL_TOOLS,
            *CALC_TOOLS,
            *CATALOGUE_TOOLS,
            *CONNECTOR_TOOLS,
            *PERSONA_TOOLS,
            *DELEGATION_TOOLS,
            *MEMORY_TOOLS,
            *FILE_TOOLS,
            *SHELL_TOOLS,
            *SKILL_TOOLS,
            *SCHEDULE_TOOLS,
            *TASK_TOOLS,
            *WEB_TOOLS,
            *MCP_TOOLS,
        ]
    )


def registry_for(*groups: Iterable[ToolSpec]) -> ToolRegistry:
    """The built-in tools and then each group's (plugin tools, a persona's
    own); a name already there keeps its first tool (the loaders reported
    the clash)."""
    registry = builtin_registry()
    for group in groups:
        for spec in group:
            if registry.get(spec.name) is None:
                registry.register(spec)
    return registry


__all__ = [
    "CALC_TOOLS",
    "CATALOGUE_TOOLS",
    "CONNECTOR_TOOLS",
    "CONTROL_TOOLS",
    "DELEGATION_TOOLS",
    "FILE_TOOLS",
    "MCP_TOOLS",
    "MEMORY_TOOLS",
    "PERSONA_TOOLS",
    "SCHEDULE_TOOLS",
    "SHELL_TOOLS",
    "SKILL_TOOLS",
    "TASK_TOOLS",
    "WEB_TOOLS",
    "builtin_registry",
    "registry_for",
]
