"""Retrieval quality of recall with the real all-MiniLM-L6-v2 embedder.

Loads the bundled model once for the module (several seconds on CPU) and runs
the sets of :mod:`tests.recall.recall_sets` — paraphrased questions, exact
terms, and the older mixed benchmark of :mod:`tests.recall.recall_eval` —
through every mode. Run with ``-s`` to see the table of recall@1/3/5 and MRR.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coterie.runtime.memory import Embedder, MemoryStore
from coterie.runtime.memory import store as store_module
from tests.recall import recall_eval, recall_sets
from tests.recall.recall_sets import EXACT, MIXED, PARAPHRASE, Metrics, RecallSet

#: How far below the better leg hybrid may fall, per set and metric.
TOLERANCE = 0.02
METRICS = ("recall@1", "recall@3", "recall@5", "MRR")


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    from coterie.runtime.memory import MiniLMEmbedder

    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def store_factory(
    minilm: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], MemoryStore]:
    counter = itertools.count()

    def factory() -> MemoryStore:
        path: Path = tmp_path_factory.mktemp("recall") / f"db{next(counter)}"
        return MemoryStore(str(path), minilm)

    return factory


@pytest.fixture(scope="module")
def table(store_factory: Callable[[], MemoryStore]) -> dict[str, dict[str, Metrics]]:
    results = {s.name: recall_sets.evaluate(store_factory, s) for s in (PARAPHRASE, EXACT, MIXED)}
    print("\n" + recall_sets.format_table(results))
    return results


@pytest.fixture(scope="module")
def results(store_factory: Callable[[], MemoryStore]) -> dict[str, dict[str, float]]:
    by_kind = recall_eval.evaluate_by_kind(store_factory, k=5)
    print()
    for mode, scores in by_kind.items():
        detail = "  ".join(f"{kind}={value:.3f}" for kind, value in sorted(scores.items()))
        print(f"recall@5 {mode:>6}: {detail}")
    return by_kind


def test_minilm_embeddings(minilm: Embedder) -> None:
    a, b, c = minilm.embed(["a cat sat on the mat", "a kitten rested on a rug", "tax law"])
    assert len(a) == minilm.dim == 384
    assert abs(sum(x * x for x in a) - 1.0) < 1e-4

    def cosine(u: list[float], v: list[float]) -> float:
        return sum(x * y for x, y in zip(u, v, strict=True))

    assert cosine(a, b) > cosine(a, c)


# -- hybrid against its legs ---------------------------------------------------


def _shortfalls(by_mode: dict[str, Metrics]) -> dict[str, float]:
    """Per metric, how far hybrid is below the better leg (negative: below)."""
    hybrid = by_mode["hybrid"].as_dict()
    vector, fts = by_mode["vector"].as_dict(), by_mode["fts"].as_dict()
    return {name: hybrid[name] - max(vector[name], fts[name]) for name in METRICS}


@pytest.mark.parametrize("set_name", [PARAPHRASE.name, EXACT.name])
def test_hybrid_keeps_up_with_the_better_leg(
    table: dict[str, dict[str, Metrics]], set_name: str
) -> None:
    shortfalls = _shortfalls(table[set_name])
    failing = {name: round(gap, 3) for name, gap in shortfalls.items() if gap < -TOLERANCE}
    assert not failing, f"{set_name}: hybrid below the better leg by {failing}"


def test_hybrid_keeps_up_on_the_older_mixed_set(table: dict[str, dict[str, Metrics]]) -> None:
    # Not tuned on: the fusion's weights were chosen on the two sets above.
    shortfalls = _shortfalls(table[MIXED.name])
    assert min(shortfalls.values()) >= -TOLERANCE, shortfalls


def test_reciprocal_rank_fusion_fails_the_bar(
    store_factory: Callable[[], MemoryStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bar can fail: the RRF this fusion replaced falls short on paraphrases."""

    def rrf(distances: dict[object, float], bm25: dict[object, float], *, text_weight: float):
        del text_weight
        scores: dict[object, float] = {}
        for leg in (distances, sorted(bm25, key=lambda key: -bm25[key])):
            for rank, key in enumerate(leg, start=1):
                scores[key] = scores.get(key, 0.0) + 1.0 / (60 + rank)
        return sorted(scores.items(), key=lambda item: -item[1])

    monkeypatch.setattr(store_module.fusion, "fuse", rrf)
    # RRF weighs the full-text leg on every query, so recall must search it on every query.
    monkeypatch.setattr(store_module.fusion, "text_weight", lambda query: 1.0)
    by_mode = recall_sets.evaluate(store_factory, PARAPHRASE)
    print("\nparaphrase with RRF k=60: " + str(by_mode["hybrid"].as_dict()))
    assert min(_shortfalls(by_mode).values()) < -TOLERANCE


def test_hybrid_is_at_least_as_good_as_either_leg(results: dict[str, dict[str, float]]) -> None:
    overall = {mode: scores["all"] for mode, scores in results.items()}
    assert overall["hybrid"] >= overall["vector"], overall
    assert overall["hybrid"] >= overall["fts"], overall


