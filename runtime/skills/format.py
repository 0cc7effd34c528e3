"""One skill: its ``SKILL.md`` in the Agent Skills format, read and checked.

A skill is a folder holding ``SKILL.md``: YAML front matter between two
``---`` lines, then the instructions (Markdown) that ``load_skill`` returns.
The front matter's fields are the format's:

- ``name`` (required): 1 to 64 lowercase letters, digits and hyphens, no
  hyphen first, last or twice in a row, equal to the folder's name;
- ``description`` (required): what the skill does and when to use it, at most
  1,024 characters (the prompt lists it);
- ``license``, ``compatibility`` (at most 500 characters): text;
- ``metadata``: a mapping of string keys to string values, for anything else;
- ``allowed-tools``: the tools the skill may use, space-delimited (or a YAML
  list); coterie reads each entry as a tool name or a pattern with ``*`` and
  ``?`` (as ``tools.allow`` in persona.yaml), and uses them only to narrow
  what the persona may call (see :mod:`coterie.runtime.skills`).

Any other field is an error (the format puts extra keys under ``metadata``),
as is a wrong value: :class:`SkillFormatError` names the file and each field
that is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from coterie.runtime.errors import ConfigError
from coterie.runtime.yaml_load import load_yaml

#: The file that makes a folder a skill.
SKILL_FILE = "SKILL.md"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
#: A larger SKILL.md is refused (the format recommends under 500 lines; put
#: long references in files of their own, which file_read reads on demand).
MAX_SKILL_FILE_BYTES = 64 * 1024
#: The front matter's fields, as the format names them.
FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")

#: A skill's name: lowercase letters and digits in words joined by single hyphens.
SKILL_NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
#: One ``allowed-tools`` entry: a tool name, or a pattern of them with ``*`` and ``?``.
TOOL_PATTERN_RE = re.compile(r"^[A-Za-z0-9_.*?-]+$")

SkillScope = Literal["persona", "global"]

#: Tools a skill's ``allowed-tools`` never takes away (the persona's own
#: filter still may): ending the turn, and loading another skill.
ALWAYS_OFFERED = ("end_task", "load_skill")


class SkillFormatError(ConfigError):
    """A ``SKILL.md`` that is not a valid skill: the file and each wrong field."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"invalid skill file {path}: {'; '.join(problems)}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        # Errors cross actor boundaries pickled; keep the constructor's arguments.
        return (type(self), (self.path, self.problems))


@dataclass(frozen=True)
class Skill:
    """A valid skill: its front matter, its instructions and where it lives."""

    name: str
    description: str
    #: The skill's ``SKILL.md``.
    path: Path
    #: ``persona``: under the persona's ``skills/``; ``global``: under ``<home>/skills``.
    scope: SkillScope
    #: The instructions: the file after its front matter.
    body: str
    #: ``allowed-tools``: patterns of the tools it may use; None when not given.
    allowed_tools: tuple[str, ...] | None = None
    license: str | None = None
    compatibility: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def tool_limit(self) -> tuple[str, ...] | None:
        """The tool patterns this skill narrows a turn to once loaded (its
        ``allowed-tools`` and :data:`ALWAYS_OFFERED`); None: no narrowing."""
        if self.allowed_tools is None:
            return None
        return (*self.allowed_tools, *ALWAYS_OFFERED)


def skill_name_problem(name: object) -> str | None:
    """Why ``name`` is not a skill name, or None when it is one."""
    if not isinstance(name, str) or not name:
        return "expected a non-empty string"
    if len(name) > MAX_NAME_CHARS:
        return f"{len(name)} characters; at most {MAX_NAME_CHARS}"
    if not SKILL_NAME_RE.match(name):
        return (
            f"{name!r}: expected lowercase letters, digits and single hyphens (not first or last)"
        )
    return None


