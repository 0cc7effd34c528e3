"""What every config section shares: a model that refuses unknown fields, and
one sentence per validation error naming the field.

Every field a file may hold is declared on its section's model and honoured;
a field that is not declared is an error, never silently dropped.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base of every config section: an unknown field is an error."""

    model_config = ConfigDict(extra="forbid")


def describe_error(err: dict[str, Any]) -> str:
    """One pydantic error as ``field.path: what is wrong``."""
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "union_tag_invalid":
        ctx = err.get("ctx", {})
        msg = f"expected one of {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    elif err["type"] == "union_tag_not_found":
        msg = (
            "missing 'provider' (expected 'openai', 'anthropic', 'scripted' or a plugin's provider)"
        )
    elif err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")  # a validator's own words
    return f"{loc}: {msg}"


__all__ = ["Strict", "describe_error"]
