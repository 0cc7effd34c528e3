"""The MemoryStore actor on Ray: shared, persona-scoped, batched, maintained."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from coterie import Runtime
from coterie.actors import memory_name
from coterie.actors._ray import memory_backend
from coterie.runtime.config import MemorySettings, RuntimeSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.memory import MemoryClient, RecallHit
from tests.helpers import scripted, write_persona

pytestmark = pytest.mark.usefixtures("ray_session")

WRITE = {
    "name": "memory",
    "arguments": {
        "action": "write",
        "category": "travel",
        "content": "Booked the Lisbon flight TP-1234",
    },
}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("mem")
    write_persona(
        home,
        "writer",
        scripted(
            [
                {"when": {"turn": 1, "contains": "remember"}, "tool_calls": [WRITE]},
                {
                    "when": {"turn": 1, "contains": "recall"},
                    "tool_calls": [{"name": "recall", "arguments": {"query": "Lisbon flight"}}],
                },
                {"when": {"turn": 2}, "text": "{last_tool_result}"},
            ]
        ),
    )
    write_persona(
        home,
        "snoop",
        scripted(
            [
                {
                    "when": {"turn": 1},
                    "tool_calls": [{"name": "recall", "arguments": {"query": "Lisbon flight"}}],
                },
                {"when": {"turn": 2}, "text": "{last_tool_result}"},
            ]
        ),
    )
    settings = RuntimeSettings(
        idle_timeout=None, memory=MemorySettings(embedder="hashing", optimize_interval=0.5)
    )
    runtime = Runtime.start(home=home, settings=settings)
    yield runtime
    runtime.shutdown()


def test_persona_memory_round_trip_and_isolation(rt: Runtime) -> None:
    saved = rt.ask("writer", "remember my flight", conversation_id="writer:a")
    assert saved.status == "ok"
    found = rt.ask("writer", "recall it", conversation_id="writer:b")
    assert found.text.startswith("[memory ") and "TP-1234" in found.text
    # Another persona sees nothing of it.
    assert rt.ask("snoop", "anything?", conversation_id="snoop:a").text == "Nothing found."
    # Named: any process in the cluster can look it up and reach the same store.
    handle = ray.get_actor(memory_name(rt.id), namespace=rt.namespace)
    hits: list[RecallHit] = ray.get(handle.recall.remote("writer", query="Lisbon flight"))
    assert [h.content for h in hits] == ["Booked the Lisbon flight TP-1234"]
    assert ray.get(handle.stats.remote()).pid == ray.get(rt.memory.stats.remote()).pid


async def test_concurrent_writes_are_batched(rt: Runtime) -> None:
    import asyncio

    client = MemoryClient(memory_backend(rt.memory), "batcher")
    before = await rt.memory.stats.remote()
    rows = await asyncio.gather(
        *(client.write(category="log", content=f"entry {i}", importance=3) for i in range(40))
    )
    after = await rt.memory.stats.remote()
    assert len({r.id for r in rows}) == 40
    assert after.writes - before.writes == 40
    assert after.write_batches - before.write_batches < 10
    assert len(await client.recall(query="", limit=50)) == 40


async def test_bad_input_is_a_tool_error(rt: Runtime) -> None:
    client = MemoryClient(memory_backend(rt.memory), "writer")
    with pytest.raises(ToolError) as info:
        await client.update("no-such-id", content="x")
    assert info.value.kind == "not_found"
    with pytest.raises(ToolError) as info:
        await client.ingest(source="empty", text="   ")
    assert info.value.kind == "invalid_arguments"


async def test_background_maintenance_does_not_block_queries(rt: Runtime) -> None:
    import asyncio

    client = MemoryClient(memory_backend(rt.memory), "maint")
    # Earlier tests' writes may already have been optimised: count from here.
    start = (await rt.memory.stats.remote()).optimizations
    await asyncio.gather(
        *(client.write(category="c", content=f"note {i}", importance=5) for i in range(20))
    )
    optimize = rt.memory.optimize.remote()
    hits = await client.recall(query="note 7")
    await optimize
    # A query beside the optimize answers, and in full: the exact note first,
    # then the other notes up to the default limit of 8.
    assert len(hits) == 8 and hits[0].content == "note 7"
    assert all(h.content.startswith("note ") for h in hits)
    # Our optimize is one; the writes since the last maintenance pass make the
    # timer run another. Wait for it (bounded, so a dead timer fails the test).
    for _ in range(100):
        if (await rt.memory.stats.remote()).optimizations >= start + 2:
            break
        await asyncio.sleep(0.1)
    stats = await rt.memory.stats.remote()
    assert stats.optimizations >= start + 2, "no background optimize ran"
    assert stats.optimize_errors == 0


async def test_user_model_cached_per_persona(rt: Runtime) -> None:
    client = MemoryClient(memory_backend(rt.memory), "modeller")
    assert await client.user_model() == []
    row = await client.write_user_model(dimension="goals", content="Run a marathon", confidence=7)
    assert row.dimension == "goals"
    assert [r.content for r in await client.user_model()] == ["Run a marathon"]
    other = MemoryClient(memory_backend(rt.memory), "someone-else")
    assert await other.user_model() == []


async def test_the_status_names_the_memory_embedder(rt: Runtime) -> None:
    choice = await rt.memory.embedder_choice.remote()
    assert (choice.kind, choice.name, choice.configured) == ("hashing", "hashing-256", "hashing")
    memory = (await rt.status_async())["memory"]
    assert memory["embedder"] == choice.model_dump()
    assert memory["description"].startswith("hashing-256 (test embedder) — set in memory.embedder")
