"""The router, persona and audit actors on a local Ray."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from coterie import Runtime
from coterie.actors import router_name
from coterie.actors._ray import YOUNG_COLLECTION_AFTER
from coterie.runtime.errors import PersonaConfigError, UnknownPersonaError
from coterie.runtime.messages import MessageEnvelope, ReplyEnvelope
from tests.helpers import scripted, write_persona

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("home")
    write_persona(
        home,
        "echo",
        scripted([{"when": {"contains": "hello"}, "text": "hi back"}], description="echoes"),
    )
    write_persona(
        home,
        "toolish",
        scripted(
            [
                {
                    "when": {"turn": 1},
                    "tool_calls": [
                        {"name": "clock", "arguments": {"format": "sundial"}},
                        {"name": "todo_write", "arguments": {"todos": [{"content": "a"}]}},
                    ],
                },
                {"when": {"turn": 2}, "text": "last: {last_tool_result}"},
            ]
        ),
    )
    write_persona(
        home,
        "slow",
        {"model": {"provider": "scripted", "default": "slow reply", "latency_ms": 400}},
    )
    write_persona(home, "settler", scripted([], default="settled"))
    write_persona(home, "lookups", scripted([], default="looked up"))
    write_persona(
        home,
        "keyless",
        {
            "model": {
                "provider": "openai",
                "name": "gpt-test",
                "api_key_env": "COTERIE_TEST_NO_SUCH_KEY",
            }
        },
    )
    write_persona(home, "broken", {"model": {"provider": "nonsense"}})
    # A priced model and a budget too small for one call (kept by the router).
    write_persona(
        home,
        "frugal",
        {
            "model": {"provider": "scripted", "name": "frugal-model", "default": "spent"},
            "budget": {"daily_usd": 0.0001},
        },
    )
    write_persona(
        home,
        "lavish",
        {"model": {"provider": "scripted", "name": "frugal-model", "default": "spent"}},
    )
    (home / "runtime.yaml").write_text(
        "prices:\n  frugal-*: {input: 1, output: 1}\n", encoding="utf-8"
    )
    runtime = Runtime.start(home=home)
    yield runtime
    runtime.shutdown()


def test_ask_and_audit(rt: Runtime) -> None:
    reply = rt.ask("echo", "hello there", conversation_id="echo:t1")
    assert (reply.text, reply.status, reply.sender) == ("hi back", "ok", "echo")
    reply = rt.ask("toolish", "go", conversation_id="toolish:t1")
    assert reply.text == "last: 0/1 completed\n1. [ ] a (medium)"
    result = rt.query(
        "select kind, count(*) from events where conversation_id in ('echo:t1', 'toolish:t1') "
        "group by 1 order by 1"
    )
    counts = dict(result.rows)
    assert counts["model_call"] == 3
    assert counts["tool_call"] == counts["tool_result"] == 2
    assert counts["turn_started"] == counts["turn_ended"] == 2
    errors = rt.query(
        "select tool, error_kind from events where kind = 'tool_result' "
        "and conversation_id = 'toolish:t1' order by tool"
    )
    assert errors.rows == [("clock", "invalid_arguments"), ("todo_write", None)]


def test_a_budget_the_router_keeps_refuses_a_call_it_cannot_afford(rt: Runtime) -> None:
    reply = rt.ask("frugal", "hi", conversation_id="frugal:t1")
    assert reply.status == "error" and "budget_exceeded" in (reply.error or "")
    assert "persona 'frugal'" in (reply.error or "")
    # Another persona on the same priced model has no budget: it is served.
    assert rt.ask("lavish", "hi", conversation_id="lavish:t1").text == "spent"
    rt.flush()
    rows = rt.query("select persona, status, error_kind from events where kind = 'budget'").rows
    assert rows == [("frugal", "exceeded", "budget_exceeded")]
    (cost,) = rt.query(
        "select cost_usd from events where kind = 'model_call' and persona = 'lavish'"
    ).rows[0]
    assert cost is not None and cost > 0


def test_conversation_continues_across_asks(rt: Runtime) -> None:
    rt.ask("echo", "hello one", conversation_id="echo:cont")
    rt.ask("echo", "hello two", conversation_id="echo:cont")
    rt.flush()
    history = ray.get(rt.audit.history.remote("echo", "echo:cont"))
    assert [m.kind for m in history] == ["user", "assistant", "user", "assistant"]


def test_unknown_persona(rt: Runtime) -> None:
    with pytest.raises(UnknownPersonaError, match=r"unknown persona 'ghost'.*echo"):
        rt.ask("ghost", "hi")


def test_bad_persona_file(rt: Runtime) -> None:
    with pytest.raises(
        PersonaConfigError,
        match=r"broken/persona.yaml[\s\S]*model.plugin.provider: expected one of",
    ):
        rt.ask("broken", "hi")


def test_missing_key_is_a_readable_error(rt: Runtime) -> None:
    reply = rt.ask("keyless", "hi")
    assert reply.status == "error"
    assert "COTERIE_TEST_NO_SUCH_KEY" in (reply.error or "")


def test_one_turn_at_a_time_per_conversation(rt: Runtime) -> None:
    rt.ask("slow", "warm up", conversation_id="slow:warm")  # the actor is up
    handle = ray.get_actor(f"coterie:{rt.id}:persona:slow", namespace=rt.namespace)

    async def go() -> list[Any]:
        first = asyncio.ensure_future(rt.ask_async("slow", "m0", conversation_id="slow:same"))
        while not (await handle.stats.remote())["busy"]:  # m0's turn is running
            await asyncio.sleep(0.01)
        later = [rt.ask_async("slow", f"m{i}", conversation_id="slow:same") for i in (1, 2)]
        other = rt.ask_async("slow", "x", conversation_id="slow:other")
        return list(await asyncio.gather(first, *later, other))

    r0, r1, r2, other = asyncio.run(go())
    # m1 and m2 arrived while m0's turn ran: they waited and shared the next turn.
    assert r1.turn_id == r2.turn_id != r0.turn_id
    assert [r.status for r in (r0, r1, r2, other)] == ["ok"] * 4
    rt.flush()
    history = ray.get(rt.audit.history.remote("slow", "slow:same"))
    assert [m.kind for m in history] == ["user", "assistant", "user", "user", "assistant"]
    rows = rt.query(
        "select turn_id, kind, ts from events where persona = 'slow' "
        "and conversation_id in ('slow:same', 'slow:other') "
        "and kind in ('turn_started', 'turn_ended')"
    ).rows
    at = {(turn_id, kind): ts for turn_id, kind, ts in rows}
    assert len(at) == len(rows) == 6  # three turns, each started and ended once
    # One turn at a time in slow:same: the merged turn started after m0's ended…
    assert at[(r1.turn_id, "turn_started")] >= at[(r0.turn_id, "turn_ended")]
    # …while slow:other's turn started during m0's: conversations run in parallel.
    assert at[(other.turn_id, "turn_started")] < at[(r0.turn_id, "turn_ended")]


def test_new_conversations_are_looked_up_in_the_log_in_shared_reads(rt: Runtime) -> None:
    rt.ask("lookups", "warm up", conversation_id="lookups:warm")
    handle = ray.get_actor(f"coterie:{rt.id}:persona:lookups", namespace=rt.namespace)
    before = ray.get(handle.stats.remote())["conversation_reads"]

    async def go() -> list[ReplyEnvelope]:
        asks = [rt.ask_async("lookups", "hi", conversation_id=f"lookups:new{i}") for i in range(8)]
        return list(await asyncio.gather(*asks))

    assert [r.status for r in asyncio.run(go())] == ["ok"] * 8
    reads = ray.get(handle.stats.remote())["conversation_reads"] - before
    # Each of the eight was looked up, some of them together (how many share
    # a read depends on when Ray delivers them).
    assert 1 <= reads <= 8
    # A new conversation starts empty and goes on from there.
    rt.ask("lookups", "second", conversation_id="lookups:new0")
    assert [m.kind for m in rt.history("lookups", "lookups:new0")] == ["user", "assistant"] * 2


def test_personas_start_a_few_at_a_time_as_runtime_yaml_says(rt: Runtime, tmp_path: Path) -> None:
    # Unset, the limit is the cluster's CPUs (at least 2).
    default = max(2, int(ray.cluster_resources().get("CPU", 0)))
    assert rt._run(rt.status_async())["personas"]["start_limit"] == default
    names = [f"p{i}" for i in range(3)]
    for name in names:
        write_persona(tmp_path, name, scripted([], default=f"{name} here"))
    (tmp_path / "runtime.yaml").write_text("max_starting_personas: 1\n", encoding="utf-8")
    runtime = Runtime.start(home=tmp_path)
    try:

        async def first_asks() -> list[ReplyEnvelope]:
            # All three need a start at once: one starts, two wait their turn.
            return list(
                await asyncio.gather(*(runtime.ask_async(n, "hi", timeout=120) for n in names))
            )

        replies = asyncio.run(first_asks())
        assert [(r.status, r.text) for r in replies] == [("ok", f"{n} here") for n in names]
        personas = runtime._run(runtime.status_async())["personas"]
        assert personas["start_limit"] == 1 and personas["waiting_to_start"] == []
        assert sorted(p["name"] for p in personas["active"]) == names
    finally:
        runtime.shutdown()


def test_router_reachable_by_name_from_anywhere(rt: Runtime) -> None:
    @ray.remote(num_cpus=0)
    def from_a_task(name: str, namespace: str) -> str:
        router = ray.get_actor(name, namespace=namespace)
        envelope = MessageEnvelope(recipient="echo", conversation_id="echo:task", text="hello")
        reply = ray.get(router.deliver.remote(envelope.model_dump_json()))
        return ReplyEnvelope.model_validate_json(reply).text

    assert ray.get(from_a_task.remote(router_name(rt.id), rt.namespace)) == "hi back"


def test_scripted_persona_does_not_load_sdks(rt: Runtime) -> None:
    rt.ask("echo", "hello", conversation_id="echo:sdk")
    handle = ray.get_actor(f"coterie:{rt.id}:persona:echo", namespace=rt.namespace)
    stats = ray.get(handle.stats.remote())
    assert stats["sdks_loaded"] == []


def _serializer_state(actor: Any) -> tuple[bool, list[str]]:
    import sys

    from coterie.actors import _lean

    loaded = [m for m in _lean.SKIPPED_SERIALIZER_MODULES if m in sys.modules]
    return _lean.LEAN_SERIALIZATION, loaded


def test_actor_processes_leave_out_rays_serializers_for_objects_they_never_send(
    rt: Runtime,
) -> None:
    """Ray's add-ons would import pyarrow, pydantic.v1 and starlette into
    every worker that decodes anything (~12 MiB each); coterie's actors are
    built before that and never send such objects."""
    rt.ask("echo", "hello", conversation_id="echo:lean")
    persona = ray.get(rt.router.resolve.remote("echo"))
    for actor in (persona, rt.router):
        assert ray.get(actor.__ray_call__.remote(_serializer_state)) == (True, [])


def test_persona_freezes_its_heap_when_set_up_and_after_its_first_turn_only(rt: Runtime) -> None:
    handle = ray.get(rt.router.resolve.remote("settler"))
    set_up = ray.get(handle.stats.remote())
    assert set_up["turns"] == 0
    # Ray, pydantic and our modules: out of the full collections' way.
    assert set_up["heap_frozen"] > 20_000
    rt.ask("settler", "one", conversation_id="settler:1")
    after_first = ray.get(handle.stats.remote())["heap_frozen"]
    # What the first turn brought in (a provider's SDK, lazily imported modules).
    assert after_first > set_up["heap_frozen"]
    for i in range(2, 5):
        rt.ask("settler", "more", conversation_id=f"settler:{i}")
    # Not again: later turns' objects stay collectable.
    assert ray.get(handle.stats.remote())["heap_frozen"] <= after_first


def _gc_threshold(self: object) -> tuple[int, int, int]:
    import gc

    return gc.get_threshold()


def test_persona_collects_its_young_objects_less_often_than_pythons_default(
    rt: Runtime,
) -> None:
    """A turn's objects go with their reference counts; at Python's 700 a busy
    persona ran the collector every few turns and found nothing to free."""
    rt.ask("echo", "hello", conversation_id="echo:gc")
    persona = ray.get(rt.router.resolve.remote("echo"))
    young, older, oldest = ray.get(persona.__ray_call__.remote(_gc_threshold))
    assert young == YOUNG_COLLECTION_AFTER > 700
    assert (older, oldest) == (10, 10)  # Python's own for the older generations


def test_personas_listing(rt: Runtime) -> None:
    listing = {p.name: p for p in rt.personas()}
    # Every persona the fixture wrote, except the one whose file is broken.
    assert set(listing) == {
        "echo",
        "toolish",
        "slow",
        "settler",
        "lookups",
        "keyless",
        "frugal",
        "lavish",
    }
    assert {name: p.description for name, p in listing.items()} == {
        "echo": "echoes",
        "toolish": "",
        "slow": "",
        "settler": "",
        "frugal": "",
        "lavish": "",
        "lookups": "",
        "keyless": "",
    }
