"""The LanceDB adapter of :mod:`runtime.memory.store`: the only module that
calls LanceDB — connections, schemas, tables and indexes, writes, filters
and searches.

Nothing here knows about personas' semantics. ``lancedb`` and ``pyarrow`` are
imported inside functions so that ``import runtime`` does not load them.
LanceDB reports its own failures (commit conflicts, a name already taken) as
``RuntimeError``; only those are caught, and only where they are expected.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from coterie.runtime.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from lancedb.db import DBConnection
    from lancedb.expr import Expr
    from lancedb.index import IndexConfig
    from lancedb.table import AsyncTable, Table

__all__ = [
    "KNOWLEDGE",
    "MEMORIES",
    "USER_MODEL",
    "Search",
    "add",
    "connect",
    "count",
    "delete",
    "ensure_vector_index",
    "fts_index_stats",
    "has_vector_index",
    "match",
    "open_table",
    "optimize",
    "ranked",
    "ranked_many",
    "recorded_embedder",
    "replace_where",
    "scan",
    "schema_for",
    "submit",
    "update_by_key",
    "upsert",
    "vector_column",
]

log = logging.getLogger("coterie.memory")

MEMORIES = "memories"
KNOWLEDGE = "knowledge"
USER_MODEL = "user_model"

#: Tables with a ``content`` full-text index and a ``vector`` column.
SEARCHABLE = (MEMORIES, KNOWLEDGE)

#: Schema metadata key recording which embedder made the vectors.
_EMBEDDER_KEY = b"coterie.embedder"

#: A searchable table with at least this many rows (all personas together) gets
#: an approximate (IVF) vector index from :func:`ensure_vector_index`. Below it,
#: exact kNN is kept. LanceDB's exact kNN costs ~1.3 ms per 1,000 rows the
#: persona holds (20 ms at 15k rows here, against 9 ms through the index).
ANN_MIN_ROWS = 10_000
#: Rows per IVF partition when the vector index is built, the fewest partitions,
#: and how far rows per partition may grow before the index is rebuilt larger.
ROWS_PER_PARTITION = 512
MIN_PARTITIONS = 64
REBUILD_GROWTH = 2
_VECTOR_INDEX_NAME = re.compile(r"vector_ivf(\d+)")
#: IVF partitions searched per query. Measured at 150k rows (293 partitions):
#: 48 probes find 98.5% of the exact top 8 (the misses are near-ties: the 8th
#: distance differs by ~0.0002) for ~1.5 ms more than LanceDB's default of 20
#: (94%). A persona with few rows in a large shared table still gets all of
#: them: with a selective prefilter LanceDB searches the matching rows exactly.
NPROBES = 48


def connect(
    uri: str,
    *,
    read_consistency_interval: float | None = None,
    storage_options: dict[str, str] | None = None,
) -> DBConnection:
    """A LanceDB connection to a directory or an object-store URI.

    ``read_consistency_interval`` (seconds): how often reads look for writes
    made by other processes (``None``: never; ``0``: on every read).
    """
    import lancedb

    interval = (
        None if read_consistency_interval is None else timedelta(seconds=read_consistency_interval)
    )
    return lancedb.connect(uri, read_consistency_interval=interval, storage_options=storage_options)


def _commit_conflict(exc: RuntimeError) -> bool:
    """Whether LanceDB lost a race with another commit (safe to try again later)."""
    return "Retryable commit conflict" in str(exc)


def add(table: Table, batch: pa.Table) -> None:
    """Append rows."""
    table.add(batch)


def update_by_key(table: Table, key: str, batch: pa.Table) -> int:
    """Replace the rows whose ``key`` matches a row of ``batch``; how many were updated."""
    result = table.merge_insert(key).when_matched_update_all().execute(batch)
    return int(result.num_updated_rows)


def upsert(table: Table, keys: list[str], batch: pa.Table) -> None:
    """Insert the rows of ``batch``, replacing those with the same ``keys``."""
    (
        table.merge_insert(keys)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(batch)
    )


def replace_where(table: Table, key: str, batch: pa.Table, where: Expr) -> int:
    """In one commit: insert ``batch`` and delete the other rows matching ``where``.

    Readers see either the old rows or the new ones. Returns how many old rows
    were deleted.
    """
    result = (
        table.merge_insert(key)
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete(where)
        .execute(batch)
    )
    return int(result.num_deleted_rows)


def delete(table: Table, where: Expr) -> None:
    """Delete the rows matching ``where``."""
    table.delete(where)


def count(table: Table, where: Expr | None = None) -> int:
    """Rows matching ``where`` (all rows when ``None``)."""
    return int(table.count_rows(None if where is None else where.to_sql()))


def optimize(table: Table) -> bool:
    """Compact, fold new rows into the indexes, prune old versions.

    ``False`` when the commit lost a race with a concurrent write (the write
    wins; try again later); other failures are raised.
    """
    try:
        table.optimize()
    except RuntimeError as exc:
        if not _commit_conflict(exc):
            raise
        return False
    return True


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


def open_table(
    db: DBConnection,
    name: str,
    dim: int,
    embedder: str,
    *,
    also_accept: Iterable[str] = (),
) -> Table:
    """Open ``name``, creating it (and its full-text index) if missing.

    Refuses a table whose vectors came from another embedder: mixing models
    would make every distance meaningless. ``also_accept`` lists other names
    the same embedder was recorded under (by earlier versions).
    """
    schema = schema_for(name, dim, embedder)
    try:
        table = db.open_table(name)
    except ValueError:  # LanceDB's "was not found"
        # exist_ok: another process may create the same table at the same moment.
        table = db.create_table(name, schema=schema, exist_ok=True)
    if name in SEARCHABLE:
        _check_embedder(table, name, dim, {embedder, *also_accept})
    if not table.schema.equals(schema, check_metadata=False):
        raise ConfigError(
            f"the {name} table at this location has an unexpected schema "
            f"({table.schema.names}); was it written by another program?"
        )
    if name in SEARCHABLE:
        _ensure_indexes(table)
    return table


def recorded_embedder(
    uri: str, *, storage_options: dict[str, str] | None = None
) -> tuple[str, int] | None:
    """``(name, dim)`` of the embedder whose vectors the store at ``uri``
    holds, read from its tables' schema (nothing else); ``None`` while it has
    none."""
    db = connect(uri, storage_options=storage_options)
    for name in SEARCHABLE:
        try:
            schema = db.open_table(name).schema
        except ValueError:  # LanceDB's "was not found"
            continue
        found = (schema.metadata or {}).get(_EMBEDDER_KEY)
        return (found.decode() if found else "?", int(schema.field("vector").type.list_size))
    return None


def _check_embedder(table: Table, name: str, dim: int, accepted: set[str]) -> None:
    schema = table.schema
    found_dim = schema.field("vector").type.list_size
    found = (schema.metadata or {}).get(_EMBEDDER_KEY, b"?").decode()
    if found_dim != dim or found not in accepted:
        opened = " or ".join(repr(n) for n in sorted(accepted))
        raise ConfigError(
            f"the {name} table holds {found_dim}-dimensional vectors from {found!r}, but the "
            f"store was opened with {opened} ({dim} dimensions); use the same embedder "
            "or a new store location"
        )


def _ensure_indexes(table: Table) -> None:
    """The ``content`` full-text index and a bitmap index on ``persona``.

    Both can be built on an empty table; rows added later are searched
    unindexed until optimize() folds them in. The persona index makes every
    persona prefilter an index lookup instead of a scan of the column.
    """
    from lancedb.index import FTS, Bitmap

    indices = list(table.list_indices())
    if not _has_fts(indices):
        _create_index(table, "content", FTS(), _has_fts)
    if not _has_persona_index(indices):
        _create_index(table, "persona", Bitmap(), _has_persona_index)


def _create_index(
    table: Table,
    column: str,
    config: Any,
    exists: Callable[[Iterable[IndexConfig]], bool],
    name: str | None = None,
) -> None:
    try:
        table.create_index(column, config=config, replace=False, name=name)
    except RuntimeError:
        # Lost a race with another process building the same index.
        if not exists(table.list_indices()):
            raise


def _has_fts(indices: Iterable[IndexConfig]) -> bool:
    return any(
        index.index_type == "FTS" and list(index.columns) == ["content"] for index in indices
    )


def _has_persona_index(indices: Iterable[IndexConfig]) -> bool:
    return any(list(index.columns) == ["persona"] for index in indices)


def _vector_indices(indices: Iterable[IndexConfig]) -> list[IndexConfig]:
    return [index for index in indices if list(index.columns) == ["vector"]]


def has_vector_index(table: Table) -> bool:
    """Whether ``table`` has an ANN index on ``vector`` (else kNN is exact)."""
    return bool(_vector_indices(table.list_indices()))


def ensure_vector_index(table: Table) -> bool | None:
    """Build the ANN index on ``vector`` once the table has :data:`ANN_MIN_ROWS`
    rows, and rebuild it with more partitions when the table has outgrown it;
    ``True`` if this call built one, ``None`` if building it lost a commit race
    (the next call tries again).

    IVF_SQ (8-bit scalar quantisation, cosine) trains in seconds, unlike
    IVF_PQ, and keeps kNN recall high. Rows added later are searched exactly
    until ``table.optimize()`` folds them into the index, so none is missed.
    The index is named after its partition count; it is rebuilt (the new one
    committed before the old is dropped, so searches never lose the index)
    once the table holds over :data:`REBUILD_GROWTH` times
    :data:`ROWS_PER_PARTITION` rows per partition. An index on ``vector``
    named otherwise (made by hand) is left alone.
    """
    from lancedb.index import IvfSq

    current = _vector_indices(table.list_indices())
    rows = table.count_rows()
    partitions = max(MIN_PARTITIONS, rows // ROWS_PER_PARTITION)
    if current:
        built = [_VECTOR_INDEX_NAME.fullmatch(index.name) for index in current]
        if not all(built) or any(
            rows <= int(m.group(1)) * ROWS_PER_PARTITION * REBUILD_GROWTH for m in built if m
        ):
            return False
    elif rows < ANN_MIN_ROWS:
        return False
    name = f"vector_ivf{partitions}"
    config = IvfSq(distance_type="cosine", num_partitions=partitions)
    try:
        _create_index(
            table, "vector", config, lambda indices: any(i.name == name for i in indices), name
        )
    except RuntimeError as exc:
        if not _commit_conflict(exc):
            raise
        return None
    for old in current:
        if old.name != name:
            try:
                table.drop_index(old.name)
            except RuntimeError as exc:
                # Another process dropped it first; anything else is worth a line.
                if "not found" not in str(exc):
                    log.warning("could not drop the old vector index %s: %s", old.name, exc)
    return True


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


@dataclass(frozen=True)
class Search:
    """One ranked search over one table (see :func:`ranked`).

    ``skip_if_empty``: first count the rows ``where`` matches (an index
    lookup) and return none without searching when there are none.
    ``rerank``: for a vector search through the IVF index, the fewest of the
    index's nearest rows (by quantised distance) whose exact distances choose
    the best ``limit`` (``limit`` itself when smaller). So a search of a few
    rows finds the best of a search of ``rerank`` rows — or closer ones —
    without reading the other rows' columns.
    """

    table: Table
    query: str | list[float]
    where: Expr
    columns: list[str]
    limit: int
    skip_if_empty: bool = False
    rerank: int = 0

    @property
    def refine_factor(self) -> int:
        """LanceDB's ``refine_factor`` for :attr:`rerank`: rows re-ranked per row kept."""
        return max(1, -(-self.rerank // max(1, self.limit)))


def ranked(
    table: Table, query: str | list[float], where: Expr, columns: list[str], limit: int
) -> list[dict[str, Any]]:
    """Best ``limit`` rows for ``query``, filtered by ``where`` *before* ranking.

    A string runs BM25 over the ``content`` full-text index (rows not yet
    indexed are scanned too, so nothing written since the last optimize is
    missed) and adds ``_score`` (higher is better); a vector runs cosine kNN —
    exact, or through the IVF index of a large table (see
    :func:`ensure_vector_index`) — and adds ``_distance`` (lower is better).
    """
    return ranked_many([Search(table, query, where, columns, limit)])[0]


def ranked_many(searches: Sequence[Search]) -> list[list[dict[str, Any]]]:
    """Several :func:`ranked` searches run concurrently; results in input order."""
    future = submit(searches)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def submit(searches: Sequence[Search]) -> Future[list[list[dict[str, Any]]]]:
    """Start :func:`ranked_many` and return at once; ``result()`` waits for it.

    The searches are issued together on LanceDB's own event loop through its
    async API: one hand-off from this thread instead of several per search
    (LanceDB's sync wrappers cross threads to fetch the schema and run the
    plan), and they overlap in LanceDB's worker threads — and with whatever
    the caller does meanwhile (``recall`` embeds the query).
    """
    from lancedb.background_loop import LOOP
    from lancedb.table import AsyncTable

    # The sync table wraps an AsyncTable (LanceDB's own sync methods run it
    # on the same loop), so both see the same version of the data.
    inners = [getattr(search.table, "_table", None) for search in searches]
    if all(isinstance(inner, AsyncTable) for inner in inners):
        coroutine = _ranked_all(searches, cast("list[AsyncTable]", inners))
        return asyncio.run_coroutine_threadsafe(coroutine, LOOP.loop)
    # Not backed by an AsyncTable (e.g. another kind of table in a later
    # LanceDB): run each search through the sync API, one after another.
    done: Future[list[list[dict[str, Any]]]] = Future()
    try:
        done.set_result([_ranked_sync(search) for search in searches])
    except Exception as exc:
        done.set_exception(exc)
    return done


async def _ranked_all(
    searches: Sequence[Search], inners: Sequence[AsyncTable]
) -> list[list[dict[str, Any]]]:
    counts: dict[tuple[int, str], asyncio.Task[int]] = {}

    async def one(search: Search, inner: AsyncTable) -> pa.Table | None:
        if search.skip_if_empty:
            where = search.where.to_sql()
            key = (id(inner), where)
            if key not in counts:
                counts[key] = asyncio.ensure_future(inner.count_rows(where))
            if await counts[key] == 0:
                return None
        builder: Any = inner.query()
        if isinstance(search.query, str):
            builder, score = builder.nearest_to_text(search.query, columns="content"), "_score"
        else:
            vector = builder.nearest_to(search.query).column("vector")
            builder, score = _vector_options(vector, search.refine_factor), "_distance"
        # Filters are prefilters in the async API (``postfilter()`` opts out).
        table: pa.Table = (
            await builder.where(search.where)
            .select([*search.columns, score])
            .limit(search.limit)
            .to_arrow()
        )
        return table

    tables = await asyncio.gather(*(one(s, i) for s, i in zip(searches, inners, strict=True)))
    return [[] if table is None else table.to_pylist() for table in tables]


def _ranked_sync(search: Search) -> list[dict[str, Any]]:
    if search.skip_if_empty and search.table.count_rows(search.where.to_sql()) == 0:
        return []
    # LanceDB's overloads type a vector search as the generic builder.
    find: Any = search.table.search
    if isinstance(search.query, str):
        builder, score = find(search.query, query_type="fts", fts_columns="content"), "_score"
    else:
        vector = find(search.query, vector_column_name="vector")
        builder, score = _vector_options(vector, search.refine_factor), "_distance"
    # Naming the score column keeps Lance from warning about auto-projection.
    rows: list[dict[str, Any]] = (
        builder.where(search.where, prefilter=True)
        .select([*search.columns, score])
        .limit(search.limit)
        .to_arrow()
        .to_pylist()
    )
    return rows


def _vector_options(builder: Any, refine_factor: int) -> Any:
    """Cosine; for an IVF index, :data:`NPROBES` partitions and exact distances
    for the results (a refine factor of 1 or more: the quantised distances only
    choose the candidates, so ``distance`` stays the true cosine distance)."""
    return builder.distance_type("cosine").nprobes(NPROBES).refine_factor(refine_factor)


def finite_or_none(value: Any) -> float | None:
    """A float column value, with NaN (e.g. a zero vector's cosine) as ``None``."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None
