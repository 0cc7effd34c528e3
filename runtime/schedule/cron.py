"""When entries fire: cron expressions in a time zone, and heartbeat intervals.

:class:`CronSpec` wraps croniter. The cron maths run on the *wall clock* of
the entry's zone (croniter over naive local times, where it is exact), and
this module maps each local time to one instant itself, so that "08:00"
stays 08:00 local across DST changes and the two transitions behave like
Vixie cron:

- spring forward: a local time the change skips (02:30 in Paris on the last
  Sunday of March) fires once, at the first instant after the gap (03:00
  local); several skipped times (``*/15 2 * * *``) fire once between them;
- fall back: a local time the change repeats (01:30 in New York on the first
  Sunday of November) fires once, at its first occurrence.

:class:`Every` is a heartbeat interval (``30m``, ``2h``, ``45s``, ``1d``):
its instants are the multiples of the interval since the Unix epoch in UTC,
so they are the same instants across restarts whatever the start time.

All instants in and out are aware datetimes; ``next_after`` answers in UTC.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from types import ModuleType
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from coterie.runtime.errors import ScheduleError


def _croniter() -> ModuleType:
    """croniter, loaded with the first cron expression read (with dateutil,
    ~0.4 MiB a persona's process never needs unless it reads one)."""
    import croniter

    return croniter


#: The ``@`` shorthands croniter expands, accepted beside five fields.
CRON_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Where a cron expression's typical period is measured from: a fixed, DST-free
# wall-clock point, so the period of an expression never depends on today.
_PERIOD_FROM = datetime(2025, 1, 6)
_PERIOD_SAMPLES = 12
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; an unknown one raises :class:`ScheduleError`."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {name!r} (an IANA name such as Europe/Paris)"
        ) from None


