"""Which search legs hybrid recall runs, and that leaving one out changes no ranking.

A plain query gives the full-text leg a fusion weight of 0, so recall
searches only the top ``limit + 1`` of the vector leg unless that ranking has
a tie the full-text leg could break (``store._text_leg_can_reorder``). These
tests compare every such recall with the full search of both legs (the
predicate forced to true) on stores full of ties — a tiny hashing embedder
puts many different words on the same vector — with exact kNN and through
the IVF index.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.memory import (
    HashingEmbedder,
    MemoryInput,
    MemoryStore,
    RecallHit,
    _lance,
    fusion,
)
from coterie.runtime.memory import store as store_module
from coterie.runtime.memory.store import CANDIDATES, _text_leg_can_reorder

WORDS = [
    "apple", "river", "stone", "cloud", "garden", "violin", "harbor", "lantern", "meadow",
    "copper", "thistle", "falcon", "ember", "willow", "quartz", "pebble", "orchard", "canyon",
    "glacier", "saffron",
]  # fmt: skip
#: Plain queries: no digit, capitals, snake_case or dotted names.
QUERIES = [
    "apple",
    "river stone",
    "garden violin harbor",
    "lantern",
    "copper falcon ember",
    "what about the meadow",
    "willow and quartz",
    "pebble orchard canyon glacier",
    "saffron",
    "thistle cloud",
]


def _fill(store: MemoryStore, seed: int) -> None:
    rng = random.Random(seed)
    contents = [" ".join(rng.sample(WORDS, rng.randint(1, 4))) for _ in range(220)]
    contents += contents[:15]  # exact duplicates: equal vectors and equal BM25
    store.write_memories(
        [MemoryInput("ada", rng.choice(["work", "home"]), text, 5) for text in contents]
    )
    store.write_memories([MemoryInput("bob", "work", text, 5) for text in contents[:40]])
    document = "\n\n".join(" ".join(rng.sample(WORDS, 6)) + "." for _ in range(60))
    store.ingest("ada", source="notes", text=document)


def _store(path: Path, dim: int) -> MemoryStore:
    # Small chunks: the document makes dozens of knowledge rows.
    store = MemoryStore(str(path), HashingEmbedder(dim=dim), chunk_size=120, chunk_overlap=0)
    _fill(store, seed=dim)
    return store


@pytest.fixture(params=[8, 64], ids=["dim8-many-ties", "dim64"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryStore:
    return _store(tmp_path / "db", request.param)


class Recorder:
    """The searches recall hands to LanceDB: (table, text or vector, rows) each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.searches: list[tuple[str, str, int]] = []
        submit = _lance.submit

        def recording(searches: Any) -> Any:
            for s in searches:
                leg = "text" if isinstance(s.query, str) else "vector"
                self.searches.append((s.table.name, leg, s.limit))
            return submit(searches)

        monkeypatch.setattr(_lance, "submit", recording)

    def take(self) -> list[tuple[str, str, int]]:
        out, self.searches = self.searches, []
        return out


def _cases() -> Iterator[dict[str, Any]]:
    for query in QUERIES:
        for limit in (1, 3, 8, 20, 50):
            yield {"query": query, "limit": limit}
        yield {"query": query, "limit": 5, "source": "memories"}
        yield {"query": query, "limit": 5, "source": "knowledge"}
        yield {"query": query, "limit": 5, "category": "work"}


def _all_of(hits: list[RecallHit]) -> list[dict[str, Any]]:
    # ``bm25`` is the full-text leg's own score: absent when it was not searched.
    return [hit.model_dump(exclude={"bm25"}) for hit in hits]


