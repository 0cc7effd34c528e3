"""The schedule store: the fire ledger's claim / accept / finish, reminders'
unique pending names (under a race), paused queues, the daily count, the
read-only open, and a file held by another process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coterie.runtime.errors import ScheduleStoreError
from coterie.runtime.messages import Origin
from coterie.runtime.schedule.records import Fire, FireKey, Miss, Reminder, Skip, fire_id
from coterie.runtime.schedule.store import ScheduleStore, entry_key

T0 = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)


def a_fire(
    instant: datetime = T0, *, kind: str = "cron", name: str = "daily", digest: str | None = None
) -> Fire:
    key = FireKey(persona="ada", kind=kind, name=name, instant=instant)  # type: ignore[arg-type]
    fid = fire_id(key)
    return Fire(
        key=key,
        fire_id=fid,
        label=name,
        conversation_id=f"ada:{kind}:{name}",
        prompt="go",
        checklist_digest=digest,
        expires_at=instant + timedelta(hours=1),
    )


def a_reminder(name: str = "call-mum", *, at: datetime = T0, persona: str = "ada") -> Reminder:
    return Reminder(
        id=f"rem_{name}_{time.monotonic_ns()}",
        persona=persona,
        name=name,
        prompt="Call mum",
        at=at,
        origin=Origin(connector="web", destination="s1"),
        created_at=T0 - timedelta(hours=1),
    )


@pytest.fixture
def store(tmp_path: Path):
    with ScheduleStore(tmp_path / "schedule.duckdb") as s:
        yield s


def test_fire_ids_are_a_hash_of_the_key() -> None:
    assert a_fire().fire_id == a_fire().fire_id
    assert a_fire().fire_id.startswith("fire_")
    assert a_fire(T0 + timedelta(seconds=1)).fire_id != a_fire().fire_id
    # The same instant written in another zone is the same fire.
    paris = T0.astimezone(datetime(2025, 1, 1, tzinfo=UTC).astimezone().tzinfo)
    assert a_fire(paris).fire_id == a_fire().fire_id


def test_claim_once_and_move_the_cursor(store: ScheduleStore) -> None:
    fire = a_fire()
    assert store.claim(fire, fingerprint="cron 0 8 * * * UTC", at=T0) is True
    assert store.claim(fire, fingerprint="cron 0 8 * * * UTC", at=T0) is False
    cursor = store.cursors()[entry_key("ada", "cron", "daily")]
    assert cursor.instant == T0 and cursor.fingerprint == "cron 0 8 * * * UTC"
    assert cursor.last_outcome == "fired"
    assert store.state(fire.fire_id) == "claimed"
    [(again, dispatched)] = store.claimed()
    assert again == fire and dispatched == T0


def test_accept_is_a_compare_and_set(store: ScheduleStore) -> None:
    fire = a_fire()
    store.claim(fire, at=T0)
    assert store.accept(fire.fire_id, at=T0) is True
    assert store.accept(fire.fire_id, at=T0) is False
    assert store.accept("fire_unknown", at=T0) is False
    assert store.claimed() == []
    assert store.finish(fire.fire_id, "ok", at=T0) == "done"
    assert store.finish(fire.fire_id, "ok", at=T0) is None  # already ended
    assert store.accept(fire.fire_id, at=T0) is False


def test_finish_maps_turn_statuses_and_acknowledges_a_skipped_checklist(
    store: ScheduleStore,
) -> None:
    hb = a_fire(kind="heartbeat", name="heartbeat", digest="abc")
    store.claim(hb, at=T0)
    store.accept(hb.fire_id, at=T0)
    assert store.finish(hb.fire_id, "skipped", at=T0) == "skipped"
    assert store.acks() == {"ada": "abc"}
    failed = a_fire(T0 + timedelta(hours=1))
    store.claim(failed, at=T0)
    # A claimed fire can fail without being accepted (it could not be delivered).
    assert store.finish(failed.fire_id, "error", reason="connector down", at=T0) == "failed"
    row = next(r for r in store.ledger() if r.fire_id == failed.fire_id)
    assert (row.state, row.status, row.reason) == ("failed", "error", "connector down")
    with pytest.raises(ValueError):
        store.finish(failed.fire_id, "bogus", at=T0)  # type: ignore[arg-type]


def test_a_claim_survives_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "schedule.duckdb"
    fire = a_fire()
    with ScheduleStore(path) as first:
        first.claim(fire, at=T0)
    with ScheduleStore(path) as second:
        assert [f for f, _ in second.claimed()] == [fire]
        assert second.accept(fire.fire_id, at=T0)
    with ScheduleStore(path) as third:
        assert third.accept(fire.fire_id, at=T0) is False


def test_skips_move_the_cursor_without_a_ledger_row(store: ScheduleStore) -> None:
    skip = Skip(
        persona="ada", kind="heartbeat", name="heartbeat", instant=T0, fire_id="f", reason="empty"
    )
    store.skip_all([(skip, "every 1800s", None)], at=T0)
    cursor = store.cursors()["ada/heartbeat/heartbeat"]
    assert (cursor.instant, cursor.last_outcome, cursor.last_reason) == (T0, "skipped", "empty")
    assert store.ledger() == []


def test_a_run_of_misses_is_one_row(store: ScheduleStore) -> None:
    miss = Miss(
        persona="ada",
        kind="cron",
        name="daily",
        count=5,
        first=T0,
        last=T0 + timedelta(days=4),
        fire_id="fire_m",
        reason="down",
    )
    store.miss(miss, fingerprint="fp", at=T0 + timedelta(days=5))
    [row] = store.ledger()
    assert (row.state, row.missed, row.first_instant) == ("missed", 5, T0)
    assert store.cursors()["ada/cron/daily"].instant == T0 + timedelta(days=4)


def test_unique_pending_reminder_names(store: ScheduleStore) -> None:
    first = a_reminder()
    assert store.add_reminder(first) is True
    assert store.add_reminder(a_reminder()) is False
    # Another persona may use the name.
    assert store.add_reminder(a_reminder(persona="bob")) is True
    assert store.reminder("ada", "call-mum") == first
    assert store.pending_count("ada") == 1
    cancelled = store.cancel_reminder("ada", "call-mum", at=T0)
    assert cancelled is not None and cancelled.id == first.id
    assert store.cancel_reminder("ada", "call-mum", at=T0) is None
    # Once it is no longer pending, the name is free again.
    assert store.add_reminder(a_reminder()) is True
    assert [r.name for r in store.reminders("ada")] == ["call-mum"]
    assert len(store.reminders("ada", pending=False)) == 2


def test_racing_adds_of_one_name_from_two_connections_let_exactly_one_win(
    tmp_path: Path,
) -> None:
    path = tmp_path / "schedule.duckdb"
    with ScheduleStore(path) as a, ScheduleStore(path) as b:
        for round_ in range(20):
            name = f"race-{round_}"
            results: list[bool] = []
            barrier = threading.Barrier(2)

            def add(
                store: ScheduleStore,
                name: str,
                barrier: threading.Barrier,
                results: list[bool],
            ) -> None:
                barrier.wait()
                results.append(store.add_reminder(a_reminder(name)))

            threads = [
                threading.Thread(target=add, args=(s, name, barrier, results)) for s in (a, b)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == [False, True], (round_, results)
            assert len([r for r in a.reminders("ada") if r.name == name]) == 1


def test_a_fired_one_shot_reminder_is_done_and_frees_its_name(store: ScheduleStore) -> None:
    reminder = a_reminder()
    store.add_reminder(reminder)
    key = FireKey(persona="ada", kind="reminder", name=reminder.id, instant=T0)
    fire = Fire(
        key=key,
        fire_id=fire_id(key),
        label=reminder.name,
        conversation_id=f"ada:job:{reminder.id}",
        prompt="Call mum",
        expires_at=T0 + timedelta(days=1),
    )
    assert store.claim(fire, next_at=None, at=T0)
    assert store.reminders("ada") == []
    [done] = store.reminders("ada", pending=False)
    assert (done.state, done.fired) == ("done", 1)
    assert store.add_reminder(a_reminder())


def test_pause_and_resume(store: ScheduleStore) -> None:
    assert store.pause("ada", "heartbeat", at=T0) is True
    assert store.pause("ada", "heartbeat", at=T0) is False
    assert store.paused() == {"ada": {"heartbeat"}}
    assert store.resume("ada", "heartbeat") is True
    assert store.resume("ada", "heartbeat") is False
    assert store.paused() == {}


def test_background_turns_are_counted_per_persona_and_day(store: ScheduleStore) -> None:
    for hour in range(3):
        store.claim(a_fire(T0 + timedelta(hours=hour)), at=T0 + timedelta(hours=hour))
    store.claim(a_fire(T0 + timedelta(days=1)), at=T0 + timedelta(days=1))
    day = (datetime(2025, 1, 6, tzinfo=UTC), datetime(2025, 1, 7, tzinfo=UTC))
    assert store.background_turns(*day) == {"ada": 3}
    assert store.background_turns_today("ada", *day) == 3
    assert store.background_turns_today("bob", *day) == 0


def test_prune_keeps_what_is_recent_or_running(store: ScheduleStore) -> None:
    old, running, recent = (
        a_fire(T0),
        a_fire(T0 + timedelta(hours=1)),
        a_fire(T0 + timedelta(days=40)),
    )
    for f in (old, running, recent):
        store.claim(f, at=f.instant)
    store.finish(old.fire_id, "ok", at=T0)
    store.accept(running.fire_id, at=T0)
    store.finish(recent.fire_id, "ok", at=recent.instant)
    # The running one's grace ended long ago: it goes too; the recent one stays.
    assert store.prune(T0 + timedelta(days=30)) == 2
    assert [r.fire_id for r in store.ledger()] == [recent.fire_id]


def test_read_only(tmp_path: Path) -> None:
    path = tmp_path / "schedule.duckdb"
    empty = ScheduleStore.read_only(path)
    assert empty.reminders() == [] and empty.cursors() == {}
    assert not path.exists()
    with pytest.raises(ScheduleStoreError, match="read-only"):
        empty.pause("ada", "cron", at=T0)
    empty.close()
    with ScheduleStore(path) as writer:
        writer.add_reminder(a_reminder())
    with ScheduleStore.read_only(path) as reader:
        assert [r.name for r in reader.reminders()] == ["call-mum"]
        with pytest.raises(ScheduleStoreError, match="read-only"):
            reader.add_reminder(a_reminder("other"))


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = ScheduleStore(tmp_path / "s.duckdb")
    store.close()
    with pytest.raises(ScheduleStoreError, match="closed"):
        store.reminders()


def test_a_file_held_by_another_process_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "schedule.duckdb"
    ScheduleStore(path).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ScheduleStoreError, match="held by another process") as info:
            ScheduleStore(path)
        assert str(path) in str(info.value)
        with pytest.raises(ScheduleStoreError, match="held by another process"):
            ScheduleStore.read_only(path)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def test_importing_the_store_loads_no_database() -> None:
    code = (
        "import sys, coterie.runtime.schedule, coterie.runtime.schedule.store, "
        "coterie.runtime.schedule.engine, coterie.runtime.schedule.service; "
        "print('duckdb' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_many_claims_and_skips_go_in_one_batch_with_the_same_answers(store: ScheduleStore) -> None:
    from coterie.runtime.schedule.store import Claim

    first = [a_fire(T0, name=f"e{i}") for i in range(10)]
    assert store.claim_all([Claim(f, fingerprint="fp") for f in first], at=T0) == [True] * 10
    later = [a_fire(T0 + timedelta(hours=1), name=f"e{i}") for i in range(5)]
    again = store.claim_all([Claim(f, fingerprint="fp") for f in first[:5] + later], at=T0)
    assert again == [False] * 5 + [True] * 5
    cursors = store.cursors()
    assert cursors["ada/cron/e0"].instant == T0 + timedelta(hours=1)
    assert cursors["ada/cron/e9"].instant == T0
    assert {c.last_outcome for c in cursors.values()} == {"fired"}
    # Starting entries again (a changed spec) moves cursors, keeps last outcomes.
    store.set_cursors(("ada", "cron", f"e{i}", T0 + timedelta(days=1), "fp2") for i in range(10))
    cursors = store.cursors()
    assert all(
        c.instant == T0 + timedelta(days=1) and c.fingerprint == "fp2" for c in cursors.values()
    )
    assert {c.last_outcome for c in cursors.values()} == {"fired"}
    skips = [
        (
            Skip(
                persona="ada",
                kind="cron",
                name=f"e{i}",
                instant=T0 + timedelta(days=2),
                fire_id=f"s{i}",
                reason="paused",
            ),
            "fp2",
            None,
        )
        for i in range(10)
    ]
    store.skip_all(skips, at=T0)
    cursors = store.cursors()
    assert {(c.last_outcome, c.last_reason, c.instant) for c in cursors.values()} == {
        ("skipped", "paused", T0 + timedelta(days=2))
    }
