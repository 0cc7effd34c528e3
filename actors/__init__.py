"""Ray actors: thin shells over the plain logic in ``runtime`` and ``tools``.

One module per actor kind — router, persona, audit, memory, scheduler, shell
(and the delegations') — plus the Ray plumbing they share (``_ray``). Only
entry points (the ``coterie`` package: the CLI, the Python API) import this
package.

Importing the package itself loads nothing of coterie's but ``_lean``: in an
actor's process the first import of it is Ray loading the actor's class, and
the serialization context Ray builds next is then built without libraries
coterie never sends (see :mod:`actors._lean`). The names below load
``_ray`` on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from coterie.actors import _lean  # noqa: F401

if TYPE_CHECKING:
    from coterie.actors._ray import (
        NAMESPACE,
        audit_name,
        memory_name,
        persona_actor_name,
        router_name,
        runtime_id,
        scheduler_name,
    )

__all__ = [
    "NAMESPACE",
    "audit_name",
    "memory_name",
    "persona_actor_name",
    "router_name",
    "runtime_id",
    "scheduler_name",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("coterie.actors._ray"), name)
    globals()[name] = value
    return value
