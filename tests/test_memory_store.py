"""MemoryStore over a temporary LanceDB directory, with the hashing embedder."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lancedb
import pytest
from aiohttp import web

from coterie.runtime.errors import ConfigError, MissingAPIKeyError, ModelHTTPError, ToolError
from coterie.runtime.memory import (
    HashingEmbedder,
    MemoryInput,
    MemoryStore,
    OpenAIEmbedder,
    build_embedder,
)
from tests.helpers import hashing_embeddings, serve_embeddings


class CountingEmbedder(HashingEmbedder):
    """Counts embed calls; raises once ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__(dim=64)
        self.calls: list[int] = []
        self.fail = False

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.fail:
            raise RuntimeError("embedding service down")
        self.calls.append(len(texts))
        return super().embed(texts)


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2025, 3, 10, 9, 0, tzinfo=UTC))


@pytest.fixture
def embedder() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture
def store(tmp_path: Path, embedder: CountingEmbedder, clock: Clock) -> MemoryStore:
    return MemoryStore(str(tmp_path / "db"), embedder, clock=clock)


def _kind(exc: pytest.ExceptionInfo[ToolError]) -> str:
    return exc.value.kind


# -- write / update / delete -------------------------------------------------


def test_write_and_recall_round_trip(store: MemoryStore) -> None:
    row = store.write_memory("ada", category="work", content="  Shipped the billing v2 API  ")
    assert row.content == "Shipped the billing v2 API"
    assert (row.importance, row.day) == (5, "2025-03-10")
    assert row.created_at.tzinfo is not None
    hits = store.recall("ada", query="billing API")
    assert [h.id for h in hits] == [row.id]
    hit = hits[0]
    assert hit.tag == f"[memory {row.id}]" == row.tag
    assert (hit.kind, hit.category, hit.importance, hit.day) == ("memory", "work", 5, row.day)
    assert hit.score is not None and hit.distance is not None and hit.bm25 is not None


def test_write_memories_is_one_embed_call_and_one_commit(
    store: MemoryStore, embedder: CountingEmbedder
) -> None:
    store.write_memory("ada", category="x", content="warm up")  # creates the table

    def version() -> int:
        # A fresh connection sees the latest commit of the table on disk.
        return int(lancedb.connect(store.uri).open_table("memories").version)

    before = version()
    embedder.calls.clear()
    items = [MemoryInput("ada", "log", f"entry number {i}", 1 + i % 10) for i in range(25)]
    items.append(MemoryInput("bob", "log", "bob's entry", 3))
    rows = store.write_memories(items)
    assert embedder.calls == [26]
    assert version() == before + 1
    assert len({r.id for r in rows}) == 26
    assert store.counts("ada")["memories"] == 26
    assert store.counts("bob")["memories"] == 1


def test_one_bad_item_writes_nothing(store: MemoryStore, embedder: CountingEmbedder) -> None:
    with pytest.raises(ToolError):
        store.write_memories([MemoryInput("ada", "log", "fine"), MemoryInput("ada", "log", " ")])
    assert embedder.calls == []
    assert store.counts()["memories"] == 0


def test_update_re_embeds_and_keeps_identity(store: MemoryStore) -> None:
    row = store.write_memory("ada", category="work", content="Met Grace about the parser")
    new = store.update_memory("ada", row.id, content="Met Linus about the kernel", importance=9)
    assert (new.id, new.created_at, new.category) == (row.id, row.created_at, "work")
    assert (new.content, new.importance) == ("Met Linus about the kernel", 9)
    # The vector changed too: a vector-only search ranks the new words.
    hits = store.recall("ada", query="Linus kernel", mode="vector")
    assert hits[0].id == row.id and hits[0].content == new.content
    assert hits[0].distance is not None and hits[0].distance < 0.5
    assert store.recall("ada", query="Grace parser", mode="fts") == []
    moved = store.update_memory("ada", row.id, content="Met Linus", category="people")
    assert (moved.category, moved.importance) == ("people", 9)
    assert store.counts()["memories"] == 1


