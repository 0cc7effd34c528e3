"""The engine's small pieces: building fires, counting instants, describing
entries and the days the daily cap counts in."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from coterie.runtime.schedule.cron import CronSpec, Every, format_duration
from coterie.runtime.schedule.entries import Checklist, Entry
from coterie.runtime.schedule.records import Fire, FireKey, Reminder, fire_id

#: A fire dispatched this long after its instant (or more) is marked late.
LATE_AFTER = timedelta(seconds=30)
#: How late a reminder may still fire (its misfire grace).
REMINDER_GRACE = timedelta(hours=24)
#: Instants counted one by one in a run of misses; more are reported as "at least".
MAX_COUNTED = 10_000


def count_instants(spec: CronSpec | Every, first: datetime, last: datetime) -> tuple[int, bool]:
    """How many instants of ``spec`` lie in [first, last] (``first`` being
    one), and whether the count stopped at :data:`MAX_COUNTED`."""
    if last < first:
        return 0, False
    if isinstance(spec, Every):
        return (last - first) // spec.interval + 1, False
    n, at = 1, first
    while n < MAX_COUNTED:
        at = spec.next_after(at)
        if at > last:
            return n, False
        n += 1
    return n, True


def before(spec: CronSpec | Every, instant: datetime) -> datetime | None:
    """The instant of ``spec`` just before ``instant``."""
    return spec.latest_at_or_before(instant - timedelta(microseconds=1))


def conversation_of(entry: Entry, fid: str) -> str:
    if entry.kind == "heartbeat":
        base = f"{entry.persona}:heartbeat"
        return f"{base}:{fid}" if entry.light else base
    base = f"{entry.persona}:cron:{entry.name}"
    return f"{base}:{fid}" if entry.conversation == "fresh" else base


def entry_fire(
    entry: Entry,
    instant: datetime,
    *,
    now: datetime,
    checklist: Checklist | None,
    manual: bool = False,
) -> Fire:
    """The fire of ``entry`` at ``instant`` (a heartbeat on the checklist
    carries its text and digest)."""
    key = FireKey(persona=entry.persona, kind=entry.kind, name=entry.name, instant=instant)
    fid = fire_id(key)
    on_checklist = entry.uses_checklist and checklist is not None
    prompt = entry.prompt if entry.prompt is not None else (checklist.text if checklist else "")
    return Fire(
        key=key,
        fire_id=fid,
        label=entry.name,
        conversation_id=conversation_of(entry, fid),
        prompt=prompt,
        late=not manual and now - instant >= LATE_AFTER,
        light=entry.light,
        model=entry.model,
        deliver=entry.deliver,
        manual=manual,
        checklist_digest=checklist.digest if on_checklist and checklist else None,
        expires_at=(now if manual else instant) + entry.grace,
    )


def reminder_fire(reminder: Reminder, instant: datetime, *, now: datetime) -> Fire:
    key = FireKey(persona=reminder.persona, kind="reminder", name=reminder.id, instant=instant)
    fid = fire_id(key)
    return Fire(
        key=key,
        fire_id=fid,
        label=reminder.name,
        conversation_id=f"{reminder.persona}:job:{reminder.id}",
        prompt=reminder.prompt,
        late=now - instant >= LATE_AFTER,
        deliver=reminder.deliver,
        origin=reminder.origin,
        expires_at=instant + REMINDER_GRACE,
    )


def reminder_instants(
    reminder: Reminder, now: datetime
) -> tuple[datetime, int, datetime | None] | None:
    """For a reminder due at ``now``: its latest due instant, how many
    instants are due (that one included), and its next instant after the
    latest (None: that was its last). None when it is not due."""
    if reminder.at > now:
        return None
    if not reminder.every_seconds:
        return reminder.at, 1, None
    step = timedelta(seconds=reminder.every_seconds)
    horizon = min(now, reminder.until) if reminder.until else now
    if horizon < reminder.at:
        return reminder.at, 1, None
    k = (horizon - reminder.at) // step
    latest = reminder.at + k * step
    following = latest + step
    if reminder.until is not None and following > reminder.until:
        return latest, k + 1, None
    return latest, k + 1, following


def describe_entry(entry: Entry) -> str:
    text = entry.describe()
    if entry.kind == "heartbeat" and entry.active_hours is not None:
        text += f", active {entry.active_hours.describe(entry.tz)}"
    return text


def describe_reminder(reminder: Reminder, tz: ZoneInfo) -> str:
    at = reminder.at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")
    if not reminder.every_seconds:
        return f"at {at}"
    text = f"every {format_duration(timedelta(seconds=reminder.every_seconds))} from {at}"
    if reminder.until is not None:
        text += f" until {reminder.until.astimezone(tz).strftime('%Y-%m-%d %H:%M %Z')}"
    return text


def day_bounds(now: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The local day of ``now`` in ``tz``, as [start, end) in UTC (23 or 25
    hours long on DST days)."""
    day = now.astimezone(tz).date()
    start = datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=tz).astimezone(UTC)
    return start, end


__all__ = [
    "LATE_AFTER",
    "MAX_COUNTED",
    "REMINDER_GRACE",
    "before",
    "count_instants",
    "day_bounds",
    "describe_entry",
    "describe_reminder",
    "entry_fire",
    "reminder_fire",
    "reminder_instants",
]