def split_front_matter(text: str) -> tuple[str, str] | None:
    """``text`` as (front matter, body), or None when it does not open with a
    ``---`` line closed by another."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        return None
    for i, line in enumerate(lines[1:], start=1):
        if line.rstrip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1 :]).strip("\r\n")
    return None


def parse_skill(path: Path, data: bytes, *, scope: SkillScope) -> Skill:
    """The skill of ``path`` (a ``SKILL.md``) whose bytes are ``data``.

    Raises :class:`SkillFormatError` naming the file and every wrong field.
    The folder's name is ``path.parent.name``: the skill's name must equal it.
    """
    shown = str(path)
    if len(data) > MAX_SKILL_FILE_BYTES:
        raise SkillFormatError(
            shown,
            [
                f"(file): larger than {MAX_SKILL_FILE_BYTES} bytes (move long "
                "references into files of their own)"
            ],
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillFormatError(shown, [f"(file): not UTF-8 (bad byte at {exc.start})"]) from None
    parts = split_front_matter(text)
    if parts is None:
        raise SkillFormatError(
            shown,
            [
                "(front matter): the file must open with a '---' line, the YAML "
                "fields, and a closing '---' line"
            ],
        )
    head, body = parts
    try:
        raw = load_yaml(head)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise SkillFormatError(shown, [f"(front matter): not valid YAML: {detail}"]) from None
    if not isinstance(raw, dict):
        raise SkillFormatError(shown, ["(front matter): expected a mapping of fields"])
    problems: list[str] = []
    values = _check_fields(raw, path.parent.name, problems)
    if problems:
        raise SkillFormatError(shown, problems)
    return Skill(path=path, scope=scope, body=body, **values)


def _check_fields(raw: dict[Any, Any], folder: str, problems: list[str]) -> dict[str, Any]:
    """The checked values of the front matter's fields, by Skill's field names;
    what is wrong goes to ``problems`` as ``field: what``."""
    values: dict[str, Any] = {}
    for key in raw:
        if key not in FIELDS:
            problems.append(
                f"{key}: unknown field (the format has {', '.join(FIELDS)}; put other "
                "keys under metadata)"
            )
    name = raw.get("name")
    if "name" not in raw:
        problems.append("name: missing")
    elif (why := skill_name_problem(name)) is not None:
        problems.append(f"name: {why}")
    elif name != folder:
        problems.append(f"name: {name!r} must equal the folder's name {folder!r}")
    values["name"] = name
    description = raw.get("description")
    if "description" not in raw:
        problems.append("description: missing")
    elif not isinstance(description, str) or not description.strip():
        problems.append("description: expected a non-empty string")
    elif len(description) > MAX_DESCRIPTION_CHARS:
        problems.append(
            f"description: {len(description)} characters; at most {MAX_DESCRIPTION_CHARS}"
        )
    values["description"] = description.strip() if isinstance(description, str) else ""
    for key, cap in (("license", None), ("compatibility", MAX_COMPATIBILITY_CHARS)):
        value = raw.get(key)
        if key in raw and (not isinstance(value, str) or not value.strip()):
            problems.append(f"{key}: expected a non-empty string")
        elif cap is not None and isinstance(value, str) and len(value) > cap:
            problems.append(f"{key}: {len(value)} characters; at most {cap}")
        values[key] = value if isinstance(value, str) else None
    values["metadata"] = _metadata(raw, problems)
    values["allowed_tools"] = _allowed_tools(raw, problems)
    return values


def _metadata(raw: dict[Any, Any], problems: list[str]) -> dict[str, str]:
    if "metadata" not in raw:
        return {}
    metadata = raw["metadata"]
    if not isinstance(metadata, dict):
        problems.append("metadata: expected a mapping of names to strings")
        return {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            problems.append(f"metadata.{key}: expected a string (quote it: '{value}')")
    return {str(k): str(v) for k, v in metadata.items()}


def _allowed_tools(raw: dict[Any, Any], problems: list[str]) -> tuple[str, ...] | None:
    if "allowed-tools" not in raw:
        return None
    value = raw["allowed-tools"]
    if isinstance(value, str):
        entries: list[Any] = value.split()
    elif isinstance(value, list):
        entries = value
    else:
        problems.append("allowed-tools: expected tool names, space-delimited or as a list")
        return None
    patterns: list[str] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            problems.append(f"allowed-tools: {entry!r} is not a tool name")
        elif "(" in entry:
            problems.append(
                f"allowed-tools: {entry!r}: argument patterns are not supported; name "
                "tools (wildcards * and ? allowed)"
            )
        elif not TOOL_PATTERN_RE.match(entry.strip()):
            problems.append(f"allowed-tools: {entry!r} is not a tool name or pattern")
        else:
            patterns.append(entry.strip())
    return tuple(dict.fromkeys(patterns))


__all__ = [
    "ALWAYS_OFFERED",
    "FIELDS",
    "MAX_COMPATIBILITY_CHARS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "MAX_SKILL_FILE_BYTES",
    "SKILL_FILE",
    "SKILL_NAME_RE",
    "Skill",
    "SkillFormatError",
    "SkillScope",
    "parse_skill",
    "skill_name_problem",
    "split_front_matter",
]
