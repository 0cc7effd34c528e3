"""Personas' long-term memory in LanceDB: memories, knowledge, the user model.

Three tables, shared by every persona and scoped by a ``persona`` column:

* ``memories`` — journal records (category, content, importance 1..10);
* ``knowledge`` — chunks of ingested documents (source, chunk index);
* ``user_model`` — one row per (persona, dimension) of facts about the user.

Every read and write filters on the persona *before* ranking or limiting
(LanceDB prefilters), so one persona never sees, counts or changes another's
rows: an id of another persona is treated exactly like an unknown id.

Search is hybrid: a full-text (BM25) leg and a vector (cosine) leg, fused by
our own score fusion (:mod:`runtime.memory.fusion`: a convex combination of
cosine similarity and relative BM25, with a full-text weight that depends on
whether the query has an identifier-like token) rather than LanceDB's
rerankers, because ``recall`` ranks two tables together and LanceDB's hybrid
query fuses within one table only.

Failures the model should read are :class:`~runtime.errors.ToolError`;
embedder and storage faults propagate as they are.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from coterie.runtime.errors import ModelError, ToolError
from coterie.runtime.memory import _lance, fusion
from coterie.runtime.memory._lance import KNOWLEDGE, MEMORIES, USER_MODEL
from coterie.runtime.memory.chunking import chunk_text
from coterie.runtime.memory.embedders import Embedder, FullTextOnly, legacy_names
from coterie.runtime.memory.records import (
    IngestResult,
    MemoryInput,
    MemoryRow,
    Mode,
    RecallHit,
    Source,
    UserModelRow,
    in_prompt_order,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from lancedb.table import Table

__all__ = ["CANDIDATES", "MAX_LIMIT", "MemoryStore"]

MAX_CONTENT_CHARS = 20_000
MAX_CHUNKS = 2_000
MAX_LIMIT = 50
#: Candidates each search leg fetches per table before fusion.
CANDIDATES = 50

log = logging.getLogger("coterie.memory")

_MEMORY_COLUMNS = ["id", "persona", "category", "content", "importance", "created_at", "day"]
#: What a search reads per memory: the persona is known, so it is not fetched.
_MEMORY_HIT_COLUMNS = [c for c in _MEMORY_COLUMNS if c != "persona"]
_KNOWLEDGE_COLUMNS = ["id", "source", "chunk", "content"]
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class MemoryStore:
    """Long-term memory for all personas over one LanceDB database.

    ``uri`` is a local directory or an object-store URI (``s3://…``; pass
    credentials in ``storage_options``). Tables are created on first use.
    ``read_consistency_interval`` (seconds) controls how often reads check
    for writes made by *other* processes or handles: ``None`` never does
    (fastest; this store always sees its own writes), ``0`` checks on every
    read. ``chunk_size``/``chunk_overlap`` shape ingested documents;
    ``clock`` (for tests) returns the current UTC time.
    """

    def __init__(
        self,
        uri: str,
        embedder: Embedder,
        *,
        read_consistency_interval: float | None = None,
        storage_options: dict[str, str] | None = None,
        chunk_size: int = 3000,
        chunk_overlap: int = 300,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.uri = uri
        self.embedder = embedder
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self._db = _lance.connect(
            uri,
            read_consistency_interval=read_consistency_interval,
            storage_options=storage_options,
        )
        self._clock = clock or (lambda: datetime.now(UTC))
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()

    # -- memories -----------------------------------------------------------

    def write_memories(self, items: Sequence[MemoryInput]) -> list[MemoryRow]:
        """Store several memories with one embedding call and one table write.

        All items are validated first: one bad item writes nothing.
        """
        if not items:
            return []
        checked = [
            (
                _persona(item.persona),
                _category(item.category),
                _content(item.content),
                _rating("importance", item.importance),
            )
            for item in items
        ]
        vectors = self._embed([content for _, _, content, _ in checked])
        now = self._now()
        rows = [
            MemoryRow(
                id=str(uuid.uuid4()),
                persona=persona,
                category=category,
                content=content,
                importance=importance,
                created_at=now,
                day=now.date().isoformat(),
            )
            for persona, category, content, importance in checked
        ]
        _lance.add(self._table(MEMORIES), self._memory_batch(rows, vectors))
        return rows

    def write_memory(
        self, persona: str, *, category: str, content: str, importance: int = 5
    ) -> MemoryRow:
        """Store one memory (see :meth:`write_memories`)."""
        return self.write_memories([MemoryInput(persona, category, content, importance)])[0]

    def update_memory(
        self,
        persona: str,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> MemoryRow:
        """Replace a memory's content (re-embedded), and optionally its category/importance."""
        old = self._get_memory(persona, memory_id)
        new = old.model_copy(
            update={
                "content": _content(content),
                "category": old.category if category is None else _category(category),
                "importance": (
                    old.importance if importance is None else _rating("importance", importance)
                ),
            }
        )
        batch = self._memory_batch([new], self._embed([new.content]))
        if _lance.update_by_key(self._table(MEMORIES), "id", batch) == 0:
            # deleted between the read and the write
            raise _not_found(memory_id)
        return new

    def delete_memory(self, persona: str, memory_id: str) -> None:
        """Delete one memory of ``persona``."""
        old = self._get_memory(persona, memory_id)
        _lance.delete(self._table(MEMORIES), _lance.match(persona=old.persona, id=old.id))

    def _get_memory(self, persona: str, memory_id: str) -> MemoryRow:
        persona = _persona(persona)
        if not isinstance(memory_id, str) or not memory_id.strip():
            raise ToolError("invalid_arguments", "a memory id is required")
        memory_id = memory_id.strip()
        found = _lance.scan(
            self._table(MEMORIES),
            _lance.match(persona=persona, id=memory_id),
            columns=_MEMORY_COLUMNS,
            limit=1,
        )
        if not found:
            raise _not_found(memory_id)
        return MemoryRow(**found[0])

    def _memory_batch(self, rows: list[MemoryRow], vectors: pa.Array) -> pa.Table:
        import pyarrow as pa

        data = {c: [getattr(r, c) for r in rows] for c in _MEMORY_COLUMNS}
        return pa.table({**data, "vector": vectors}, schema=self._schema(MEMORIES))

    # -- recall -------------------------------------------------------------

    def recall(
        self,
        persona: str,
        *,
        query: str = "",
        source: Source = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
        mode: Mode = "hybrid",
    ) -> list[RecallHit]:
        """Search a persona's memories and knowledge (see the module doc).

        * ``date`` (``YYYY-MM-DD``, UTC): every memory written that day, oldest
          first; all other arguments are ignored.
        * empty ``query``: the most important, then most recent, memories
          (knowledge has no importance and is skipped).
        * otherwise ``mode`` ranks by ``hybrid`` (both legs fused by
          :func:`runtime.memory.fusion.fuse`), ``vector`` or ``fts`` alone;
          each hit's ``score`` is the fused score in ``[0, 1]`` (cosine
          similarity in ``vector`` mode, BM25 relative to the best hit in
          ``fts`` mode). ``category`` keeps only memories of that category
          (knowledge chunks have none, so they drop out).
        """
        persona = _persona(persona)
        if date is not None:
            return self._memories_on(persona, _day(date))
        if source not in ("all", "memories", "knowledge"):
            raise ToolError("invalid_arguments", "source must be all, memories or knowledge")
        if mode not in ("hybrid", "vector", "fts"):
            raise ToolError("invalid_arguments", "mode must be hybrid, vector or fts")
        if isinstance(self.embedder, FullTextOnly):
            mode = "fts"  # full-text-only store: there is no vector leg to search
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ToolError("invalid_arguments", f"limit must be an integer from 1 to {MAX_LIMIT}")
        filters: dict[str, Any] = {"persona": persona}
        if category is not None:
            filters["category"] = _category(category)
        query = (query or "").strip()
        if not query:
            return [] if source == "knowledge" else self._top_memories(filters, limit)

        tables: list[tuple[str, Any, list[str]]] = []
        if source != "knowledge":
            tables.append((MEMORIES, _lance.match(**filters), _MEMORY_HIT_COLUMNS))
        if source != "memories" and category is None:
            tables.append((KNOWLEDGE, _lance.match(persona=persona), _KNOWLEDGE_COLUMNS))
        if not tables:
            return []

        weight = fusion.text_weight(query)
        by_key, vector_keys, text_keys = self._search_legs(tables, query, mode, limit, weight)
        ranked = fusion.fuse(
            {key: by_key[key]["distance"] for key in vector_keys},
            {key: by_key[key]["bm25"] for key in text_keys},
            text_weight=weight,
        )[:limit]
        return [_hit(key[0], by_key[key], score) for key, score in ranked]

    def _search_legs(
        self,
        tables: list[tuple[str, Any, list[str]]],
        query: str,
        mode: Mode,
        limit: int,
        text_weight: float,
    ) -> tuple[dict[tuple[str, str], dict[str, Any]], list[tuple[str, str]], list[tuple[str, str]]]:
        """The rows each leg of a ``mode`` recall found, by ``(table, id)``, and
        each leg's ranking of them (see :meth:`_leg`; empty for a leg not searched).
        ``text_weight`` is the full-text leg's weight in the fusion that follows.

        Each leg searches every table concurrently; the full-text leg starts
        first and runs while the query is embedded. Fusing two legs needs
        :data:`CANDIDATES` rows of each; a ranking by the vector leg alone
        needs only its top ``limit``. That is ``vector`` mode, and also a
        hybrid recall of a plain query: fusion gives its full-text leg no
        weight, so that leg can only break exact ties, and it is searched (both
        legs in full, exactly as for any other query) only when the vector
        leg's top ``limit + 1`` holds a tie (:func:`_text_leg_can_reorder`).
        Either way the ranking and the scores are those of the full search
        (at 100k memories a plain query took 6.5-6.7 ms at p50 instead of
        9.6-11, at 60% of the CPU time: ``benchmarks/recall.py``); hits the
        full-text leg was not asked about have no ``bm25``.
        """

        def searches(leg_query: list[float] | str, rows: int = CANDIDATES) -> list[_lance.Search]:
            # A persona with no knowledge costs one index lookup, not a search.
            # Through an IVF index, the exact distances of the index's best
            # CANDIDATES rows rank them, however few are fetched.
            return [
                _lance.Search(
                    self._table(name),
                    leg_query,
                    where,
                    columns,
                    rows,
                    skip_if_empty=name == KNOWLEDGE,
                    rerank=CANDIDATES,
                )
                for name, where, columns in tables
            ]

        text_breaks_ties_only = mode == "hybrid" and text_weight == 0.0
        fetch = CANDIDATES
        if mode == "vector":
            fetch = limit
        elif text_breaks_ties_only:
            fetch = min(limit + 1, CANDIDATES)  # one more, to see a tie at the cut
        text_leg = (
            None if mode == "vector" or text_breaks_ties_only else _lance.submit(searches(query))
        )
        by_key: dict[tuple[str, str], dict[str, Any]] = {}
        vector_keys: list[tuple[str, str]] = []
        text_keys: list[tuple[str, str]] = []
        try:
            if mode != "fts":
                vector = self._embed([query]).to_pylist()[0]
                found = _lance.ranked_many(searches(vector, fetch))
                vector_keys = self._leg(tables, found, by_key)
                if text_breaks_ties_only and _text_leg_can_reorder(
                    {key: by_key[key]["distance"] for key in vector_keys}, limit
                ):
                    text_leg = _lance.submit(searches(query))
                    if fetch < CANDIDATES and any(len(rows) >= fetch for rows in found):
                        # Some table holds more rows than were fetched: fetch them in full.
                        by_key = {}
                        found = _lance.ranked_many(searches(vector))
                        vector_keys = self._leg(tables, found, by_key)
            if text_leg is not None:
                text_keys = self._leg(tables, text_leg.result(), by_key)
        finally:
            if text_leg is not None:
                text_leg.cancel()  # a no-op unless the vector leg failed
        return by_key, vector_keys, text_keys

    def _leg(
        self,
        tables: list[tuple[str, Any, list[str]]],
        found_per_table: list[list[dict[str, Any]]],
        by_key: dict[tuple[str, str], dict[str, Any]],
    ) -> list[tuple[str, str]]:
        """One search leg's rows from every table, merged into one ranking.

        Cosine distances from one embedder are comparable across tables; BM25
        scores from two indexes only roughly are (each has its own term
        statistics), which fusing BM25 relative to the best hit tolerates.
        Rows without a finite score are left out of the ranking.
        """
        found: list[tuple[float, tuple[str, str]]] = []
        for (name, _, _), rows in zip(tables, found_per_table, strict=True):
            for row in rows:
                key = (name, row["id"])
                merged = by_key.setdefault(key, row)
                if "_score" in row:
                    bm25 = merged["bm25"] = _lance.finite_or_none(row.pop("_score"))
                    rank = None if bm25 is None else -bm25
                else:
                    rank = merged["distance"] = _lance.finite_or_none(row.pop("_distance"))
                if rank is not None:
                    found.append((rank, key))
        found.sort(key=lambda item: item[0])
        return [key for _, key in found]

    def _top_memories(self, filters: dict[str, Any], limit: int) -> list[RecallHit]:
        rows = _lance.scan(
            self._table(MEMORIES),
            _lance.match(**filters),
            columns=_MEMORY_COLUMNS,
            order=[("importance", False), ("created_at", False)],
            limit=limit,
        )
        return [_hit(MEMORIES, row, None) for row in rows]

    def _memories_on(self, persona: str, day: str) -> list[RecallHit]:
        rows = _lance.scan(
            self._table(MEMORIES),
            _lance.match(persona=persona, day=day),
            columns=_MEMORY_COLUMNS,
            order=[("created_at", True)],
        )
        return [_hit(MEMORIES, row, None) for row in rows]

    # -- knowledge ----------------------------------------------------------

    def ingest(self, persona: str, *, source: str, text: str) -> IngestResult:
        """Chunk, embed (one call) and store a document under ``source``.

        Re-ingesting a source replaces its chunks in a single commit (a merge
        that inserts the new chunks and deletes the old ones together), so
        readers see either the old or the new document, and a failure —
        before or during the write — leaves the old chunks in place.
        """
        persona = _persona(persona)
        source = _label("source", source, 200)
        if not isinstance(text, str) or not text.strip():
            raise ToolError("invalid_arguments", "the document has no text to ingest")
        chunks = chunk_text(text, size=self.chunk_size, overlap=self.chunk_overlap)
        if len(chunks) > MAX_CHUNKS:
            raise ToolError(
                "too_large",
                f"the document makes {len(chunks):,} chunks; at most {MAX_CHUNKS:,} are "
                "allowed per source — split it into several sources",
            )
        vectors = self._embed(chunks)

        import pyarrow as pa

        now = self._now()
        batch = pa.table(
            {
                "id": [str(uuid.uuid4()) for _ in chunks],
                "persona": [persona] * len(chunks),
                "source": [source] * len(chunks),
                "chunk": list(range(len(chunks))),
                "content": chunks,
                "ingest_id": [uuid.uuid4().hex] * len(chunks),
                "created_at": [now] * len(chunks),
                "vector": vectors,
            },
            schema=self._schema(KNOWLEDGE),
        )
        replaced = _lance.replace_where(
            self._table(KNOWLEDGE), "id", batch, _lance.match(persona=persona, source=source)
        )
        return IngestResult(source=source, chunks=len(chunks), replaced=replaced)

    # -- user model ---------------------------------------------------------

    def write_user_model(
        self, persona: str, *, dimension: str, content: str, confidence: int = 5
    ) -> UserModelRow:
        """Set one dimension of the user model, replacing any previous value.

        Dimensions are lower-cased so ``Preferences`` and ``preferences`` are
        the same row.
        """
        import pyarrow as pa

        row = UserModelRow(
            persona=_persona(persona),
            dimension=_label("dimension", dimension, 64).lower(),
            content=_content(content),
            confidence=_rating("confidence", confidence),
            updated_at=self._now(),
        )
        batch = pa.Table.from_pylist([row.model_dump()], schema=self._schema(USER_MODEL))
        _lance.upsert(self._table(USER_MODEL), ["persona", "dimension"], batch)
        return row

    def user_model(self, persona: str) -> list[UserModelRow]:
        """Every dimension of ``persona``'s user model, recommended dimensions first."""
        rows = _lance.scan(self._table(USER_MODEL), _lance.match(persona=_persona(persona)))
        return in_prompt_order([UserModelRow(**row) for row in rows])

    # -- maintenance --------------------------------------------------------

    def optimize(self, *, attempts: int = 3) -> dict[str, bool]:
        """Compact small files, fold new rows into the indexes, prune old versions.

        A searchable table of :data:`runtime.memory._lance.ANN_MIN_ROWS` rows or more
        also gets its approximate (IVF) vector index here, after the compaction,
        and a larger one when it has outgrown it (see
        :func:`runtime.memory._lance.ensure_vector_index`); later runs fold new rows in.

        Safe beside concurrent reads and writes. Lance commits are
        multi-version: a query keeps the snapshot it started on, and pruning
        only removes versions older than LanceDB's default of seven days. A
        compaction that races a write touching the same files loses — the
        write succeeds and the compaction commit fails as retryable — so it is
        retried up to ``attempts`` times. Returns, per table, whether it was
        optimised (``False``: still contended; the next run catches up).
        """
        done: dict[str, bool] = {}
        for name in (MEMORIES, KNOWLEDGE, USER_MODEL):
            table = self._table(name)
            for attempt in range(1, attempts + 1):
                if _lance.optimize(table):
                    done[name] = True
                    break
                log.debug("optimize %s: commit conflict (attempt %d)", name, attempt)
            else:
                log.warning("optimize %s: gave up after %d commit conflicts", name, attempts)
                done[name] = False
            if name in _lance.SEARCHABLE and done[name]:
                self._ensure_vector_index(name, table)
        return done

    def _ensure_vector_index(self, name: str, table: Table) -> None:
        built = _lance.ensure_vector_index(table)
        if built is None:
            log.debug("optimize %s: vector index lost a commit conflict; next run", name)
        elif built:
            log.info("optimize %s: built the ANN vector index", name)

    def counts(self, persona: str | None = None) -> dict[str, int]:
        """Rows per table, for one persona or (``None``) for all."""
        where = None if persona is None else _lance.match(persona=_persona(persona))
        return {
            name: _lance.count(self._table(name), where)
            for name in (MEMORIES, KNOWLEDGE, USER_MODEL)
        }

    def fts_unindexed(self) -> dict[str, int]:
        """Rows not yet in each full-text index (searched by a slower flat scan)."""
        return {
            name: _lance.fts_index_stats(self._table(name))[1] for name in (MEMORIES, KNOWLEDGE)
        }

    # -- plumbing -----------------------------------------------------------

    def _table(self, name: str) -> Table:
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = _lance.open_table(
                    self._db,
                    name,
                    self.embedder.dim,
                    self.embedder.name,
                    also_accept=legacy_names(self.embedder.name),
                )
                self._tables[name] = table
            return table

    def _now(self) -> datetime:
        # ``day`` is the UTC calendar day, whatever zone the clock answers in.
        return self._clock().astimezone(UTC)

    def _schema(self, name: str) -> pa.Schema:
        return _lance.schema_for(name, self.embedder.dim, self.embedder.name)

    def _embed(self, texts: list[str]) -> pa.FixedSizeListArray:
        vectors = self.embedder.embed(texts)
        if len(vectors) != len(texts):
            raise ModelError(f"embedder returned {len(vectors)} vectors for {len(texts)} texts")
        try:
            return _lance.vector_column(vectors, self.embedder.dim)
        except ValueError as exc:
            raise ModelError(str(exc)) from exc