def test_delete(store: MemoryStore) -> None:
    keep = store.write_memory("ada", category="a", content="keep me")
    gone = store.write_memory("ada", category="a", content="delete me")
    store.delete_memory("ada", gone.id)
    assert [h.id for h in store.recall("ada")] == [keep.id]
    with pytest.raises(ToolError) as exc:
        store.delete_memory("ada", gone.id)
    assert _kind(exc) == "not_found"


# -- recall ------------------------------------------------------------------


def test_hybrid_mixes_memories_and_knowledge(store: MemoryStore) -> None:
    mem = store.write_memory("ada", category="travel", content="Booked the Lisbon flight")
    budget = store.write_memory("ada", category="work", content="Reviewed the quarterly budget")
    store.ingest("ada", source="guide", text="Lisbon trams.\n\nLisbon food and pastries.")
    hits = store.recall("ada", query="Lisbon")
    # Everything ada has: both memories (the vector leg ranks every row) and
    # the one chunk of the short guide.
    tags = [h.tag for h in hits]
    assert sorted(tags) == sorted([mem.tag, budget.tag, "[knowledge guide#0]"])
    assert tags.index(mem.tag) < tags.index(budget.tag)  # the one that says Lisbon first
    knowledge = next(h for h in hits if h.kind == "knowledge")
    assert (knowledge.source, knowledge.chunk) == ("guide", 0)
    # Fused scores are sorted; both stores were searched together.
    assert [h.score for h in hits] == sorted((h.score or 0 for h in hits), reverse=True)


def test_source_filter(store: MemoryStore) -> None:
    store.write_memory("ada", category="travel", content="Lisbon flight booked")
    store.ingest("ada", source="guide", text="Lisbon guide")
    assert {h.kind for h in store.recall("ada", query="Lisbon", source="memories")} == {"memory"}
    assert {h.kind for h in store.recall("ada", query="Lisbon", source="knowledge")} == {
        "knowledge"
    }
    assert store.recall("ada", source="knowledge") == []  # empty query skips knowledge


def test_category_filter_is_a_prefilter(store: MemoryStore) -> None:
    # 80 "work" memories match the query better than the 3 "health" ones;
    # a post-filter on the top candidates would lose the health ones.
    store.write_memories(
        [MemoryInput("ada", "work", f"dentist dentist appointment work {i}") for i in range(80)]
    )
    health = store.write_memories(
        [MemoryInput("ada", "health", f"knee physio session {i} dentist") for i in range(3)]
    )
    store.ingest("ada", source="dentists", text="dentist list")
    hits = store.recall("ada", query="dentist", category="health", limit=50)
    assert {h.id for h in hits} == {r.id for r in health}
    assert store.recall("ada", query="dentist", category="nope") == []


@pytest.mark.parametrize("mode", ["hybrid", "vector", "fts"])
def test_modes(store: MemoryStore, mode: Any) -> None:
    row = store.write_memory("ada", category="work", content="Error E4417 in the ingest worker")
    store.write_memory("ada", category="work", content="Lunch with the design team")
    hits = store.recall("ada", query="E4417", mode=mode, limit=1)
    assert [h.id for h in hits] == [row.id]
    if mode == "fts":
        assert hits[0].distance is None and hits[0].bm25 is not None
    if mode == "vector":
        assert hits[0].bm25 is None and hits[0].distance is not None


def test_limit(store: MemoryStore) -> None:
    store.write_memories([MemoryInput("ada", "log", f"note {i} about cats") for i in range(30)])
    assert len(store.recall("ada", query="cats", limit=5)) == 5
    assert len(store.recall("ada", limit=20)) == 20


def test_date_lists_every_memory_of_that_day(store: MemoryStore, clock: Clock) -> None:
    first = store.write_memories([MemoryInput("ada", "log", f"day one {i}") for i in range(12)])
    clock.now += timedelta(days=1)
    second = store.write_memory("ada", category="log", content="day two")
    store.write_memory("bob", category="log", content="bob on day two")
    day_one = store.recall("ada", date="2025-03-10", query="ignored", limit=1, category="x")
    assert [h.id for h in day_one] == [r.id for r in first]  # all 12, oldest first
    assert [h.id for h in store.recall("ada", date="2025-03-11")] == [second.id]
    assert store.recall("ada", date="2025-03-12") == []


