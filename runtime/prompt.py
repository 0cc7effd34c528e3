"""System prompt assembly."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, tzinfo

from runtime.config import Persona


def build_system_prompt(
    persona: Persona,
    *,
    roster: Sequence[tuple[str, str]] = (),
    tz: tzinfo | None = None,
    today: datetime | None = None,
) -> str:
    """SOUL, today's date, and the other personas (name and description)."""
    today = today or datetime.now(tz)
    parts = [persona.soul.strip() or f"You are {persona.name}, a helpful assistant."]
    parts.append(
        f"## Context\nYou are the persona `{persona.name}`. Today is {today:%A, %Y-%m-%d}."
    )
    others = [(n, d) for n, d in roster if n != persona.name]
    if others:
        lines = "\n".join(f"- {n}: {d}" if d else f"- {n}" for n, d in others)
        parts.append(f"## Other personas\n{lines}")
    return "\n\n".join(parts)


__all__ = ["build_system_prompt"]
