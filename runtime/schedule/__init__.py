"""The scheduler's plain logic: heartbeats, cron entries and reminders, no Ray.

- :mod:`~coterie.runtime.schedule.cron`: cron expressions in a zone (croniter,
  DST handled both ways) and heartbeat intervals;
- :mod:`~coterie.runtime.schedule.entries`: ``schedules.yaml`` and ``HEARTBEAT.md``;
- :mod:`~coterie.runtime.schedule.records`: fires, decisions, reminders,
  listings, the ``remind`` tool's request and result;
- :mod:`~coterie.runtime.schedule.clock`: the real clock and a fake one;
- :mod:`~coterie.runtime.schedule.store`: the DuckDB file (the fire ledger,
  cursors, reminders, acknowledgements, paused queues);
- :mod:`~coterie.runtime.schedule.engine`: :class:`Scheduler`, every decision;
- :mod:`~coterie.runtime.schedule.service`: the :class:`SchedulerService`
  protocol and :class:`LocalScheduler`, a whole scheduler in one process.

The guide's page "Schedules and reminders" says what a user sees.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Every name loads with its module when first asked for. Importing one module
# of the package runs this file first: a persona's process needs the remind
# tool's records, never the engine, its store, the service or croniter.
if TYPE_CHECKING:
    from coterie.runtime.schedule.clock import Clock, FakeClock, SystemClock
    from coterie.runtime.schedule.cron import CronSpec, Every, format_duration, parse_duration
    from coterie.runtime.schedule.engine import Scheduler
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
    from coterie.runtime.schedule.service import (
        LocalScheduler,
        SchedulerService,
        read_listing,
    )
    from coterie.runtime.schedule.store import STORE_FILE, ScheduleStore

#: Every name, by the module that defines it.
_LAZY = {
    "Clock": "clock",
    "FakeClock": "clock",
    "SystemClock": "clock",
    "CronSpec": "cron",
    "Every": "cron",
    "format_duration": "cron",
    "parse_duration": "cron",
    "Scheduler": "engine",
    "CHECKLIST_FILE": "entries",
    "HEARTBEAT_NAME": "entries",
    "SCHEDULES_FILE": "entries",
    "ActiveHours": "entries",
    "Checklist": "entries",
    "CronConfig": "entries",
    "DeliverTarget": "entries",
    "Entry": "entries",
    "EntryKind": "entries",
    "HeartbeatConfig": "entries",
    "PersonaSchedules": "entries",
    "ScheduleFile": "entries",
    "load_schedules": "entries",
    "read_checklist": "entries",
    "write_schedules": "entries",
    "Decision": "records",
    "EntryStatus": "records",
    "Fire": "records",
    "FireKey": "records",
    "FireReport": "records",
    "FireState": "records",
    "Miss": "records",
    "Outcome": "records",
    "Queue": "records",
    "RemindAction": "records",
    "Reminder": "records",
    "RemindRequest": "records",
    "RemindResult": "records",
    "ScheduleFileError": "records",
    "ScheduleListing": "records",
    "Skip": "records",
    "fire_id": "records",
    "LocalScheduler": "service",
    "SchedulerService": "service",
    "read_listing": "service",
    "STORE_FILE": "store",
    "ScheduleStore": "store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CHECKLIST_FILE",
    "HEARTBEAT_NAME",
    "SCHEDULES_FILE",
    "STORE_FILE",
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
    "LocalScheduler",
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
    "ScheduleStore",
    "Scheduler",
    "SchedulerService",
    "Skip",
    "SystemClock",
    "fire_id",
    "format_duration",
    "load_schedules",
    "parse_duration",
    "read_checklist",
    "read_listing",
    "write_schedules",
]
