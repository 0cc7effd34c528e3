"""Path rails for tools that read the persona's files.

Relative paths resolve inside the persona's workspace; absolute paths must
already be inside it. Symlinks are resolved before the check, so a link that
points outside is refused like any other escape.
"""

from __future__ import annotations

from pathlib import Path

from runtime.context import TurnContext
from runtime.errors import ToolError


def workspace_path(ctx: TurnContext, raw: str) -> Path:
    """``raw`` as a real path inside ``ctx.workspace``; ToolError otherwise."""
    if ctx.workspace is None:
        raise ToolError("unavailable", "this persona has no workspace")
    if not raw or "\x00" in raw:
        raise ToolError("invalid_path", "the path is empty or contains a NUL byte")
    root = ctx.workspace.resolve()
    candidate = Path(raw).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve(strict=False)
    if resolved != root and not resolved.is_relative_to(root):
        raise ToolError("path_denied", f"{raw!r} is outside the workspace ({root})")
    if resolved.name == ".env":
        raise ToolError("path_denied", ".env files hold secrets and cannot be read by tools")
    return resolved


__all__ = ["workspace_path"]