def test_each_leg_does_its_job(
    results: dict[str, dict[str, float]], table: dict[str, dict[str, Metrics]]
) -> None:
    # Exact rare terms are what BM25 is for; paraphrases are what vectors are for.
    assert results["fts"]["lexical"] >= results["vector"]["lexical"]
    assert results["vector"]["semantic"] > results["fts"]["semantic"]
    assert table["exact"]["fts"].mrr > table["exact"]["vector"].mrr
    assert table["paraphrase"]["vector"].mrr > table["paraphrase"]["fts"].mrr


# -- the sets themselves -------------------------------------------------------


@pytest.mark.parametrize("recall_set", [PARAPHRASE, EXACT], ids=lambda s: s.name)
def test_set_sizes_and_distractors(recall_set: RecallSet) -> None:
    assert len(recall_set.queries) >= 40
    assert len(recall_set.memories) >= 100
    answers = {key for query in recall_set.queries for key in query.relevant}
    assert len(recall_set.memories) - len(answers) >= 50  # memories that answer nothing
    assert len({q.text for q in recall_set.queries}) == len(recall_set.queries)
    contents = [content for _, content, _ in recall_set.memories.values()]
    assert len(set(contents)) == len(contents)


def test_paraphrases_share_almost_no_words_with_their_answers() -> None:
    shared_per_query = []
    for query in PARAPHRASE.queries:
        words = recall_sets.content_words(query.text)
        for key in query.relevant:
            shared = words & recall_sets.content_words(PARAPHRASE.memories[key][1])
            assert len(shared) <= 1, (query.text, shared)
            shared_per_query.append(len(shared))
    assert sum(shared_per_query) / len(shared_per_query) <= 0.25


def test_paraphrase_distractors_share_the_questions_words() -> None:
    # A distractor is a memory that answers nothing but shares the question's words.
    trapped = 0
    for query in PARAPHRASE.queries:
        words = recall_sets.content_words(query.text)
        others = (c for k, (_, c, _) in PARAPHRASE.memories.items() if k not in query.relevant)
        trapped += any(words & recall_sets.content_words(content) for content in others)
    assert trapped >= 0.75 * len(PARAPHRASE.queries)


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def test_exact_queries_hinge_on_a_rare_term_with_near_misses() -> None:
    frequency = Counter(t for _, c, _ in EXACT.memories.values() for t in _tokens(c))
    near_missed = 0
    for query in EXACT.queries:
        (answer,) = query.relevant
        rare = {
            t for t in _tokens(query.text) & _tokens(EXACT.memories[answer][1]) if frequency[t] <= 2
        }
        assert rare, f"{query.text!r} shares no rare term with its answer"
        others: Iterator[str] = (
            t for k, (_, c, _) in EXACT.memories.items() if k != answer for t in _tokens(c)
        )
        near_missed += any(
            len(term) >= 3 and other != term and _edit_distance(term, other) <= 2
            for other in others
            for term in rare
        )
    assert near_missed >= 0.6 * len(EXACT.queries)


# -- the metrics ----------------------------------------------------------------


def test_score_rankings() -> None:
    metrics = recall_sets.score_rankings(
        [["a", "b", "c"], ["x", "y", "z", "w", "b"], ["q"]],
        [["a"], ["b", "c"], ["nope"]],
    )
    assert metrics.ranks == (1, 5, None)
    assert metrics.recall_at_1 == pytest.approx(1 / 3)
    assert metrics.recall_at_3 == pytest.approx(1 / 3)
    assert metrics.recall_at_5 == pytest.approx((1 + 0.5 + 0) / 3)
    assert metrics.mrr == pytest.approx((1 + 1 / 5 + 0) / 3)
    with pytest.raises(ValueError):
        recall_sets.score_rankings([], [])


def test_recall_set_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown"):
        RecallSet("bad", {"m1": ("x", "y", 5)}, (recall_sets.Query("q", ("m2",)),))


def test_evaluate_returns_metrics_per_mode(tmp_path: Path) -> None:
    # The plumbing only: the hashing embedder keeps this instant.
    from coterie.runtime.memory import HashingEmbedder

    factory: Callable[[], MemoryStore] = lambda: MemoryStore(  # noqa: E731
        str(tmp_path / "db"), HashingEmbedder()
    )
    scores = recall_eval.evaluate(factory, k=5)
    assert set(scores) == {"vector", "fts", "hybrid"}
    assert all(0.0 <= value <= 1.0 for value in scores.values())
    small = RecallSet("small", dict(list(EXACT.memories.items())[:20]), EXACT.queries[:3])
    metrics = recall_sets.evaluate(
        lambda: MemoryStore(str(tmp_path / "db2"), HashingEmbedder()), small
    )
    assert set(metrics) == {"vector", "fts", "hybrid"}
    assert metrics["fts"].recall_at_1 == 1.0  # OPS-2291, OPS-2219, OPS-2290 by their numbers
    assert "recall@1" in recall_sets.format_table({"small": metrics})
