"""Built-in tools, one module per family."""

from __future__ import annotations

from runtime.tool import ToolRegistry
from tools.calc import CALC_TOOLS
from tools.connectors import CONNECTOR_TOOLS
from tools.control import CONTROL_TOOLS
from tools.delegation import DELEGATION_TOOLS
from tools.files import FILE_TOOLS
from tools.mcp import MCP_TOOLS
from tools.memory import MEMORY_TOOLS
from tools.personas import PERSONA_TOOLS
from tools.shell import SHELL_TOOLS
from tools.tasks import TASK_TOOLS
from tools.web import WEB_TOOLS


def builtin_registry() -> ToolRegistry:
    """A registry holding every built-in tool."""
    return ToolRegistry(
        [
            *CONTROL_TOOLS,
            *CALC_TOOLS,
            *CONNECTOR_TOOLS,
            *PERSONA_TOOLS,
            *DELEGATION_TOOLS,
            *MEMORY_TOOLS,
            *FILE_TOOLS,
            *SHELL_TOOLS,
            *TASK_TOOLS,
            *WEB_TOOLS,
            *MCP_TOOLS,
        ]
    )


__all__ = [
    "CALC_TOOLS",
    "CONNECTOR_TOOLS",
    "CONTROL_TOOLS",
    "DELEGATION_TOOLS",
    "FILE_TOOLS",
    "MCP_TOOLS",
    "MEMORY_TOOLS",
    "PERSONA_TOOLS",
    "SHELL_TOOLS",
    "TASK_TOOLS",
    "WEB_TOOLS",
    "builtin_registry",
]