def parse_duration(text: str | int | float) -> timedelta:
    """``"30m"``, ``"2h"``, ``"45s"``, ``"1d"`` (or a number of seconds) as a
    positive :class:`timedelta`; anything else raises :class:`ScheduleError`."""
    if isinstance(text, bool):
        raise ScheduleError(f"{text!r} is not a duration (e.g. 45s, 30m, 2h, 1d)")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _DURATION_RE.match(str(text))
        if not match:
            raise ScheduleError(f"{text!r} is not a duration (e.g. 45s, 30m, 2h, 1d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ScheduleError(f"{text!r} is not a positive duration")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """A duration the way schedules.yaml writes it (``90s`` -> ``90s``, ``2h``)."""
    seconds = value.total_seconds()
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _to_instant(local: datetime, tz: ZoneInfo) -> datetime:
    """The instant of a naive wall-clock time in ``tz``: its first occurrence
    when the time is repeated, the end of the gap when it does not exist."""
    first = local.replace(tzinfo=tz, fold=0)
    second = local.replace(tzinfo=tz, fold=1)
    if first.utcoffset() == second.utcoffset():
        return first.astimezone(UTC)
    a, b = first.astimezone(UTC), second.astimezone(UTC)
    lo, hi = min(a, b), max(a, b)
    if lo.astimezone(tz).replace(tzinfo=None) == local:
        # A repeated time: both readings exist; the first one is earlier.
        return lo
    # A skipped time: the zone's offset changes somewhere in [lo, hi]; the
    # first instant after the gap is that change (found to the second).
    before = lo.astimezone(tz).utcoffset()
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi.replace(microsecond=0)


@dataclass(frozen=True)
class CronSpec:
    """A cron expression in a time zone (use :meth:`parse`)."""

    expr: str
    tz: ZoneInfo

    @classmethod
    def parse(cls, expr: str, tz: str | ZoneInfo) -> CronSpec:
        """Five fields (minute hour day month weekday) or an ``@`` shorthand;
        a bad expression, one that never fires or an unknown zone raises
        :class:`ScheduleError` quoting it."""
        zone_ = tz if isinstance(tz, ZoneInfo) else zone(tz)
        text = " ".join(str(expr).split())
        if text.startswith("@"):
            if text.lower() not in CRON_ALIASES:
                raise ScheduleError(
                    f"{expr!r} is not a cron expression (the @ shorthands are "
                    f"{', '.join(sorted(CRON_ALIASES))})"
                )
            text = text.lower()
        elif len(text.split()) != 5:
            raise ScheduleError(
                f"{expr!r} is not a 5-field cron expression (minute hour day-of-month month "
                "day-of-week, e.g. '0 8 * * 1-5')"
            )
        cron = _croniter()
        try:
            cron.croniter(text, _PERIOD_FROM).get_next(datetime)
        except cron.CroniterBadDateError:
            raise ScheduleError(f"cron expression {expr!r} never fires") from None
        except (cron.CroniterBadCronError, cron.CroniterError, ValueError, KeyError) as exc:
            raise ScheduleError(f"{expr!r} is not a valid cron expression: {exc}") from None
        return cls(text, zone_)

    @property
    def zone_name(self) -> str:
        return self.tz.key

    def next_after(self, instant: datetime) -> datetime:
        """The first fire strictly after ``instant`` (aware), in UTC."""
        after = instant.astimezone(UTC)
        local = after.astimezone(self.tz).replace(tzinfo=None, fold=0)
        it = _croniter().croniter(self.expr, local)
        # In the second pass of a repeated hour, local times just after
        # ``instant``'s reading already fired on the first pass: passed over.
        while True:
            candidate = _to_instant(it.get_next(datetime), self.tz)
            if candidate > after:
                return candidate

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The last fire at or before ``instant``, in UTC (None if none in
        croniter's search window)."""
        at = instant.astimezone(UTC)
        local = at.astimezone(self.tz).replace(tzinfo=None, fold=0)
        # Start ahead: in the second pass of a repeated hour, a local time
        # after ``instant``'s reading fired (on the first pass) before it.
        # Instants grow with local times, so the first one at or before
        # ``instant`` walking back is the latest.
        cron = _croniter()
        it = cron.croniter(self.expr, local + timedelta(hours=3))
        try:
            for _ in range(10_000):
                candidate = _to_instant(it.get_prev(datetime), self.tz)
                if candidate <= at:
                    return candidate
        except cron.CroniterBadDateError:
            return None
        return None

    def period(self) -> timedelta:
        """The typical gap between fires: the shortest of a dozen consecutive
        gaps on the wall clock (what the default ``misfire_grace`` and the
        ``min_interval`` check use)."""
        return self._period

    @cached_property
    def _period(self) -> timedelta:
        it = _croniter().croniter(self.expr, _PERIOD_FROM)
        times = [it.get_next(datetime) for _ in range(_PERIOD_SAMPLES)]
        return min(b - a for a, b in itertools.pairwise(times))

    def describe(self) -> str:
        return f"cron {self.expr} ({self.tz.key})"


@dataclass(frozen=True)
class Every:
    """A heartbeat interval: fires at every multiple of ``interval`` since the
    Unix epoch (UTC), so the instants survive restarts unchanged."""

    interval: timedelta

    @classmethod
    def parse(cls, text: str | int | float) -> Every:
        """``"30m"``, ``"2h"``, ``"45s"``, ``"1d"``; raises :class:`ScheduleError`."""
        return cls(parse_duration(text))

    def next_after(self, instant: datetime) -> datetime:
        """The first multiple of the interval strictly after ``instant``, in UTC."""
        step = self.interval
        elapsed = instant.astimezone(UTC) - _EPOCH
        k = elapsed // step
        return _EPOCH + (k + 1) * step

    def latest_at_or_before(self, instant: datetime) -> datetime:
        elapsed = instant.astimezone(UTC) - _EPOCH
        return _EPOCH + (elapsed // self.interval) * self.interval

    def period(self) -> timedelta:
        return self.interval

    def describe(self) -> str:
        return f"every {format_duration(self.interval)}"


__all__ = [
    "CRON_ALIASES",
    "CronSpec",
    "Every",
    "format_duration",
    "parse_duration",
    "zone",
]
