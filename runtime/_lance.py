"""LanceDB plumbing for :mod:`runtime.memory_store`: schemas, tables, filters, RRF.

Nothing here knows about personas' semantics; it only keeps the store module
free of Arrow and LanceDB details. ``lancedb`` and ``pyarrow`` are imported
inside functions so that ``import runtime`` does not load them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from runtime.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from lancedb.db import DBConnection
    from lancedb.expr import Expr
    from lancedb.table import Table

__all__ = [
    "KNOWLEDGE",
    "MEMORIES",
    "USER_MODEL",
    "fts_index_stats",
    "match",
    "open_table",
    "ranked",
    "rrf",
    "scan",
    "schema_for",
    "vector_column",
]

MEMORIES = "memories"
KNOWLEDGE = "knowledge"
USER_MODEL = "user_model"

#: Tables with a ``content`` full-text index and a ``vector`` column.
SEARCHABLE = (MEMORIES, KNOWLEDGE)

#: Schema metadata key recording which embedder made the vectors.
_EMBEDDER_KEY = b"coterie.embedder"

K = TypeVar("K", bound=Hashable)


def schema_for(table: str, dim: int, embedder: str) -> pa.Schema:
    """The explicit Arrow schema of one of the store's tables."""
    import pyarrow as pa

    utc = pa.timestamp("us", tz="UTC")
    vector = pa.field("vector", pa.list_(pa.float32(), dim), nullable=False)
    fields: dict[str, list[pa.Field]] = {
        MEMORIES: [
            pa.field("id", pa.string(), nullable=False),
            pa.field("persona", pa.string(), nullable=False),
            pa.field("category", pa.string(), nullable=False),
            pa.field("content", pa.string(), nullable=False),
            pa.field("importance", pa.int32(), nullable=False),
            pa.field("created_at", utc, nullable=False),
            pa.field("day", pa.string(), nullable=False),
            vector,
        ],
        KNOWLEDGE: [
            pa.field("id", pa.string(), nullable=False),
            pa.field("persona", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("chunk", pa.int32(), nullable=False),
            pa.field("content", pa.string(), nullable=False),
            pa.field("ingest_id", pa.string(), nullable=False),
            pa.field("created_at", utc, nullable=False),
            vector,
        ],
        USER_MODEL: [
            pa.field("persona", pa.string(), nullable=False),
            pa.field("dimension", pa.string(), nullable=False),
            pa.field("content", pa.string(), nullable=False),
            pa.field("confidence", pa.int32(), nullable=False),
            pa.field("updated_at", utc, nullable=False),
        ],
    }
    metadata = {_EMBEDDER_KEY: embedder.encode()} if table in SEARCHABLE else None
    return pa.schema(fields[table], metadata=metadata)


def open_table(db: DBConnection, name: str, dim: int, embedder: str) -> Table:
    """Open ``name``, creating it (and its full-text index) if missing.

    Refuses a table whose vectors came from another embedder: mixing models
    would make every distance meaningless.
    """
    schema = schema_for(name, dim, embedder)
    try:
        table = db.open_table(name)
    except ValueError:  # LanceDB's "was not found"
        # exist_ok: another process may create the same table at the same moment.
        table = db.create_table(name, schema=schema, exist_ok=True)
    if name in SEARCHABLE:
        _check_embedder(table, name, dim, embedder)
    if not table.schema.equals(schema, check_metadata=False):
        raise ConfigError(
            f"the {name} table at this location has an unexpected schema "
            f"({table.schema.names}); was it written by another program?"
        )
    if name in SEARCHABLE:
        _ensure_fts(table)
    return table


def _check_embedder(table: Table, name: str, dim: int, embedder: str) -> None:
    schema = table.schema
    found_dim = schema.field("vector").type.list_size
    found = (schema.metadata or {}).get(_EMBEDDER_KEY, b"?").decode()
    if found_dim != dim or found != embedder:
        raise ConfigError(
            f"the {name} table holds {found_dim}-dimensional vectors from {found!r}, but the "
            f"store was opened with {embedder!r} ({dim} dimensions); use the same embedder "
            "or a new store location"
        )


def _ensure_fts(table: Table) -> None:
    from lancedb.index import FTS

    if _has_fts(table):
        return
    try:
        # An FTS index can be built on an empty table; rows added later are
        # searched unindexed until optimize() folds them in.
        table.create_index("content", config=FTS(), replace=False)
    except Exception:
        # Lost a race with another process building the same index.
        if not _has_fts(table):
            raise


def _has_fts(table: Table) -> bool:
    return any(
        index.index_type == "FTS" and list(index.columns) == ["content"]
        for index in table.list_indices()
    )


def fts_index_stats(table: Table) -> tuple[int, int]:
    """``(indexed, unindexed)`` row counts of the ``content`` full-text index."""
    for index in table.list_indices():
        if index.index_type == "FTS":
            stats = table.index_stats(index.name)
            if stats is not None:
                return stats.num_indexed_rows, stats.num_unindexed_rows
    return 0, table.count_rows()


def match(**columns: Any) -> Expr:
    """``col = value AND …`` as a typed expression: values are never spliced into SQL."""
    from lancedb.expr import col, lit

    exprs = [col(name) == lit(value) for name, value in columns.items()]
    result = exprs[0]
    for expr in exprs[1:]:
        result = result & expr
    return result


def vector_column(vectors: Sequence[Sequence[float]], dim: int) -> pa.FixedSizeListArray:
    """Embedder output as an Arrow ``fixed_size_list<float32>[dim]`` column."""
    import numpy as np
    import pyarrow as pa

    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"embedder returned vectors of shape {array.shape}, expected (n, {dim})")
    if not np.isfinite(array).all():
        raise ValueError("embedder returned a vector with NaN or infinite values")
    return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), dim)