def test_empty_query_orders_by_importance_then_recency(store: MemoryStore) -> None:
    low = store.write_memory("ada", category="a", content="low", importance=2)
    high_old = store.write_memory("ada", category="a", content="high old", importance=9)
    mid = store.write_memory("ada", category="b", content="mid", importance=5)
    high_new = store.write_memory("ada", category="a", content="high new", importance=9)
    store.ingest("ada", source="doc", text="knowledge is skipped")
    assert [h.id for h in store.recall("ada")] == [high_new.id, high_old.id, mid.id, low.id]
    assert [h.id for h in store.recall("ada", category="a", limit=2)] == [
        high_new.id,
        high_old.id,
    ]
    blank = store.recall("ada", query="   ")  # a blank query is an empty one
    assert [h.id for h in blank] == [high_new.id, high_old.id, mid.id, low.id]
    assert all(h.score is None for h in blank)


# -- isolation ---------------------------------------------------------------


def test_personas_are_isolated(store: MemoryStore) -> None:
    ada = store.write_memory("ada", category="secret", content="ada's launch code ZX81")
    bob = store.write_memories(
        [MemoryInput("bob", "secret", f"bob's launch code ZX81 copy {i}") for i in range(60)]
    )
    hits = store.recall("ada", query="launch code ZX81", limit=50)
    assert [h.id for h in hits] == [ada.id]  # prefiltered: bob's 60 never crowd ada out
    assert [h.id for h in store.recall("ada", query="ZX81", mode="fts")] == [ada.id]
    # Bob's 60 all match: his recall is full (the limit), and only his rows.
    bob_hits = store.recall("bob", query="ZX81", limit=50)
    assert len(bob_hits) == 50 and len({h.id for h in bob_hits}) == 50
    assert {h.id for h in bob_hits} <= {r.id for r in bob}
    assert all(h.content.startswith("bob's launch code") for h in bob_hits)
    assert store.recall("carol", query="ZX81") == []
    # Another persona's id is indistinguishable from an unknown one.
    for call in (
        lambda: store.update_memory("bob", ada.id, content="stolen"),
        lambda: store.delete_memory("bob", ada.id),
    ):
        with pytest.raises(ToolError) as exc:
            call()
        assert _kind(exc) == "not_found"
        assert ada.id in exc.value.detail
    assert [h.content for h in store.recall("ada", date=ada.day)] == [ada.content]


def test_knowledge_and_user_model_are_isolated(store: MemoryStore) -> None:
    store.ingest("ada", source="handbook", text="ada's handbook about onboarding")
    store.ingest("bob", source="handbook", text="bob's handbook about onboarding")
    result = store.ingest("bob", source="handbook", text="bob's second edition")
    assert result.replaced == 1
    [ada_chunk] = store.recall("ada", query="handbook", source="knowledge")
    assert ada_chunk.content.startswith("ada's")
    store.write_user_model("ada", dimension="baseline", content="Ada, London")
    store.write_user_model("bob", dimension="baseline", content="Bob, Oslo")
    assert [r.content for r in store.user_model("ada")] == ["Ada, London"]
    assert [r.content for r in store.user_model("bob")] == ["Bob, Oslo"]
    assert store.counts("ada") == {"memories": 0, "knowledge": 1, "user_model": 1}


def test_filter_values_are_escaped(store: MemoryStore) -> None:
    tricky = 'o\'brien \\ "quoted" ) OR 1=1 --'
    row = store.write_memory(tricky, category="it's", content="apostrophes everywhere")
    store.write_memory("other", category="it's", content="apostrophes elsewhere")
    assert [h.id for h in store.recall(tricky, query="apostrophes", category="it's")] == [row.id]
    assert store.recall("x' OR '1'='1", query="apostrophes") == []
    assert store.recall(tricky, query="apostrophes", category="x' OR '1'='1") == []
    assert store.counts(tricky)["memories"] == 1
    store.delete_memory(tricky, row.id)
    assert store.counts()["memories"] == 1


# -- knowledge ---------------------------------------------------------------


