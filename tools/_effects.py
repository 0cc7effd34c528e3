"""The resolved effects of the built-in tools, for permission rules.

Each function turns a call's validated arguments into the
:class:`~runtime.permissions.effects.Effect` the rules match: what the call
would do, independent of how it was spelled. The tools' own rails (paths,
network policy, access level) still apply when the call runs.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from coterie.runtime.context import TurnContext
from coterie.runtime.permissions.effects import (
    Effect,
    host_effect,
    named_effect,
    path_effect,
)
from coterie.runtime.permissions.shell import MAX_SCRIPT_BYTES, ShellParseError, commands

#: Seconds a host lookup may take before the rules see the name alone.
LOOKUP_TIMEOUT = 2.0


def _real(ctx: TurnContext, raw: str) -> str:
    """``raw`` as the tools resolve it: relative to the workspace, ``~``
    expanded, ``..`` and symlinks resolved."""
    path = Path(raw).expanduser()
    if not path.is_absolute():
        base = ctx.settings.workspace or Path.cwd()
        path = base / path
    return os.path.realpath(path)


def file_effect(verb: str) -> Any:
    """The effect of a file tool: ``verb`` (read, write) on its real path."""

    def effect(args: Any, ctx: TurnContext) -> Effect:
        raw = getattr(args, "path", ".")
        try:
            real = _real(ctx, raw)
        except (OSError, ValueError) as exc:
            return Effect("path", (), f"{verb} {raw}", unreadable=str(exc))
        return path_effect(verb, real, verb=verb)

    return effect


def shell_effect(args: Any, ctx: TurnContext) -> Effect:
    """The commands a ``shell_exec`` line runs (wrappers unwrapped, scripts
    in the workspace read)."""
    cwd = _real(ctx, args.cwd or ".")
    workspace = os.path.realpath(ctx.settings.workspace) if ctx.settings.workspace else None

    def read_script(path: str) -> str | None:
        real = os.path.realpath(os.path.join(cwd, os.path.expanduser(path)))
        if workspace is None or not (real == workspace or real.startswith(workspace + os.sep)):
            return None  # only the persona's own files: its workspace
        try:
            with open(real, "rb") as f:
                return f.read(MAX_SCRIPT_BYTES).decode("utf-8", "replace")
        except OSError:
            return None

    summary = f"run {args.command!r} in {cwd}"
    try:
        found = commands(args.command, read_script=read_script)
    except ShellParseError as exc:
        return Effect("shell", (), summary, unreadable=str(exc))
    return Effect("shell", tuple(found), summary, details={"cwd": cwd})


async def web_effect(args: Any, ctx: TurnContext) -> Effect:
    """The host a ``web_fetch`` reaches, and the addresses it resolves to."""
    return await url_effect(args.url)


async def url_effect(url: str) -> Effect:
    """The host of ``url``, and the addresses it resolves to."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError as exc:
        return Effect("host", (), f"fetch {url}", unreadable=str(exc))
    if not host:
        return Effect("host", (), f"fetch {url}", unreadable="the URL names no host")
    addresses: list[str] = []
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None), LOOKUP_TIMEOUT
        )
        addresses = [str(info[4][0]) for info in infos]
    except (OSError, TimeoutError, UnicodeError):
        pass  # the name alone: the fetch itself will fail or be refused
    return host_effect("fetch", url, host, addresses)


def persona_effect(args: Any, ctx: TurnContext) -> Effect:
    """The persona an ``ask_persona`` or ``send_to_persona`` reaches."""
    return named_effect("persona", args.persona, f"message {args.persona}: {args.text[:200]}")


def agent_effect(default: Any) -> Any:
    """The coding agent ``start_coding_agent`` starts (the default one when
    none is named: ``default(ctx)`` names it)."""

    def effect(args: Any, ctx: TurnContext) -> Effect:
        name = args.agent or default(ctx) or "(default)"
        return named_effect("agent", name, f"start coding agent {name}: {args.task[:200]}")

    return effect


__all__ = [
    "agent_effect",
    "file_effect",
    "persona_effect",
    "shell_effect",
    "url_effect",
    "web_effect",
]
