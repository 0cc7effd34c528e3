"""Fault injection on a real local Ray: a steady load of turns while actors die.

Four conversations over two personas run turns back to back (each turn: a
``memory`` write and a ``clock`` call, then a reply) while, one at a time,
the AuditLog actor, a persona actor, the router, the MemoryStore actor and a
ShellProcess actor are killed with ``ray.kill`` (Ray restarts the first
four). Afterwards:

* no caller waited past its timeout, and every reply is an answer or a
  readable error;
* every turn that answered has each of its audit rows exactly once
  (5 ``chat_message``, 2 ``model_call``, 2 ``tool_call``), no row is doubled;
* every conversation rebuilds from the log with each answered message in it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest
import ray

from coterie import Runtime
from coterie.actors import memory_name, persona_actor_name
from coterie.runtime.config import MemorySettings, RuntimeSettings
from coterie.runtime.messages import AssistantMessage, ReplyEnvelope, ToolResultMessage, UserMessage
from tests.helpers import scripted, write_persona

pytestmark = pytest.mark.usefixtures("ray_session")

PERSONAS = ("alpha", "beta")
CONVERSATIONS = [(p, f"{p}:load:{i}") for p in PERSONAS for i in range(2)]
ASK_TIMEOUT = 60.0
#: What each answered turn leaves in the audit log.
EXPECTED = {"chat_message": 5, "model_call": 2, "tool_call": 2}

WORKER = scripted(
    [
        {
            "when": {"turn": 1},
            "tool_calls": [
                {
                    "name": "memory",
                    "arguments": {"action": "write", "category": "load", "content": "a turn ran"},
                },
                {"name": "clock", "arguments": {}},
            ],
        },
        {"when": {"turn": 2}, "text": "done"},
    ],
    latency_ms=20,
)
SHELLY = scripted(
    [
        {
            "when": {"turn": 1, "contains": "start"},
            "tool_calls": [
                {"name": "shell_exec", "arguments": {"command": "sleep 60", "background": True}}
            ],
        },
        {
            "when": {"turn": 1, "contains": "list"},
            "tool_calls": [{"name": "process", "arguments": {"action": "list"}}],
        },
        {"when": {"turn": 2}, "text": "{last_tool_result}"},
    ],
    access="full",
)


@dataclass
class Load:
    """Turns sent and what came back."""

    replies: list[tuple[str, str, ReplyEnvelope]] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    stop: bool = False


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("faults")
    for name in PERSONAS:
        write_persona(home, name, WORKER)
    write_persona(home, "shelly", SHELLY)
    settings = RuntimeSettings(idle_timeout=None, memory=MemorySettings(embedder="hashing"))
    runtime = Runtime.start(home=home, settings=settings)
    yield runtime
    runtime.shutdown()


async def converse(rt: Runtime, persona: str, conversation: str, load: Load) -> None:
    n = 0
    while not load.stop:
        text = f"{conversation} turn {n}"
        try:
            reply = await asyncio.wait_for(
                rt.ask_async(persona, text, conversation_id=conversation, timeout=ASK_TIMEOUT),
                ASK_TIMEOUT + 15,
            )
        except TimeoutError:
            load.hung.append(text)
            continue
        load.replies.append((conversation, text, reply))
        n += 1


def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def answered(load: Load) -> int:
    return sum(r.status == "ok" for _, _, r in load.replies)


def answers(handle: Any) -> bool:
    try:
        return bool(ray.get(handle.ping.remote(), timeout=5))
    except (ray.exceptions.RayError, TimeoutError):
        return False


def restarted(handle: Any, before: int) -> Callable[[], bool]:
    """Whether an actor answers again from a new process."""

    def check() -> bool:
        try:
            return bool(ray.get(handle.ping.remote(), timeout=5)) and pid_of(handle) != before
        except (ray.exceptions.RayError, TimeoutError):
            return False

    return check


def pid_of(handle: Any) -> int:
    stats = ray.get(handle.stats.remote(), timeout=10)
    return int(stats["pid"] if isinstance(stats, dict) else stats.pid)


def test_actors_die_under_load_and_nothing_is_lost(rt: Runtime) -> None:
    # Warm up: every persona answers once (and the shell persona starts a process).
    for persona, conversation in CONVERSATIONS:
        assert rt.ask(persona, "warm up", conversation_id=conversation).status == "ok"
    started = rt.ask("shelly", "start a process", conversation_id="shelly:c")
    assert '"backgrounded": true' in started.text, started.error
    load = Load()
    killed: list[str] = []

    async def run() -> None:
        workers = [asyncio.ensure_future(converse(rt, p, c, load)) for p, c in CONVERSATIONS]
        try:
            await asyncio.to_thread(inject, rt, load, killed)
        finally:
            load.stop = True
            await asyncio.gather(*workers)

    asyncio.run(run())

    # Every caller got an answer or a readable error, none waited past its timeout.
    assert load.hung == []
    errors = [r.error for _, _, r in load.replies if r.status != "ok"]
    assert all(isinstance(e, str) and e for e in errors), errors
    assert answered(load) >= 40, f"only {answered(load)} turns answered"
    # The process of the killed ShellProcess actor is reported lost, not hanging.
    listed = rt.ask("shelly", "list processes", conversation_id="shelly:c")
    assert '"lost": true' in listed.text, listed.text

    # Every answered turn's rows are in the log exactly once.
    rt.flush()
    ok_turns = {r.turn_id for _, _, r in load.replies if r.status == "ok"}
    # (The results a restarted persona gives the calls its death cut off are
    # recorded with its next turn: they are counted apart.)
    counts = rt.query(
        "select turn_id, kind, count(*), count(distinct id) from events "
        "where kind in ('chat_message', 'model_call', 'tool_call') "
        "and persona in ('alpha', 'beta') "
        "and coalesce(payload->'message'->>'error_kind', '') != 'interrupted' group by 1, 2"
    ).rows
    found: dict[str, dict[str, int]] = {}
    for turn_id, kind, n, distinct in counts:
        assert n == distinct, f"row doubled in {turn_id} ({kind})"
        found.setdefault(turn_id, {})[kind] = n
    missing = {t: found.get(t) for t in ok_turns if found.get(t) != EXPECTED}
    assert missing == {}, f"{len(missing)} of {len(ok_turns)} answered turns lack rows"
    # Only calls of the killed persona were cut off, and each got one result.
    cut = rt.query(
        "select persona, count(*), count(distinct payload->'message'->>'call_id') from events "
        "where kind = 'chat_message' and payload->'message'->>'error_kind' = 'interrupted' "
        "group by 1"
    ).rows
    assert all(persona == "alpha" and n == distinct for persona, n, distinct in cut), cut
    [(rows, ids)] = rt.query("select count(*), count(distinct id) from events").rows
    assert rows == ids

    # Conversations rebuild with every answered message, in order, and every
    # tool call has its result (a call cut off by the persona's death included).
    for persona, conversation in CONVERSATIONS:
        messages = rt.history(persona, conversation)
        history = [m.text for m in messages if isinstance(m, UserMessage)]
        sent = [text for c, text, r in load.replies if c == conversation and r.status == "ok"]
        assert [t for t in history if t in sent] == sent
        calls = [c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
        results = [m.call_id for m in messages if isinstance(m, ToolResultMessage)]
        assert sorted(calls) == sorted(results), conversation
    print(
        f"\nfault injection: {len(load.replies)} turns ({answered(load)} answered, "
        f"{len(errors)} readable errors), killed {', '.join(killed)}; "
        f"rows expected {sum(EXPECTED.values()) * len(ok_turns)}, found "
        f"{sum(sum(found.get(t, {}).values()) for t in ok_turns)}"
    )


def inject(rt: Runtime, load: Load, killed: list[str]) -> None:
    """Kill one actor of each kind in turn, with turns answered in between."""

    def progress(turns: int) -> None:
        target = answered(load) + turns
        until(lambda: answered(load) >= target, f"{turns} more answered turns")

    progress(10)
    # 1. The AuditLog actor, while turns are running.
    before = pid_of(rt.audit)
    ray.kill(rt.audit, no_restart=False)
    killed.append("audit")
    until(restarted(rt.audit, before), "the audit actor to restart")
    progress(10)
    # 2. A persona actor, mid-turn as likely as not.
    persona = ray.get_actor(persona_actor_name(rt.id, "alpha"), namespace=rt.namespace)
    before = pid_of(persona)
    ray.kill(persona, no_restart=False)
    killed.append("persona")
    until(restarted(persona, before), "the persona to restart")
    progress(10)
    # 3. The router.
    ray.kill(rt.router, no_restart=False)
    killed.append("router")
    until(lambda: answers(rt.router), "the router to restart")
    progress(10)
    # 4. The MemoryStore actor (memory writes fail readably meanwhile).
    memory = ray.get_actor(memory_name(rt.id), namespace=rt.namespace)
    before = memory_pid(memory)
    ray.kill(memory, no_restart=False)
    killed.append("memory")
    until(lambda: memory_pid(memory) not in (None, before), "the memory store to restart")
    progress(10)
    # 5. A ShellProcess actor (not restarted: its process is reported lost).
    shelly = ray.get_actor(persona_actor_name(rt.id, "shelly"), namespace=rt.namespace)
    shell_worker = shell_actor_process(pid_of(shelly))
    shell_worker.kill()
    killed.append("shell")
    progress(5)


def memory_pid(handle: Any) -> int | None:
    try:
        return int(ray.get(handle.stats.remote(), timeout=5).pid)
    except (ray.exceptions.RayError, TimeoutError):
        return None


def shell_actor_process(persona_pid: int) -> psutil.Process:
    """The worker process of the ShellProcess actor running ``sleep 60``."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "sleep" and proc.info["cmdline"][-1:] == ["60"]:
            worker = proc.parent()
            while worker is not None and "ShellProcessActor" not in " ".join(worker.cmdline()):
                worker = worker.parent()
            if worker is not None and worker.pid != os.getpid():
                return worker
    raise AssertionError(f"no ShellProcess actor runs sleep 60 (persona pid {persona_pid})")