def test_ingest_chunks_and_replaces(tmp_path: Path, embedder: CountingEmbedder) -> None:
    store = MemoryStore(str(tmp_path / "db"), embedder, chunk_size=200, chunk_overlap=40)
    text = "\n\n".join(f"Section {i}. " + "Body text sentence. " * 6 for i in range(10))
    embedder.calls.clear()
    first = store.ingest("ada", source="manual", text=text)
    # Ten 130-character sections; two never fit in 200, so one chunk each.
    assert (first.chunks, first.replaced) == (10, 0)
    assert embedder.calls == [first.chunks]  # one batched call
    second = store.ingest("ada", source="manual", text="Short replacement about gizmos.")
    assert (second.chunks, second.replaced) == (1, first.chunks)
    hits = store.recall("ada", query="Section Body gizmos", source="knowledge", limit=50)
    assert [h.tag for h in hits] == ["[knowledge manual#0]"]
    assert store.counts()["knowledge"] == 1


def test_failed_ingest_keeps_the_old_chunks(store: MemoryStore, embedder: CountingEmbedder) -> None:
    store.ingest("ada", source="spec", text="Version one of the widget spec.")
    embedder.fail = True
    with pytest.raises(RuntimeError):
        store.ingest("ada", source="spec", text="Version two of the widget spec.")
    embedder.fail = False
    [hit] = store.recall("ada", query="widget spec", source="knowledge")
    assert hit.content == "Version one of the widget spec."


def test_ingest_errors(tmp_path: Path, embedder: CountingEmbedder) -> None:
    store = MemoryStore(str(tmp_path / "db"), embedder, chunk_size=100, chunk_overlap=0)
    for kwargs, kind in [
        ({"source": "s", "text": "  \n "}, "invalid_arguments"),
        ({"source": " ", "text": "text"}, "invalid_arguments"),
        ({"source": "s", "text": "\n\n".join(["paragraph " * 9] * 2001)}, "too_large"),
    ]:
        with pytest.raises(ToolError) as exc:
            store.ingest("ada", **kwargs)
        assert _kind(exc) == kind
    assert embedder.calls == []


# -- user model --------------------------------------------------------------


def test_user_model_upsert(store: MemoryStore) -> None:
    store.write_user_model("ada", dimension="goals", content="learn Rust")
    store.write_user_model("ada", dimension="hobbies", content="climbing", confidence=3)
    store.write_user_model("ada", dimension="baseline", content="Ada, 36, London")
    saved = store.write_user_model("ada", dimension=" Goals ", content="ship v2", confidence=9)
    assert (saved.dimension, saved.content, saved.confidence) == ("goals", "ship v2", 9)
    rows = store.user_model("ada")
    assert [(r.dimension, r.content) for r in rows] == [
        ("baseline", "Ada, 36, London"),
        ("goals", "ship v2"),
        ("hobbies", "climbing"),
    ]
    assert store.counts()["user_model"] == 3


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "kind"),
    [
        ({"content": ""}, "invalid_arguments"),
        ({"content": "   "}, "invalid_arguments"),
        ({"content": "x" * 20_001}, "too_large"),
        ({"content": "ok", "importance": 0}, "invalid_arguments"),
        ({"content": "ok", "importance": 11}, "invalid_arguments"),
        ({"content": "ok", "importance": True}, "invalid_arguments"),
        ({"content": "ok", "importance": "5"}, "invalid_arguments"),
        ({"content": "ok", "category": ""}, "invalid_arguments"),
        ({"content": "ok", "category": "c" * 65}, "invalid_arguments"),
    ],
)
def test_bad_memory_input(store: MemoryStore, kwargs: dict[str, Any], kind: str) -> None:
    args = {"category": "log", **kwargs}
    with pytest.raises(ToolError) as exc:
        store.write_memory("ada", **args)
    assert _kind(exc) == kind