def _compare_with_full_search(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> list[list[tuple[str, str, int]]]:
    recorder = Recorder(monkeypatch)
    cases = list(_cases())
    assert all(fusion.text_weight(case["query"]) == 0.0 for case in cases)
    skipping, searched = [], []
    for case in cases:
        skipping.append(_all_of(store.recall("ada", **case)))
        searched.append(recorder.take())
    with monkeypatch.context() as m:
        m.setattr(store_module, "_text_leg_can_reorder", lambda distances, limit: True)
        full = [_all_of(store.recall("ada", **case)) for case in cases]
    for case, got, want in zip(cases, skipping, full, strict=True):
        assert got == want, case
    return searched


def test_skipping_the_text_leg_changes_no_ranking(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    searched = _compare_with_full_search(store, monkeypatch)
    legs = [{leg for _, leg, _ in searches} for searches in searched]
    # Both paths were taken: the vector leg alone, and both legs after a tie.
    assert {"vector"} in legs
    assert {"vector", "text"} in legs


def test_skipping_the_text_leg_changes_no_ranking_through_the_ivf_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_lance, "ANN_MIN_ROWS", 200)
    monkeypatch.setattr(_lance, "MIN_PARTITIONS", 2)
    monkeypatch.setattr(_lance, "ROWS_PER_PARTITION", 64)
    store = _store(tmp_path / "db", 16)
    store.optimize()
    assert _lance.has_vector_index(store._table("memories"))
    _compare_with_full_search(store, monkeypatch)
    for query in QUERIES:
        everything = _all_of(store.recall("ada", query=query, mode="vector", limit=50))
        for limit in (1, 4, 9):
            got = _all_of(store.recall("ada", query=query, mode="vector", limit=limit))
            assert got == everything[:limit], (query, limit)


def test_a_plain_query_searches_the_top_of_the_vector_leg_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore(str(tmp_path / "db"), HashingEmbedder(dim=256))
    # "apple" and n other words: a distance that grows with n (the best three
    # differ; further down, hash collisions make ties).
    store.write_memories(
        [
            MemoryInput("ada", "log", " ".join(["apple"] + [f"w{n}x{i}" for i in range(n)]), 5)
            for n in range(1, 20)
        ]
    )
    store.ingest("ada", source="notes", text="apple orchard, apple tree. " * 20)
    recorder = Recorder(monkeypatch)
    hits = store.recall("ada", query="apple", limit=2)
    assert len(hits) == 2
    assert recorder.take() == [("memories", "vector", 3), ("knowledge", "vector", 3)]
    store.recall("ada", query="apple", mode="vector", limit=3)
    assert recorder.take() == [("memories", "vector", 3), ("knowledge", "vector", 3)]
    # An identifier-like token gives the full-text leg weight: both legs, in full.
    store.recall("ada", query="APPLE", limit=3)
    assert sorted(recorder.take()) == sorted(
        (table, leg, CANDIDATES)
        for table in ("memories", "knowledge")
        for leg in ("text", "vector")
    )


def test_a_tie_at_the_cut_searches_both_legs_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fusion gives a memory only the full-text leg found the vector leg's
    lowest similarity, so after a tie the vector leg is searched in full too:
    the lowest of its first few rows would rank such a memory far too high."""
    embedder = HashingEmbedder(dim=8)
    by_vector: dict[tuple[float, ...], list[str]] = {}
    for letters in itertools.product("bcdfghklmnprstvz", repeat=3):
        word = "".join(letters)
        by_vector.setdefault(tuple(embedder.embed([word])[0]), []).append(word)
    same = next(words for words in by_vector.values() if len(words) >= 3)[:3]
    store = MemoryStore(str(tmp_path / "db"), embedder)
    far = " ".join(["apple river stone cloud garden violin harbor lantern"] * 3 + [same[0]])
    store.write_memories(
        [MemoryInput("ada", "log", text, 5) for text in [*same, far, *WORDS, *QUERIES]]
    )
    recorder = Recorder(monkeypatch)
    hits = store.recall("ada", query=same[0], source="memories", limit=2)
    # Three memories share the query's vector: a tie at the cut, which BM25
    # breaks; the far memory that names the word ranks by its own similarity.
    assert [hit.content for hit in hits] == [same[0], same[1]]
    assert recorder.take() == [
        ("memories", "vector", 3),
        ("memories", "text", CANDIDATES),
        ("memories", "vector", CANDIDATES),
    ]


def test_vector_mode_returns_the_top_of_the_longer_ranking(store: MemoryStore) -> None:
    for query in QUERIES:
        everything = _all_of(store.recall("ada", query=query, mode="vector", limit=50))
        for limit in (1, 2, 5, 9, 20):
            got = _all_of(store.recall("ada", query=query, mode="vector", limit=limit))
            assert got == everything[:limit], (query, limit)


def test_text_leg_can_reorder_agrees_with_the_fusion() -> None:
    """Whenever it says no, fusing in any BM25 scores leaves the top ``limit`` as is."""
    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        n = rng.randint(0, 14)
        # Few distinct values (those beyond 1 clamp to similarity 0): many ties.
        values = [rng.choice([*(i / 20 for i in range(1, 20)), 1.2, 1.5]) for _ in range(n)]
        distances = {("m", str(i)): d for i, d in enumerate(sorted(values))}
        keys = list(distances) + [("k", str(i)) for i in range(rng.randint(0, 4))]
        bm25 = {key: rng.choice([0.5, 1.0, 2.0, 3.0]) for key in keys if rng.random() < 0.6}
        limit = rng.randint(1, 10)
        can = _text_leg_can_reorder(distances, limit)
        seen[can] += 1
        if not can:
            assert (
                fusion.fuse(distances, bm25, text_weight=0.0)[:limit]
                == fusion.fuse(distances, {}, text_weight=0.0)[:limit]
            )
    assert min(seen.values()) > 300


def test_text_leg_can_reorder_cases() -> None:
    def d(*values: float) -> dict[tuple[str, str], float]:
        return {("m", str(i)): value for i, value in enumerate(values)}

    assert not _text_leg_can_reorder(d(0.1, 0.2, 0.3, 0.4), 2)
    assert _text_leg_can_reorder(d(0.1, 0.2, 0.2, 0.4), 2)  # a tie at the cut
    assert _text_leg_can_reorder(d(0.1, 0.1, 0.3, 0.4), 2)  # a tie inside the top
    assert not _text_leg_can_reorder(d(0.1, 0.2, 0.3, 0.3), 2)  # a tie below the cut
    assert _text_leg_can_reorder(d(0.1, 0.2), 2)  # the lowest makes the cut
    assert _text_leg_can_reorder({}, 1)
    assert _text_leg_can_reorder(d(0.1, 1.3, 1.6), 2)  # both similarities clamp to 0


def test_refine_factor_keeps_the_reranked_pool() -> None:
    def search(limit: int, rerank: int) -> _lance.Search:
        return _lance.Search(None, "q", None, [], limit, rerank=rerank)  # type: ignore[arg-type]

    assert search(9, CANDIDATES).refine_factor == 6  # 54 rows re-ranked, at least 50
    assert search(50, CANDIDATES).refine_factor == 1
    assert search(8, 0).refine_factor == 1
    assert search(51, CANDIDATES).refine_factor == 1
