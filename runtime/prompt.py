"""System prompt assembly."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, tzinfo

from coterie.runtime.config import Persona
from coterie.runtime.memory.records import UserModelRow


def build_system_prompt(
    persona: Persona,
    *,
    roster: Sequence[tuple[str, str]] = (),
    user_model: Sequence[UserModelRow] = (),
    tz: tzinfo | None = None,
    today: datetime | None = None,
    skills: str = "",
) -> str:
    """SOUL, today's date, the user model, the skills section (made by
    :class:`~coterie.runtime.skills.SkillPrompt`) and the other personas."""
    today = today or datetime.now(tz)
    parts = [persona.soul.strip() or f"You are {persona.name}, a helpful assistant."]
    parts.append(
        f"## Context\nYou are the persona `{persona.name}`. Today is {today:%A, %Y-%m-%d}."
    )
    if user_model:
        lines = "\n".join(
            f"- {row.dimension} (confidence {row.confidence}/10): {row.content}"
            for row in user_model
        )
        parts.append(f"## What you know about the user\n{lines}")
    if skills:
        parts.append(skills)
    others = [(n, d) for n, d in roster if n != persona.name]
    if others:
        lines = "\n".join(f"- {n}: {d}" if d else f"- {n}" for n, d in others)
        parts.append(f"## Other personas\n{lines}")
    return "\n\n".join(parts)


__all__ = ["build_system_prompt"]
