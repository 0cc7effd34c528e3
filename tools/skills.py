"""Skills: ``load_skill``.

The system prompt lists each skill's name and description
(:mod:`coterie.runtime.skills`); ``load_skill`` returns one skill's
instructions — its ``SKILL.md`` without the front matter — and the absolute
paths of its other files, which ``file_read`` (and ``file_list``, ``glob``,
``grep``) can read: a persona's own skills are in its directory, and the
folders of the global skills it sees are readable (never writable) through
the path rails (:mod:`coterie.tools._paths`).

A skill with ``allowed-tools`` narrows the rest of the turn to those tools
(``ctx.outputs.tool_limits``; the loop offers the next model call only what
matches). The tool is offered only to a persona that has skills (usable or
not: a broken one is named in the prompt, and loading it says why).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.skills import SKILL_FILE, Skill, SkillSet
from coterie.runtime.tool import tool
from coterie.tools._paths import is_secret

#: Files of a skill listed by ``load_skill`` (the rest are counted).
MAX_LISTED_FILES = 100
#: Characters of each description in the list an unknown name gets.
DESCRIPTION_CHARS = 160


class LoadSkillArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=200,
        description="the skill's name, as listed under Skills in your instructions",
    )


def _has_skills(ctx: TurnContext) -> bool:
    return bool(ctx.settings.skills)


def skill_files(folder: Path, *, limit: int = MAX_LISTED_FILES) -> tuple[list[Path], int]:
    """The regular files under ``folder`` but its ``SKILL.md``, sorted, at
    most ``limit`` of them, and how many there are in all. Hidden entries,
    ``.env`` files and symlinks are left out (the file tools would refuse a
    link out of the folder, and secrets are never read by tools)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):  # never follows symlinked folders
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        base = Path(root)
        for name in sorted(files):
            path = base / name
            if name.startswith(".") or is_secret(path) or path.is_symlink():
                continue
            if base == folder and name == SKILL_FILE:
                continue
            found.append(path)
    found.sort()
    return found[:limit], len(found)


def _catalogue(skills: SkillSet) -> str:
    """Every skill by name with the start of its description, and the broken ones."""
    lines = []
    for skill in skills.skills:
        text = " ".join(skill.description.split())
        if len(text) > DESCRIPTION_CHARS:
            text = text[: DESCRIPTION_CHARS - 1] + "…"
        lines.append(f"- {skill.name}: {text}")
    for problem in skills.problems:
        lines.append(f"- {problem.name}: (cannot be loaded: {problem.detail})")
    return "\n".join(lines) or "(none)"


def _render(skill: Skill, folder: Path, files: list[Path], total: int) -> str:
    where = "your own skill" if skill.scope == "persona" else "a shared skill"
    parts = [f"# Skill {skill.name} ({where}, {folder})", skill.body.strip() or "(no instructions)"]
    if files:
        listing = "\n".join(f"- {path}" for path in files)
        more = (
            f"\n… and {total - len(files)} more (file_list {folder})" if total > len(files) else ""
        )
        parts.append(
            f"Files of this skill (read them with file_read when needed):\n{listing}{more}"
        )
    limit = skill.tool_limit()
    if limit is not None:
        parts.append(
            "While this skill is loaded, this turn may use only these tools (those your "
            f"own settings allow): {', '.join(limit)}."
        )
    return "\n\n".join(parts)


@tool(name="load_skill", timeout=30.0, available=_has_skills)
async def load_skill(args: LoadSkillArgs, ctx: TurnContext) -> str:
    """Load a skill: its full instructions, and the paths of its other files
    (read them with file_read). Skills are listed by name and description in
    your instructions; load one when the task matches its description, before
    you start. A name that is not a skill answers with every skill's name."""
    skills = ctx.settings.skills
    name = args.name.strip()
    skill = skills.get(name)
    if skill is None:
        problem = skills.problem(name)
        if problem is not None:
            raise ToolError("invalid_skill", f"skill {name!r} cannot be loaded: {problem}")
        raise ToolError("not_found", f"no skill named {name!r}. Skills:\n{_catalogue(skills)}")
    # The real folder: the paths listed are the ones the rails check.
    folder = await asyncio.to_thread(skill.folder.resolve)
    files, total = await asyncio.to_thread(skill_files, folder)
    limit = skill.tool_limit()
    if limit is not None:
        ctx.outputs.tool_limits.append(limit)
    return _render(skill, folder, files, total)


SKILL_TOOLS = [load_skill]

__all__ = ["SKILL_TOOLS", "LoadSkillArgs", "load_skill", "skill_files"]
