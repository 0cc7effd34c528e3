"""What long-term memory stores and answers: typed records, no storage code.

These cross actor boundaries (the MemoryStore actor returns them) and are what
:class:`~runtime.services.MemoryService` promises, so tools read fields, never
raw dict keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

Source = Literal["all", "memories", "knowledge"]
Mode = Literal["hybrid", "vector", "fts"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class MemoryInput:
    """One memory to write; validated by the store (bad values are ToolErrors)."""

    persona: str
    category: str
    content: str
    importance: int = 5


class MemoryRow(_Frozen):
    """A stored memory."""

    id: str
    persona: str
    category: str
    content: str
    importance: int
    created_at: datetime
    day: str

    @property
    def tag(self) -> str:
        return f"[memory {self.id}]"


class RecallHit(_Frozen):
    """One recall result: a memory or a knowledge chunk.

    ``score`` is the relevance in ``[0, 1]`` that ranked the hit: in hybrid
    mode ``(1 - w) * cosine similarity + w * BM25 / the query's best BM25``,
    ``w`` the query's full-text weight (see :mod:`runtime.memory.fusion`); the
    cosine similarity alone in ``vector`` mode and the relative BM25 in
    ``fts`` mode. ``None`` for the empty-query and ``date`` listings, which
    are not ranked by relevance. ``distance`` (cosine) and ``bm25`` are the
    legs' own scores when the hit came from that leg.
    """

    kind: Literal["memory", "knowledge"]
    id: str
    tag: str
    content: str
    score: float | None = None
    category: str | None = None
    importance: int | None = None
    created_at: datetime | None = None
    day: str | None = None
    source: str | None = None
    chunk: int | None = None
    distance: float | None = None
    bm25: float | None = None


class IngestResult(_Frozen):
    """What ``ingest`` stored: ``chunks`` new chunks, ``replaced`` old ones removed."""

    source: str
    chunks: int
    replaced: int


class UserModelRow(_Frozen):
    """One dimension of a persona's model of its user."""

    persona: str
    dimension: str
    content: str
    confidence: int
    updated_at: datetime


#: user_model dimensions listed first, in this order; others follow by name.
RECOMMENDED_DIMENSIONS = ("baseline", "preferences", "working_patterns", "feedback", "goals")


def in_prompt_order(rows: list[UserModelRow]) -> list[UserModelRow]:
    """User-model rows as the system prompt lists them: recommended dimensions first."""
    order = {name: i for i, name in enumerate(RECOMMENDED_DIMENSIONS)}
    return sorted(rows, key=lambda r: (order.get(r.dimension, len(order)), r.dimension))


class MemoryStats(_Frozen):
    """Counters of a memory server (see ``MemoryServer.stats``)."""

    pid: int
    uri: str
    embedder: str
    rows: dict[str, int]
    writes: int
    write_batches: int
    optimizations: int
    optimize_errors: int


__all__ = [
    "RECOMMENDED_DIMENSIONS",
    "IngestResult",
    "MemoryInput",
    "MemoryRow",
    "MemoryStats",
    "Mode",
    "RecallHit",
    "Source",
    "UserModelRow",
    "in_prompt_order",
]
