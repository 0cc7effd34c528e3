"""Read-only SQL over the audit log: the statement check and a read-only transaction.

``duckdb`` is imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coterie.runtime.errors import AuditQueryError

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class QueryResult:
    """The result of an audit query: column names and rows."""

    columns: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def as_dicts(self) -> list[dict[str, Any]]:
        """The rows as ``{column: value}`` dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _parse_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    """Parse ``sql`` and refuse it unless every statement only reads."""
    import duckdb

    read_only = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise AuditQueryError(f"audit query failed: {exc}") from exc
    if not statements:
        raise AuditQueryError("audit query is empty")
    refused = [s.type.name for s in statements if s.type not in read_only]
    if refused:
        raise AuditQueryError(
            "audit queries are read-only (SELECT, EXPLAIN); refused "
            f"{', '.join(refused)} statement{'s' if len(refused) > 1 else ''}"
        )
    return statements


def run_read_only(cur: duckdb.DuckDBPyConnection, sql: str) -> QueryResult:
    """Run ``sql`` on a dedicated cursor inside a read-only transaction.

    The statement-type check alone is not enough: ``WITH d AS (DELETE ...
    RETURNING *) SELECT ...`` parses as a SELECT and ``EXPLAIN ANALYZE``
    executes its statement. The read-only transaction refuses both.
    """
    import duckdb

    statements = _parse_read_only(cur, sql)
    result = QueryResult(columns=[])
    try:
        cur.execute("BEGIN TRANSACTION READ ONLY")
        for statement in statements:
            cur.execute(statement)
            # Always fetch fully: a partly fetched result blocks the connection.
            rows = cur.fetchall()
            columns = [d[0] for d in cur.description or ()]
            result = QueryResult(columns=columns, rows=rows)
    except duckdb.Error as exc:
        if "read-only mode" in str(exc):
            raise AuditQueryError(
                f"audit queries are read-only; refused a statement that writes: {exc}"
            ) from exc
        raise AuditQueryError(f"audit query failed: {exc}") from exc
    return result


def read_only_query(path: str | Path, sql: str) -> QueryResult:
    """Query an audit file directly, for when no runtime has it open.

    Only SELECT and EXPLAIN statements are admitted. A running runtime holds
    the file's write lock; query through it (``AuditLog.query`` on the actor) instead.
    """
    import duckdb

    path = Path(path)
    if not path.exists():
        raise AuditQueryError(f"no audit log at {path}")
    try:
        con = duckdb.connect(str(path), read_only=True, config={"enable_external_access": False})
    except duckdb.Error as exc:
        raise AuditQueryError(
            f"cannot open audit log {path} read-only (is a runtime using it? "
            f"then query through the runtime): {exc}"
        ) from exc
    try:
        return run_read_only(con, sql)
    finally:
        con.close()


__all__ = ["QueryResult", "read_only_query", "run_read_only"]
