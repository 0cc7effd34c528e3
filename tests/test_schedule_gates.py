"""The gates that skip a fire before any model call, each with its reason:
an empty checklist, a checklist unchanged since it was acknowledged,
active_hours, the daily cap, a paused queue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.schedule import FakeClock
from coterie.runtime.schedule.records import Reminder
from tests.schedule_helpers import T0, Rig, make_persona, only_fires, skips, touch

CHECKLIST_HEARTBEAT = "heartbeat: {every: 30m}\n"


@pytest.fixture
def rig(tmp_path: Path):
    rig = Rig(tmp_path, FakeClock(T0))
    yield rig
    if rig.store is not None:
        rig.kill()


def step(rig: Rig, minutes: int = 30) -> list:
    rig.clock.advance(timedelta(minutes=minutes))
    return rig.due()


def test_an_empty_or_missing_checklist_skips_without_a_fire(rig: Rig) -> None:
    folder = make_persona(rig.home, schedules=CHECKLIST_HEARTBEAT)
    rig.start()
    rig.due()
    decisions = step(rig)
    assert only_fires(decisions) == []
    [skip] = skips(decisions)
    assert "empty checklist" in skip.reason
    assert skip.instant == T0 + timedelta(minutes=30)
    # Headings and comments only: still nothing to do.
    touch(folder / "HEARTBEAT.md", "# Heartbeat\n<!-- add things to check -->\n")
    rig.e.reload()
    [skip] = skips(step(rig))
    assert "empty checklist" in skip.reason
    # The reason is the entry's last outcome.
    [row] = rig.e.listing().entries
    assert (row.last_outcome, row.last_reason) == ("skipped", skip.reason)
    # Nothing in the ledger: a skip starts no turn and costs no model call.
    assert rig.e.store.ledger() == []


def test_an_acknowledged_unchanged_checklist_skips_until_it_changes(rig: Rig) -> None:
    folder = make_persona(
        rig.home, schedules=CHECKLIST_HEARTBEAT, checklist="- [ ] check the deploy\n"
    )
    rig.start()
    rig.due()
    rig.clock.advance(timedelta(minutes=30))
    [fire] = rig.fires()
    assert fire.prompt == "- [ ] check the deploy"
    assert fire.checklist_digest is not None
    # The turn finds nothing to do: it ends skipped, which acknowledges the checklist.
    store = rig.e.store
    assert store.accept(fire.fire_id, at=rig.clock.now())
    store.finish(fire.fire_id, "skipped", at=rig.clock.now())
    rig.e.invalidate()
    decisions = step(rig)
    assert only_fires(decisions) == []
    [skip] = skips(decisions)
    assert "unchanged" in skip.reason
    # A turn that did work does not acknowledge: after an edit it fires, and
    # keeps firing while its turns end ok.
    touch(folder / "HEARTBEAT.md", "- [ ] check the deploy\n- [ ] water the plants\n")
    rig.e.reload()
    rig.clock.advance(timedelta(minutes=30))
    [fire] = rig.fires()
    store.accept(fire.fire_id, at=rig.clock.now())
    store.finish(fire.fire_id, "ok", at=rig.clock.now())
    rig.e.invalidate()
    rig.clock.advance(timedelta(minutes=30))
    assert len(rig.fires()) == 1


def test_a_heartbeat_with_a_prompt_is_not_gated_by_the_checklist(rig: Rig) -> None:
    make_persona(rig.home, schedules="heartbeat: {every: 30m, prompt: Look around.}\n")
    rig.start()
    rig.due()
    rig.clock.advance(timedelta(minutes=30))
    [fire] = rig.fires()
    assert fire.prompt == "Look around." and fire.checklist_digest is None


def test_outside_active_hours_skips(rig: Rig) -> None:
    make_persona(
        rig.home,
        schedules="heartbeat: {every: 1h, prompt: hi, active_hours: {start: '10:00', "
        "end: '11:00', tz: Europe/Paris}}\n",
    )
    rig.start()
    rig.due()  # 09:00 UTC = 10:00 Paris
    [skip] = skips(step(rig, 60))  # 10:00 UTC = 11:00 Paris: outside (end is excluded)
    assert "outside active_hours (10:00–11:00 Europe/Paris)" in skip.reason
    rig.clock.set(datetime(2025, 1, 7, 9, 0, tzinfo=UTC))  # tomorrow 10:00 Paris
    fires = only_fires(rig.due())
    assert [f.instant for f in fires] == [datetime(2025, 1, 7, 9, 0, tzinfo=UTC)]


def test_the_daily_cap_skips_heartbeat_and_cron_fires_until_the_next_day(tmp_path: Path) -> None:
    rig = Rig(
        tmp_path,
        FakeClock(datetime(2025, 1, 6, 0, 0, tzinfo=UTC)),
        settings=ScheduleSettings(min_interval=1, max_background_turns_per_day=3),
    )
    make_persona(
        rig.home,
        schedules="heartbeat: {every: 1h, prompt: hi}\ncron:\n  - {name: q, cron: '30 * * * *', "
        "prompt: x}\n",
    )
    make_persona(rig.home, "bob", schedules="heartbeat: {every: 1h, prompt: hi}\n")
    rig.start()
    rig.due()
    fired: list[str] = []
    capped: list[str] = []
    for _ in range(8):  # 00:30 … 04:00
        rig.clock.advance(timedelta(minutes=30))
        decisions = rig.due()
        fires = only_fires(decisions)
        assert all(rig.e.claim(fires, rig.clock.now()))
        fired += [f"{f.persona}/{f.label}" for f in fires]
        capped += [f"{s.persona}/{s.name}" for s in skips(decisions)]
    assert fired.count("ada/heartbeat") + fired.count("ada/q") == 3
    assert fired.count("bob/heartbeat") == 3  # the cap is per persona
    assert len(capped) == 5 + 1
    reasons = {r.last_reason for r in rig.e.listing("ada").entries if r.last_outcome == "skipped"}
    assert reasons == {"daily cap reached (3 background turns today: max_background_turns_per_day)"}
    # A new day (in the runtime's zone) starts a new count (the engine looks
    # again at 00:00 after a pause of its loop: what fell due meanwhile is missed).
    rig.clock.set(datetime(2025, 1, 7, 0, 0, tzinfo=UTC))
    labels = {f"{f.persona}/{f.label}" for f in only_fires(rig.due())}
    assert {"ada/heartbeat", "bob/heartbeat"} <= labels
    rig.kill()


def test_the_daily_cap_counts_in_the_runtime_zone(tmp_path: Path) -> None:
    # 23:30 UTC on the 6th is already the 7th in Tokyo: yesterday's turns don't count.
    from zoneinfo import ZoneInfo

    rig = Rig(
        tmp_path,
        FakeClock(datetime(2025, 1, 6, 13, 0, tzinfo=UTC)),
        settings=ScheduleSettings(min_interval=1, max_background_turns_per_day=1),
        tz=ZoneInfo("Asia/Tokyo"),
    )
    make_persona(rig.home, schedules="heartbeat: {every: 1h, prompt: hi}\n")
    rig.start()
    rig.due()
    rig.clock.set(datetime(2025, 1, 6, 14, 0, tzinfo=UTC))  # 23:00 Tokyo on the 6th
    assert len(rig.fires()) == 1
    rig.clock.set(datetime(2025, 1, 6, 15, 0, tzinfo=UTC))  # 00:00 Tokyo on the 7th
    assert len(rig.fires()) == 1
    rig.kill()


def test_a_paused_queue_skips_its_entries_and_holds_reminders(rig: Rig) -> None:
    make_persona(
        rig.home,
        schedules="heartbeat: {every: 30m, prompt: hi}\ncron:\n  - {name: c, cron: '*/30 * * * *', "
        "prompt: x}\n",
    )
    rig.start()
    store = rig.e.store
    store.add_reminder(
        Reminder(
            id="rem_1",
            persona="ada",
            name="tea",
            prompt="Tea time",
            at=T0 + timedelta(minutes=30),
            created_at=T0,
        )
    )
    store.pause("ada", "heartbeat", at=T0)
    store.pause("ada", "cron", at=T0)
    rig.e.invalidate()
    rig.due()
    decisions = step(rig)
    assert only_fires(decisions) == []
    reasons = sorted((s.name, s.reason) for s in skips(decisions))
    assert reasons == [
        ("c", "the cron queue is paused"),
        ("heartbeat", "the heartbeat queue is paused"),
    ]
    # The reminder was held, not skipped: resuming fires it, late.
    assert [r.name for r in store.reminders("ada")] == ["tea"]
    listing = rig.e.listing("ada")
    assert listing.paused == {"ada": ["cron", "heartbeat"]}
    assert all(row.paused for row in listing.entries)
    store.resume("ada", "cron")
    rig.e.invalidate()
    rig.clock.advance(timedelta(minutes=5))
    [fire] = rig.fires()
    assert (fire.kind, fire.label, fire.late) == ("reminder", "tea", True)
    assert store.reminders("ada") == []


def test_reminders_a_person_set_are_not_capped_but_background_ones_are(tmp_path: Path) -> None:
    rig = Rig(
        tmp_path,
        FakeClock(T0),
        settings=ScheduleSettings(min_interval=1, max_background_turns_per_day=0),
    )
    make_persona(rig.home)
    rig.start()
    for name, background in (("asked", False), ("self-set", True)):
        rig.e.store.add_reminder(
            Reminder(
                id=f"rem_{name}",
                persona="ada",
                name=name,
                prompt=name,
                at=T0 + timedelta(minutes=1),
                background=background,
                created_at=T0,
            )
        )
    rig.e.invalidate()
    rig.clock.advance(timedelta(minutes=1))
    decisions = rig.due()
    assert [f.label for f in only_fires(decisions)] == ["asked"]
    [skip] = skips(decisions)
    assert skip.label == "self-set" and "daily cap" in skip.reason
    [ended] = [r for r in rig.e.store.reminders("ada", pending=False) if r.name == "self-set"]
    assert ended.state == "skipped"
    rig.kill()
