"""Skills: playbooks a persona loads when a task calls for one.

A skill is a folder with a ``SKILL.md`` in the Agent Skills format (YAML
front matter, then instructions), under ``<home>/skills/`` (every persona's)
or ``<home>/personas/<name>/skills/`` (one persona's; it overrides a global
skill of the same name). The system prompt lists each skill's name and
description under a token budget; ``load_skill`` returns a skill's
instructions and the paths of its other files, which ``file_read`` can read.

- :mod:`~coterie.runtime.skills.format`: one ``SKILL.md`` read and checked
  (:class:`Skill`, :class:`SkillFormatError` naming the file and field);
- :mod:`~coterie.runtime.skills.catalog`: the skills one persona sees
  (override, ``skills:`` narrowing, problems), noticed cheaply when files
  change (:class:`SkillCatalog`, :class:`SkillSet`);
- :mod:`~coterie.runtime.skills.listing`: the prompt's section under its
  budget, and the warning and audit event naming what it leaves out
  (:class:`SkillPrompt`).

``allowed-tools`` only narrows: once a turn loads a skill that has it, the
turn's later model calls are offered only the tools that the persona's own
filter allows *and* that match the skill's list (``end_task`` and
``load_skill`` stay). Loading another skill narrows further; nothing widens
until the turn ends.
"""

from __future__ import annotations

from coterie.runtime.skills.catalog import (
    MAX_SKILLS_PER_FOLDER,
    SkillCatalog,
    SkillProblem,
    SkillSet,
)
from coterie.runtime.skills.format import (
    ALWAYS_OFFERED,
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    MAX_SKILL_FILE_BYTES,
    SKILL_FILE,
    Skill,
    SkillFormatError,
    SkillScope,
    parse_skill,
    skill_name_problem,
)
from coterie.runtime.skills.listing import (
    CHARS_PER_TOKEN,
    SkillListing,
    SkillPrompt,
    estimate_tokens,
    skill_listing,
)

__all__ = [
    "ALWAYS_OFFERED",
    "CHARS_PER_TOKEN",
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "MAX_SKILLS_PER_FOLDER",
    "MAX_SKILL_FILE_BYTES",
    "SKILL_FILE",
    "Skill",
    "SkillCatalog",
    "SkillFormatError",
    "SkillListing",
    "SkillProblem",
    "SkillPrompt",
    "SkillScope",
    "SkillSet",
    "estimate_tokens",
    "parse_skill",
    "skill_listing",
    "skill_name_problem",
]
