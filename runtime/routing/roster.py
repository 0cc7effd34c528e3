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

from coterie.runtime.config import check_persona_name, parse_persona_config, persona_names
from coterie.runtime.errors import PersonaConfigError

log = logging.getLogger("coterie.routing")

#: Personas listed (with descriptions) in each persona's prompt and tools.
ROSTER_LIMIT = 200


#: Sorted names, the mtime each description was read at (nan: none), descriptions.
_Table = tuple[list[str], "array[float]", list[str]]


def _row(names: list[str], name: str) -> int | None:
    i = bisect_left(names, name)
    return i if i < len(names) and names[i] == name else None


def _read(path: str) -> tuple[float, bytes]:
    """The file's mtime and bytes, from one open (unbuffered: a few µs less
    per file than ``open()``, which counts at 10,000 files)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        stat = os.fstat(fd)
        data = os.read(fd, stat.st_size + 1)
        if len(data) > stat.st_size:  # it grew since the stat: read to the end
            chunks = [data]
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            data = b"".join(chunks)
        return stat.st_mtime, data
    finally:
        os.close(fd)


class Roster:
    """Names and descriptions of the personas in ``home``, as one compact table.

    A home may register thousands of personas, so the table is three aligned
    columns over the sorted names: the names themselves, the mtime of each
    ``persona.yaml`` when its description was read (``nan``: not read yet, or
    invalid), and the description. Looking a name up is a bisection; there is
    no per-persona object. Rows of personas that disappeared go at the next
    :meth:`refresh`; rows of those that stay keep their cached description.

    A refresh replaces the whole table at once, and a reader takes the table
    once: pages are read in a worker thread while the router's loop may
    refresh, and a row number must never meet another table's columns.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._dir = str(home / "personas")
        self._table: _Table = ([], array("d"), [])
        self.refresh()

    @property
    def names(self) -> list[str]:
        """The names found by the last :meth:`refresh`, sorted (a copy)."""
        return list(self._table[0])

    def __len__(self) -> int:
        """How many names the last :meth:`refresh` found (without a copy)."""
        return len(self._table[0])

    def refresh(self) -> list[str]:
        """Re-list the persona directories (names only), keeping what is cached."""
        names = persona_names(self.home)
        old_names, old_mtimes, old_descriptions = self._table
        if names != old_names:
            old = {n: i for i, n in enumerate(old_names) if not isnan(old_mtimes[i])}
            mtimes = array("d", [nan]) * len(names)
            descriptions = [""] * len(names)
            for i, name in enumerate(names):
                j = old.get(name)
                if j is not None:
                    mtimes[i] = old_mtimes[j]
                    descriptions[i] = old_descriptions[j]
            self._table = (names, mtimes, descriptions)
        return list(names)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a persona, looking again once if it was not."""
        if _row(self._table[0], name) is not None:
            return True
        self.refresh()
        return _row(self._table[0], name) is not None

    def description(self, name: str) -> str | None:
        """The persona's description; ``None`` if its file is missing or invalid.

        A cached row costs one stat; any other read opens the file once (its
        mtime from the open file, so it always matches what was read).
        """
        directory = f"{self._dir}/{name}"
        try:
            check_persona_name(directory, name)
        except PersonaConfigError as exc:
            log.warning("skipping persona %s: %s", name, exc)
            return None
        path = f"{directory}/persona.yaml"
        names, mtimes, descriptions = self._table
        row = _row(names, name)
        try:
            if row is not None and not isnan(mtimes[row]) and os.stat(path).st_mtime == mtimes[row]:
                return descriptions[row]
            mtime, data = _read(path)
        except OSError:
            return None
        try:
            description = parse_persona_config(path, data).description
        except PersonaConfigError as exc:
            log.warning("skipping persona %s: %s", name, exc)
            return None
        if row is not None:  # into the table the row came from (current or replaced)
            mtimes[row] = mtime
            descriptions[row] = description
        return description

    def page(self, offset: int, limit: int | None) -> list[tuple[str, str]]:
        """(name, description) of the valid personas among the names
        ``offset`` to ``offset + limit`` (by name): only those files are read."""
        names = self._table[0][offset : None if limit is None else offset + limit]
        out: list[tuple[str, str]] = []
        for name in names:
            description = self.description(name)
            if description is not None:
                out.append((name, description))
        return out

    def entries(self, limit: int | None = ROSTER_LIMIT) -> list[tuple[str, str]]:
        """(name, description) of valid personas, the first ``limit`` by name."""
        out: list[tuple[str, str]] = []
        for name in self._table[0]:
            description = self.description(name)
            if description is not None:
                out.append((name, description))
            if limit is not None and len(out) >= limit:
                break
        return out


__all__ = ["ROSTER_LIMIT", "Roster"]