def test_bad_ids_and_recall_arguments(store: MemoryStore) -> None:
    row = store.write_memory("ada", category="log", content="something")
    cases: list[tuple[Any, str]] = [
        (lambda: store.update_memory("ada", "no-such-id", content="x"), "not_found"),
        (lambda: store.delete_memory("ada", "00000000-0000-0000-0000-000000000000"), "not_found"),
        (lambda: store.update_memory("ada", "", content="x"), "invalid_arguments"),
        (lambda: store.update_memory("ada", row.id, content=" "), "invalid_arguments"),
        (
            lambda: store.update_memory("ada", row.id, content="x", importance=42),
            "invalid_arguments",
        ),
        (lambda: store.recall("ada", query="x", limit=0), "invalid_arguments"),
        (lambda: store.recall("ada", query="x", limit=51), "invalid_arguments"),
        (lambda: store.recall("ada", query="x", source="web"), "invalid_arguments"),  # type: ignore[arg-type]
        (lambda: store.recall("ada", date="10/03/2025"), "invalid_arguments"),
        (lambda: store.recall("ada", date="2025-02-30"), "invalid_arguments"),
        (lambda: store.write_user_model("ada", dimension="", content="x"), "invalid_arguments"),
        (lambda: store.write_user_model("ada", dimension="d", content="x", confidence=0), ""),
    ]
    for call, kind in cases:
        with pytest.raises(ToolError) as exc:
            call()
        assert _kind(exc) == (kind or "invalid_arguments")
    with pytest.raises(ValueError):
        store.write_memory("", category="log", content="no persona")
    assert [h.id for h in store.recall("ada", date=" 2025-03-10 ")] == [row.id]


# -- freshness, maintenance, storage ------------------------------------------


def test_rows_written_after_the_fts_index_are_found(store: MemoryStore) -> None:
    store.write_memories([MemoryInput("ada", "log", f"routine entry {i}") for i in range(20)])
    store.optimize()
    assert store.fts_unindexed() == {"memories": 0, "knowledge": 0}
    late = store.write_memory("ada", category="log", content="the quokka escaped")
    store.ingest("ada", source="zoo", text="Quokka enclosure rules")
    # These rows are not in the index yet: search scans them unindexed.
    assert store.fts_unindexed() == {"memories": 1, "knowledge": 1}
    hits = store.recall("ada", query="quokka", mode="fts")
    assert {h.tag for h in hits} == {late.tag, "[knowledge zoo#0]"}
    # An update rewrites the row: the new words are found, the old ones not.
    store.update_memory("ada", late.id, content="the wombat escaped")
    assert [h.id for h in store.recall("ada", query="wombat", mode="fts")] == [late.id]
    assert store.recall("ada", query="quokka", mode="fts", source="memories") == []
    store.optimize()
    assert store.fts_unindexed() == {"memories": 0, "knowledge": 0}
    assert [h.id for h in store.recall("ada", query="wombat", mode="fts")] == [late.id]


def test_optimize_beside_reads_and_writes(store: MemoryStore) -> None:
    store.write_memories([MemoryInput("ada", "log", f"seed {i} lantern") for i in range(50)])
    stop = threading.Event()
    errors: list[BaseException] = []

    runs: list[dict[str, bool]] = []

    def optimizer() -> None:
        try:
            while not stop.is_set():
                runs.append(store.optimize())
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    thread = threading.Thread(target=optimizer)
    thread.start()
    try:
        for i in range(15):
            row = store.write_memory("ada", category="log", content=f"lantern {i}")
            assert row.id in {h.id for h in store.recall("ada", query=f"lantern {i}", limit=50)}
            store.update_memory("ada", row.id, content=f"lamp {i}")
            store.ingest("ada", source="doc", text=f"lantern manual rev {i}")
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert runs  # at least one pass ran; contended ones report False, not raise
    assert store.optimize() == {"memories": True, "knowledge": True, "user_model": True}
    assert store.counts() == {"memories": 65, "knowledge": 1, "user_model": 0}


def test_other_embedder_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    MemoryStore(uri, HashingEmbedder(dim=32)).write_memory("a", category="c", content="x")
    with pytest.raises(ConfigError, match="hashing-32"):
        MemoryStore(uri, HashingEmbedder(dim=16)).recall("a", query="x")


