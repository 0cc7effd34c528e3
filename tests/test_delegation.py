"""Personas talking to each other on Ray: asks, mirrors, caps, cycles,
passivation, and actors (persona or router) killed and coming back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from coterie import Runtime
from coterie.actors import persona_actor_name
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.errors import QueueFullError
from coterie.runtime.messages import MessageEnvelope
from tests.helpers import scripted, write_persona

pytestmark = pytest.mark.usefixtures("ray_session")


POST_ALPHA = {"persona": "alpha", "text": "fyi"}


def seen_by_model(rt: Runtime, turn_id: str) -> int:
    """How many chat messages the (single) model call of a turn carried."""
    [(messages,)] = rt.query(
        "select cast(payload->>'messages' as integer) from events "
        f"where kind = 'model_call' and turn_id = '{turn_id}'"
    ).rows
    return int(messages)


def wait_until(condition: Callable[[], bool], deadline: float = 30.0) -> None:
    """Poll ``condition()`` until it holds (fails after ``deadline`` seconds)."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.05)


def count(rt: Runtime, where: str) -> int:
    """How many audit events match ``where`` (after a flush)."""
    [(n,)] = rt.query(f"select count(*) from events where {where}").rows
    return int(n)


def ask_rule(target: str, text: str) -> dict[str, Any]:
    return {"name": "ask_persona", "arguments": {"persona": target, "text": text}}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("deleg")
    write_persona(
        home,
        "boss",
        scripted(
            [
                {
                    "when": {"turn": 1, "contains": "both"},
                    "tool_calls": [ask_rule("alpha", "a?"), ask_rule("beta", "b?")],
                },
                {
                    "when": {"turn": 1, "contains": "post"},
                    "tool_calls": [
                        {
                            "name": "send_to_persona",
                            "arguments": {"persona": "alpha", "text": "fyi"},
                        }
                    ],
                },
                {"when": {"turn": 1, "contains": "loop"}, "tool_calls": [ask_rule("looper", "x")]},
                {"when": {"turn": 2}, "text": "got [{tool_result_1}] and [{tool_result_2}]"},
            ],
            default="boss heard it",
        ),
    )
    write_persona(home, "alpha", scripted(default="alpha here", latency_ms=300))
    write_persona(home, "beta", scripted(default="beta here", latency_ms=300))
    # looper asks boss back: boss is waiting on looper → a cycle.
    write_persona(
        home,
        "looper",
        scripted(
            [
                {"when": {"turn": 1}, "tool_calls": [ask_rule("boss", "and you?")]},
                {"when": {"turn": 2}, "text": "looper saw: {last_tool_result}"},
            ]
        ),
    )
    write_persona(home, "sleepy", scripted(default="zzz", latency_ms=2500))
    runtime = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None, max_queue=2))
    yield runtime
    runtime.shutdown()


def test_coordinator_asks_two_concurrently(rt: Runtime) -> None:
    # Warm actors: a cold start (seconds, and not the same for both) would
    # spread the two 300 ms turns apart whatever the asks did.
    for name in ("alpha", "beta"):
        assert rt.ask(name, "warm up", conversation_id=f"{name}:warm").status == "ok"
    reply = rt.ask("boss", "ask both", conversation_id="boss:both")
    assert reply.text == "got [alpha here] and [beta here]"
    rows = rt.query(
        "select persona, conversation_id, min(ts) filter (where kind = 'turn_started'), "
        "max(ts) filter (where kind = 'turn_ended') from events "
        "where conversation_id like '%:inbox:boss' group by 1, 2 order by 1"
    ).rows
    assert [r[:2] for r in rows] == [("alpha", "alpha:inbox:boss"), ("beta", "beta:inbox:boss")]
    # The two specialists' turns overlapped: the asks ran concurrently.
    assert max(r[2] for r in rows) < min(r[3] for r in rows)


def test_send_is_mirrored_back(rt: Runtime) -> None:
    reply = rt.ask("boss", "post it", conversation_id="boss:post")
    assert reply.status == "ok"
    # alpha's reply comes back as a new turn of boss, in boss:inbox:alpha.
    wait_until(
        lambda: (
            count(
                rt,
                "persona = 'boss' and conversation_id = 'boss:inbox:alpha' and kind = 'turn_ended'",
            )
            >= 1
        )
    )
    history = ray.get(rt.audit.history.remote("boss", "boss:inbox:alpha"))
    assert history[0].text == "[message from persona alpha] alpha here"
    assert history[-1].text == "boss heard it"


def test_ask_cycle_fails_fast(rt: Runtime) -> None:
    reply = rt.ask("boss", "loop please", conversation_id="boss:loop")
    assert "ask cycle: boss → looper → boss" in reply.text
    # looper's ask failed before sending anything: boss never got a message
    # from looper, so nobody waited on anybody.
    errors = rt.query(
        "select tool, error_kind from events where persona = 'looper' and kind = 'tool_result'"
    ).rows
    assert errors == [("ask_persona", "ask_cycle")]
    assert count(rt, "conversation_id = 'boss:inbox:looper'") == 0


