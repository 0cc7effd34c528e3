"""The scheduler on Ray, end to end, on a real clock with schedules of a
second or two:

- through a real ``coterie serve``: a reminder asked from a web session
  fires two seconds later and is delivered back to that session through the
  web connector; a heartbeat in plain text gets one forced end_task, found
  nothing to do and leaves the history — also once the persona's process was
  killed and its conversation rebuilt from the audit log; a heartbeat on an
  empty checklist never reaches the model server (a real openai client
  against the fake server) and never starts its persona's process; the daily
  cap stops a busy heartbeat; ``coterie schedules`` and ``GET /v1/schedules``
  show all of it;
- the Scheduler actor killed (SIGKILL) at each step of a fire — before the
  ledger write, after it, after the dispatch — never loses the fire nor runs
  its turn twice;
- a whole-runtime restart: a reminder that fell due while it was down fires
  once, late; a heartbeat that fell due many times is one miss, no backlog.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

from coterie.actors import persona_actor_name, runtime_id
from coterie.actors.scheduler import HOLD_POINTS
from coterie.api import Runtime
from coterie.cli import main
from coterie.runtime.audit import QueryResult
from coterie.runtime.schedule import Reminder, RemindRequest, ScheduleStore
from coterie.runtime.serve.client import ServedDoor, ServerClient, ServerError
from coterie.runtime.serve.discovery import ServerState
from tests.fakes import FakeOpenAIServer
from tests.helpers import write_persona
from tests.serving import running_server

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

SESSION = "web-sched1"
# Whatever this persona is asked, the scheduler's framing says what it is.
ADA = {
    "description": "keeps time",
    "model": {
        "provider": "scripted",
        "rules": [
            {
                "when": {"turn": 1, "contains": "remind me"},
                "tool_calls": [
                    {
                        "name": "remind",
                        "arguments": {"action": "remind", "prompt": "tea", "in_seconds": 2},
                    }
                ],
            },
            {"when": {"turn": 2, "contains": "remind me"}, "text": "Set."},
            {
                "when": {"turn": 1, "contains": "Reminder"},
                "tool_calls": [{"name": "reply_to_origin", "arguments": {"text": "Tea time!"}}],
            },
            {
                "when": {"turn": 2, "contains": "Reminder"},
                "tool_calls": [{"name": "end_task", "arguments": {"status": "ok"}}],
            },
            # A heartbeat answered in plain text: the loop forces end_task.
            {"when": {"turn": 1, "contains": "Heartbeat"}, "text": "All quiet."},
            {
                "when": {"turn": 2, "contains": "end_task"},
                "tool_calls": [{"name": "end_task", "arguments": {"status": "skipped"}}],
            },
        ],
        "default": "ok",
    },
}


def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def write_schedules(home: Path, persona: str, schedules: dict[str, Any], checklist: str) -> None:
    folder = home / "personas" / persona
    (folder / "schedules.yaml").write_text(yaml.safe_dump(schedules))
    (folder / "HEARTBEAT.md").write_text(checklist)


def openai_persona(base_url: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "model": {
            "provider": "openai",
            "name": "fake-model",
            "base_url": base_url,
            # Any variable every process has: the fake server checks no key.
            "api_key_env": "PATH",
            "max_retries": 0,
        },
    }


@contextmanager
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """The fake OpenAI server, on a loop of its own in a thread (the
    persona processes reach it over HTTP)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    found: list[FakeOpenAIServer] = []
    stop = asyncio.Event()

    async def serve() -> None:
        async with FakeOpenAIServer(default_text="Checked.") as srv:
            found.append(srv)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(30), "the fake model server did not start"
    try:
        yield found[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def served_query(client: ServerClient) -> Callable[[str], QueryResult]:
    """``POST /v1/audit/query`` as a function of the SQL."""

    def query(sql: str) -> QueryResult:
        data = client.post("/v1/audit/query", {"sql": sql})
        return QueryResult(columns=data["columns"], rows=[tuple(r) for r in data["rows"]])

    return query


def schedule_rows(query: Callable[[str], QueryResult], where: str) -> list[dict[str, Any]]:
    result = query(
        "select payload->>'persona' as persona, payload->>'name' as name, status as outcome, "
        "payload->>'reason' as reason, conversation_id, call_id as fire_id from events "
        f"where kind = 'schedule' and {where} order by ts, seq"
    )
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


# -- through coterie serve ------------------------------------------------------


@pytest.fixture(scope="module")
def model_server() -> Iterator[FakeOpenAIServer]:
    with fake_openai() as srv:
        yield srv


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, model_server: FakeOpenAIServer) -> Path:
    home = tmp_path_factory.mktemp("sched-home")
    (home / "runtime.yaml").write_text(
        yaml.safe_dump(
            {
                "schedule": {
                    "min_interval": 1,
                    "reload_interval": 1,
                    "max_background_turns_per_day": 2,
                }
            }
        )
    )
    write_persona(home, "ada", ADA)
    write_schedules(home, "ada", {"heartbeat": {"every": "2s"}}, "- glance at the inbox\n")
    # An empty checklist: every heartbeat is skipped before anything starts.
    write_persona(home, "quiet", openai_persona(model_server.base_url, "idles"))
    write_schedules(home, "quiet", {"heartbeat": {"every": "1s"}}, "# Heartbeat\n\n")
    # Work each time: its turns reach the model until the daily cap (2).
    write_persona(home, "busy", openai_persona(model_server.base_url, "always busy"))
    write_schedules(home, "busy", {"heartbeat": {"every": "1s"}}, "- check the queue\n")
    return home


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[ServerState]:
    with running_server(home) as state:
        yield state