def scan(
    table: Table,
    where: Expr,
    *,
    columns: list[str] | None = None,
    order: Sequence[tuple[str, bool]] = (),
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Rows matching ``where``, sorted by ``(column, ascending)`` pairs."""
    from lancedb.query import ColumnOrdering

    builder = table.search().where(where)
    if columns is not None:
        builder = builder.select(columns)
    if order:
        builder = builder.order_by(
            [ColumnOrdering(column_name=name, ascending=asc) for name, asc in order]
        )
    return builder.limit(limit).to_arrow().to_pylist()


def ranked(
    table: Table, query: str | list[float], where: Expr, columns: list[str], limit: int
) -> list[dict[str, Any]]:
    """Best ``limit`` rows for ``query``, filtered by ``where`` *before* ranking.

    A string runs BM25 over the ``content`` full-text index (rows not yet
    indexed are scanned too, so nothing written since the last optimize is
    missed) and adds ``_score`` (higher is better); a vector runs exact cosine
    kNN and adds ``_distance`` (lower is better).
    """
    # LanceDB's overloads type a vector search as the generic builder.
    search: Any = table.search
    if isinstance(query, str):
        builder, score = search(query, query_type="fts", fts_columns="content"), "_score"
    else:
        builder = search(query, vector_column_name="vector").distance_type("cosine")
        score = "_distance"
    # Naming the score column keeps Lance from warning about auto-projection.
    rows: list[dict[str, Any]] = (
        builder.where(where, prefilter=True)
        .select([*columns, score])
        .limit(limit)
        .to_arrow()
        .to_pylist()
    )
    return rows


def rrf(ranked_lists: Iterable[Sequence[K]], *, k: int = 60) -> dict[K, float]:
    """Reciprocal-rank fusion: ``score(d) = Σ 1 / (k + rank(d))`` over the lists.

    Only ranks matter, so lists whose own scores are incomparable (cosine
    distance, BM25) fuse cleanly; ``k = 60`` is the constant of Cormack et
    al. (2009) and damps the weight of the very top ranks.
    """
    scores: dict[K, float] = {}
    for ranked in ranked_lists:
        for rank, key in enumerate(ranked, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return scores


def finite_or_none(value: Any) -> float | None:
    """A float column value, with NaN (e.g. a zero vector's cosine) as ``None``."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None
