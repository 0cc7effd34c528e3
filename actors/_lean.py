"""What a coterie actor's process leaves out of Ray's serialization context.

The first time a Ray worker decodes anything it builds its serialization
context, and Ray's add-ons then import every library they have a serializer
for that happens to be installed: pyarrow (for Ray Data's tables),
pydantic.v1 and starlette (for Ray Serve). Coterie needs pyarrow (DuckDB,
LanceDB) and so has it installed, but none of these objects ever crosses a
coterie actor's boundary: Arrow stays inside the audit, memory and eval
actors, and coterie's models are pydantic v2. Importing them costs each
process ~12 MiB of its own memory and ~0.1 s of CPU at start (see "What an
actor's process leaves out" in docs/cluster.md), so coterie's actor processes
build the context without them. Should such an object cross anyway, it is pickled like any
other object.

This module is imported first by the ``actors`` package, and imports nothing
of coterie's: in an actor's process that is when Ray loads the actor's class,
before it decodes the actor's arguments.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import ray

log = logging.getLogger("coterie.ray")

#: The modules Ray's serializer add-ons import that coterie's workers skip.
SKIPPED_SERIALIZER_MODULES = ("pyarrow", "pydantic.v1", "starlette")


class _SkipModules:
    """A meta-path finder refusing some module names while it is installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = frozenset(names)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in self.names:
            raise ModuleNotFoundError(f"{name} is not loaded by Ray's serializers here", name=name)
        return None


def lean_serialization_context() -> bool:
    """In a Ray worker whose serialization context does not exist yet, build it
    without :data:`SKIPPED_SERIALIZER_MODULES`; whether it did.

    Anywhere else (a driver, a worker that has decoded something already, one
    that has those modules loaded anyway) it does nothing, and a Ray whose
    internals differ from what this expects is left to its defaults.
    """
    try:
        from ray._private import worker as ray_worker

        worker = ray_worker.global_worker
        if worker.mode != ray.WORKER_MODE or worker.serialization_context_map:
            return False
        if any(name in sys.modules for name in SKIPPED_SERIALIZER_MODULES):
            return False
        skip = _SkipModules(SKIPPED_SERIALIZER_MODULES)
        sys.meta_path.insert(0, skip)
        try:
            worker.get_serialization_context()
        finally:
            sys.meta_path.remove(skip)
        return True
    except Exception:  # boundary: Ray's defaults are always a safe fallback
        log.debug("Ray's serialization context left to its defaults", exc_info=True)
        return False


#: Whether this process's serialization context was built without the skipped modules.
LEAN_SERIALIZATION = lean_serialization_context()

__all__ = ["LEAN_SERIALIZATION", "SKIPPED_SERIALIZER_MODULES", "lean_serialization_context"]
