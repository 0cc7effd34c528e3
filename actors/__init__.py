"""Ray actors: thin shells over the plain logic in ``runtime`` and ``tools``.

One module per actor kind — router, persona, audit, memory, shell — plus the
Ray plumbing they share (``_ray``). Only entry points (the ``coterie``
package: the CLI, the Python API) import this package.
"""

from __future__ import annotations

from actors._ray import (
    NAMESPACE,
    audit_name,
    memory_name,
    persona_actor_name,
    router_name,
    runtime_id,
)

__all__ = [
    "NAMESPACE",
    "audit_name",
    "memory_name",
    "persona_actor_name",
    "router_name",
    "runtime_id",
]
