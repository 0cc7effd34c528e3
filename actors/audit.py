"""The AuditLog actor: :class:`runtime.audit.AuditLog` on Ray.

One per runtime, named; it owns the DuckDB file. Personas record into an
:class:`~runtime.audit.AuditBuffer` wired to it (``actors._ray.audit_buffer_for``).
"""

from __future__ import annotations

from typing import Any

import ray

from coterie.runtime.audit import AuditLog


class AuditLogActor(AuditLog):
    """:class:`~runtime.audit.AuditLog` as it runs on Ray (the subclass adds
    nothing but its name: the process shows as ``ray::AuditLogActor``)."""


AuditLogActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(AuditLogActor)


def get_or_create_audit_log(
    path: str,
    *,
    name: str = "coterie:audit",
    namespace: str | None = None,
    detached: bool = False,
    flush_interval: float = 0.05,
    flush_rows: int = 5000,
    options: dict[str, Any] | None = None,
) -> Any:
    """The named audit log actor, created on first use.

    An existing actor of that name is returned as is, whatever its ``path``
    (check ``ping()`` if that matters). ``options`` are more Ray actor options
    (where it runs: ``actors.router.placement_options``).
    """
    return AuditLogActorRemote.options(  # type: ignore[attr-defined]
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        num_cpus=0,
        **(options or {}),
    ).remote(path, flush_interval=flush_interval, flush_rows=flush_rows)


__all__ = ["AuditLogActor", "AuditLogActorRemote", "get_or_create_audit_log"]
