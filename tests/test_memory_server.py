"""MemoryServer and MemoryClient without Ray, over a real LanceDB directory.

The server is what the MemoryStore actor runs; the client is what a persona's
tools talk to (tests/test_memory_actor.py covers the actor wiring).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime.config import MemorySettings
from runtime.errors import ToolError
from runtime.memory import (
    HashingEmbedder,
    LazyEmbedder,
    MemoryClient,
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
        assert stats.embedder == "hashing" and stats.rows == {
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
    assert (lazy.name, lazy.dim, lazy.loaded) == ("hashing", 256, False)
    [vector] = lazy.embed(["hello world"])
    assert len(vector) == 256 and lazy.loaded


def test_embedder_process_env_comes_from_settings() -> None:
    assert embedder_process_env(MemorySettings()) == {"OMP_NUM_THREADS": "1"}
    assert embedder_process_env(MemorySettings(embed_threads=3)) == {"OMP_NUM_THREADS": "3"}
    assert embedder_process_env(MemorySettings(embed_threads=None)) == {}
    assert embedder_process_env(MemorySettings(embedder="hashing")) == {}
