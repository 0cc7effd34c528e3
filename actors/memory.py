"""The MemoryStore actor: :class:`runtime.memory.MemoryServer` on Ray.

One per runtime, named; it owns the LanceDB tables and the embedding model,
so personas load neither. Its process gets the embedder's thread settings in
its environment (``memory.embed_threads``), and it is where ``memory.embedder:
auto`` is decided: by the packages and the environment of the node it runs on
(``embedder_choice`` reports the outcome).
"""

from __future__ import annotations

from typing import Any

import ray

from coterie.actors.metrics import ray_meter
from coterie.runtime.config import MemorySettings
from coterie.runtime.memory import MemoryServer


class MemoryStoreActor(MemoryServer):
    """:class:`~runtime.memory.MemoryServer` as it runs on Ray: its
    operations counted and timed in Ray metrics (the process shows as
    ``ray::MemoryStoreActor``)."""

    def __init__(self, uri: str, settings: MemorySettings | None = None, **kwargs: Any) -> None:
        super().__init__(uri, settings, meter=ray_meter(), **kwargs)


MemoryStoreActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(
    MemoryStoreActor
)


def get_or_create_memory_store(
    uri: str,
    settings: MemorySettings,
    *,
    name: str,
    namespace: str,
    detached: bool,
    options: dict[str, Any] | None = None,
) -> Any:
    """The named MemoryStore actor, created on first use; ``options`` are more
    Ray actor options (where it runs: ``actors.router.placement_options``)."""
    from coterie.runtime.memory import embedder_process_env

    env = embedder_process_env(settings)
    return MemoryStoreActorRemote.options(  # type: ignore[attr-defined]
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        runtime_env={"env_vars": env} if env else None,
        **(options or {}),
    ).remote(uri, settings)


__all__ = ["MemoryStoreActor", "MemoryStoreActorRemote", "get_or_create_memory_store"]
