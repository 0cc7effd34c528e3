"""Tools on demand: the core set offered in full, the rest found by name.

A persona allowing many tools need not send every definition on every
call. With the catalogue on (``tools.catalogue``, see
:class:`~coterie.runtime.config.ToolFilter`) a model call offers the full
definitions of the *core* tools, of those found on this turn, and of
``find_tools``, whose call lists the other tools matching a query, one line
each, and makes their definitions part of the turn's next model calls. A
tool the model calls by its exact name without looking it up still runs:
the catalogue narrows what is shown, never what is allowed.

:func:`offer` is what the loop asks before each model call; :func:`search`
is ``find_tools``'s matching.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping

from coterie.runtime.config import ToolFilter
from coterie.runtime.config.persona import CATALOGUE_AUTO_ABOVE
from coterie.runtime.tool import ToolSpec

#: The tool that looks the others up.
FIND_TOOLS = "find_tools"

#: Offered in full whenever the catalogue is on (``tools.core`` replaces it):
#: what most turns need, and what ends or steers a turn.
DEFAULT_CORE: tuple[str, ...] = (
    "end_task",
    "ask_user",
    "reply_to_origin",
    "todo_write",
    "memory",
    "recall",
    "file_read",
    "file_write",
    "file_edit",
    "shell_exec",
    "ask_persona",
    "load_skill",
)

#: Most tools one ``find_tools`` call lists.
FIND_LIMIT = 8


def active(tool_filter: ToolFilter, visible: int) -> bool:
    """Whether the catalogue is on for a call that may offer ``visible`` tools."""
    if tool_filter.catalogue == "on":
        return True
    if tool_filter.catalogue == "off":
        return False
    return visible > CATALOGUE_AUTO_ABOVE


def offer(
    tools: Mapping[str, ToolSpec],
    *,
    tool_filter: ToolFilter,
    finder: ToolSpec | None,
    revealed: set[str],
) -> tuple[dict[str, ToolSpec], dict[str, ToolSpec]]:
    """The tools whose definitions one model call carries, and those left
    for ``find_tools`` to find. ``tools``: every tool the call may use;
    ``finder``: the ``find_tools`` spec (None: no catalogue possible);
    ``revealed``: the names found on this turn so far."""
    if finder is None or not active(tool_filter, len(tools)):
        return dict(tools), {}
    core = _core_matcher(tuple(tool_filter.core) if tool_filter.core is not None else DEFAULT_CORE)
    shown: dict[str, ToolSpec] = {}
    hidden: dict[str, ToolSpec] = {}
    for name, spec in tools.items():
        if name in revealed or core(name) is not None:
            shown[name] = spec
        else:
            hidden[name] = spec
    if hidden:
        shown[FIND_TOOLS] = finder
    return shown, hidden


@functools.lru_cache(maxsize=64)
def _core_matcher(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """One regex for a core list (offer runs before every model call)."""
    if not patterns:
        return lambda name: None
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)).match


def one_line(spec: ToolSpec) -> str:
    """A tool's description cut to its first sentence or line."""
    text = " ".join(spec.description.split())
    end = re.search(r"(?<=[.!?])\s", text)
    line = text[: end.start()] if end else text
    return line if len(line) <= 160 else line[:157] + "..."


def search(
    hidden: Mapping[str, ToolSpec], query: str, *, limit: int = FIND_LIMIT
) -> list[ToolSpec]:
    """The hidden tools best matching ``query``: a name pattern (``web_*``),
    an exact name, or words matched against names and descriptions (names
    weigh most); at most ``limit``, best first."""
    query = query.strip().lower()
    if not query:
        return []
    if any(ch in query for ch in "*?["):
        return [s for n, s in hidden.items() if fnmatch.fnmatchcase(n, query)][:limit]
    if query in hidden:
        return [hidden[query]]
    words = [w for w in re.split(r"[^a-z0-9]+", query) if len(w) > 1]
    scored: list[tuple[int, str, ToolSpec]] = []
    for name, spec in hidden.items():
        name_words = set(name.lower().split("_"))
        text = spec.description.lower()
        score = 0
        for word in words:
            stem = word[:-1] if len(word) > 3 and word.endswith("s") else word
            if word in name_words or stem in name_words:
                score += 5
            elif stem in name.lower():
                score += 3
            if stem in text:
                score += 1
        if score:
            scored.append((-score, name, spec))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [spec for _, _, spec in scored[:limit]]


__all__ = ["DEFAULT_CORE", "FIND_LIMIT", "FIND_TOOLS", "active", "offer", "one_line", "search"]
