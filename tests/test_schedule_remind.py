"""Every action of the remind tool through the service, and each bad input
(a ToolError whose detail names the field; nothing written or half-written)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.messages import Origin
from coterie.runtime.schedule import FakeClock, Fire, LocalScheduler, RemindRequest
from coterie.runtime.schedule.entries import DeliverTarget
from tests.schedule_helpers import T0, make_persona, touch

WEB = Origin(connector="web", destination="session-1")


@pytest.fixture
async def sched(tmp_path: Path):
    make_persona(tmp_path)
    sent: list[Fire] = []

    async def dispatch(fire: Fire) -> None:
        sent.append(fire)

    scheduler = LocalScheduler.open(
        tmp_path,
        dispatch=dispatch,
        settings=ScheduleSettings(min_interval=60),
        clock=FakeClock(T0),
        tz=ZoneInfo("Europe/Paris"),
    )
    scheduler.sent = sent  # type: ignore[attr-defined]
    yield scheduler
    await scheduler.stop()


async def remind(
    sched: LocalScheduler,
    *,
    background: bool = False,
    turn_id: str | None = None,
    origin: Origin | None = WEB,
    deliver: DeliverTarget | None = None,
    **fields: object,
) -> str:
    result = await sched.remind(
        "ada",
        RemindRequest.model_validate(fields),
        origin=origin,
        background=background,
        turn_id=turn_id,
        deliver=deliver,
    )
    return str(result)


async def refused(sched: LocalScheduler, kind: str, field: str, **fields: object) -> str:
    with pytest.raises(ToolError) as info:
        await remind(sched, **fields)
    assert info.value.kind == kind, info.value
    assert info.value.detail.startswith(f"{field}:"), info.value.detail
    return info.value.detail


def schedules_file(sched: LocalScheduler) -> Path:
    return sched.engine.persona_dir("ada") / "schedules.yaml"


async def test_list_when_empty_and_with_entries(sched: LocalScheduler) -> None:
    text = await remind(sched, action="list")
    assert "No recurring entries and no pending reminders" in text
    assert "Europe/Paris" in text
    await remind(
        sched,
        action="add",
        type="cron",
        name="alerts",
        cron="0 8 * * 1-5",
        prompt="Summarize.",
        tz="America/New_York",
    )
    await remind(sched, action="remind", prompt="Call mum", in_seconds=3600)
    result = await sched.remind("ada", RemindRequest(action="list"), origin=WEB, background=False)
    assert result.listing is not None
    kinds = [(r.kind, r.name, r.tz) for r in result.listing.entries]
    assert kinds[0] == ("cron", "alerts", "America/New_York")
    assert kinds[1][0:2] == ("reminder", "call-mum-1736154000")
    assert "America/New_York" in result.message and "call-mum" in result.message


async def test_add_writes_a_valid_file_that_fires(sched: LocalScheduler) -> None:
    text = await remind(
        sched,
        action="add",
        type="cron",
        name="alerts",
        cron="0 10 * * *",
        prompt="Summarize the alerts.",
        tz="UTC",
        fresh=True,
        deliver_connector="telegram",
        deliver_to="42",
    )
    assert "Added 'alerts'" in text and "next fire 2025-01-06 10:00:00 UTC (UTC)" in text
    written = schedules_file(sched).read_text()
    assert "alerts" in written and "conversation: fresh" in written
    assert "destination: '42'" in written
    await sched.tick()
    sched.clock.set(datetime(2025, 1, 6, 10, 0, tzinfo=UTC))  # type: ignore[attr-defined]
    await sched.tick()
    [fire] = sched.sent  # type: ignore[attr-defined]
    assert (fire.label, fire.prompt) == ("alerts", "Summarize the alerts.")
    assert fire.deliver == DeliverTarget(connector="telegram", destination="42")


async def test_add_a_heartbeat_and_only_one(sched: LocalScheduler) -> None:
    text = await remind(sched, action="add", type="heartbeat", every="30m", light=True)
    assert "Added 'heartbeat'" in text
    assert sched.engine.schedules("ada").file.heartbeat.light  # type: ignore[union-attr]
    await refused(sched, "already_exists", "type", action="add", type="heartbeat", every="1h")


@pytest.mark.parametrize(
    ("fields", "kind", "field"),
    [
        ({"action": "add"}, "invalid_arguments", "type"),
        (
            {"action": "add", "type": "cron", "cron": "0 8 * * *", "prompt": "x"},
            "invalid_arguments",
            "name",
        ),
        (
            {"action": "add", "type": "cron", "name": "a", "prompt": "x"},
            "invalid_arguments",
            "cron",
        ),
        (
            {"action": "add", "type": "cron", "name": "a", "cron": "0 8 * * *"},
            "invalid_arguments",
            "prompt",
        ),
        (
            {"action": "add", "type": "cron", "name": "a", "cron": "61 8 * * *", "prompt": "x"},
            "invalid_arguments",
            "cron",
        ),
        (
            {
                "action": "add",
                "type": "cron",
                "name": "a",
                "cron": "0 8 * * *",
                "prompt": "x",
                "tz": "Mars/Base",
            },
            "invalid_arguments",
            "tz",
        ),
        (
            {"action": "add", "type": "cron", "name": "Not Ok", "cron": "0 8 * * *", "prompt": "x"},
            "invalid_arguments",
            "name",
        ),
        (
            {
                "action": "add",
                "type": "cron",
                "name": "heartbeat",
                "cron": "0 8 * * *",
                "prompt": "x",
            },
            "invalid_arguments",
            "name",
        ),
        (
            {
                "action": "add",
                "type": "cron",
                "name": "a",
                "cron": "* * * * *",
                "prompt": "x",
                "every": "1h",
            },
            "invalid_arguments",
            "every",
        ),
        (
            {
                "action": "add",
                "type": "cron",
                "name": "a",
                "cron": "0 8 * * *",
                "prompt": "x",
                "deliver_to": "42",
            },
            "invalid_arguments",
            "deliver_to",
        ),
        ({"action": "add", "type": "heartbeat"}, "invalid_arguments", "every"),
        ({"action": "add", "type": "heartbeat", "every": "10s"}, "invalid_arguments", "every"),
        ({"action": "add", "type": "heartbeat", "every": "soon"}, "invalid_arguments", "every"),
        (
            {"action": "add", "type": "heartbeat", "every": "1h", "cron": "0 8 * * *"},
            "invalid_arguments",
            "cron",
        ),
        (
            {
                "action": "add",
                "type": "cron",
                "name": "a",
                "cron": "0 8 * * *",
                "prompt": "x",
                "in_seconds": 60,
            },
            "invalid_arguments",
            "in_seconds",
        ),
        ({"action": "update"}, "invalid_arguments", "name"),
        ({"action": "update", "name": "nope", "prompt": "x"}, "not_found", "name"),
        ({"action": "update", "name": "heartbeat", "every": "1h"}, "not_found", "name"),
        ({"action": "remove"}, "invalid_arguments", "name"),
        ({"action": "remove", "name": "nope"}, "not_found", "name"),
        ({"action": "run_now"}, "invalid_arguments", "name"),
        ({"action": "run_now", "name": "nope"}, "not_found", "name"),
        ({"action": "cancel_reminder"}, "invalid_arguments", "name"),
        ({"action": "cancel_reminder", "name": "nope"}, "not_found", "name"),
        ({"action": "pause"}, "invalid_arguments", "queue"),
        ({"action": "resume"}, "invalid_arguments", "queue"),
    ],
)
async def test_bad_inputs_of_the_recurring_actions(
    sched: LocalScheduler, fields: dict, kind: str, field: str
) -> None:
    await refused(sched, kind, field, **fields)
    assert not schedules_file(sched).exists()  # nothing written


async def test_a_duplicate_cron_name_is_refused_and_the_file_kept(sched: LocalScheduler) -> None:
    await remind(sched, action="add", type="cron", name="a", cron="0 8 * * *", prompt="x")
    before = schedules_file(sched).read_text()
    await refused(
        sched,
        "already_exists",
        "name",
        action="add",
        type="cron",
        name="a",
        cron="0 9 * * *",
        prompt="y",
    )
    await refused(sched, "invalid_arguments", "cron", action="update", name="a", cron="not a cron")
    assert schedules_file(sched).read_text() == before


async def test_update_and_remove(sched: LocalScheduler) -> None:
    await remind(sched, action="add", type="cron", name="a", cron="0 8 * * *", prompt="x")
    text = await remind(sched, action="update", name="a", cron="30 9 * * *", fresh=True)
    assert "Updated 'a'" in text
    [entry] = sched.engine.schedules("ada").file.cron  # type: ignore[union-attr]
    assert (entry.cron, entry.prompt, entry.conversation) == ("30 9 * * *", "x", "fresh")
    await refused(sched, "invalid_arguments", "cron", action="update", name="a")
    await refused(
        sched, "invalid_arguments", "type", action="update", name="a", type="heartbeat", prompt="y"
    )
    await remind(sched, action="add", type="heartbeat", every="1h")
    await remind(sched, action="update", name="heartbeat", every="2h", prompt="Look.")
    hb = sched.engine.schedules("ada").file.heartbeat  # type: ignore[union-attr]
    assert (hb.every, hb.prompt) == ("2h", "Look.")  # type: ignore[union-attr]
    assert "Removed 'a'" in await remind(sched, action="remove", name="a")
    assert "Removed 'heartbeat'" in await remind(sched, action="remove", name="heartbeat")
    assert sched.engine.entries("ada") == []


async def test_an_unloadable_file_is_not_overwritten(sched: LocalScheduler) -> None:
    touch(schedules_file(sched), "cron: [\n")
    await refused(
        sched,
        "unavailable",
        "schedules.yaml",
        action="add",
        type="cron",
        name="a",
        cron="0 8 * * *",
        prompt="x",
    )
    assert schedules_file(sched).read_text() == "cron: [\n"


async def test_run_now_fires_the_entry_at_once(sched: LocalScheduler) -> None:
    await remind(sched, action="add", type="cron", name="a", cron="0 8 * * *", prompt="Go.")
    text = await remind(sched, action="run_now", name="a")
    [fire] = sched.sent  # type: ignore[attr-defined]
    assert fire.manual and fire.prompt == "Go." and fire.fire_id in text
    assert sched.store.state(fire.fire_id) == "claimed"
    # It moved no cursor: the scheduled 08:00 still fires.
    await remind(sched, action="pause", queue="cron")
    await refused(sched, "unavailable", "queue", action="run_now", name="a")


async def test_run_now_respects_the_daily_cap(tmp_path: Path) -> None:
    make_persona(tmp_path)

    async def dispatch(fire: Fire) -> None:
        return None

    sched = LocalScheduler.open(
        tmp_path,
        dispatch=dispatch,
        settings=ScheduleSettings(max_background_turns_per_day=1),
        clock=FakeClock(T0),
    )
    await remind(sched, action="add", type="cron", name="a", cron="0 8 * * *", prompt="Go.")
    await remind(sched, action="run_now", name="a")
    await refused(sched, "limit_reached", "name", action="run_now", name="a")
    await sched.stop()


async def test_remind_at_an_instant_with_an_offset(sched: LocalScheduler) -> None:
    text = await remind(
        sched, action="remind", prompt="Call mum", at="2025-01-10T16:00:00+01:00", name="mum"
    )
    assert (
        "Reminder 'mum' set for 2025-01-10 16:00:00 CET (Europe/Paris) = 2025-01-10T15:00:00Z"
        in text
    )
    assert "no offset" not in text
    [reminder] = sched.store.reminders("ada")
    assert reminder.at == datetime(2025, 1, 10, 15, 0, tzinfo=UTC)
    assert reminder.origin == WEB  # captured: the fired turn replies there


async def test_a_naive_time_is_the_runtime_zone_and_the_result_says_so(
    sched: LocalScheduler,
) -> None:
    text = await remind(sched, action="remind", prompt="Standup", at="2025-01-10T09:30:00")
    assert "no offset: read in the runtime's zone, Europe/Paris" in text
    [reminder] = sched.store.reminders("ada")
    # 09:30 in Paris, not 09:30 UTC: the "8 hours early after a restart" bug.
    assert reminder.at == datetime(2025, 1, 10, 8, 30, tzinfo=UTC)


async def test_remind_in_seconds_fires_and_delivers_to_the_origin(sched: LocalScheduler) -> None:
    text = await remind(sched, action="remind", prompt="Check on the deploy", in_seconds=120)
    assert "check-on-the-deploy-1736154000" in text  # a slug of the prompt and the time
    await sched.tick()
    sched.clock.advance(120)  # type: ignore[attr-defined]
    await sched.tick()
    [fire] = sched.sent  # type: ignore[attr-defined]
    assert fire.kind == "reminder" and fire.prompt == "Check on the deploy"
    assert fire.reply_origin == WEB
    assert fire.conversation_id == f"ada:job:{fire.key.name}"


async def test_a_delivery_override_beats_the_origin(sched: LocalScheduler) -> None:
    await remind(
        sched,
        action="remind",
        prompt="x",
        in_seconds=60,
        deliver_connector="telegram",
        deliver_to="99",
    )
    [reminder] = sched.store.reminders("ada")
    assert reminder.deliver == DeliverTarget(connector="telegram", destination="99")
    # Without an override, the turn's own delivery target is the default.
    await remind(
        sched,
        action="remind",
        prompt="y",
        in_seconds=60,
        name="y",
        deliver=DeliverTarget(connector="cli"),
    )
    assert sched.store.reminder("ada", "y").deliver == DeliverTarget(connector="cli")  # type: ignore[union-attr]


async def test_a_recurring_reminder_with_until(sched: LocalScheduler) -> None:
    text = await remind(
        sched,
        action="remind",
        prompt="Stretch",
        name="stretch",
        in_seconds=60,
        every_seconds=3600,
        until="2025-01-06T15:00:00+01:00",
    )
    assert "then every 1h until 2025-01-06 15:00:00 CET" in text
    [reminder] = sched.store.reminders("ada")
    assert reminder.every_seconds == 3600
    assert reminder.until == datetime(2025, 1, 6, 14, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fields", "kind", "field", "needle"),
    [
        ({"prompt": "x", "at": "2024-01-10T16:00:00+00:00"}, "invalid_arguments", "at", "past"),
        ({"prompt": "x", "at": "2025-01-06T08:59:54+00:00"}, "invalid_arguments", "at", "past"),
        ({"prompt": "x", "at": "next friday"}, "invalid_arguments", "at", "ISO 8601"),
        (
            {"prompt": "x", "at": "2025-02-01T00:00:00Z", "in_seconds": 60},
            "invalid_arguments",
            "at",
            "not both",
        ),
        ({"prompt": "x"}, "invalid_arguments", "at", "at (ISO 8601) or in_seconds"),
        ({"in_seconds": 60}, "invalid_arguments", "prompt", "prompt"),
        (
            {"prompt": "x", "in_seconds": 60, "every_seconds": 30},
            "invalid_arguments",
            "every_seconds",
            "min_interval",
        ),
        (
            {"prompt": "x", "in_seconds": 60, "until": "2025-02-01T00:00:00Z"},
            "invalid_arguments",
            "until",
            "every_seconds",
        ),
        (
            {
                "prompt": "x",
                "in_seconds": 3600,
                "every_seconds": 600,
                "until": "2025-01-06T09:30:00Z",
            },
            "invalid_arguments",
            "until",
            "not after",
        ),
        (
            {"prompt": "x", "in_seconds": 60, "name": "Bad Name"},
            "invalid_arguments",
            "name",
            "lowercase",
        ),
        (
            {"prompt": "x", "in_seconds": 60, "queue": "cron"},
            "invalid_arguments",
            "queue",
            "not used",
        ),
        (
            {"prompt": "x", "in_seconds": 60, "cron": "0 8 * * *"},
            "invalid_arguments",
            "cron",
            "not used",
        ),
    ],
)
async def test_bad_reminders(
    sched: LocalScheduler, fields: dict, kind: str, field: str, needle: str
) -> None:
    detail = await refused(sched, kind, field, action="remind", **fields)
    assert needle in detail
    assert sched.store.reminders() == []


async def test_a_time_within_the_five_second_grace_is_taken_as_now(sched: LocalScheduler) -> None:
    await remind(sched, action="remind", prompt="x", at="2025-01-06T08:59:56+00:00", name="now")
    assert sched.store.reminder("ada", "now").at == T0  # type: ignore[union-attr]


async def test_a_duplicate_pending_name_is_refused_and_freed_by_cancel(
    sched: LocalScheduler,
) -> None:
    await remind(sched, action="remind", prompt="x", in_seconds=60, name="tea")
    await refused(
        sched, "already_exists", "name", action="remind", prompt="y", in_seconds=90, name="tea"
    )
    text = await remind(sched, action="cancel_reminder", name="tea")
    assert "Cancelled reminder 'tea'" in text
    assert sched.store.reminders() == []
    await remind(sched, action="remind", prompt="y", in_seconds=90, name="tea")


async def test_concurrent_adds_of_one_name_let_exactly_one_win(sched: LocalScheduler) -> None:
    async def add() -> str:
        try:
            return await remind(sched, action="remind", prompt="x", in_seconds=60, name="race")
        except ToolError as exc:
            return exc.kind

    results = await asyncio.gather(*(add() for _ in range(5)))
    assert results.count("already_exists") == 4
    assert sum(r.startswith("Reminder 'race' set") for r in results) == 1
    assert len(sched.store.reminders("ada")) == 1


async def test_pause_and_resume_a_queue(sched: LocalScheduler) -> None:
    assert "Paused the heartbeat queue" in await remind(sched, action="pause", queue="heartbeat")
    assert "Already paused" in await remind(sched, action="pause", queue="heartbeat")
    listing = await sched.listing("ada")
    assert listing.paused == {"ada": ["heartbeat"]}
    assert "Resumed the heartbeat queue" in await remind(sched, action="resume", queue="heartbeat")
    assert "was not paused" in await remind(sched, action="resume", queue="heartbeat")
    assert (await sched.listing("ada")).paused == {}


def test_an_unknown_queue_or_action_is_refused_by_the_arguments_model() -> None:
    with pytest.raises(ValidationError, match="queue"):
        RemindRequest.model_validate({"action": "pause", "queue": "email"})
    with pytest.raises(ValidationError, match="action"):
        RemindRequest.model_validate({"action": "snooze"})
    with pytest.raises(ValidationError, match="in_seconds"):
        RemindRequest.model_validate({"action": "remind", "prompt": "x", "in_seconds": 0})
    with pytest.raises(ValidationError, match="extra"):
        RemindRequest.model_validate({"action": "list", "colour": "red"})
    # Every field is described in the schema the model sees.
    schema = RemindRequest.model_json_schema()
    assert all("description" in prop for prop in schema["properties"].values())


async def test_a_background_turn_creates_at_most_three(sched: LocalScheduler) -> None:
    await remind(sched, action="remind", prompt="a", in_seconds=60, background=True, turn_id="t1")
    await remind(
        sched,
        action="add",
        type="cron",
        name="c",
        cron="0 8 * * *",
        prompt="x",
        background=True,
        turn_id="t1",
    )
    await remind(
        sched, action="remind", prompt="b", in_seconds=60, name="b", background=True, turn_id="t1"
    )
    detail = await refused(
        sched,
        "limit_reached",
        "action",
        action="remind",
        prompt="d",
        in_seconds=60,
        name="d",
        background=True,
        turn_id="t1",
    )
    assert "at most 3" in detail
    await refused(
        sched,
        "limit_reached",
        "action",
        action="add",
        type="cron",
        name="e",
        cron="0 9 * * *",
        prompt="x",
        background=True,
        turn_id="t1",
    )
    # Another turn, or a person's turn, is not bound by t1's count.
    await remind(
        sched, action="remind", prompt="d", in_seconds=60, name="d", background=True, turn_id="t2"
    )
    await remind(sched, action="remind", prompt="e", in_seconds=60, name="e")
    # What a background turn sets counts against the daily cap when it fires.
    assert sched.store.reminder("ada", "d").background  # type: ignore[union-attr]
    assert not sched.store.reminder("ada", "e").background  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="turn_id"):
        await remind(sched, action="remind", prompt="f", in_seconds=60, background=True)


async def test_pending_reminders_are_bounded(tmp_path: Path) -> None:
    make_persona(tmp_path)

    async def dispatch(fire: Fire) -> None:
        return None

    sched = LocalScheduler.open(
        tmp_path,
        dispatch=dispatch,
        settings=ScheduleSettings(max_pending_reminders=2),
        clock=FakeClock(T0),
    )
    for name in ("a", "b"):
        await remind(sched, action="remind", prompt=name, in_seconds=60, name=name)
    await refused(
        sched, "limit_reached", "name", action="remind", prompt="c", in_seconds=60, name="c"
    )
    await sched.stop()
