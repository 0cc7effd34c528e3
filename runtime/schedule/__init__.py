"""The scheduler's plain logic: heartbeats, cron entries and reminders, no Ray.

- :mod:`~coterie.runtime.schedule.cron`: cron expressions in a zone (croniter,
  DST handled both ways) and heartbeat intervals;
- :mod:`~coterie.runtime.schedule.entries`: ``schedules.yaml`` and ``HEARTBEAT.md``;
- :mod:`~coterie.runtime.schedule.records`: fires, decisions, reminders,
  listings, the ``remind`` tool's request and result;
- :mod:`~coterie.runtime.schedule.clock`: the real clock and a fake one.

The guide's page "Schedules and reminders" says what a user sees.
"""

from __future__ import annotations

from coterie.runtime.schedule.clock import Clock, FakeClock, SystemClock
from coterie.runtime.schedule.cron import CronSpec, Every, format_duration, parse_duration
from coterie.runtime.schedule.entries import (
    CHECKLIST_FILE,
    HEARTBEAT_NAME,
    SCHEDULES_FILE,
    ActiveHours,
    Checklist,
    CronConfig,
    DeliverTarget,
    Entry,
    EntryKind,
    HeartbeatConfig,
    PersonaSchedules,
    ScheduleFile,
    load_schedules,
    read_checklist,
    write_schedules,
)
from coterie.runtime.schedule.records import (
    Decision,
    EntryStatus,
    Fire,
    FireKey,
    FireReport,
    FireState,
    Miss,
    Outcome,
    Queue,
    RemindAction,
    Reminder,
    RemindRequest,
    RemindResult,
    ScheduleFileError,
    ScheduleListing,
    Skip,
    fire_id,
)

__all__ = [
    "CHECKLIST_FILE",
    "HEARTBEAT_NAME",
    "SCHEDULES_FILE",
    "ActiveHours",
    "Checklist",
    "Clock",
    "CronConfig",
    "CronSpec",
    "Decision",
    "DeliverTarget",
    "Entry",
    "EntryKind",
    "EntryStatus",
    "Every",
    "FakeClock",
    "Fire",
    "FireKey",
    "FireReport",
    "FireState",
    "HeartbeatConfig",
    "Miss",
    "Outcome",
    "PersonaSchedules",
    "Queue",
    "RemindAction",
    "RemindRequest",
    "RemindResult",
    "Reminder",
    "ScheduleFile",
    "ScheduleFileError",
    "ScheduleListing",
    "Skip",
    "SystemClock",
    "fire_id",
    "format_duration",
    "load_schedules",
    "parse_duration",
    "read_checklist",
    "write_schedules",
]
