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
import gc
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import ray

from coterie.actors.metrics import ray_meter
from coterie.runtime.audit import AuditBuffer, Row
from coterie.runtime.errors import ActorLostError, CoterieError, ToolError
from coterie.runtime.memory import MemoryBackend
from coterie.runtime.metrics import EventMetrics
from coterie.runtime.routing import retry_transient

if TYPE_CHECKING:
    from coterie.runtime.schedule.service import SchedulerService

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


def scheduler_name(rid: str) -> str:
    return f"coterie:{rid}:scheduler"


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


def cluster_addresses() -> frozenset[str]:
    """The IP addresses of the Ray cluster's nodes (tools must not reach them)."""
    return frozenset(
        str(node["NodeManagerAddress"]) for node in ray.nodes() if node.get("NodeManagerAddress")
    )


#: Allocations (net of frees) of tracked objects before a young collection.
YOUNG_COLLECTION_AFTER = 5000


def freeze_heap() -> int:
    """Exempt every object alive now from the cyclic collector; how many are.

    A persona process holds ~150,000 long-lived objects (Ray, pydantic, the
    provider SDK, our modules). Without this, each full collection walks all
    of them: ~90 ms of CPU every few dozen turns on this box, which tripled
    the persona CPU of one burst in four. Called once the process is set up
    and again once its first turn has loaded the SDK; objects frozen then
    stay (modules, classes, the client), which is what they would do anyway.

    It also lets the young generation grow to :data:`YOUNG_COLLECTION_AFTER`
    objects before it is collected (Python's default is 700). A turn's
    objects are freed by their reference counts, not by the collector (a
    busy OpenAI persona's collections found nothing to free), yet at 700 a
    persona ran a collection every four turns and a full one every ~500:
    0.082 ms of CPU per turn, against 0.006 ms at 5,000
    (``benchmarks/turn_cpu.py``, its collector rows).
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_AFTER, older, oldest)
    return gc.get_freeze_count()


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

    async def stream(self, handle: Any, data: str) -> AsyncIterator[str]:
        try:
            async for ref in handle.stream.remote(data):
                yield await ref
        except ray.exceptions.RayTaskError as exc:
            raise unwrap(exc) from None
        except ray.exceptions.RayActorError as exc:
            raise ActorLostError(f"{type(exc).__name__}: {exc}") from None

    async def ping(self, handle: Any) -> None:
        try:
            await asyncio.wait_for(remote(handle.ping.remote()), PING_TIMEOUT)
        except TimeoutError:
            raise ActorLostError(f"no answer within {PING_TIMEOUT:g} s") from None

    def actor_id(self, handle: Any) -> str:
        return actor_id(handle)


# -- plain calls -------------------------------------------------------------


class ActorProxy:
    """An actor handle whose methods are awaited like a plain object's:
    ``await proxy.method(*args)`` is ``handle.method.remote(*args)`` with the
    errors translated by :func:`remote`.

    Methods named in ``reads`` are safe to repeat and retried while Ray says
    the actor is unavailable (see :func:`read`). An actor whose class is a
    plain ``runtime`` class (``MemoryServer``) serves, through its proxy, the
    same interface as the class in-process.
    """

    def __init__(self, handle: Any, *, reads: frozenset[str] = frozenset()) -> None:
        self._handle = handle
        self._reads = reads

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        bound = getattr(self._handle, method)
        repeatable = method in self._reads

        async def call(*args: Any, **kwargs: Any) -> Any:
            if repeatable:
                return await remote(read(lambda: bound.remote(*args, **kwargs)))
            return await remote(bound.remote(*args, **kwargs))

        call.__name__ = method
        return call


class NamedActorProxy(ActorProxy):
    """An :class:`ActorProxy` over the actor named ``name``, its handle made
    on the first call. Ray imports an actor's class module (and all that
    module imports) in every process that makes a handle to it: a persona
    that never gets a fire or sets a reminder does not load the scheduler's
    engine, store and actor. A name no actor holds (any more) is an
    :class:`ActorLostError` at the call, which the callers handle as any
    unreachable actor."""

    def __init__(self, name: str, namespace: str, *, reads: frozenset[str] = frozenset()) -> None:
        super().__init__(None, reads=reads)
        self._name = name
        self._namespace = namespace

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("__"):  # copy, pickle and the like: not the actor's
            raise AttributeError(method)
        if self._handle is None:
            try:
                self._handle = ray.get_actor(self._name, namespace=self._namespace)
            except ValueError:
                raise ActorLostError(f"no actor {self._name!r} is running") from None
        return super().__getattr__(method)


def scheduler_service(name: str, namespace: str) -> SchedulerService:
    """The Scheduler actor named ``name`` as the :class:`SchedulerService` a
    persona's turns use (its errors translated; a listing is retried while
    the actor restarts, since it is safe to repeat); its handle is made on
    the first call (:class:`NamedActorProxy`)."""
    proxy = NamedActorProxy(name, namespace, reads=frozenset({"listing"}))
    return cast("SchedulerService", proxy)


def memory_backend(handle: Any) -> MemoryBackend:
    """The MemoryStore actor as the :class:`~runtime.memory.MemoryBackend` a
    persona's :class:`~runtime.memory.MemoryClient` talks to."""
    return cast(MemoryBackend, ActorProxy(handle, reads=frozenset({"recall", "user_model"})))


# -- audit -------------------------------------------------------------------


def audit_buffer_for(
    handle: Any, *, spool_path: str | Path | None = None, **kwargs: Any
) -> AuditBuffer:
    """An :class:`AuditBuffer` whose batches go to the AuditLog actor ``handle``.

    With ``spool_path`` (one per persona, on local disk) rows survive the
    process being killed: a buffer created on the same spool after a restart
    resends them as replayed batches, which the actor deduplicates. Its
    events are counted in Ray metrics (``observer=``: an
    :class:`~runtime.metrics.EventMetrics` of one's own, with gauges).
    """

    async def send(rows: list[Row]) -> None:
        await handle.append.remote(rows)

    async def replay(rows: list[Row]) -> None:
        await handle.append.remote(rows, replayed=True)

    # Every event recorded is counted in the process's Ray metrics.
    kwargs.setdefault("observer", EventMetrics(ray_meter()))
    return AuditBuffer(send, replay=replay, spool_path=spool_path, **kwargs)


def upload_runtime_env(env: dict[str, Any] | None, scratch: Path) -> dict[str, Any] | None:
    """``env`` (local paths, from :func:`runtime.plugins.shipping.runtime_env_for`)
    with its ``py_modules`` uploaded to the cluster: an actor's own runtime
    environment may name only URIs, local paths being a job's. Uploading the
    same files again reuses what is there (the URI is their content's hash)."""
    if not env or not env.get("py_modules"):
        return env
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    scratch.mkdir(parents=True, exist_ok=True)
    uploaded: dict[str, Any] = upload_py_modules_if_needed(
        dict(env), include_gitignore=True, scratch_dir=str(scratch)
    )
    return uploaded


__all__ = [
    "NAMESPACE",
    "ActorProxy",
    "NamedActorProxy",
    "RayPersonaLink",
    "actor_id",
    "audit_buffer_for",
    "audit_name",
    "cluster_addresses",
    "freeze_heap",
    "memory_backend",
    "memory_name",
    "persona_actor_name",
    "read",
    "remote",
    "router_name",
    "runtime_id",
    "scheduler_name",
    "scheduler_service",
    "unwrap",
    "upload_runtime_env",
]
