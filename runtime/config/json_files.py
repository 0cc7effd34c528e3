"""Reading the JSON files beside the YAML ones (``acp.json``, ``mcp.json``) and
naming the entry and field of each of their errors.

The files' own models live with their concern (``runtime.delegation.acp.roster``,
``runtime.mcp.config``); what they share is here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def read_json_config(path: Path, error: Callable[[str, list[str]], Exception]) -> Any:
    """The decoded JSON file at ``path`` (``acp.json``, ``mcp.json``); ``None``
    when there is none. An unreadable or invalid file raises ``error(path,
    problems)``. Synchronous: a small file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(str(path), [f"unreadable: {exc}"]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(str(path), [f"not valid JSON: {exc}"]) from None


def describe_entry_error(
    err: Mapping[str, Any], *, section: str, label: str, top_hint: str | None = None
) -> str:
    """A pydantic error of a file whose ``section`` maps names to entries
    (``agents``, ``mcpServers``), naming the entry (``label`` 'name') and the
    field; ``top_hint`` is added to an unknown top-level field."""
    loc = [str(p) for p in err["loc"]]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    if len(loc) >= 3 and loc[0] == section:
        return f"{label} {loc[1]!r}, field {'.'.join(loc[2:])!r}: {msg}"
    if len(loc) == 2 and loc[0] == section:
        return f"{label} {loc[1]!r}: {msg}"
    if len(loc) == 1 and err["type"] == "extra_forbidden" and top_hint:
        return f"field {loc[0]!r}: unknown field ({top_hint})"
    return f"{'.'.join(loc) or '(top level)'}: {msg}"


__all__ = ["describe_entry_error", "read_json_config"]
