"""What the scheduler's tests share: a home with personas, an engine over a
DuckDB file with a fake clock, and a stand-in persona that accepts fires."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.schedule import FakeClock, Fire, Scheduler, ScheduleStore
from coterie.runtime.schedule.records import Decision, Miss, Skip

T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)  # a Monday
_stamp = [1_700_000_000_000_000_000]


def touch(path: Path, text: str) -> None:
    """Write ``text`` and give the file a new modification time (two writes
    in the same clock tick would otherwise look unchanged)."""
    path.write_text(text)
    _stamp[0] += 1_000_000_000
    os.utime(path, ns=(_stamp[0], _stamp[0]))


def make_persona(
    home: Path, name: str = "ada", *, schedules: str | None = None, checklist: str | None = None
) -> Path:
    folder = home / "personas" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "persona.yaml").write_text("model: {provider: scripted, default: ok}\n")
    if schedules is not None:
        touch(folder / "schedules.yaml", schedules)
    if checklist is not None:
        touch(folder / "HEARTBEAT.md", checklist)
    return folder


@dataclass
class Rig:
    """An engine over ``<home>/schedule.duckdb`` that a test can 'kill'
    (drop the engine and close the store, as a dead process would) and
    start again on the same file."""

    home: Path
    clock: FakeClock
    settings: ScheduleSettings = field(default_factory=lambda: ScheduleSettings(min_interval=1))
    tz: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    store: ScheduleStore | None = None
    engine: Scheduler | None = None

    def start(self) -> Scheduler:
        self.store = ScheduleStore(self.home / "schedule.duckdb")
        self.engine = Scheduler(
            self.store, self.clock, home=self.home, settings=self.settings, tz=self.tz
        )
        return self.engine

    def kill(self) -> None:
        assert self.store is not None
        self.store.close()
        self.store = self.engine = None

    @property
    def e(self) -> Scheduler:
        assert self.engine is not None
        return self.engine

    def due(self) -> list[Decision]:
        return self.e.due(self.clock.now())

    def fires(self) -> list[Fire]:
        """What is due, with every fire claimed (as the loop does)."""
        decisions = self.due()
        fires = [d for d in decisions if isinstance(d, Fire)]
        assert all(self.e.claim(fires, self.clock.now()))
        return fires


def skips(decisions: list[Decision]) -> list[Skip]:
    return [d for d in decisions if isinstance(d, Skip)]


def misses(decisions: list[Decision]) -> list[Miss]:
    return [d for d in decisions if isinstance(d, Miss)]


def only_fires(decisions: list[Decision]) -> list[Fire]:
    return [d for d in decisions if isinstance(d, Fire)]
