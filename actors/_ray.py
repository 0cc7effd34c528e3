"""Ray plumbing shared by the actor shells: names, error translation, links.

Everything here translates between Ray and the plain interfaces of
``runtime``: Ray's exceptions become coterie's (a task error carrying a
coterie error is that error; an unreachable actor is
:class:`~runtime.errors.ActorLostError`), and the policies — retries, caches,
what to do when an actor is gone — stay in ``runtime`` where they are tested
without Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import ray

from runtime.audit import AuditBuffer, Row
from runtime.errors import ActorLostError, CoterieError, ToolError
from runtime.memory.records import IngestResult, MemoryRow, RecallHit, Source, UserModelRow
from runtime.routing import retry_transient

NAMESPACE = "coterie"
#: How long a ping may take before the actor counts as not (yet) reachable.
PING_TIMEOUT = 5.0


# -- names -------------------------------------------------------------------
# Actor names carry a short id derived from the runtime's home, so several
# runtimes (homes) can share one Ray cluster without clashing.


def runtime_id(home: Path) -> str:
    return hashlib.sha1(str(home).encode()).hexdigest()[:10]


def router_name(rid: str) -> str:
    return f"coterie:{rid}:router"


def audit_name(rid: str) -> str:
    return f"coterie:{rid}:audit"


def persona_actor_name(rid: str, persona: str) -> str:
    return f"coterie:{rid}:persona:{persona}"


def memory_name(rid: str) -> str:
    return f"coterie:{rid}:memory"


# -- errors ------------------------------------------------------------------


def unwrap(exc: BaseException) -> BaseException:
    """The coterie (or tool) error inside a Ray task error, else the error itself."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, CoterieError | ToolError) else exc


async def remote(call: Awaitable[Any]) -> Any:
    """Await an actor call: errors raised inside come back as themselves, an
    actor that is gone as :class:`ActorLostError`."""
    try:
        return await call
    except ray.exceptions.RayTaskError as exc:
        raise unwrap(exc) from None
    except ray.exceptions.RayActorError as exc:
        raise ActorLostError(f"{type(exc).__name__}: {exc}") from None


async def read(make_call: Callable[[], Awaitable[Any]]) -> Any:
    """An idempotent actor call (``make_call`` returns its ObjectRef), made
    again while Ray reports the actor unavailable — seen when many actors
    start at once and a connection is slow to come up. Wrap it in
    :func:`remote` to translate the errors that remain."""
    return await retry_transient(make_call, transient=(ray.exceptions.ActorUnavailableError,))


def actor_id(handle: Any) -> str:
    return str(handle._actor_id.hex())


# -- the router and personas -------------------------------------------------


class RayPersonaLink:
    """:class:`~runtime.routing.directory.PersonaLink` over Ray actor handles."""

    def __init__(self, router_name: str, namespace: str) -> None:
        self.router_name = router_name
        self.namespace = namespace
        self._router: Any = None

    async def call_router(self, method: str, *args: Any) -> Any:
        try:
            if self._router is None:
                self._router = ray.get_actor(self.router_name, namespace=self.namespace)
            return await getattr(self._router, method).remote(*args)
        except ray.exceptions.RayTaskError as exc:
            raise unwrap(exc) from None
        except (ray.exceptions.RayActorError, ValueError) as exc:
            # ValueError: no actor of that name (yet) — the router is restarting.
            self._router = None
            raise ActorLostError(f"{type(exc).__name__}: {exc}") from None

    async def call(self, handle: Any, method: Literal["handle", "post"], data: str) -> Any:
        return await remote(getattr(handle, method).remote(data))

    async def ping(self, handle: Any) -> None:
        try:
            await asyncio.wait_for(remote(handle.ping.remote()), PING_TIMEOUT)
        except TimeoutError:
            raise ActorLostError(f"no answer within {PING_TIMEOUT:g} s") from None

    def actor_id(self, handle: Any) -> str:
        return actor_id(handle)


# -- memory ------------------------------------------------------------------


class RayMemoryBackend:
    """:class:`~runtime.memory.client.MemoryBackend` over the MemoryStore actor."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def write(
        self, persona: str, *, category: str, content: str, importance: int
    ) -> MemoryRow:
        row: MemoryRow = await remote(
            self._handle.write.remote(
                persona, category=category, content=content, importance=importance
            )
        )
        return row

    async def update(
        self,
        persona: str,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> MemoryRow:
        row: MemoryRow = await remote(
            self._handle.update.remote(
                persona, memory_id, content=content, category=category, importance=importance
            )
        )
        return row

    async def delete(self, persona: str, memory_id: str) -> None:
        await remote(self._handle.delete.remote(persona, memory_id))

    async def recall(
        self,
        persona: str,
        *,
        query: str = "",
        source: Source = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
    ) -> list[RecallHit]:
        hits: list[RecallHit] = await remote(
            read(
                lambda: self._handle.recall.remote(
                    persona, query=query, source=source, category=category, limit=limit, date=date
                )
            )
        )
        return hits

    async def ingest(self, persona: str, *, source: str, text: str) -> IngestResult:
        result: IngestResult = await remote(
            self._handle.ingest.remote(persona, source=source, text=text)
        )
        return result

    async def write_user_model(
        self, persona: str, *, dimension: str, content: str, confidence: int
    ) -> UserModelRow:
        row: UserModelRow = await remote(
            self._handle.write_user_model.remote(
                persona, dimension=dimension, content=content, confidence=confidence
            )
        )
        return row

    async def user_model(self, persona: str) -> list[UserModelRow]:
        rows: list[UserModelRow] = await remote(
            read(lambda: self._handle.user_model.remote(persona))
        )
        return rows


# -- audit -------------------------------------------------------------------


def audit_buffer_for(
    handle: Any, *, spool_path: str | Path | None = None, **kwargs: Any
) -> AuditBuffer:
    """An :class:`AuditBuffer` whose batches go to the AuditLog actor ``handle``.

    With ``spool_path`` (one per persona, on local disk) rows survive the
    process being killed: a buffer created on the same spool after a restart
    resends them as replayed batches, which the actor deduplicates.
    """

    async def send(rows: list[Row]) -> None:
        await handle.append.remote(rows)

    async def replay(rows: list[Row]) -> None:
        await handle.append.remote(rows, replayed=True)

    return AuditBuffer(send, replay=replay, spool_path=spool_path, **kwargs)


__all__ = [
    "NAMESPACE",
    "RayMemoryBackend",
    "RayPersonaLink",
    "actor_id",
    "audit_buffer_for",
    "audit_name",
    "memory_name",
    "persona_actor_name",
    "read",
    "remote",
    "router_name",
    "runtime_id",
    "unwrap",
]
