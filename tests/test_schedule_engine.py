"""The scheduler's decisions with a fake clock: heartbeats and cron entries
firing, DST through the engine, hot reload good and bad, the listing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.schedule import FakeClock
from tests.schedule_helpers import T0, Rig, make_persona, touch

HEARTBEAT = "heartbeat:\n  every: 30m\n  prompt: Check in.\n"


@pytest.fixture
def rig(tmp_path: Path):
    rig = Rig(tmp_path, FakeClock(T0))
    yield rig
    if rig.store is not None:
        rig.kill()


def test_a_heartbeat_fires_on_its_grid_from_the_next_instant(rig: Rig) -> None:
    make_persona(rig.home, schedules=HEARTBEAT)
    rig.start()
    rig.clock.set(T0 + timedelta(minutes=7))
    assert rig.due() == []  # a new entry starts from now: nothing retroactive
    rig.clock.set(T0 + timedelta(minutes=30))
    [fire] = rig.fires()
    assert fire.instant == T0 + timedelta(minutes=30)
    assert (fire.kind, fire.label, fire.late, fire.prompt) == (
        "heartbeat",
        "heartbeat",
        False,
        "Check in.",
    )
    assert fire.conversation_id == "ada:heartbeat"
    assert rig.due() == []  # the same instant never fires twice
    rig.clock.advance(timedelta(minutes=29))
    assert rig.due() == []
    rig.clock.advance(timedelta(minutes=1))
    assert [f.instant for f in rig.fires()] == [T0 + timedelta(hours=1)]


def test_a_cron_entry_fires_at_its_local_time(rig: Rig) -> None:
    make_persona(
        rig.home,
        schedules="cron:\n  - name: alerts\n    cron: '0 8 * * 1-5'\n    tz: Europe/Paris\n"
        "    prompt: Summarize the overnight alerts.\n    conversation: fresh\n"
        "    deliver: {connector: telegram, destination: '42'}\n",
    )
    rig.start()
    rig.due()
    # Tuesday 08:00 in Paris is 07:00 UTC in January.
    rig.clock.set(datetime(2025, 1, 7, 7, 0, tzinfo=UTC))
    [fire] = rig.fires()
    assert fire.instant == datetime(2025, 1, 7, 7, 0, tzinfo=UTC)
    assert fire.prompt == "Summarize the overnight alerts."
    assert fire.conversation_id == f"ada:cron:alerts:{fire.fire_id}"  # fresh
    assert fire.reply_origin is not None and fire.reply_origin.destination == "42"
    assert rig.e.next_wake(rig.clock.now()) == datetime(2025, 1, 8, 7, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("zone", "start", "steps", "expected_local"),
    [
        # Spring forward in Paris: 02:30 does not exist on 2024-03-31.
        (
            "Europe/Paris",
            datetime(2024, 3, 30, 12, tzinfo=UTC),
            [datetime(2024, 3, 31, 1, 0, tzinfo=UTC), datetime(2024, 4, 1, 0, 30, tzinfo=UTC)],
            ["03:00+0200", "02:30+0200"],
        ),
        # Fall back in New York: 01:30 happens twice on 2024-11-03; it fires once.
        (
            "America/New_York",
            datetime(2024, 11, 2, 12, tzinfo=UTC),
            [datetime(2024, 11, 3, 5, 30, tzinfo=UTC), datetime(2024, 11, 4, 6, 30, tzinfo=UTC)],
            ["01:30-0400", "01:30-0500"],
        ),
    ],
)
def test_dst_both_ways_through_the_engine(
    tmp_path: Path, zone: str, start: datetime, steps: list[datetime], expected_local: list[str]
) -> None:
    rig = Rig(tmp_path, FakeClock(start))
    hour = 2 if zone == "Europe/Paris" else 1  # the hour the change skips / repeats
    make_persona(
        rig.home,
        schedules=f"cron:\n  - {{name: nightly, cron: '30 {hour} * * *', tz: {zone}, prompt: x}}\n",
    )
    rig.start()
    rig.due()
    got = []
    # Walk through the two days five minutes at a time: each fire is seen once.
    t = start
    end = steps[-1] + timedelta(minutes=1)
    while t < end:
        t += timedelta(minutes=5)
        rig.clock.set(min(t, end))
        got.extend(rig.fires())
    assert [f.instant for f in got] == steps
    assert [f.instant.astimezone(ZoneInfo(zone)).strftime("%H:%M%z") for f in got] == (
        expected_local
    )
    assert not any(f.late for f in got)
    rig.kill()


def test_the_listing_shows_each_zone(rig: Rig) -> None:
    make_persona(
        rig.home,
        schedules="heartbeat: {every: 1h, prompt: hi, active_hours: {start: '03:00', "
        "end: '20:00', tz: America/New_York}}\ncron:\n  - {name: paris, cron: '0 8 * * *', "
        "tz: Europe/Paris, prompt: x}\n",
    )
    rig.tz = ZoneInfo("Asia/Tokyo")
    rig.start()
    listing = rig.e.listing()
    assert listing.timezone == "Asia/Tokyo"
    hb, paris = listing.entries
    assert (hb.name, hb.tz) == ("heartbeat", "America/New_York")
    assert hb.schedule == "every 1h, active 03:00–20:00 America/New_York"
    assert hb.next_fire_utc == T0 + timedelta(hours=1)
    assert hb.next_fire is not None and hb.next_fire.utcoffset() == timedelta(hours=-5)
    assert (paris.tz, paris.schedule) == ("Europe/Paris", "cron 0 8 * * * (Europe/Paris)")
    assert paris.next_fire is not None and paris.next_fire.strftime("%H:%M %Z") == "08:00 CET"
    assert paris.next_fire_utc == datetime(2025, 1, 7, 7, 0, tzinfo=UTC)
    # After a fire, the last outcome is listed.
    rig.due()
    rig.clock.set(T0 + timedelta(hours=1))
    [fire] = rig.fires()
    assert rig.e.store.accept(fire.fire_id, at=rig.clock.now())
    [hb, _] = rig.e.listing("ada").entries
    assert hb.last_outcome == "accepted"
    assert rig.e.listing("bob").entries == []


def test_hot_reload_applies_a_good_edit_and_keeps_the_schedule_on_a_bad_one(rig: Rig) -> None:
    folder = make_persona(rig.home, schedules=HEARTBEAT)
    rig.start()
    rig.due()
    # A good edit: a cron entry appears, starting from now (nothing retroactive).
    touch(
        folder / "schedules.yaml",
        HEARTBEAT + "cron:\n  - {name: every-ten, cron: '*/10 * * * *', prompt: tick}\n",
    )
    rig.clock.set(T0 + timedelta(minutes=5))
    assert rig.e.reload() == []
    assert [e.name for e in rig.e.entries()] == ["heartbeat", "every-ten"]
    assert rig.due() == []
    rig.clock.set(T0 + timedelta(minutes=10))
    assert [f.label for f in rig.fires()] == ["every-ten"]
    # A bad edit: the previous schedule stays; the error names file, entry and field.
    touch(
        folder / "schedules.yaml",
        HEARTBEAT + "cron:\n  - {name: every-ten, cron: '99 * * * *', prompt: tick}\n",
    )
    [error] = rig.e.reload()
    assert (error.persona, error.entry, error.field) == ("ada", "cron 'every-ten'", "cron")
    assert error.path == str(folder / "schedules.yaml")
    assert rig.e.reload() == []  # reported once, not every look
    assert [e.name for e in rig.e.entries()] == ["heartbeat", "every-ten"]
    rig.clock.set(T0 + timedelta(minutes=20))
    assert [f.label for f in rig.fires()] == ["every-ten"]
    assert rig.e.listing().errors == [error]
    # Fixed: the error goes, the new schedule applies.
    touch(folder / "schedules.yaml", HEARTBEAT)
    assert rig.e.reload() == []
    assert rig.e.listing().errors == []
    assert [e.name for e in rig.e.entries()] == ["heartbeat"]
    rig.clock.set(T0 + timedelta(minutes=30))
    assert [f.label for f in rig.fires()] == ["heartbeat"]


def test_a_bad_file_at_start_lists_its_error_and_runs_nothing(rig: Rig) -> None:
    make_persona(rig.home, schedules="heartbeat: {every: often}\n")
    make_persona(rig.home, "bob", schedules=HEARTBEAT)
    rig.start()
    rig.due()
    [error] = rig.e.listing().errors
    assert (error.persona, error.entry, error.field) == ("ada", "heartbeat", "every")
    rig.clock.set(T0 + timedelta(minutes=30))
    assert [f.persona for f in rig.fires()] == ["bob"]


def test_a_changed_spec_starts_its_entry_again_from_now(rig: Rig) -> None:
    folder = make_persona(
        rig.home, schedules="cron:\n  - {name: a, cron: '0 10 * * *', prompt: x}\n"
    )
    rig.start()
    rig.due()
    rig.clock.set(T0 + timedelta(minutes=30))
    touch(folder / "schedules.yaml", "cron:\n  - {name: a, cron: '0 9 * * *', prompt: x}\n")
    rig.e.reload()
    # 09:00 today has passed under the new spec: it is not fired late.
    assert rig.due() == []
    rig.clock.set(T0 + timedelta(days=1))
    assert [f.instant for f in rig.fires()] == [T0 + timedelta(days=1)]


def test_removed_personas_and_entries_stop(rig: Rig) -> None:
    folder = make_persona(rig.home, schedules=HEARTBEAT)
    rig.start()
    rig.due()
    (folder / "schedules.yaml").unlink()
    rig.e.reload()
    rig.clock.set(T0 + timedelta(hours=2))
    assert rig.due() == []
    assert rig.e.next_wake() is None


def test_settings_are_honoured(tmp_path: Path) -> None:
    # min_interval: a heartbeat below it does not load.
    rig = Rig(tmp_path, FakeClock(T0), settings=ScheduleSettings(min_interval=3600))
    make_persona(rig.home, schedules=HEARTBEAT)
    rig.start()
    rig.due()
    [error] = rig.e.listing().errors
    assert error.field == "every" and "min_interval" in error.message
    rig.kill()