def test_queue_cap_refuses_persona_messages_not_people(rt: Runtime) -> None:
    def from_boss(i: int) -> MessageEnvelope:
        return MessageEnvelope(
            sender="boss",
            recipient="sleepy",
            conversation_id="sleepy:inbox:boss",
            text=f"m{i}",
            source_kind="persona",
            reply_mode="none",
        )

    def m0_turn_started() -> bool:
        where = "conversation_id = 'sleepy:inbox:boss' and kind = 'turn_started'"
        return count(rt, where) >= 1

    async def flood() -> None:
        await rt.directory.post(from_boss(0))
        # m0's turn is running (2.5 s): m0 is off the queue, which is empty.
        wait_until(m0_turn_started)
        await rt.directory.post(from_boss(1))
        await rt.directory.post(from_boss(2))
        with pytest.raises(QueueFullError, match=r"\(2/2"):
            await rt.directory.post(from_boss(3))

    asyncio.run(flood())
    # People are never refused: with the persona queue at its cap, four more
    # messages from a person are all taken (a refusal would raise here).
    for i in range(4):
        rt.send("sleepy", f"user {i}", conversation_id="sleepy:inbox:boss")
    rt.flush()
    accepted = rt.query(
        "select payload->'envelope'->>'source_kind', count(*) from events "
        "where kind = 'envelope' and conversation_id = 'sleepy:inbox:boss' group by 1 order by 1"
    ).rows
    assert accepted == [("persona", 3), ("user", 4)]


def test_persona_killed_mid_turn_comes_back(rt: Runtime) -> None:
    rt.ask("alpha", "warm up", conversation_id="alpha:kill")
    handle = ray.get_actor(persona_actor_name(rt.id, "alpha"), namespace=rt.namespace)
    assert not ray.get(handle.stats.remote())["busy"]

    async def killed() -> Any:
        task = asyncio.ensure_future(rt.ask_async("alpha", "doomed", conversation_id="alpha:kill"))
        # Killed as soon as the doomed message is in (its 300 ms turn running):
        # likely inside the audit buffer's flush interval, so that only the
        # spool keeps what the dying actor recorded. Stats do not flush it.
        end = time.monotonic() + 30
        while not (await handle.stats.remote())["busy"]:
            assert time.monotonic() < end, "the doomed message never reached alpha"
            await asyncio.sleep(0.005)
        ray.kill(handle, no_restart=False)
        return await asyncio.wait_for(task, 30)

    reply = asyncio.run(killed())
    assert reply.status == "error"
    assert "died while handling the message" in (reply.error or "")
    after = rt.ask("alpha", "again", conversation_id="alpha:kill")
    assert after.text == "alpha here", after.error
    # The restarted actor rebuilt the whole conversation, the killed turn's
    # message included: the model of the next turn saw warm-up, its answer,
    # the doomed message and the new one.
    assert seen_by_model(rt, after.turn_id) == 4
    assert [m.kind for m in rt.history("alpha", "alpha:kill")] == [
        "user",
        "assistant",
        "user",
        "user",
        "assistant",
    ]
    # No audit event was lost: the killed turn's envelope and start are there.
    rows = rt.query(
        "select kind, count(*) from events where conversation_id = 'alpha:kill' "
        "and kind in ('envelope', 'turn_started') group by 1 order by 1"
    ).rows
    assert rows == [("envelope", 3), ("turn_started", 3)]


def test_router_killed_comes_back(rt: Runtime) -> None:
    before = rt.ask("beta", "hello", conversation_id="beta:router")
    handle = ray.get_actor(persona_actor_name(rt.id, "beta"), namespace=rt.namespace)
    pid = ray.get(handle.stats.remote())["pid"]
    ray.kill(rt.router, no_restart=False)
    # Cached addresses keep working, and new resolutions wait for the restart.
    rt.directory.forget("beta")
    after = rt.ask("beta", "hello again", conversation_id="beta:router")
    assert before.status == after.status == "ok", after.error
    handle = ray.get_actor(persona_actor_name(rt.id, "beta"), namespace=rt.namespace)
    assert ray.get(handle.stats.remote())["pid"] == pid  # the same actor, re-found by name
    assert rt.ask("boss", "ask both", conversation_id="boss:after-router").status == "ok"


def test_passivation_round_trip(tmp_path: Path, ray_session: None) -> None:
    home = tmp_path / "virtual"
    write_persona(home, "idler", scripted(default="still here"))
    write_persona(home, "other", scripted(default="other"))
    rt = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=1.0))
    try:
        assert rt.ask("idler", "one", conversation_id="idler:c").text == "still here"
        assert ray.get(rt.router.active.remote()) == ["idler"]
        # No process for an idle persona: the watcher has it passivated.
        wait_until(lambda: ray.get(rt.router.active.remote()) == [])
        # The cached handle is stale; delivery re-resolves and reactivates.
        second = rt.ask("idler", "two", conversation_id="idler:c")
        assert second.text == "still here"
        # The new actor rebuilt the conversation: its model saw the first exchange.
        assert seen_by_model(rt, second.turn_id) == 3
    finally:
        rt.shutdown()


def test_todo_list_survives_passivation(tmp_path: Path, ray_session: None) -> None:
    home = tmp_path / "todos"
    todo = {"content": "Book the venue", "status": "in_progress", "priority": "high"}
    write_persona(
        home,
        "keeper",
        scripted(
            [
                {
                    "when": {"turn": 1, "contains": "plan"},
                    "tool_calls": [{"name": "todo_write", "arguments": {"todos": [todo]}}],
                },
                {
                    "when": {"turn": 1, "contains": "list"},
                    "tool_calls": [{"name": "todo_read", "arguments": {}}],
                },
                {"when": {"turn": 2}, "text": "{last_tool_result}"},
            ]
        ),
    )
    rt = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=1.0))
    try:
        planned = rt.ask("keeper", "plan it", conversation_id="keeper:c")
        assert planned.text == "0/1 completed\n1. [~] Book the venue (high)", planned.error
        wait_until(lambda: ray.get(rt.router.active.remote()) == [])  # passivated
        listed = rt.ask("keeper", "list it", conversation_id="keeper:c")
        # The new actor rebuilt the todo list from the audit log with the conversation.
        assert listed.text == planned.text, listed.error
    finally:
        rt.shutdown()
