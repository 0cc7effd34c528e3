"""Retrieval quality of recall with the real all-MiniLM-L6-v2 embedder.

Loads the bundled model once for the module (several seconds on CPU) and runs
the fixed benchmark of :mod:`runtime.testing.recall_eval`. Run with ``-s`` to
see the recall@5 of each mode.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.memory import Embedder, MemoryStore
from runtime.testing import recall_eval


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    from runtime.memory import MiniLMEmbedder

    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def results(
    minilm: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, float]]:
    counter = itertools.count()

    def factory() -> MemoryStore:
        path: Path = tmp_path_factory.mktemp("recall") / f"db{next(counter)}"
        return MemoryStore(str(path), minilm)

    by_kind = recall_eval.evaluate_by_kind(factory, k=5)
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


def test_hybrid_is_at_least_as_good_as_either_leg(results: dict[str, dict[str, float]]) -> None:
    overall = {mode: scores["all"] for mode, scores in results.items()}
    assert overall["hybrid"] >= overall["vector"], overall
    assert overall["hybrid"] >= overall["fts"], overall


def test_each_leg_does_its_job(results: dict[str, dict[str, float]]) -> None:
    # Exact rare terms are what BM25 is for; paraphrases are what vectors are for.
    assert results["fts"]["lexical"] >= results["vector"]["lexical"]
    assert results["vector"]["semantic"] > results["fts"]["semantic"]


def test_evaluate_returns_one_number_per_mode(tmp_path: Path) -> None:
    # The plumbing only: the hashing embedder keeps this instant.
    from runtime.memory import HashingEmbedder

    factory: Callable[[], MemoryStore] = lambda: MemoryStore(  # noqa: E731
        str(tmp_path / "db"), HashingEmbedder()
    )
    scores = recall_eval.evaluate(factory, k=5)
    assert set(scores) == {"vector", "fts", "hybrid"}
    assert all(0.0 <= value <= 1.0 for value in scores.values())
