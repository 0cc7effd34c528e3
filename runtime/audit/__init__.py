"""The audit log: rows, the source-side buffer and its spool, the DuckDB writer,
read-only queries, and the log that batches writes.

Importing this package loads neither DuckDB nor Arrow; they load when a writer
is made (or a file is queried), so persona processes never pay for them.
"""

from __future__ import annotations

from coterie.runtime.audit.buffer import AuditBuffer
from coterie.runtime.audit.loader import ConversationLoader
from coterie.runtime.audit.log import AuditLog, AuditLogStats
from coterie.runtime.audit.query import QueryResult, read_only_query
from coterie.runtime.audit.rows import EVENT_COLUMNS, Row, Send, event_to_row
from coterie.runtime.audit.writer import AuditWriter, event_schema, rows_to_table

__all__ = [
    "EVENT_COLUMNS",
    "AuditBuffer",
    "AuditLog",
    "AuditLogStats",
    "AuditWriter",
    "ConversationLoader",
    "QueryResult",
    "Row",
    "Send",
    "event_schema",
    "event_to_row",
    "read_only_query",
    "rows_to_table",
]