def test_read_consistency_sees_other_handles(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    writer = MemoryStore(uri, HashingEmbedder())
    reader = MemoryStore(uri, HashingEmbedder(), read_consistency_interval=0)
    writer.write_memory("ada", category="c", content="first")
    assert reader.counts("ada")["memories"] == 1
    writer.write_memory("ada", category="c", content="second")
    assert reader.counts("ada")["memories"] == 2


# -- embedders ---------------------------------------------------------------


def test_hashing_embedder_is_deterministic_and_normalised() -> None:
    emb = build_embedder("hashing", dim=32)
    a, b, empty = emb.embed(["Hello world", "hello, WORLD!", "..."])
    assert a == b
    assert abs(sum(x * x for x in a) - 1.0) < 1e-9
    assert sum(x * x for x in empty) == 1.0
    with pytest.raises(ConfigError):
        build_embedder("nope")  # type: ignore[arg-type]


@pytest.fixture
def fake_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TEST_EMBED_KEY", "sk-test")
    yield


async def test_openai_embedder_against_local_server(fake_key: None) -> None:
    requests: list[dict[str, Any]] = []

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append({"auth": request.headers.get("Authorization"), **body})
        # Answer out of order: the client must sort by index.
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(text)), float(i), 1.0]}
            for i, text in enumerate(body["input"])
        ]
        return web.json_response(
            {
                "object": "list",
                "data": data[::-1],
                "model": body["model"],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        )

    runner, base_url = await serve_embeddings(embeddings)
    try:
        emb = OpenAIEmbedder(
            "local-embed", base_url=base_url, api_key_env="TEST_EMBED_KEY", dim=3, batch_size=2
        )
        assert (emb.name, emb.dim) == ("openai:local-embed", 3)
        vectors = await asyncio.to_thread(emb.embed, ["a", "bb", "ccc"])
        assert vectors == [[1.0, 0.0, 1.0], [2.0, 1.0, 1.0], [3.0, 0.0, 1.0]]
        assert [r["input"] for r in requests] == [["a", "bb"], ["ccc"]]
        assert requests[0]["auth"] == "Bearer sk-test"
        assert requests[0]["encoding_format"] == "float"
        assert "dimensions" not in requests[0]
        v3 = OpenAIEmbedder(
            "text-embedding-3-small", base_url=base_url, api_key_env="TEST_EMBED_KEY", dim=3
        )
        await asyncio.to_thread(v3.embed, ["x"])
        assert requests[-1]["dimensions"] == 3
        wrong = OpenAIEmbedder("m", base_url=base_url, api_key_env="TEST_EMBED_KEY", dim=4)
        with pytest.raises(Exception, match="expected 4"):
            await asyncio.to_thread(wrong.embed, ["x"])
    finally:
        await runner.cleanup()


async def test_openai_embedder_http_error(fake_key: None) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad model"}}, status=400)

    runner, base_url = await serve_embeddings(refuse)
    try:
        emb = OpenAIEmbedder("m", base_url=base_url, api_key_env="TEST_EMBED_KEY", dim=3)
        with pytest.raises(ModelHTTPError) as exc:
            await asyncio.to_thread(emb.embed, ["x"])
        assert exc.value.status == 400 and "bad model" in str(exc.value)
    finally:
        await runner.cleanup()


def test_openai_embedder_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError, match="NO_SUCH_KEY"):
        OpenAIEmbedder("text-embedding-3-small", api_key_env="NO_SUCH_KEY")


async def test_openai_embedder_in_a_store(tmp_path: Path, fake_key: None) -> None:
    """The store over the real OpenAIEmbedder, served hashing vectors locally."""
    inputs: list[list[str]] = []
    runner, base_url = await serve_embeddings(hashing_embeddings(inputs))
    try:
        emb = OpenAIEmbedder(
            "text-embedding-3-small", base_url=base_url, api_key_env="TEST_EMBED_KEY", dim=48
        )
        store = MemoryStore(str(tmp_path / "db"), emb)
        row = await asyncio.to_thread(
            store.write_memory, "ada", category="c", content="served vectors"
        )
        other = await asyncio.to_thread(
            store.write_memory, "ada", category="c", content="something unrelated"
        )
        hits = await asyncio.to_thread(store.recall, "ada", query="served", mode="vector")
        assert [h.id for h in hits] == [row.id, other.id]
        assert hits[0].distance is not None and hits[0].distance < 0.5
        # Each write embedded its content, the query was embedded on its own.
        assert inputs == [["served vectors"], ["something unrelated"], ["served"]]
    finally:
        await runner.cleanup()