def test_a_reminder_from_a_web_session_comes_back_to_it(server: ServerState, home: Path) -> None:
    client = ServerClient(server)
    asked = client.post(
        "/v1/personas/ada/messages",
        {"text": "remind me about tea", "session": SESSION, "connector": "web"},
    )
    assert asked["reply"]["text"] == "Set."
    got: list[dict[str, Any]] = []

    def delivered() -> bool:
        got.extend(
            client.get(f"/v1/connectors/web/messages?destination={SESSION}&wait=5")["messages"]
        )
        return bool(got)

    until(delivered, "the reminder's message in the web session", timeout=60)
    [message] = got
    assert message["text"] == "Tea time!" and message["persona"] == "ada"
    assert message["conversation_id"].startswith("ada:job:")
    query = served_query(client)

    def reminder_done() -> bool:
        return any(
            r["outcome"] == "done"
            for r in schedule_rows(query, f"conversation_id = '{message['conversation_id']}'")
        )

    until(reminder_done, "the reminder's turn to end")
    rows = schedule_rows(query, "payload->>'entry_kind' = 'reminder'")
    assert sorted(r["outcome"] for r in rows) == ["accepted", "done", "fired"]


def test_heartbeats_skip_without_the_model_and_the_cap_holds(
    server: ServerState, home: Path, model_server: FakeOpenAIServer
) -> None:
    client = ServerClient(server)
    query = served_query(client)

    def capped() -> bool:
        return any(
            "daily cap" in (r["reason"] or "") for r in schedule_rows(query, "persona = 'busy'")
        )

    until(capped, "busy's heartbeats to reach the daily cap", timeout=60)
    quiet = schedule_rows(query, "persona = 'quiet'")
    assert len(quiet) >= 3 and {r["outcome"] for r in quiet} == {"skipped"}
    assert all("empty checklist" in r["reason"] for r in quiet)
    # The model server never heard of quiet, and no process was started for it.
    systems = [json.dumps(r["messages"][0]) for r in model_server.requests]
    assert not any("`quiet`" in s for s in systems)
    assert any("`busy`" in s for s in systems)  # the same server, reached by busy
    named = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    rid = runtime_id(home)
    assert persona_actor_name(rid, "quiet") not in named
    assert persona_actor_name(rid, "busy") in named
    busy = schedule_rows(query, "persona = 'busy'")
    # max_background_turns_per_day: two fires ran (one turn each, or one
    # turn for both when the second came before the first's turn began).
    assert [r["outcome"] for r in busy].count("accepted") == 2
    capped_at = next(i for i, r in enumerate(busy) if "daily cap" in (r["reason"] or ""))
    assert "accepted" not in [r["outcome"] for r in busy[capped_at:]]
    # What the status route counts.
    status = client.get("/v1/status")["scheduler"]
    assert status["entries"] == 3 and status["outcomes"]["skipped"] >= 3


