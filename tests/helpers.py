"""Small builders shared by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from runtime.context import TurnContext
from runtime.testing import turn_context


def make_ctx(text: str = "hi", **kwargs: Any) -> TurnContext:
    """A turn context on a fresh conversation holding one user message."""
    return turn_context(text, **kwargs)


def write_persona(home: Path, name: str, config: dict[str, Any], soul: str = "") -> Path:
    """Write ``<home>/personas/<name>/persona.yaml`` (and SOUL.md)."""
    path = home / "personas" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "persona.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (path / "SOUL.md").write_text(soul or f"You are {name}.", encoding="utf-8")
    return path


def scripted(
    rules: list[dict[str, Any]] | None = None,
    default: str = "ok",
    *,
    latency_ms: float = 0,
    **extra: Any,
) -> dict[str, Any]:
    """A persona.yaml body with a scripted model."""
    model: dict[str, Any] = {"provider": "scripted", "rules": rules or [], "default": default}
    if latency_ms:
        model["latency_ms"] = latency_ms
    return {"model": model, **extra}


def asker(description: str = "asks back") -> dict[str, Any]:
    """A scripted persona that asks "Which city?" (Paris, Oslo) about a trip
    and otherwise echoes its input as ``you said: …``."""
    return scripted(
        [
            {
                "when": {"contains": "trip"},
                "tool_calls": [
                    {
                        "name": "ask_user",
                        "arguments": {"question": "Which city?", "buttons": ["Paris", "Oslo"]},
                    }
                ],
            },
            {"when": {}, "text": "you said: {input}"},
        ],
        description=description,
    )
