"""Ray actors: thin shells over the plain logic in ``runtime`` and ``tools``.

One module per actor kind — router, persona, audit, memory, shell — plus the
Ray plumbing they share (``_ray``). Only entry points (the ``coterie``
package: the CLI, the Python API) import this package.
"""

from __future__ import annotations

# First, before anything of coterie's loads: in an actor's process this is
# Ray loading the actor's class, and the serialization context Ray builds next
# is built without libraries coterie never sends (see actors._lean).
from actors import _lean  # noqa: F401
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