def test_a_skipped_heartbeat_stays_out_of_a_rebuilt_history(
    server: ServerState, home: Path
) -> None:
    client = ServerClient(server)
    query = served_query(client)

    def dropped() -> bool:
        return bool(
            query(
                "select count(*) from events where kind = 'turn_dropped' and persona = 'ada'"
            ).rows[0][0]
        )

    until(dropped, "ada's first heartbeat to be dropped from its history")
    per_turn = query(
        "select turn_id, count(*) from events where kind = 'model_call' and persona = 'ada' "
        "and conversation_id = 'ada:heartbeat' group by turn_id"
    ).rows
    # Each heartbeat turn: the plain answer and exactly one forced end_task.
    assert per_turn and {n for _, n in per_turn} == {2}
    # Later heartbeats are skipped: the checklist is unchanged and acknowledged.
    until(
        lambda: any(
            "unchanged" in (r["reason"] or "")
            for r in schedule_rows(query, "persona = 'ada' and status = 'skipped'")
        ),
        "an acknowledged-checklist skip",
    )
    # The persona's process dies; its conversation comes back from the log.
    persona = ray.get_actor(
        persona_actor_name(runtime_id(home), "ada"), namespace=ray.get_runtime_context().namespace
    )
    pid = ray.get(persona.stats.remote())["pid"]
    os.kill(pid, signal.SIGKILL)
    until(lambda: _pid(persona) not in (None, pid), "ada's process to restart")
    reply = client.post(
        "/v1/personas/ada/messages", {"text": "anything?", "conversation_id": "ada:heartbeat"}
    )
    assert reply["reply"]["status"] == "ok"
    seen = query(
        "select payload->>'messages' from events where kind = 'model_call' and persona = 'ada' "
        "and conversation_id = 'ada:heartbeat' order by ts desc limit 1"
    ).rows[0][0]
    assert int(seen) == 1  # only the new message: the dropped heartbeat stayed out
    history = client.get("/v1/personas/ada/conversations/ada:heartbeat")["messages"]
    assert [m["kind"] for m in history] == ["user", "assistant"]


def _pid(handle: Any) -> int | None:
    try:
        return int(ray.get(handle.stats.remote(), timeout=5)["pid"])
    except (ray.exceptions.RayError, TimeoutError):
        return None


