"""Cron maths in a zone, across both DST transitions, and heartbeat intervals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from coterie.runtime.errors import ScheduleError
from coterie.runtime.schedule.cron import CronSpec, Every, format_duration, parse_duration

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def fires(spec: CronSpec | Every, start: datetime, n: int) -> list[datetime]:
    out, at = [], start
    for _ in range(n):
        at = spec.next_after(at)
        out.append(at)
    return out


def test_a_weekday_cron_fires_at_eight_local_and_answers_in_utc() -> None:
    spec = CronSpec.parse("0 8 * * 1-5", "Europe/Paris")
    # Friday 2025-01-10 09:00 UTC: next is Monday 08:00 Paris (07:00 UTC).
    got = fires(spec, datetime(2025, 1, 10, 9, tzinfo=UTC), 2)
    assert got == [datetime(2025, 1, 13, 7, tzinfo=UTC), datetime(2025, 1, 14, 7, tzinfo=UTC)]
    assert all(t.tzinfo == UTC for t in got)


def test_eight_oclock_stays_eight_oclock_local_across_spring_forward() -> None:
    spec = CronSpec.parse("0 8 * * *", PARIS)
    got = fires(spec, datetime(2024, 3, 29, 12, tzinfo=UTC), 3)
    assert [t.astimezone(PARIS).hour for t in got] == [8, 8, 8]
    # The UTC instant moves by an hour on the day the clocks change.
    assert [t.hour for t in got] == [7, 6, 6]


def test_a_time_skipped_by_spring_forward_fires_once_just_after_the_gap() -> None:
    # Paris, 2024-03-31: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    spec = CronSpec.parse("30 2 * * *", PARIS)
    got = fires(spec, datetime(2024, 3, 30, 12, tzinfo=UTC), 2)
    assert got[0] == datetime(2024, 3, 31, 1, 0, tzinfo=UTC)  # 03:00 CEST
    assert got[0].astimezone(PARIS).strftime("%H:%M") == "03:00"
    assert got[1].astimezone(PARIS).strftime("%d %H:%M") == "01 02:30"


def test_several_skipped_times_fire_once_between_them() -> None:
    spec = CronSpec.parse("*/15 2 * * *", PARIS)
    got = fires(spec, datetime(2024, 3, 31, 0, 50, tzinfo=UTC), 2)
    assert got[0] == datetime(2024, 3, 31, 1, 0, tzinfo=UTC)
    # Next is the next day's 02:00, not 02:15/02:30/02:45 of the gap again.
    assert got[1].astimezone(PARIS).strftime("%m-%d %H:%M") == "04-01 02:00"


def test_a_time_repeated_by_fall_back_fires_once_at_its_first_occurrence() -> None:
    # New York, 2024-11-03: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    spec = CronSpec.parse("30 1 * * *", NEW_YORK)
    got = fires(spec, datetime(2024, 11, 2, 12, tzinfo=UTC), 2)
    assert got[0] == datetime(2024, 11, 3, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert got[0].astimezone(NEW_YORK).utcoffset() == timedelta(hours=-4)
    # The second 01:30 (EST, 06:30 UTC) is not a fire; the next is a day later.
    assert got[1] == datetime(2024, 11, 4, 6, 30, tzinfo=UTC)


def test_an_every_twenty_minutes_cron_does_not_repeat_the_fall_back_hour() -> None:
    spec = CronSpec.parse("*/20 * * * *", NEW_YORK)
    got = fires(spec, datetime(2024, 11, 3, 5, 30, tzinfo=UTC), 3)
    local = [t.astimezone(NEW_YORK).strftime("%H:%M%z") for t in got]
    assert local == ["01:40-0400", "02:00-0500", "02:20-0500"]
    # From inside the repeated hour (01:10 EST), nothing of that hour fires again.
    second_pass = datetime(2024, 11, 3, 6, 10, tzinfo=UTC)
    assert spec.next_after(second_pass) == datetime(2024, 11, 3, 7, 0, tzinfo=UTC)
    # The latest fire at or before it was the first pass's 01:40.
    assert spec.latest_at_or_before(second_pass) == datetime(2024, 11, 3, 5, 40, tzinfo=UTC)


def test_latest_at_or_before_includes_the_instant_itself() -> None:
    spec = CronSpec.parse("0 * * * *", "UTC")
    at = datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    assert spec.latest_at_or_before(at) == at
    assert spec.latest_at_or_before(at + timedelta(minutes=59)) == at


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("61 * * * *", "not a valid cron expression"),
        ("* * * *", "not a 5-field cron expression"),
        ("0 8 * * 1-5 2025", "not a 5-field cron expression"),
        ("0 0 30 2 *", "never fires"),
        ("@reboot", "not a cron expression"),
        ("*/0 * * * *", "not a valid cron expression"),
    ],
)
def test_a_bad_expression_raises_naming_it(expr: str, needle: str) -> None:
    with pytest.raises(ScheduleError, match=needle) as info:
        CronSpec.parse(expr, "UTC")
    assert repr(expr) in str(info.value)


def test_an_unknown_zone_is_an_error() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Base'"):
        CronSpec.parse("0 8 * * *", "Mars/Base")


def test_aliases_and_periods() -> None:
    assert CronSpec.parse("@daily", "UTC").period() == timedelta(days=1)
    assert CronSpec.parse("*/20 * * * *", "UTC").period() == timedelta(minutes=20)
    # Weekdays: the shortest gap (a day), not the weekend's three.
    assert CronSpec.parse("0 8 * * 1-5", "UTC").period() == timedelta(days=1)


def test_every_is_aligned_on_the_epoch_so_restarts_agree() -> None:
    every = Every.parse("30m")
    a = every.next_after(datetime(2025, 1, 1, 9, 7, 13, tzinfo=UTC))
    b = every.next_after(datetime(2025, 1, 1, 9, 29, 59, tzinfo=UTC))
    assert a == b == datetime(2025, 1, 1, 9, 30, tzinfo=UTC)
    # Strictly after: an instant on the grid gives the next one.
    assert every.next_after(a) == datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    assert every.latest_at_or_before(a) == a
    # Any zone in, UTC out.
    paris = datetime(2025, 1, 1, 10, 7, tzinfo=PARIS)
    assert every.next_after(paris) == datetime(2025, 1, 1, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"), [("45s", 45), ("30m", 1800), ("2h", 7200), ("1d", 86400), (90, 90)]
)
def test_durations(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "5", "5w", "-1m", "0s", "soon", True])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ScheduleError):
        parse_duration(text)  # type: ignore[arg-type]


def test_format_duration_round_trips() -> None:
    for text in ("45s", "30m", "2h", "1d", "90m"):
        assert format_duration(parse_duration(text)) == text
