"""How hybrid recall fuses its two search legs: pure functions, no LanceDB.

The vector leg (cosine, all-MiniLM-L6-v2 by default) understands meaning
but not strings it has never seen whole: its word pieces make ``OPS-2291``
and ``OPS-2219`` nearly the same vector (cosine 0.82), and the transposed
booking references ``KX4TQ9`` and ``KX4QT9`` all but equal (0.99). The
full-text leg (BM25) is the opposite: exact on ids, but on a
question in everyday words its best hits are the memories that merely share
one of those words (``doctor``, ``car``, ``birthday``). So the fusion gives
the full-text leg a weight that depends on the query:

* a query with an **identifier-like token** — a digit (``OPS-2291``,
  ``LH1127``, ``exit code 137``), a word in capitals (``MARLIN``,
  ``ENOSPC``), a snake_case or dotted name (``wombat_pricing``,
  ``payments.settled.v3``) or an inner capital (``FritzBox``) — gets
  :data:`IDENTIFIER_TEXT_WEIGHT` (0.75);
* any other query gets :data:`PLAIN_TEXT_WEIGHT` (0): the vector leg ranks;
  full-text only breaks exact ties, and what only it found ranks at the
  vector leg's lowest similarity.

Each hit's score is then a convex combination of the two legs' normalised
scores (:func:`fuse`)::

    score = (1 - w) * max(0, 1 - cosine_distance) + w * bm25 / best_bm25

``best_bm25`` is the best BM25 score of this query's candidates. A leg that
found nothing gets no weight, so ``vector`` mode scores are cosine
similarities and ``fts`` mode scores relative BM25. A candidate missing from
the vector leg (not among its top candidates) gets that leg's lowest
similarity — it scored no better — and one missing from the full-text leg 0.

Measured with all-MiniLM-L6-v2 on the sets of :mod:`tests.recall.recall_sets`
(recall@1 / recall@3 / recall@5 / MRR; ``tests/test_recall_quality.py``)::

                        paraphrase (47 q, 110 m)   exact (52 q, 111 m)
    vector              .64 .87 .98 .77            .79 .94 .96 .86
    fts                 .02 .09 .15 .07            .98 1.0 1.0 .99
    RRF k=60 (before)   .15 .57 .83 .41            .92 1.0 1.0 .96
    this fusion         .64 .87 .98 .77            .98 1.0 1.0 .99

Alternatives measured on the same legs, none within 0.02 of the better leg
on both sets: weighted RRF (k 1–60, text weight 0.1–2; best worst-metric
gap −0.17), convex combinations with one fixed weight (raw or min-max
cosine; BM25 over its maximum, min-max or saturated ``b / (b + K)``; best gap
−0.14), and query-adaptive weights that give plain questions any text weight
at all: even 0.01 cost paraphrase recall@1 (.64 → .60), because the cosine
similarities of the top paraphrase candidates are often within 0.01 of each
other. On identifier queries every text weight from 0.6 to 1 scored the
same; 0.75 is the middle of that plateau, and leaves the vector leg a say
among hits whose BM25 is close (two memories naming the same ticket). A cross-encoder reranker was
ruled out by cost: fusion must stay well under a millisecond per query
(:func:`fuse` is a dictionary pass over at most a few hundred candidates).

Names (``Priya Ramesh``) are deliberately not identifier-like: the vector leg
ranked all nine name queries of the exact set (and both of the mixed set)
first anyway, and counting any capitalised word after the first as one
handed "... for Christmas?" to BM25 (paraphrase recall@1 .64 → .62) for no
gain anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import TypeVar

__all__ = [
    "IDENTIFIER_TEXT_WEIGHT",
    "PLAIN_TEXT_WEIGHT",
    "fuse",
    "has_identifier",
    "text_weight",
]

K = TypeVar("K", bound=Hashable)

#: Weight of the full-text leg for a query with an identifier-like token.
IDENTIFIER_TEXT_WEIGHT = 0.75
#: Weight of the full-text leg for any other query.
PLAIN_TEXT_WEIGHT = 0.0

_IDENTIFIER = re.compile(
    r"""
    \d                            # a digit: OPS-2291, LH1127, 40P01, exit code 137
    | \b[A-Z]{3,}\b               # a word in capitals: MARLIN, ENOSPC
    | [^\W_]{2,}[_.][^\W_]        # snake_case, dotted: wombat_pricing, db.prod (not e.g.)
    | [a-z][A-Z]                  # an inner capital: FritzBox, ThinkPad
    """,
    re.VERBOSE,
)


def has_identifier(query: str) -> bool:
    """Whether ``query`` has a token an embedder is likely to blur (see the module doc)."""
    return _IDENTIFIER.search(query) is not None


def text_weight(query: str) -> float:
    """The full-text leg's weight in :func:`fuse` for ``query``."""
    return IDENTIFIER_TEXT_WEIGHT if has_identifier(query) else PLAIN_TEXT_WEIGHT


def fuse(
    distances: Mapping[K, float],
    bm25: Mapping[K, float],
    *,
    text_weight: float,
) -> list[tuple[K, float]]:
    """Candidates of both legs with their fused scores, best first.

    ``distances`` maps the vector leg's candidates to their cosine distance,
    ``bm25`` the full-text leg's to their BM25 score; either may be empty
    (that leg's weight then goes to the other). Scores are in ``[0, 1]``
    (see the module doc); ties go to the higher BM25, then the smaller
    distance, then the order of ``distances`` and then of ``bm25``.
    """
    if not 0.0 <= text_weight <= 1.0:
        raise ValueError(f"text_weight must be between 0 and 1, not {text_weight}")
    best = max(bm25.values(), default=0.0)
    if best <= 0.0:
        text_weight = 0.0
    elif not distances:
        text_weight = 1.0
    similarity = {key: max(0.0, 1.0 - distance) for key, distance in distances.items()}
    floor = min(similarity.values(), default=0.0)
    relative = {key: max(0.0, score) / best for key, score in bm25.items()} if best > 0 else {}
    scored = [
        (
            (1.0 - text_weight) * similarity.get(key, floor) + text_weight * relative.get(key, 0.0),
            relative.get(key, 0.0),
            -distances.get(key, 2.0),
            key,
        )
        for key in {**distances, **bm25}
    ]
    scored.sort(key=lambda item: item[:3], reverse=True)
    return [(key, score) for score, _, _, key in scored]
