"""Subagents on Ray: one Subagent actor per spawn, grouped wake, audit in
DuckDB under the subagent's own conversation, a killed actor reports
``crashed``, cancel kills it."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
import ray

from coterie import Runtime
from coterie.actors import persona_actor_name
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.messages import AssistantMessage, ToolResultMessage, UserMessage
from tests.helpers import owned_by, ray_actors, scripted, write_persona

pytestmark = pytest.mark.usefixtures("ray_session")


def spawn(task: str, **extra: Any) -> dict[str, Any]:
    return {"name": "spawn_subagent", "arguments": {"task": task, **extra}}


def wait_until(condition: Callable[[], bool], deadline: float = 60.0, what: str = "") -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"not reached in {deadline:g} s: {what or condition}"
        time.sleep(0.1)


SLOW = {"provider": "scripted", "name": "slow", "latency_ms": 600_000, "timeout": 900}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("subagents")
    write_persona(
        home,
        "lead",
        scripted(
            [
                {"when": {"context": "subagent", "contains": "pid"}, "text": "pid report"},
                {"when": {"context": "subagent"}, "text": "checked: {input}"},
                # The wake (checked first: its text names what ended, "crashed"…).
                {"when": {"contains": "finished"}, "text": "Summary:\n{input}"},
                {
                    "when": {"turn": 1, "contains": "fan out"},
                    "tool_calls": [spawn("look at pid"), spawn("look at the logs")],
                },
                {
                    "when": {"turn": 1, "contains": "crash"},
                    "tool_calls": [spawn("hang", model="slow")],
                },
                {
                    "when": {"turn": 1, "contains": "persona dies"},
                    "tool_calls": [spawn("hang", model="slow"), spawn("hang too", model="slow")],
                },
                {
                    "when": {"turn": 1, "contains": "too slow"},
                    "tool_calls": [spawn("hang", model="slow", timeout_s=3)],
                },
            ],
            default="noted",
        )
        # A subagent model that never answers in time.
        | {"subagents": {"models": {"slow": SLOW}}},
    )
    runtime = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None))
    yield runtime
    runtime.shutdown()


def subagents(rt: Runtime) -> list[dict[str, Any]]:
    """The lead persona's live Subagent actors (the actor table's entries).

    Only actors this runtime's persona created count: the machine may hold
    other Ray sessions' workers (a lost node's leftovers, another checkout's
    tests), and those must not change the count. Not by process title: Ray
    sets an async actor's title back to idle whenever any of its calls ends,
    so a running subagent can be titled idle.
    """
    lead = persona_actor_name(rt.id, "lead")
    if not any(a["Name"] == lead and a["State"] == "ALIVE" for a in ray_actors()):
        return []  # not started yet (or restarting): it owns none
    return [a for a in owned_by(lead, "SubagentActor") if a["State"] == "ALIVE"]


def the_spare(rt: Runtime) -> dict[str, Any]:
    """The lead's one idle Subagent actor, which its next spawn takes.

    A spawn leaves one spare behind; if none was made yet, one spawn (in a
    conversation of its own) makes it.
    """
    if not subagents(rt):
        rt.ask("lead", "fan out please", conversation_id="lead:warm-up")
        rt.wait_settled("lead", "lead:warm-up", timeout=120)
    wait_until(lambda: len(subagents(rt)) == 1, what="one spare Subagent actor")
    (spare,) = subagents(rt)
    assert spare["Pid"], spare
    return spare


def titled(pids: set[int], title: str) -> list[tuple[psutil.Process, str]]:
    """The processes among ``pids`` still running whose title starts with
    ``title``, each with its command line."""
    found = []
    for pid in sorted(pids - {0}):  # 0: an actor whose process never started
        try:
            proc = psutil.Process(pid)
            cmd = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if cmd.startswith(title):
            found.append((proc, cmd))
    return found


def is_gone(actor: dict[str, Any], rt: Runtime) -> bool:
    """``actor`` is dead in the actor table and its process has exited."""
    alive = {a["ActorID"] for a in subagents(rt)}
    return actor["ActorID"] not in alive and not titled({int(actor["Pid"])}, "ray::")


def wake_of(rt: Runtime, conv: str) -> str:
    messages = rt.history("lead", conv)
    wakes = [m.text for m in messages if isinstance(m, UserMessage) and m.source == "delegation"]
    assert len(wakes) == 1, wakes
    return wakes[0]


def test_two_spawns_run_in_their_own_actors_and_come_back_as_one_wake(rt: Runtime) -> None:
    conv = "lead:fan"
    reply = rt.ask("lead", "fan out please", conversation_id=conv)
    assert reply.status == "ok" and reply.steps == 1
    rt.wait_settled("lead", conv, timeout=120)
    messages = rt.history("lead", conv)
    handles = [
        json.loads(m.content)["handle"]
        for m in messages
        if isinstance(m, ToolResultMessage) and m.name == "spawn_subagent"
    ]
    assert len(handles) == 2
    wakes = [m for m in messages if isinstance(m, UserMessage) and m.source == "delegation"]
    assert len(wakes) == 1
    assert "pid report" in wakes[0].text and "checked: look at the logs" in wakes[0].text
    final = messages[-1]
    assert isinstance(final, AssistantMessage) and final.text.startswith("Summary:")
    # Each subagent ran in its own actor: the DuckDB log has their turns
    # under their own conversation ids, linked from the parent's turn.
    rows = rt.query(
        "select conversation_id, count(*) filter (where kind = 'model_call'), "
        "count(*) filter (where kind = 'turn_ended') from events "
        f"where conversation_id in ('{handles[0]}', '{handles[1]}') group by 1 order by 1"
    ).rows
    assert rows == sorted((h, 1, 1) for h in handles)
    links = rt.query(
        "select call_id, status, payload->>'child_conversation_id' from events "
        f"where kind = 'delegation' and conversation_id = '{conv}' "
        "and payload->>'phase' = 'finished' order by call_id"
    ).rows
    assert links == sorted((h, "ok", h) for h in handles)
    assert (
        rt.query(
            f"select count(distinct turn_id) from events where kind = 'delegation' "
            f"and conversation_id = '{conv}'"
        ).rows[0][0]
        == 1
    )
    # The subagents' actors are gone (killed once they reported); only a spare waits.
    wait_until(lambda: len(subagents(rt)) == 1, what="only the spare left")


def test_a_killed_subagent_actor_reports_crashed(rt: Runtime) -> None:
    conv = "lead:crash"
    spare = the_spare(rt)
    assert rt.ask("lead", "crash test", conversation_id=conv).steps == 1
    # The spawn took the spare: its task runs there once its turn has started.
    wait_until(lambda: subagent_turns_started(rt, conv) == 1, what="the subagent started")
    assert spare["ActorID"] in {a["ActorID"] for a in subagents(rt)}
    os.kill(int(spare["Pid"]), signal.SIGKILL)
    rt.wait_settled("lead", conv, timeout=120)
    text = wake_of(rt, conv)
    assert "(subagent) · crashed" in text and "ActorLostError" in text


def test_a_subagent_past_its_timeout_is_stopped_and_reported(rt: Runtime) -> None:
    conv = "lead:slow"
    spare = the_spare(rt)
    assert rt.ask("lead", "too slow", conversation_id=conv).steps == 1
    rt.wait_settled("lead", conv, timeout=120)
    text = wake_of(rt, conv)
    assert "(subagent) · timeout" in text and "did not finish within 3 s" in text
    # The actor it ran in is gone (its model would still be sleeping: 600 s).
    assert subagent_turns_started(rt, conv) == 1
    wait_until(lambda: is_gone(spare, rt), what="the timed-out subagent's actor gone")


def test_work_lost_with_a_killed_persona_is_reported_after_its_restart(rt: Runtime) -> None:
    conv = "lead:persona-dies"
    # The turn ends once both subagents run (their handles are registered).
    assert rt.ask("lead", "the persona dies", conversation_id=conv).steps == 1
    # Both run their task: each has started its turn in the audit log. (Not
    # by the process title: Ray sets it back to idle as each call ends, and a
    # freshly created subagent was seen titled idle while it ran.)
    wait_until(lambda: subagent_turns_started(rt, conv) == 2, what="both subagents started")
    # Every Subagent actor the persona owns dies with it, the spare too.
    lead = persona_actor_name(rt.id, "lead")
    running = {int(a["Pid"]) for a in owned_by(lead, "SubagentActor") if a["State"] == "ALIVE"}
    assert len(running) >= 2
    handle = ray.get_actor(persona_actor_name(rt.id, "lead"), namespace=rt.namespace)
    os.kill(ray.get(handle.stats.remote())["pid"], signal.SIGKILL)
    # Ray restarts the persona; its subagents died with it (it owned them).
    # Nobody sends it a message: it finds the lost work in the audit log itself.
    wait_until(lambda: len(delegation_wakes(rt, conv)) == 1, 120, "the lost-work wake")
    rt.wait_settled("lead", conv, timeout=60)
    (text,) = delegation_wakes(rt, conv)
    assert "All 2 tasks you delegated together have finished." in text
    assert text.count("(subagent) · crashed") == 2 and "has restarted" in text
    assert "task: hang too" in text
    final = rt.history("lead", conv)[-1]
    assert isinstance(final, AssistantMessage) and final.text.startswith("Summary:")
    # The restarted persona owns new actors: those the killed one owned are checked by pid.
    wait_until(lambda: titled(running, "ray::SubagentActor") == [], what="subagents gone")
    # Each is reported once: a finished row per handle; a second check finds nothing.
    rows = rt.query(
        "select call_id, status from events where kind = 'delegation' "
        f"and conversation_id = '{conv}' and payload->>'phase' = 'finished'"
    ).rows
    assert sorted(status for _, status in rows) == ["crashed", "crashed"]
    assert len({h for h, _ in rows}) == 2
    assert ray.get(handle.recover_lost_work.remote()) == 0


def subagent_turns_started(rt: Runtime, conv: str) -> int:
    """How many of the subagents ``conv`` delegated to have started their turn."""
    started: int = rt.query(
        "select count(distinct conversation_id) from events where kind = 'turn_started' "
        "and conversation_id in (select call_id from events where kind = 'delegation' "
        f"and conversation_id = '{conv}')"
    ).rows[0][0]
    return started


def delegation_wakes(rt: Runtime, conv: str) -> list[str]:
    return [
        m.text
        for m in rt.history("lead", conv)
        if isinstance(m, UserMessage) and m.source == "delegation"
    ]
