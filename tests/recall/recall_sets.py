"""Retrieval-quality sets for :meth:`MemoryStore.recall`, and their metrics.

Two sets pull the search legs in opposite directions:

* :data:`PARAPHRASE` — questions worded differently from the memory that
  answers them (what the vector leg is for);
* :data:`EXACT` — ids, error codes, booking references, product codes and
  names, each beside a near miss (what the full-text leg is for);

and :data:`MIXED` is the older benchmark of :mod:`tests.recall.recall_eval`
(seventy memories, exact, paraphrased and mixed queries), in the same form.

:func:`evaluate` loads a set into a fresh store and reports, per mode,
recall@1/3/5 and the mean reciprocal rank (:class:`Metrics`).
:func:`content_words` is the crude tokenizer the tests use to check that a
paraphrase really shares no words with its answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.recall import _exact_set, _paraphrase_set, recall_eval

if TYPE_CHECKING:
    from coterie.runtime.memory import MemoryStore, Mode

__all__ = [
    "DEPTH",
    "EXACT",
    "MIXED",
    "MODES",
    "PARAPHRASE",
    "Metrics",
    "Query",
    "RecallSet",
    "content_words",
    "evaluate",
    "format_table",
    "load",
    "score_rankings",
]

MODES: tuple[Mode, ...] = ("vector", "fts", "hybrid")
#: How many hits each query asks for: the reciprocal rank is counted to here.
DEPTH = 10


@dataclass(frozen=True)
class Query:
    """A question and the keys of the memories that answer it."""

    text: str
    relevant: tuple[str, ...]


@dataclass(frozen=True)
class RecallSet:
    """Memories (key -> category, content, importance) and questions about them."""

    name: str
    memories: Mapping[str, tuple[str, str, int]]
    queries: tuple[Query, ...]

    def __post_init__(self) -> None:
        unknown = {k for q in self.queries for k in q.relevant} - set(self.memories)
        if unknown:
            raise ValueError(f"{self.name}: queries name unknown memories {sorted(unknown)}")

    @property
    def persona(self) -> str:
        return f"recall-{self.name}"


@dataclass(frozen=True)
class Metrics:
    """Mean retrieval quality of one mode over one set.

    ``recall_at_k`` is the share of a query's relevant memories in its top
    ``k`` hits, averaged over queries; ``mrr`` the mean of 1 / rank of the
    first relevant hit (0 when none is in the top :data:`DEPTH`). ``ranks``
    holds that rank per query (``None``: not found), for finding the misses.
    """

    recall_at_1: float
    recall_at_3: float
    recall_at_5: float
    mrr: float
    ranks: tuple[int | None, ...]

    def as_dict(self) -> dict[str, float]:
        return {
            "recall@1": self.recall_at_1,
            "recall@3": self.recall_at_3,
            "recall@5": self.recall_at_5,
            "MRR": self.mrr,
        }


def _from_pairs(
    name: str,
    memories: Mapping[str, tuple[str, str, int]],
    queries: Sequence[tuple[str, tuple[str, ...]]],
) -> RecallSet:
    return RecallSet(name, memories, tuple(Query(text, relevant) for text, relevant in queries))


PARAPHRASE = _from_pairs("paraphrase", _paraphrase_set.MEMORIES, _paraphrase_set.QUERIES)
EXACT = _from_pairs("exact", _exact_set.MEMORIES, _exact_set.QUERIES)
MIXED = RecallSet(
    "mixed",
    recall_eval.MEMORIES,
    tuple(Query(q.text, q.relevant) for q in recall_eval.QUERIES),
)


def load(store: MemoryStore, recall_set: RecallSet) -> dict[str, str]:
    """Write the set's memories under its persona; returns key -> stored id."""
    from coterie.runtime.memory import MemoryInput

    keys = list(recall_set.memories)
    rows = store.write_memories(
        [
            MemoryInput(recall_set.persona, category, content, importance)
            for category, content, importance in recall_set.memories.values()
        ]
    )
    return {key: row.id for key, row in zip(keys, rows, strict=True)}


def score_rankings(rankings: Sequence[Sequence[str]], relevant: Sequence[Sequence[str]]) -> Metrics:
    """Metrics of ranked keys (best first) against each query's relevant keys."""
    if not rankings or len(rankings) != len(relevant):
        raise ValueError("need one ranking per query, and at least one query")
    recalls: dict[int, list[float]] = {1: [], 3: [], 5: []}
    ranks: list[int | None] = []
    for ranked, wanted in zip(rankings, relevant, strict=True):
        want = set(wanted)
        for k, values in recalls.items():
            values.append(len(want.intersection(ranked[:k])) / len(want))
        first = next((i for i, key in enumerate(ranked[:DEPTH], 1) if key in want), None)
        ranks.append(first)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    return Metrics(
        recall_at_1=mean(recalls[1]),
        recall_at_3=mean(recalls[3]),
        recall_at_5=mean(recalls[5]),
        mrr=mean([0.0 if rank is None else 1.0 / rank for rank in ranks]),
        ranks=tuple(ranks),
    )


def evaluate(
    store_factory: Callable[[], MemoryStore],
    recall_set: RecallSet,
    *,
    modes: Sequence[Mode] = MODES,
) -> dict[str, Metrics]:
    """Load ``recall_set`` into a fresh store and measure each mode on it."""
    store = store_factory()
    ids = load(store, recall_set)
    key_of = {stored: key for key, stored in ids.items()}
    relevant = [query.relevant for query in recall_set.queries]
    out: dict[str, Metrics] = {}
    for mode in modes:
        rankings = [
            [
                key_of[hit.id]
                for hit in store.recall(
                    recall_set.persona, query=query.text, mode=mode, limit=DEPTH
                )
            ]
            for query in recall_set.queries
        ]
        out[mode] = score_rankings(rankings, relevant)
    return out


def format_table(results: Mapping[str, Mapping[str, Metrics]]) -> str:
    """A plain-text table: one row per set and mode, one column per metric."""
    columns = ("recall@1", "recall@3", "recall@5", "MRR")
    lines = [f"{'set':<11} {'mode':<7} " + " ".join(f"{name:>8}" for name in columns)]
    for set_name, by_mode in results.items():
        for mode, metrics in by_mode.items():
            values = " ".join(f"{value:8.3f}" for value in metrics.as_dict().values())
            lines.append(f"{set_name:<11} {mode:<7} {values}")
    return "\n".join(lines)


# -- lexical overlap ----------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")
#: Function words (and a few empty verbs) a content-word comparison ignores.
_FUNCTION_WORDS = """
    a about after all also am an and any are as at be been before both but by can could
    did do does doing for from get gets got had has have he her here him his how i if in
    into is it its just me mine my no not of off on once only or our out over own she should
    so some such than that the their them then there these they this those to too under up
    us very was we were what when where which while who whom why will with would you your
    yours
"""
_STOP_WORDS = frozenset(_FUNCTION_WORDS.split())
_SUFFIXES = ("ing", "ed", "es", "s")


def content_words(text: str) -> set[str]:
    """Lower-cased, crudely stemmed words of ``text`` minus function words."""
    words: set[str] = set()
    for word in _WORD.findall(text.lower()):
        if word in _STOP_WORDS or (len(word) == 1 and word.isalpha()):  # the s of "'s"
            continue
        for suffix in _SUFFIXES:
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                word = word[: -len(suffix)]
                break
        words.add(word)
    return words