def test_coterie_schedules_and_the_route_list_it_all(
    server: ServerState, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = ServerClient(server)
    listing = client.get("/v1/schedules")
    rows = {(e["persona"], e["name"]): e for e in listing["entries"]}
    assert set(rows) >= {("ada", "heartbeat"), ("quiet", "heartbeat"), ("busy", "heartbeat")}
    assert rows[("quiet", "heartbeat")]["last_outcome"] == "skipped"
    assert "empty checklist" in rows[("quiet", "heartbeat")]["last_reason"]
    assert rows[("busy", "heartbeat")]["tz"] == "UTC" and listing["timezone"] == "UTC"
    one = client.get("/v1/schedules?persona=busy")
    assert {e["persona"] for e in one["entries"]} == {"busy"}
    with pytest.raises(ServerError) as unknown:
        client.get("/v1/schedules?persona=nobody")
    assert unknown.value.status == 404 and unknown.value.kind == "unknown_persona"
    # The same through the front door other processes use (coterie mcp-serve).
    served = asyncio.run(ServedDoor(client).schedules_async("quiet"))
    assert [(e.persona, e.kind, e.schedule) for e in served.entries] == [
        ("quiet", "heartbeat", "every 1s")
    ]
    assert main(["--home", str(home), "schedules", "quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "quiet" in out and "every 1s" in out and "empty checklist" in out
    assert "served at" in out and "busy" not in out


# -- the Scheduler actor killed at each step of a fire ---------------------------


def test_a_killed_scheduler_neither_loses_a_fire_nor_runs_it_twice(tmp_path: Path) -> None:
    home = tmp_path / "kills"
    write_persona(home, "ada", ADA)
    (home / "runtime.yaml").write_text("schedule: {min_interval: 1, reload_interval: 1}\n")
    rt = Runtime.start(home=home)
    try:
        sched = rt.scheduler
        for point in HOLD_POINTS:
            name = f"check-{point.replace('_', '-')}"
            ray.get(sched.hold_at.remote(point))
            ray.get(
                sched.remind.remote(
                    "ada",
                    RemindRequest(action="remind", prompt="check", in_seconds=1, name=name),
                    origin=None,
                    background=False,
                )
            )
            until(lambda p=point: ray.get(sched.held.remote()) == p, f"the hold at {point}")
            pid = ray.get(sched.pid.remote())
            os.kill(pid, signal.SIGKILL)
            until(
                lambda pid=pid: _scheduler_pid(sched) not in (None, pid),
                "the scheduler to restart",
            )

            def ended(name: str = name) -> bool:
                rows = schedule_rows(rt.query, f"payload->>'name' = '{name}'")
                return any(r["outcome"] == "done" for r in rows)

            until(ended, f"the fire held at {point} to run")
            rows = schedule_rows(rt.query, f"payload->>'name' = '{name}'")
            [conversation] = {r["conversation_id"] for r in rows if r["outcome"] == "accepted"}
            turns = rt.query(
                "select count(*) from events where kind = 'turn_started' "
                f"and conversation_id = '{conversation}'"
            ).rows[0][0]
            assert turns == 1, (point, rows)
            assert [r["outcome"] for r in rows].count("accepted") == 1, (point, rows)
    finally:
        rt.shutdown()


def _scheduler_pid(handle: Any) -> int | None:
    try:
        return int(ray.get(handle.pid.remote(), timeout=5))
    except (ray.exceptions.RayError, TimeoutError):
        return None


# -- a whole-runtime restart -----------------------------------------------------


def test_a_restart_fires_what_fell_due_once_late_and_no_backlog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "restart"
    write_persona(home, "ada", ADA)
    write_persona(home, "bob", {"model": {"provider": "scripted", "default": "ok"}})
    write_schedules(home, "bob", {"heartbeat": {"every": "1s", "misfire_grace": "1s"}}, "")
    (home / "runtime.yaml").write_text("schedule: {min_interval: 1, reload_interval: 1}\n")
    rt = Runtime.start(home=home)
    try:
        until(lambda: bool(schedule_rows(rt.query, "persona = 'bob'")), "bob's first skip")
    finally:
        rt.shutdown()
    down = datetime.now(UTC)
    # While it is down, a reminder set earlier falls due (a minute ago).
    with ScheduleStore(home / "schedule.duckdb") as store:
        assert store.add_reminder(
            Reminder(
                id="rem_whiledown",
                persona="ada",
                name="while-down",
                prompt="water the plants",
                at=down - timedelta(seconds=60),
                created_at=down - timedelta(minutes=5),
            )
        )
    time.sleep(3)  # bob's heartbeat falls due every second meanwhile
    rt = Runtime.start(home=home)
    try:
        up = datetime.now(UTC)

        def fired() -> bool:
            rows = schedule_rows(rt.query, "payload->>'name' = 'while-down'")
            return any(r["outcome"] == "done" for r in rows)

        until(fired, "the reminder that fell due while down")
        rows = schedule_rows(rt.query, "payload->>'name' = 'while-down'")
        assert sorted(r["outcome"] for r in rows) == ["accepted", "done", "late"]
        [conversation] = {r["conversation_id"] for r in rows if r["outcome"] == "accepted"}
        assert conversation == "ada:job:rem_whiledown"
        turns = rt.query(
            f"select count(*) from events where conversation_id = '{conversation}' "
            "and kind = 'turn_started'"
        ).rows[0][0]
        assert turns == 1
        bob = schedule_rows(rt.query, "persona = 'bob' and status = 'missed'")
        [missed] = bob  # one event for the whole run of misses, never a backlog
        found = re.search(r"(\d+) fire\(s\) fell due", missed["reason"])
        assert found is not None and int(found.group(1)) >= 3, missed
        skipped_since = rt.query(
            "select count(*) from events where kind = 'schedule' and persona = 'bob' "
            f"and status = 'skipped' and ts >= '{up.replace(tzinfo=None).isoformat()}'"
        ).rows[0][0]
        elapsed = (datetime.now(UTC) - up).total_seconds()
        assert skipped_since <= elapsed + 2  # one a second at most: no catch-up burst
        assert rt.query(
            "select count(*) from events where kind = 'turn_started' and persona = 'bob'"
        ).rows == [(0,)]
    finally:
        rt.shutdown()
    # No runtime now: coterie schedules reads the files and the store.
    assert main(["--home", str(home), "schedules", "bob"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "bob" in out and "every 1s" in out and "read from the files and the store" in out
