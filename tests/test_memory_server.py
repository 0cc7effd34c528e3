"""MemoryServer and MemoryClient without Ray, over a real LanceDB directory.

The server is what the MemoryStore actor runs; the client is what a persona's
tools talk to (tests/test_memory_actor.py covers the actor wiring).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from coterie.runtime.config import MemorySettings
from coterie.runtime.errors import ConfigError, ToolError
from coterie.runtime.memory import (
    Embedder,
    HashingEmbedder,
    LazyEmbedder,
    MemoryClient,
    MemoryInput,
    MemoryRow,
    MemoryServer,
    MemoryStore,
    embedder_process_env,
)


class FlakyStore(MemoryStore):
    """A store whose first optimize() fails, as a full disk would."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.optimize_calls = 0

    def optimize(self, *, attempts: int = 3) -> dict[str, bool]:
        self.optimize_calls += 1
        if self.optimize_calls == 1:
            raise OSError("no space left on device")
        return super().optimize(attempts=attempts)


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(str(tmp_path / "memory"), HashingEmbedder(dim=64))


@pytest.fixture
async def server(store: MemoryStore) -> AsyncIterator[MemoryServer]:
    srv = MemoryServer.serving(store)
    yield srv
    await srv.aclose()


async def test_concurrent_writes_share_batches(server: MemoryServer) -> None:
    client = MemoryClient(server, "ana")
    rows = await asyncio.gather(
        *(client.write(category="log", content=f"entry {i}", importance=3) for i in range(40))
    )
    assert len({r.id for r in rows}) == 40 and all(r.persona == "ana" for r in rows)
    stats = await server.stats()
    assert stats.writes == 40
    assert stats.write_batches < 10  # coalesced, not one commit each
    assert len(await client.recall(limit=50)) == 40


async def test_one_bad_write_does_not_fail_its_batch(server: MemoryServer) -> None:
    client = MemoryClient(server, "ana")
    results = await asyncio.gather(
        client.write(category="ok", content="first", importance=3),
        client.write(category="ok", content="bad", importance=42),
        client.write(category="ok", content="third", importance=3),
        return_exceptions=True,
    )
    first, bad, third = results
    assert isinstance(bad, ToolError) and bad.kind == "invalid_arguments"
    assert "importance" in bad.detail
    assert not isinstance(first, BaseException) and first.content == "first"
    assert not isinstance(third, BaseException) and third.content == "third"
    assert sorted(h.content for h in await client.recall()) == ["first", "third"]


async def test_clients_are_bound_to_their_persona(server: MemoryServer) -> None:
    ana, bo = MemoryClient(server, "ana"), MemoryClient(server, "bo")
    row = await ana.write(category="c", content="ana's secret plan", importance=9)
    assert await bo.recall(query="secret plan") == []
    with pytest.raises(ToolError) as err:
        await bo.delete(row.id)
    assert err.value.kind == "not_found"
    assert [h.id for h in await ana.recall(query="secret plan")] == [row.id]


async def test_the_client_passes_the_recall_mode_through(server: MemoryServer) -> None:
    client = MemoryClient(server, "ana")
    row = await client.write(category="c", content="tea at four with Grace", importance=5)
    # No word of the query is in the memory: the full-text leg alone finds
    # nothing, while the vector leg (and so hybrid) still returns the nearest.
    assert [h.id for h in await client.recall(query="quokka", mode="vector")] == [row.id]
    assert await client.recall(query="quokka", mode="fts") == []
    assert [h.id for h in await client.recall(query="Grace", mode="fts")] == [row.id]


async def test_user_model_cache_keeps_prompt_order_after_writes(server: MemoryServer) -> None:
    client = MemoryClient(server, "ana")
    await client.write_user_model(dimension="zodiac", content="virgo", confidence=2)
    assert [r.dimension for r in await client.user_model()] == ["zodiac"]  # now cached
    await client.write_user_model(dimension="feedback", content="terse", confidence=8)
    await client.write_user_model(dimension="preferences", content="tea", confidence=6)
    cached = [r.dimension for r in await client.user_model()]
    fresh = [r.dimension for r in await MemoryClient(server, "ana").user_model()]
    # Recommended dimensions first, in their own order (not by name), as the
    # store — and so the system prompt — lists them.
    assert cached == fresh == ["preferences", "feedback", "zodiac"]


async def test_maintenance_survives_a_failed_run(tmp_path: Path) -> None:
    store = FlakyStore(str(tmp_path / "flaky"), HashingEmbedder(dim=64))
    server = MemoryServer.serving(store, MemorySettings(optimize_interval=0.05))
    try:
        client = MemoryClient(server, "ana")
        await client.write(category="c", content="one", importance=5)
        deadline = asyncio.get_running_loop().time() + 10
        while (await server.stats()).optimizations < 1:
            assert asyncio.get_running_loop().time() < deadline, "maintenance stopped"
            await asyncio.sleep(0.05)
            if store.optimize_calls == 1:
                # Something new to fold in, so the next run has work to do.
                await client.write(category="c", content="two", importance=5)
        stats = await server.stats()
        assert stats.optimize_errors == 1 and stats.optimizations >= 1
    finally:
        await server.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await server.stats()


