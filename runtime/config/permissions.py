"""``permissions:`` in ``persona.yaml`` (defaults in ``runtime.yaml``): who may
do what, as ordered rules on the resolved effect of each tool call.

A rule is ``{tool, match?, action, reason?, exact?}``:

- ``tool``: a tool name or shell-style pattern (``shell_exec``, ``file_*``,
  ``github__*`` for an MCP server's tools), or a list of them;
- ``match``: what the call does, read from its resolved effect (see
  :mod:`runtime.permissions`): a shell command's words, a file's absolute
  path (``{workspace}``, ``{persona}``, ``{home}`` and ``~`` expand; a
  leading ``!`` inverts), a web host (a name pattern, an IP address or a
  CIDR range), a coding agent's or a persona's name; absent: every call;
- ``action``: ``allow``, ``ask`` (a person approves the call) or ``deny``;
- ``exact``: the match must be the whole effect, not its first words.

A rule that does not parse stops the persona from starting: rules fail
closed, never silently off.
"""

from __future__ import annotations

import ipaddress
import shlex
from typing import Literal

from pydantic import Field, field_validator, model_validator

from coterie.runtime.config._strict import Strict

PermissionAction = Literal["allow", "ask", "deny"]

#: The placeholders a path pattern may hold.
PATH_PLACEHOLDERS = ("{workspace}", "{persona}", "{home}")


class PermissionRule(Strict):
    """One rule: which tools, which effect, and what happens."""

    tool: str | list[str] = Field(description="tool name(s) or pattern(s): shell_exec, file_*")
    match: str | None = Field(
        default=None, description="the effect the rule applies to (absent: every call)"
    )
    action: PermissionAction
    reason: str | None = Field(default=None, max_length=500)
    exact: bool = Field(default=False, description="match the whole effect, not its first words")

    @field_validator("tool")
    @classmethod
    def _tools(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names:
            raise ValueError("names no tool")
        for name in names:
            if not name.strip():
                raise ValueError("a tool name is empty")
        return value

    @field_validator("match")
    @classmethod
    def _match(cls, value: str | None) -> str | None:
        if value is None:
            return None
        text = value.strip()
        if not text or text == "!":
            raise ValueError("is empty (leave it out to match every call)")
        try:
            shlex.split(text.removeprefix("!"))
        except ValueError as exc:
            raise ValueError(f"cannot be read as words: {exc}") from None
        if "/" in text and not text.startswith(("/", "!", "{", "~", "*", ".")):
            # 10.0.0.0/8 must be a valid range, not silently a name pattern.
            head = text.split("/", 1)[0]
            if _looks_like_ip(head):
                try:
                    ipaddress.ip_network(text, strict=False)
                except ValueError as exc:
                    raise ValueError(f"is not a valid address range: {exc}") from None
        return text

    @model_validator(mode="after")
    def _exact_needs_match(self) -> PermissionRule:
        if self.exact and self.match is None:
            raise ValueError("exact: true needs a match")
        return self

    def tools(self) -> list[str]:
        """The rule's tool patterns as a list."""
        return [self.tool] if isinstance(self.tool, str) else list(self.tool)


def _looks_like_ip(text: str) -> bool:
    return bool(text) and (all(c.isdigit() or c == "." for c in text) or ":" in text)


class PermissionSettings(Strict):
    """``permissions:``: the rules, and what an ``ask`` does without a person.

    ``unattended``: what ``ask`` becomes on a turn nobody reads along
    (heartbeat, cron, eval, subagent); ``approval_timeout``: seconds an
    approval waits for its answer before it expires (the model is told the
    call was denied).
    """

    rules: list[PermissionRule] = Field(default_factory=list)
    unattended: Literal["deny", "allow"] = "deny"
    approval_timeout: float = Field(default=600.0, gt=0, le=7 * 86_400)


__all__ = [
    "PATH_PLACEHOLDERS",
    "PermissionAction",
    "PermissionRule",
    "PermissionSettings",
]
