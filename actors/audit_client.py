"""The persona side of the audit log: a buffer wired to the AuditLog actor.

Apart from :mod:`actors.audit` so that persona processes never import DuckDB
or Arrow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.audit_buffer import AuditBuffer, Row


def audit_buffer_for(
    handle: Any, *, spool_path: str | Path | None = None, **kwargs: Any
) -> AuditBuffer:
    """An :class:`AuditBuffer` whose batches go to the audit log actor ``handle``.

    With ``spool_path`` (one per persona, on local disk) rows survive the
    process being killed: a buffer created on the same spool after a restart
    resends them as replayed batches, which the actor deduplicates.
    """

    async def send(rows: list[Row]) -> None:
        await handle.append.remote(rows)

    async def replay(rows: list[Row]) -> None:
        await handle.append.remote(rows, replayed=True)

    return AuditBuffer(send, replay=replay, spool_path=spool_path, **kwargs)


__all__ = ["audit_buffer_for"]
