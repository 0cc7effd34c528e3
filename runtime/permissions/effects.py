"""The resolved effect of a tool call: what permission rules are matched on.

A tool declares how its arguments become an :class:`Effect` (``@tool(effect=…)``):
``shell_exec`` the commands its line runs (:mod:`runtime.permissions.shell`),
the file tools the real path (``..`` and symlinks resolved), ``web_fetch`` the
host and the addresses it resolves to, ``start_coding_agent`` the agent,
``ask_persona``/``send_to_persona`` the persona. A tool without one (an MCP
server's) is matched on its arguments as canonical JSON.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

from coterie.runtime.permissions.shell import ShellParseError, commands

EffectKind = Literal["shell", "path", "host", "agent", "persona", "call"]


@dataclass(frozen=True)
class Effect:
    """What one call does, in the terms rules match on.

    ``subjects``: for ``shell`` each command's argv; for ``path`` the
    absolute, real paths; for ``host`` the host name then its addresses;
    for ``agent``/``persona`` the name; for ``call`` the arguments' JSON.
    ``summary`` is what a person reads before approving; ``unreadable``
    says why the effect could not be read (an unclosed quote): such a call
    is asked about whenever a rule with a match covers its tool.
    """

    kind: EffectKind
    subjects: tuple[Any, ...]
    summary: str
    unreadable: str | None = None
    #: What the summary leaves out but a person may want (a shell line's cwd).
    details: dict[str, str] = field(default_factory=dict)


def call_effect(tool: str, arguments: Any) -> Effect:
    """The effect of a tool that declares none: its arguments."""
    canon = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
    shown = canon if len(canon) <= 400 else canon[:400] + "…"
    return Effect("call", (canon,), f"{tool} {shown}")


def path_effect(tool: str, path: os.PathLike[str] | str, *, verb: str) -> Effect:
    """A file tool's effect: the real path (``..`` and symlinks resolved)."""
    real = os.path.realpath(path)
    return Effect("path", (real,), f"{verb} {real}")


def normalize_host(host: str) -> tuple[str, list[str]]:
    """A URL's host as rules compare it: the lower-case ASCII name (or the
    canonical address), and the address it is when it is an IP in any
    spelling (``2130706433``, ``0x7f.1``, ``[::ffff:127.0.0.1]``)."""
    name = host.strip().strip("[]").rstrip(".").lower()
    address = _as_ip(name)
    if address is not None:
        return address, [address]
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError:
        pass
    return name, []


def _as_ip(text: str) -> str | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        if not text or not all(c in "0123456789abcdefx." for c in text):
            return None
        try:  # the forms inet_aton takes: 2130706433, 0x7f.1, 127.1, 0177.0.0.1
            ip = ipaddress.ip_address(socket.inet_aton(text))
        except (OSError, ValueError):
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def host_effect(tool: str, url: str, host: str, addresses: list[str]) -> Effect:
    """A web tool's effect: its host, then every address it resolved to."""
    name, literal = normalize_host(host)
    seen = dict.fromkeys([*literal, *(a for a in (_as_ip(x) for x in addresses) if a)])
    return Effect("host", (name, *(a for a in seen if a != name)), f"{tool} {url}")


def agent_request_effect(
    agent: str, command: str | None, paths: list[str], title: str | None, kind: str | None
) -> Effect:
    """What a coding agent asks permission for: the command it would run
    (read like ``shell_exec``'s), else the paths it would touch, else its
    title; matched as the tool ``coding_agent``."""
    what = title or kind or "an action"
    if command:
        summary = f"{agent} wants to run {command!r}"
        try:
            return Effect("shell", tuple(commands(command)), summary)
        except ShellParseError as exc:
            return Effect("shell", (), summary, unreadable=str(exc))
    if paths:
        real = tuple(os.path.realpath(p) for p in paths)
        return Effect("path", real, f"{agent} wants to {what}: {', '.join(real)}")
    return call_effect("coding_agent", {"agent": agent, "title": title, "kind": kind})


def named_effect(kind: Literal["agent", "persona"], name: str, summary: str) -> Effect:
    """An effect named by one thing: a coding agent, a persona."""
    return Effect(kind, (name,), summary)


__all__ = [
    "Effect",
    "EffectKind",
    "agent_request_effect",
    "call_effect",
    "host_effect",
    "named_effect",
    "normalize_host",
    "path_effect",
]