async def test_store_opens_lazily_with_the_settings_embedder(tmp_path: Path) -> None:
    settings = MemorySettings(embedder="hashing")
    server = MemoryServer(str(tmp_path / "lazy"), settings)
    try:
        stats = await server.stats()
        assert stats.embedder == "hashing-256" and stats.rows == {
            "memories": 0,
            "knowledge": 0,
            "user_model": 0,
        }
        row = await MemoryClient(server, "ana").write(category="c", content="x", importance=1)
        assert row.content == "x"
    finally:
        await server.aclose()


def test_lazy_embedder_builds_on_first_text_only() -> None:
    lazy = LazyEmbedder(MemorySettings(embedder="hashing"))
    # Named as the real embedder is, without building it.
    assert (lazy.name, lazy.dim, lazy.loaded) == (HashingEmbedder().name, 256, False)
    [vector] = lazy.embed(["hello world"])
    assert len(vector) == 256 and lazy.loaded


def test_embedder_process_env_comes_from_settings() -> None:
    assert embedder_process_env(MemorySettings()) == {"OMP_NUM_THREADS": "1"}
    assert embedder_process_env(MemorySettings(embed_threads=3)) == {"OMP_NUM_THREADS": "3"}
    assert embedder_process_env(MemorySettings(embed_threads=None)) == {}
    assert embedder_process_env(MemorySettings(embedder="hashing")) == {}
    assert embedder_process_env(MemorySettings(embedder="none")) == {}
    # auto runs the local model whenever it is installed: its process is set up for it.
    assert embedder_process_env(MemorySettings(embedder="auto")) == {"OMP_NUM_THREADS": "1"}


class GatedStore(MemoryStore):
    """A store whose batch writes wait for ``gate`` (to cancel a caller mid-write)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.started = threading.Event()

    def write_memories(self, items: Sequence[MemoryInput]) -> list[MemoryRow]:
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        return super().write_memories(items)


async def test_a_caller_that_stops_waiting_mid_batch_does_not_stall_the_others(
    tmp_path: Path,
) -> None:
    store = GatedStore(str(tmp_path / "gated"), HashingEmbedder(dim=64))
    server = MemoryServer.serving(store)
    try:
        client = MemoryClient(server, "ana")
        writes = [
            asyncio.ensure_future(client.write(category="c", content=f"m{i}", importance=3))
            for i in range(3)
        ]
        await asyncio.to_thread(store.started.wait, 10)  # the batch is being written
        writes[0].cancel()  # its caller gives up
        store.gate.set()
        rows = await asyncio.wait_for(asyncio.gather(*writes[1:]), 10)
        assert [r.content for r in rows] == ["m1", "m2"]
        assert writes[0].cancelled()
        # The server goes on serving.
        later = await asyncio.wait_for(client.write(category="c", content="m3", importance=3), 10)
        assert later.content == "m3"
    finally:
        await server.aclose()


async def test_a_write_given_up_before_its_batch_is_not_written(server: MemoryServer) -> None:
    client = MemoryClient(server, "ana")
    gone = asyncio.ensure_future(client.write(category="c", content="never", importance=3))
    kept = asyncio.ensure_future(client.write(category="c", content="kept", importance=3))
    await asyncio.sleep(0)  # both queued, the batch window not over yet
    gone.cancel()
    assert (await kept).content == "kept"
    assert [h.content for h in await client.recall(limit=10)] == ["kept"]


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("lazy", "direct"),  # written through the actor's embedder, opened directly
        ("direct", "lazy"),
        ("legacy", "direct"),  # a store an earlier version wrote as "hashing"
        ("legacy", "lazy"),
    ],
)
def test_a_store_opens_with_either_kind_of_embedder(tmp_path: Path, first: str, then: str) -> None:
    class Legacy(HashingEmbedder):
        name = "hashing"

    def make(kind: str) -> Embedder:
        if kind == "lazy":
            return LazyEmbedder(MemorySettings(embedder="hashing"))
        return Legacy() if kind == "legacy" else HashingEmbedder()

    uri = str(tmp_path / "shared")
    MemoryStore(uri, make(first)).write_memory("ana", category="c", content="the valve")
    hits = MemoryStore(uri, make(then)).recall("ana", query="valve")
    assert [h.content for h in hits] == ["the valve"]


def test_a_store_of_another_model_is_still_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "other")
    MemoryStore(uri, HashingEmbedder()).write_memory("ana", category="c", content="x")
    with pytest.raises(ConfigError, match="from 'hashing-256'"):
        MemoryStore(uri, LazyEmbedder(MemorySettings(embedder="minilm"))).recall("ana", query="x")