# -- validation and conversion ----------------------------------------------


def _persona(persona: str) -> str:
    # The runtime, not the model, supplies the persona: a bad one is a bug.
    if not isinstance(persona, str) or not persona.strip():
        raise ValueError("persona must be a non-empty string")
    return persona


def _label(what: str, value: str, max_chars: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolError("invalid_arguments", f"{what} must be a non-empty string")
    value = value.strip()
    if len(value) > max_chars:
        raise ToolError("invalid_arguments", f"{what} is longer than {max_chars} characters")
    return value


def _category(category: str) -> str:
    return _label("category", category, 64)


def _content(content: str) -> str:
    if not isinstance(content, str) or not content.strip():
        raise ToolError("invalid_arguments", "content must be a non-empty string")
    content = content.strip()
    if len(content) > MAX_CONTENT_CHARS:
        raise ToolError(
            "too_large",
            f"content is {len(content):,} characters; the limit is {MAX_CONTENT_CHARS:,}",
        )
    return content


def _rating(what: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10:
        raise ToolError(
            "invalid_arguments", f"{what} must be an integer from 1 to 10, not {value!r}"
        )
    return value


def _day(value: str) -> str:
    if not isinstance(value, str) or not _DAY.fullmatch(value.strip()):
        raise ToolError("invalid_arguments", f"date must look like YYYY-MM-DD, not {value!r}")
    try:
        return datetime.strptime(value.strip(), "%Y-%m-%d").date().isoformat()
    except ValueError:
        raise ToolError("invalid_arguments", f"{value!r} is not a calendar date") from None


def _not_found(memory_id: str) -> ToolError:
    return ToolError(
        "not_found", f"no memory with id {memory_id!r} (ids come from recall's [memory …] tags)"
    )


def _text_leg_can_reorder(distances: dict[tuple[str, str], float], limit: int) -> bool:
    """Whether a full-text leg of weight 0 could change the top ``limit`` of a
    hybrid recall whose vector leg found ``distances`` (best first).

    With a text weight of 0, :func:`runtime.memory.fusion.fuse` scores each
    hit by the vector leg alone; BM25 only orders hits of exactly equal score,
    and a hit that only the full-text leg found gets the vector leg's lowest
    score. So the full-text leg matters only if two of the best ``limit + 1``
    scores are equal, or if there are no more than ``limit`` of them (the
    lowest score then makes the cut, and so would its ties).
    """
    scores = [score for _, score in fusion.fuse(distances, {}, text_weight=0.0)]
    if len(scores) <= limit:
        return True
    best = scores[: limit + 1]
    return any(a == b for a, b in itertools.pairwise(best))


def _hit(table: str, row: dict[str, Any], score: float | None) -> RecallHit:
    if table == MEMORIES:
        return RecallHit(
            kind="memory",
            tag=f"[memory {row['id']}]",
            score=score,
            **{k: v for k, v in row.items() if k != "persona"},
        )
    return RecallHit(
        kind="knowledge", tag=f"[knowledge {row['source']}#{row['chunk']}]", score=score, **row
    )
