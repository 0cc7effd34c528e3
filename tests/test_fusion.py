"""The hybrid-recall fusion on hand-made rankings (no LanceDB, no embedder)."""

from __future__ import annotations

import statistics
import time

import pytest

from coterie.runtime.memory import fusion
from coterie.runtime.memory.fusion import IDENTIFIER_TEXT_WEIGHT, fuse, has_identifier, text_weight


@pytest.mark.parametrize(
    "query",
    [
        "OPS-2291",
        "what happened with OPS-2219?",
        "exit code 137",
        "a41f9c2",
        "40P01",
        "MARLIN",
        "what is ENOSPC",
        "wombat_pricing",
        "payments.settled.v3",
        "FritzBox admin page",
        "flight on 12 May",
    ],
)
def test_identifier_like_queries(query: str) -> None:
    assert has_identifier(query)
    assert text_weight(query) == IDENTIFIER_TEXT_WEIGHT


@pytest.mark.parametrize(
    "query",
    [
        "Who is my doctor?",
        "What did I give my husband for Christmas?",
        "Priya Ramesh",  # names are left to the vector leg (see the module doc)
        "a year-three class check-up",
        "e.g. the usual coffee",
        "IT and HR",  # two capitals are an ordinary acronym, not a code
        "",
    ],
)
def test_plain_queries(query: str) -> None:
    assert not has_identifier(query)
    assert text_weight(query) == fusion.PLAIN_TEXT_WEIGHT == 0.0


def test_plain_weight_keeps_the_vector_order_and_lets_text_break_ties() -> None:
    distances = {"a": 0.2, "b": 0.3, "c": 0.3, "d": 0.6}
    bm25 = {"d": 2.0, "c": 1.0, "x": 5.0}  # x: found by full text only
    ranked = fuse(distances, bm25, text_weight=0.0)
    assert [key for key, _ in ranked] == ["a", "c", "b", "x", "d"]
    scores = dict(ranked)
    assert scores["a"] == pytest.approx(0.8)
    assert scores["b"] == scores["c"] == pytest.approx(0.7)
    # Missing from the vector leg: no better than its worst candidate, and
    # ahead of it only through the BM25 tie-break.
    assert scores["x"] == scores["d"] == pytest.approx(0.4)


def test_identifier_weight_lets_the_exact_match_win() -> None:
    # The vector leg blurs OPS-2291 and OPS-2219; BM25 has the exact number.
    distances = {"ops-2219": 0.40, "ops-2291": 0.42, "other": 0.50}
    bm25 = {"ops-2291": 8.0, "ops-2219": 3.0}
    ranked = fuse(distances, bm25, text_weight=0.75)
    assert [key for key, _ in ranked] == ["ops-2291", "ops-2219", "other"]
    scores = dict(ranked)
    assert scores["ops-2291"] == pytest.approx(0.25 * 0.58 + 0.75 * 1.0)
    assert scores["ops-2219"] == pytest.approx(0.25 * 0.60 + 0.75 * 3.0 / 8.0)
    assert scores["other"] == pytest.approx(0.25 * 0.50)


def test_the_vector_leg_orders_equal_text_matches() -> None:
    distances = {"far": 0.7, "near": 0.3}
    bm25 = {"far": 5.0, "near": 5.0}
    assert [key for key, _ in fuse(distances, bm25, text_weight=0.75)] == ["near", "far"]


def test_one_leg_alone_takes_all_the_weight() -> None:
    text_only = fuse({}, {"a": 2.0, "b": 8.0}, text_weight=0.0)
    assert text_only == [("b", 1.0), ("a", 0.25)]
    vector_only = fuse({"a": 0.1, "b": 0.5}, {}, text_weight=0.75)
    assert vector_only == [("a", pytest.approx(0.9)), ("b", pytest.approx(0.5))]
    assert fuse({}, {}, text_weight=0.5) == []


def test_scores_stay_between_zero_and_one() -> None:
    # Cosine distance runs to 2 (opposite vectors); similarity is clipped at 0.
    ranked = fuse({"a": 1.8, "b": 0.0}, {"a": 4.0}, text_weight=0.5)
    assert dict(ranked) == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}
    assert [key for key, _ in ranked] == ["a", "b"]  # equal: the BM25 match first
    assert all(0.0 <= score <= 1.0 for _, score in ranked)


def test_a_bad_weight_is_refused() -> None:
    with pytest.raises(ValueError):
        fuse({"a": 0.1}, {}, text_weight=1.5)


def test_fusion_is_far_under_a_millisecond() -> None:
    # Two tables x two legs x 50 candidates is the most recall fuses.
    distances = {("memories", str(i)): i / 200 for i in range(100)}
    bm25 = {("memories", str(i)): 10.0 - i / 20 for i in range(50, 150)}
    query = "what happened with OPS-2219 on db-prod-07?"
    timings = []
    for _ in range(50):
        start = time.perf_counter()
        fuse(distances, bm25, text_weight=text_weight(query))
        timings.append(time.perf_counter() - start)
    assert statistics.median(timings) < 0.001
