"""The personas' schedule files as the engine watches them: each persona's
``schedules.yaml`` and ``HEARTBEAT.md``, read again when their stamp
(modification time, size, inode) changes. A file that no longer loads keeps
what was loaded before (nothing, at start) and its error is kept for the
listings until the file is fixed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from coterie.runtime.errors import ScheduleConfigError
from coterie.runtime.schedule.entries import (
    CHECKLIST_FILE,
    SCHEDULES_FILE,
    Checklist,
    Entry,
    PersonaSchedules,
    load_schedules,
    read_checklist,
)
from coterie.runtime.schedule.records import ScheduleFileError

log = logging.getLogger("coterie.schedule")

_Stamp = tuple[int, int, int] | None
# A file not looked at yet (no real stamp equals it; a missing file is None).
_UNREAD: _Stamp = (-1, -1, -1)


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _file_error(persona: str, err: ScheduleConfigError, now: datetime) -> ScheduleFileError:
    return ScheduleFileError(
        persona=persona,
        path=err.path,
        entry=err.entry,
        field=err.field,
        message=err.message,
        since=now,
    )


@dataclass
class _Persona:
    """What is held of one persona's files."""

    schedules_stamp: _Stamp = _UNREAD
    checklist_stamp: _Stamp = _UNREAD
    schedules: PersonaSchedules | None = None
    checklist: Checklist | None = None
    error: ScheduleFileError | None = None
    checklist_error: ScheduleFileError | None = None


@dataclass
class Changes:
    """What one look found: personas whose entries changed (their new
    entries), personas gone, and errors new since the last look."""

    entries: dict[str, tuple[Entry, ...]] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    errors: list[ScheduleFileError] = field(default_factory=list)


class PersonaFiles:
    """Every persona's ``schedules.yaml`` and ``HEARTBEAT.md`` under ``home``."""

    def __init__(
        self,
        home: Path,
        personas: Callable[[], Iterable[str]],
        *,
        min_interval: timedelta,
        tz: ZoneInfo,
    ) -> None:
        self.home = home
        self._personas = personas
        self._min_interval = min_interval
        self._tz = tz
        self._held: dict[str, _Persona] = {}

    def folder(self, persona: str) -> Path:
        return self.home / "personas" / persona

    def look(self, now: datetime) -> Changes:
        """Stat every persona's files; read again the changed ones."""
        names = set(self._personas())
        changes = Changes()
        for gone in sorted(set(self._held) - names):
            del self._held[gone]
            changes.gone.append(gone)
        for persona in sorted(names):
            held = self._held.setdefault(persona, _Persona())
            folder = self.folder(persona)
            stamp = _stamp(folder / SCHEDULES_FILE)
            if stamp != held.schedules_stamp:
                held.schedules_stamp = stamp
                try:
                    loaded = load_schedules(
                        folder,
                        persona=persona,
                        min_interval=self._min_interval,
                        default_tz=self._tz,
                    )
                except ScheduleConfigError as exc:
                    held.error = _file_error(persona, exc, now)
                    changes.errors.append(held.error)
                    log.warning("%s (the previous schedule stays in force)", exc)
                else:
                    held.schedules, held.error = loaded, None
                    changes.entries[persona] = loaded.entries
            stamp = _stamp(folder / CHECKLIST_FILE)
            if stamp != held.checklist_stamp:
                held.checklist_stamp = stamp
                try:
                    held.checklist, held.checklist_error = read_checklist(folder), None
                except ScheduleConfigError as exc:
                    held.checklist_error = _file_error(persona, exc, now)
                    changes.errors.append(held.checklist_error)
                    log.warning("%s (the previous checklist stays in force)", exc)
        return changes

    def schedules(self, persona: str) -> PersonaSchedules | None:
        """The persona's schedule in force (the last one that loaded)."""
        held = self._held.get(persona)
        return held.schedules if held else None

    def checklist(self, persona: str) -> Checklist | None:
        held = self._held.get(persona)
        return held.checklist if held else None

    def errors(self, persona: str | None = None) -> list[ScheduleFileError]:
        """The files that do not load now (of one persona)."""
        return [
            err
            for name, held in sorted(self._held.items())
            if persona is None or name == persona
            for err in (held.error, held.checklist_error)
            if err is not None
        ]


__all__ = ["Changes", "PersonaFiles"]
