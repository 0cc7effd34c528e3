"""Personas defined in code (``coterie.Persona``), for notebooks and evals.

A :class:`CodePersona` is validated exactly as a ``persona.yaml`` is (the
same fields, the same messages, naming ``<persona NAME defined in code>``)
and then written as a persona directory of the home: ``persona.yaml``,
``SOUL.md``, and — for tools given as functions — ``tools.pickle`` with
their code, pickled by value so that any node can run them. From there it
is a persona like any other: started on its first message, passivated when
idle, listed, served, evaluated, found again after a restart.

A marker file, ``.defined-in-code`` (the code tools' names, JSON), tells a
persona written here from one written by hand: a hand-written one is never
overwritten, and only one written here is removed again.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from coterie.runtime.config import PersonaConfig, check_persona_name
from coterie.runtime.config._strict import describe_error
from coterie.runtime.errors import PersonaConfigError
from coterie.runtime.plugins.refs import PluginProblem
from coterie.runtime.tool import ToolDefinitionError, ToolSpec, check_spec

#: The code of a persona's own tools, and the marker of a persona written here.
CODE_TOOLS = "tools.pickle"
MARKER = ".defined-in-code"
SOUL = "SOUL.md"
#: How a persona's own tools are named as a plugin.
CODE_PLUGIN = "code"


class CodePersona:
    """A persona given in code: ``CodePersona("weatherbot", soul=…, model={…},
    tools=[weather, "clock"], access="readonly")``.

    ``tools`` lists what it is offered: tools (``@tool`` functions, their code
    goes with the persona) and names or patterns of built-in and plugin
    tools; it becomes ``tools.allow`` (default: every tool, as in
    persona.yaml). Every other keyword is a persona.yaml field.
    """

    def __init__(
        self,
        name: str,
        *,
        soul: str = "",
        tools: Sequence[ToolSpec | str] | None = None,
        **fields: Any,
    ) -> None:
        self.name = name
        self.soul = soul
        self.label = f"<persona {name} defined in code>"
        check_persona_name(self.label, name)
        problems: list[str] = []
        self.code_tools: list[ToolSpec] = []
        allow: list[str] = []
        for i, item in enumerate(tools or ()):
            if isinstance(item, str):
                allow.append(item)
                continue
            try:
                spec = check_spec(item)
            except ToolDefinitionError as exc:
                problems.append(f"tools.{i}: {exc}")
                continue
            if spec.name in allow:
                problems.append(f"tools.{i}: {spec.name!r} is listed more than once")
                continue
            self.code_tools.append(spec)
            allow.append(spec.name)
        body = dict(fields)
        if tools is not None:
            if "tools" in body:
                problems.append("tools: give the tools list or a tools mapping, not both")
            body["tools"] = {"allow": allow}
        if problems:
            raise PersonaConfigError(self.label, problems)
        try:
            self.config = PersonaConfig.model_validate(body)
        except ValidationError as exc:
            raise PersonaConfigError(
                self.label,
                [describe_error(e) for e in exc.errors()],  # type: ignore[arg-type]
            ) from None
        self.body = self.config.model_dump(mode="json", exclude_unset=True)

    def check_names(self, taken: Iterable[str]) -> None:
        """Refuse code tools named like a built-in or plugin tool."""
        clash = sorted({s.name for s in self.code_tools} & set(taken))
        if clash:
            raise PersonaConfigError(
                self.label,
                [
                    f"tools: {n!r} is the name of a built-in or plugin tool; rename it"
                    for n in clash
                ],
            )


def _write(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def is_code_persona(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def write_code_persona(
    home: Path, persona: CodePersona, dumps: Callable[[list[ToolSpec]], bytes]
) -> Path:
    """Write ``persona`` into ``<home>/personas/<name>`` (replacing one written
    here before; never one written by hand) and return its directory.
    ``dumps`` pickles its tools by value. ``persona.yaml`` comes last: until
    it is there, no persona of that name exists, so a failure halfway leaves
    no half-written persona."""
    directory = home / "personas" / persona.name
    if (directory / "persona.yaml").exists() and not is_code_persona(directory):
        raise PersonaConfigError(
            persona.label,
            [f"{directory} holds a persona that was not defined in code; choose another name"],
        )
    directory.mkdir(parents=True, exist_ok=True)
    if persona.code_tools:
        _write(directory / CODE_TOOLS, dumps(persona.code_tools))
    else:
        (directory / CODE_TOOLS).unlink(missing_ok=True)
    _write(directory / SOUL, persona.soul.encode("utf-8"))
    names = [spec.name for spec in persona.code_tools]
    _write(directory / MARKER, json.dumps({"tools": names}).encode("utf-8"))
    _write(directory / "persona.yaml", yaml.safe_dump(persona.body, sort_keys=False).encode())
    return directory


def remove_code_persona(home: Path, name: str) -> bool:
    """Remove a persona written by :func:`write_code_persona` (its workspace
    too); False when there is none. A hand-written persona is refused."""
    directory = home / "personas" / name
    if not (directory / "persona.yaml").exists():
        return False
    if not is_code_persona(directory):
        raise PersonaConfigError(
            str(directory), ["not a persona defined in code: remove it by hand if you mean to"]
        )
    (directory / "persona.yaml").unlink()
    shutil.rmtree(directory, ignore_errors=True)
    return True


def code_tool_names(directory: Path) -> list[str]:
    """The names of a code persona's own tools (from its marker: no unpickling)."""
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    tools = data.get("tools") if isinstance(data, dict) else None
    return [t for t in tools if isinstance(t, str)] if isinstance(tools, list) else []


def load_code_tools(
    directory: Path, loads: Callable[[bytes], Any]
) -> tuple[list[ToolSpec], list[PluginProblem]]:
    """A persona's own tools (none without ``tools.pickle``), and why some
    could not be loaded (a module their code needs is missing here…)."""
    path = directory / CODE_TOOLS
    if not path.is_file():
        return [], []
    label = f"{CODE_PLUGIN} of persona {directory.name}"
    try:
        specs = loads(path.read_bytes())
    except Exception as exc:  # the user's code: contained and named
        return [], [
            PluginProblem(plugin=label, cause=f"cannot load {path}: {type(exc).__name__}: {exc}")
        ]
    found: list[ToolSpec] = []
    problems: list[PluginProblem] = []
    for spec in specs if isinstance(specs, list) else []:
        try:
            found.append(check_spec(spec))
        except ToolDefinitionError as exc:
            problems.append(PluginProblem(plugin=label, name=exc.tool_name, cause=exc.problem))
    return found, problems


__all__ = [
    "CODE_PLUGIN",
    "CODE_TOOLS",
    "MARKER",
    "CodePersona",
    "code_tool_names",
    "is_code_persona",
    "load_code_tools",
    "remove_code_persona",
    "write_code_persona",
]
