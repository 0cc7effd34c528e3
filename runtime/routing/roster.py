"""The personas of a home: their names, and their descriptions read on demand.

A name is a directory ``<home>/personas/<name>`` holding a ``persona.yaml``.
Listing names is cheap; a description costs reading and validating the
file, so it is cached and re-read only when the file's mtime changes.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_left
from math import isnan, nan
from pathlib import Path

from runtime.config import load_persona_dir, persona_names
from runtime.errors import PersonaConfigError

log = logging.getLogger("coterie.routing")

#: Personas listed (with descriptions) in each persona's prompt and tools.
ROSTER_LIMIT = 200


class Roster:
    """Names and descriptions of the personas in ``home``, as one compact table.

    A home may register thousands of personas, so the table is three aligned
    columns over the sorted names: the names themselves, the mtime of each
    ``persona.yaml`` when its description was read (``nan``: not read yet, or
    invalid), and the description. Looking a name up is a bisection; there is
    no per-persona object. Rows of personas that disappeared go at the next
    :meth:`refresh`; rows of those that stay keep their cached description.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._names: list[str] = []
        self._mtimes = array("d")
        self._descriptions: list[str] = []
        self.refresh()

    @property
    def names(self) -> list[str]:
        """The names found by the last :meth:`refresh`, sorted."""
        return list(self._names)

    def refresh(self) -> list[str]:
        """Re-list the persona directories (names only), keeping what is cached."""
        names = persona_names(self.home)
        if names != self._names:
            old = {n: i for i, n in enumerate(self._names) if not isnan(self._mtimes[i])}
            mtimes = array("d", [nan]) * len(names)
            descriptions = [""] * len(names)
            for i, name in enumerate(names):
                j = old.get(name)
                if j is not None:
                    mtimes[i] = self._mtimes[j]
                    descriptions[i] = self._descriptions[j]
            self._names, self._mtimes, self._descriptions = names, mtimes, descriptions
        return self.names

    def _row(self, name: str) -> int | None:
        i = bisect_left(self._names, name)
        return i if i < len(self._names) and self._names[i] == name else None

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a persona, looking again once if it was not."""
        if self._row(name) is not None:
            return True
        self.refresh()
        return self._row(name) is not None

    def description(self, name: str) -> str | None:
        """The persona's description; ``None`` if its file is missing or invalid."""
        path = self.home / "personas" / name / "persona.yaml"
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        row = self._row(name)
        if row is not None and self._mtimes[row] == mtime:
            return self._descriptions[row]
        try:
            description = load_persona_dir(path.parent, name).config.description
        except PersonaConfigError as exc:
            log.warning("skipping persona %s: %s", name, exc)
            return None
        if row is not None:
            self._mtimes[row] = mtime
            self._descriptions[row] = description
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
