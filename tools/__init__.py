"""Built-in tools, one module per family."""

from __future__ import annotations

from runtime.tool import ToolRegistry
from tools.control import CONTROL_TOOLS


def builtin_registry() -> ToolRegistry:
    """A registry holding every built-in tool."""
    return ToolRegistry(CONTROL_TOOLS)


__all__ = ["CONTROL_TOOLS", "builtin_registry"]
