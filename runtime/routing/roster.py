"""The personas of a home: their names, and their descriptions read on demand.

A name is a directory ``<home>/personas/<name>`` holding a ``persona.yaml``.
Listing names is cheap; a description costs reading and validating the
file, so it is cached and re-read only when the file's mtime changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from runtime.config import load_persona_dir, persona_names
from runtime.errors import PersonaConfigError

log = logging.getLogger("coterie.routing")

#: Personas listed (with descriptions) in each persona's prompt and tools.
ROSTER_LIMIT = 200


class Roster:
    """Names and descriptions of the personas in ``home``.

    The description cache holds at most one entry per persona directory;
    entries of personas that disappeared go at the next :meth:`refresh`.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._names: list[str] = []
        self._known: frozenset[str] = frozenset()
        # name -> (mtime of persona.yaml, description)
        self._descriptions: dict[str, tuple[float, str]] = {}
        self.refresh()

    @property
    def names(self) -> list[str]:
        """The names found by the last :meth:`refresh`, sorted."""
        return list(self._names)

    def refresh(self) -> list[str]:
        """Re-list the persona directories (names only)."""
        self._names = persona_names(self.home)
        self._known = frozenset(self._names)
        for gone in set(self._descriptions) - self._known:
            del self._descriptions[gone]
        return self.names

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a persona, looking again once if it was not."""
        if name in self._known:
            return True
        self.refresh()
        return name in self._known

    def description(self, name: str) -> str | None:
        """The persona's description; ``None`` if its file is missing or invalid."""
        path = self.home / "personas" / name / "persona.yaml"
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        cached = self._descriptions.get(name)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            description = load_persona_dir(path.parent, name).config.description
        except PersonaConfigError as exc:
            log.warning("skipping persona %s: %s", name, exc)
            return None
        if name in self._known:
            self._descriptions[name] = (mtime, description)
        return description

    def page(self, offset: int, limit: int | None) -> list[tuple[str, str]]:
        """(name, description) of the valid personas among the names
        ``offset`` to ``offset + limit`` (by name): only those files are read."""
        names = self._names[offset : None if limit is None else offset + limit]
        out: list[tuple[str, str]] = []
        for name in names:
            description = self.description(name)
            if description is not None:
                out.append((name, description))
        return out

    def entries(self, limit: int | None = ROSTER_LIMIT) -> list[tuple[str, str]]:
        """(name, description) of valid personas, the first ``limit`` by name."""
        out: list[tuple[str, str]] = []
        for name in self._names:
            description = self.description(name)
            if description is not None:
                out.append((name, description))
            if limit is not None and len(out) >= limit:
                break
        return out


__all__ = ["ROSTER_LIMIT", "Roster"]
