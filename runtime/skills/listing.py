"""The skills section of a persona's system prompt, under a token budget.

The prompt lists each skill the persona may load as ``- name: description``,
in the persona's order of priority, while the lines fit
``skills.prompt_budget`` (runtime.yaml). Tokens are estimated without a
tokenizer as characters / 4, rounded up — close for English prose with the
common tokenizers, and the same on every machine. The first skill that does
not fit ends the listing (the order is the priority: a later, shorter one
does not jump the queue). Skills left out are never dropped silently: the
section says how many more there are and how to see them (``load_skill``
with a name that is not a skill answers with all of them), and the first
turn that sees that listing logs a warning naming them and records a
:class:`~coterie.runtime.messages.SkillsListed` event. Skills that cannot be
used are named the same way.

The section is a function of the skills' snapshot alone — no time, no
counter — and is built once per snapshot, so the prompt is the same bytes
from turn to turn while the skills do not change (prompt caches depend on
it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coterie.runtime.messages import SkillsListed
from coterie.runtime.skills.catalog import SkillProblem, SkillSet

log = logging.getLogger("coterie.skills")

#: Characters counted as one token by :func:`estimate_tokens`.
CHARS_PER_TOKEN = 4

INTRO = (
    "Skills are playbooks for particular tasks. When one fits the task at hand, "
    "call load_skill with its name before you start, and follow it."
)


def estimate_tokens(text: str) -> int:
    """Tokens of ``text``, estimated as characters / 4 rounded up."""
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class SkillListing:
    """The skills section of one snapshot: its text and what it holds."""

    #: The section ("" when the persona has no skills and no problems).
    text: str
    #: The skills listed, in order.
    listed: tuple[str, ...]
    #: The skills the budget left out, in order.
    left_out: tuple[str, ...]
    #: Skills that cannot be used.
    problems: tuple[SkillProblem, ...]
    #: The estimated tokens of the listed lines (what the budget bounds).
    tokens: int
    budget: int


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def skill_listing(skills: SkillSet, *, budget: int) -> SkillListing:
    """The section listing ``skills`` within ``budget`` estimated tokens.

    The budget bounds the ``- name: description`` lines; the section's fixed
    sentences (its heading, what skills are, the notes on what is not listed)
    are not counted.
    """
    lines: list[str] = []
    listed: list[str] = []
    left_out: list[str] = []
    used = 0
    for skill in skills.skills:
        line = f"- {skill.name}: {' '.join(skill.description.split())}"
        cost = estimate_tokens(line + "\n")
        if left_out or used + cost > budget:
            left_out.append(skill.name)
            continue
        lines.append(line)
        listed.append(skill.name)
        used += cost
    parts: list[str] = []
    if skills.skills:
        parts.append(INTRO)
        parts.extend(lines)
    if left_out:
        n = len(left_out)
        more = "more " if listed else ""
        parts.append(
            f"{n} {more}{_plural(n, 'skill is', 'skills are')} not listed here (the "
            "listing's budget is spent): call load_skill with a name that is not a skill "
            "to get every skill's name and description."
        )
    if skills.problems:
        names = ", ".join(dict.fromkeys(p.name for p in skills.problems))
        parts.append(
            f"{_plural(len(skills.problems), 'This skill', 'These skills')} cannot be "
            f"loaded now: {names} (load_skill with the name says why; tell the person "
            "who looks after your skills)."
        )
    text = "## Skills\n" + "\n".join(parts) if parts else ""
    return SkillListing(
        text=text,
        listed=tuple(listed),
        left_out=tuple(left_out),
        problems=skills.problems,
        tokens=used,
        budget=budget,
    )


class SkillPrompt:
    """One persona's skills section, built once per snapshot, and the report
    of each new listing (a warning and an audit event)."""

    def __init__(self, persona: str, *, budget: int) -> None:
        self.persona = persona
        self.budget = budget
        self._for: SkillSet | None = None
        self._listing = skill_listing(SkillSet(), budget=budget)
        self._reported: SkillSet | None = None

    def listing(self, skills: SkillSet) -> SkillListing:
        """The section of ``skills`` (the same object while the snapshot is)."""
        if skills is not self._for:
            self._listing = skill_listing(skills, budget=self.budget)
            self._for = skills
        return self._listing

    def report(
        self, skills: SkillSet, *, conversation_id: str, turn_id: str
    ) -> SkillsListed | None:
        """The event to record about ``skills`` when its listing was not
        reported yet (None otherwise, or when there were and are no skills);
        logs a warning naming what the budget left out and what cannot be used."""
        if skills is self._reported:
            return None
        first = self._reported is None
        self._reported = skills
        if first and not skills:
            return None
        listing = self.listing(skills)
        if listing.left_out:
            log.warning(
                "%s: the skills listing's budget (%d tokens) left out %d %s: %s",
                self.persona,
                self.budget,
                len(listing.left_out),
                _plural(len(listing.left_out), "skill", "skills"),
                ", ".join(listing.left_out),
            )
        for problem in listing.problems:
            log.warning("%s: skill %r cannot be used: %s", self.persona, problem.name, problem)
        return SkillsListed(
            persona=self.persona,
            conversation_id=conversation_id,
            turn_id=turn_id,
            listed=list(listing.listed),
            left_out=list(listing.left_out),
            problems=[f"{p.name}: {p}" for p in listing.problems],
            budget=self.budget,
            tokens=listing.tokens,
        )


__all__ = [
    "CHARS_PER_TOKEN",
    "SkillListing",
    "SkillPrompt",
    "estimate_tokens",
    "skill_listing",
]
