"""LocalScheduler's loop driven by a fake clock: it fires, reports skips and
misses, recovers at start, retries a failed dispatch, picks up edits, wakes
for a new reminder; accept/finish through the service; the offline listing."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.errors import ScheduleStoreError
from coterie.runtime.messages import Origin
from coterie.runtime.schedule import (
    FakeClock,
    Fire,
    FireReport,
    LocalScheduler,
    RemindRequest,
    read_listing,
)
from tests.schedule_helpers import T0, make_persona, touch


class Harness:
    def __init__(self, home: Path, *, fail: int = 0) -> None:
        self.home = home
        self.clock = FakeClock(T0)
        self.sent: list[Fire] = []
        self.reports: list[FireReport] = []
        self.fail = fail
        self.sched = self.open()

    def open(self) -> LocalScheduler:
        return LocalScheduler.open(
            self.home,
            dispatch=self.dispatch,
            report=self.reports.append,
            settings=ScheduleSettings(min_interval=1, reload_interval=2),
            clock=self.clock,
        )

    async def dispatch(self, fire: Fire) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("the router is away")
        self.sent.append(fire)

    async def advance(self, seconds: float) -> None:
        """Move the clock and wait for the loop's pass (no real waiting: the
        loop wakes as soon as the fake clock reaches its instant)."""
        self.sched.ticked.clear()
        self.clock.advance(seconds)
        await asyncio.wait_for(self.sched.ticked.wait(), 10)


@pytest.fixture
async def h(tmp_path: Path):
    make_persona(tmp_path, schedules="heartbeat: {every: 1m, prompt: hi}\n")
    harness = Harness(tmp_path)
    yield harness
    await harness.sched.stop()


async def test_the_loop_fires_on_the_fake_clock(h: Harness) -> None:
    await h.sched.start()
    await h.advance(0)
    assert h.sent == []
    await h.advance(60)
    [fire] = h.sent
    assert fire.instant == T0 + timedelta(minutes=1)
    assert [(r.outcome, r.name) for r in h.reports] == [("fired", "heartbeat")]
    # The persona accepts it once, then finishes it.
    assert await h.sched.accept(fire.fire_id) is True
    assert await h.sched.accept(fire.fire_id) is False
    await h.sched.finish(fire.fire_id, "ok")
    assert h.sched.store.state(fire.fire_id) == "done"
    [row] = (await h.sched.listing("ada")).entries
    assert row.last_outcome == "done"


async def test_skips_and_misses_are_reported_with_their_reasons(tmp_path: Path) -> None:
    make_persona(tmp_path, schedules="heartbeat: {every: 10m}\n")  # no HEARTBEAT.md
    h = Harness(tmp_path)
    await h.sched.start()
    await h.advance(0)
    for _ in range(300):  # the loop also wakes every reload_interval (2 s)
        await h.advance(2)
    assert h.sent == []
    [report] = h.reports
    assert (report.outcome, report.name) == ("skipped", "heartbeat")
    assert "empty checklist" in (report.reason or "")
    await h.sched.stop()
    # Down for an hour: one miss report, one late fire (a checklist now).
    touch(tmp_path / "personas" / "ada" / "HEARTBEAT.md", "- check the queue\n")
    h.clock.advance(3600 + 60)
    h.reports.clear()
    h.sched = h.open()
    await h.sched.start()
    await h.advance(0)
    outcomes = sorted(r.outcome for r in h.reports)
    assert outcomes == ["late", "missed"]
    [fire] = h.sent
    assert fire.late and fire.prompt == "- check the queue"
    await h.sched.stop()


async def test_start_recovers_a_fire_claimed_before_a_crash(tmp_path: Path) -> None:
    make_persona(tmp_path, schedules="heartbeat: {every: 1m, prompt: hi}\n")
    h = Harness(tmp_path)
    await h.sched.tick()
    h.clock.advance(60)
    engine = h.sched.engine
    [fire] = engine.due()
    assert engine.claim([fire]) == [True]
    await h.sched.stop()  # "crashed" between the claim and the dispatch
    h.sched = h.open()
    await h.sched.start()
    assert [f.fire_id for f in h.sent] == [fire.fire_id]
    assert await h.sched.accept(fire.fire_id)
    await h.sched.stop()


async def test_a_failed_dispatch_is_retried_until_accepted(tmp_path: Path) -> None:
    make_persona(tmp_path, schedules="heartbeat: {every: 10m, prompt: hi}\n")
    h = Harness(tmp_path, fail=1)
    await h.sched.start()
    await h.advance(0)
    await h.advance(600)
    assert h.sent == [] and h.reports == []  # failed: still claimed, not reported
    await h.advance(30)
    assert h.sent == []
    await h.advance(31)  # a minute after the claim: sent again
    [fire] = h.sent
    assert await h.sched.accept(fire.fire_id)
    await h.advance(61)
    assert len(h.sent) == 1  # accepted: never sent again
    await h.sched.stop()


async def test_an_edit_applies_within_the_reload_interval(h: Harness) -> None:
    await h.sched.start()
    await h.advance(0)
    touch(h.home / "personas" / "ada" / "schedules.yaml", "heartbeat: {every: 1h, prompt: hi}\n")
    assert [r.schedule for r in (await h.sched.listing()).entries] == ["every 1m"]
    await h.advance(2)  # the loop looks at the files every reload_interval (2 s)
    assert [r.schedule for r in (await h.sched.listing()).entries] == ["every 1h"]


async def test_a_new_reminder_wakes_the_loop(h: Harness) -> None:
    await h.sched.start()
    await h.advance(0)
    await h.sched.remind(
        "ada",
        RemindRequest(action="remind", prompt="Tea", in_seconds=5, name="tea"),
        origin=Origin(connector="web", destination="s"),
        background=False,
    )
    await h.advance(5)
    [fire] = h.sent
    assert (fire.label, fire.prompt) == ("tea", "Tea")


async def test_the_offline_listing_reads_files_and_the_store(h: Harness) -> None:
    await h.sched.start()
    await h.advance(0)
    await h.advance(60)
    # While the scheduler holds the store, the offline listing says so.
    with pytest.raises(ScheduleStoreError, match="held"):
        await asyncio.to_thread(_other_process_listing, h.home)
    await h.sched.stop()
    listing = read_listing(h.home)
    [row] = listing.entries
    assert (row.persona, row.name, row.last_outcome) == ("ada", "heartbeat", "fired")
    assert read_listing(h.home, "bob").entries == []


def _other_process_listing(home: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; from coterie.runtime.schedule import read_listing\n"
        "try:\n    read_listing(Path(sys.argv[1]))\nexcept Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(home)], capture_output=True, text=True, check=True
    ).stdout
    if out.startswith("ScheduleStoreError"):
        raise ScheduleStoreError(out)


async def test_an_empty_home_lists_nothing(tmp_path: Path) -> None:
    listing = read_listing(tmp_path)
    assert listing.entries == [] and listing.errors == []
    assert not (tmp_path / "schedule.duckdb").exists()


async def test_the_ledger_keeps_history_days(tmp_path: Path) -> None:
    make_persona(tmp_path, schedules="heartbeat: {every: 1h, prompt: hi}\n")
    clock = FakeClock(T0)
    sent: list[Fire] = []

    async def dispatch(fire: Fire) -> None:
        sent.append(fire)

    sched = LocalScheduler.open(
        tmp_path, dispatch=dispatch, settings=ScheduleSettings(history_days=1), clock=clock
    )
    await sched.tick()
    clock.advance(3600)
    await sched.tick()
    [fire] = sent
    assert await sched.accept(fire.fire_id)
    await sched.finish(fire.fire_id, "ok")
    clock.advance(timedelta(hours=23))
    await sched.tick()
    assert fire.fire_id in {r.fire_id for r in sched.store.ledger()}  # younger than a day
    clock.advance(timedelta(hours=7))  # pruning runs every 6 hours
    await sched.tick()
    assert fire.fire_id not in {r.fire_id for r in sched.store.ledger()}
    await sched.stop()
