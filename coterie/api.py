"""The Python API: :class:`Runtime` starts or joins Ray and talks to personas.

>>> rt = Runtime.start()                      # local Ray, ~/.coterie
>>> print(rt.ask("concierge", "what time is it?").text)
>>> rt.shutdown()

``RAY_ADDRESS`` (or ``address=``) joins an existing cluster; the runtime's
actors are then detached so they outlive this driver.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import ray

from coterie import cluster
from coterie.actors._plugins import builtin_names, env_options
from coterie.actors._ray import (
    RayPersonaLink,
    audit_name,
    memory_backend,
    memory_name,
    read,
    remote,
    router_name,
    runtime_id,
    scheduler_name,
    unwrap,
    upload_runtime_env,
)
from coterie.actors.audit import get_or_create_audit_log
from coterie.actors.memory import get_or_create_memory_store
from coterie.actors.router import (
    RouterActorRemote,
    await_started,
    check_cluster_placement,
    placement_options,
)
from coterie.actors.scheduler import get_or_create_scheduler
from coterie.holder import clear_holder, home_in_use, is_lock_conflict, record_holder
from coterie.runtime import tracing
from coterie.runtime.audit import QueryResult
from coterie.runtime.config import (
    RuntimeSettings,
    load_settings,
    persona_exists,
    persona_names,
    resolve_home,
    with_tracing_resolved,
)
from coterie.runtime.connectors import ConnectorInfo, OutboundMessage
from coterie.runtime.errors import (
    ActorLostError,
    ApprovalClosedError,
    ApprovalError,
    CoterieError,
    DeliveryError,
    UnknownApprovalError,
    UnknownPersonaError,
)
from coterie.runtime.eval.records import RunReport
from coterie.runtime.fires import SchedulerStats
from coterie.runtime.frontdoor import (
    ApprovalInfo,
    PersonaInfo,
    approvals_of,
    approvals_sql,
    valid_approval_id,
)
from coterie.runtime.memory import MemoryClient, RecallHit
from coterie.runtime.memory.choice import EmbedderChoice
from coterie.runtime.messages import (
    ApprovalEvent,
    ChatMessage,
    MessageEnvelope,
    Origin,
    ReplyEnvelope,
    StreamItem,
)
from coterie.runtime.permissions.approvals import ANSWERS
from coterie.runtime.plugins import Plugins, PluginSet, plugin_set
from coterie.runtime.plugins.code import CodePersona, remove_code_persona, write_code_persona
from coterie.runtime.routing import Directory, RouterStatus
from coterie.runtime.schedule.records import ScheduleListing

DEFAULT_ASK_TIMEOUT = 120.0
#: Seconds a status waits for the memory store (it may still be starting).
MEMORY_STATUS_TIMEOUT = 10.0
#: Seconds a status waits for the scheduler (it may be restarting).
SCHEDULER_STATUS_TIMEOUT = 10.0
T = TypeVar("T")


log = logging.getLogger(__name__)


def _plugins_of(home: Path, settings: RuntimeSettings) -> tuple[PluginSet, Plugins]:
    """The home's plugins, loaded here, and as its actors get them: with
    their code uploaded to the cluster when it must be shipped."""
    described, loaded, env = plugin_set(home, settings.plugins, taken=builtin_names())
    with tempfile.TemporaryDirectory(prefix="coterie-plugins-") as scratch:
        uploaded = upload_runtime_env(env, Path(scratch))
    return described.model_copy(update={"runtime_env": uploaded}), loaded


def _dumps_by_value(specs: list[Any]) -> bytes:
    """A code persona's tools pickled with their code, so that a node that
    has not got their module (a notebook's ``__main__``, a script) runs them.
    Installed packages and coterie stay references: every node has them."""
    from ray import cloudpickle

    from coterie.runtime.plugins.refs import outside_installation

    modules = {spec.fn.__module__ for spec in specs} | {
        spec.args_model.__module__ for spec in specs
    }
    by_value = []
    for name in sorted(modules):
        module = sys.modules.get(name)
        if module is None or name == "__main__":
            continue  # cloudpickle pickles __main__'s objects by value already
        file = getattr(module, "__file__", None)
        if file and outside_installation(Path(file)):
            cloudpickle.register_pickle_by_value(module)
            by_value.append(module)
    try:
        return bytes(cloudpickle.dumps(specs))
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)


class Runtime:
    """A handle on one coterie runtime (one home) on a Ray cluster.

    Its ``*_async`` methods make it a :class:`~coterie.runtime.frontdoor.FrontDoor`
    (the facade every door talks to: ``coterie serve``, ``coterie mcp-serve``,
    the connectors); the others are their blocking forms, for scripts.
    """

    def __init__(
        self,
        *,
        home: Path,
        namespace: str,
        owns_ray: bool,
        detached: bool,
        settings: RuntimeSettings | None = None,
    ) -> None:
        self.home = home
        self.namespace = namespace
        self.id = runtime_id(home)
        self._owns_ray = owns_ray
        self.detached = detached
        # Tracing resolved here, against this process's environment: every
        # actor is handed the same endpoint, whatever its node's environment.
        self.settings = with_tracing_resolved(settings or load_settings(home), os.environ)
        tracing.setup(self.settings.tracing, process="driver")
        placement = self.settings.placement
        pinned = [
            (placement.router, "the router"),
            (placement.audit, "the audit log"),
            (placement.memory, "the memory store"),
        ]
        for asked, who in pinned:  # a clear error now, not actors pending forever
            check_cluster_placement(asked, who)
        self.plugins: PluginSet
        self.loaded_plugins: Plugins
        self.plugins, self.loaded_plugins = _plugins_of(home, self.settings)
        self.audit: Any = get_or_create_audit_log(
            str(home / "audit.duckdb"),
            name=audit_name(self.id),
            namespace=namespace,
            detached=detached,
            options=placement_options(placement.audit),
        )
        memory_uri = self.settings.memory.uri or str(home / "memory")
        self.memory: Any = get_or_create_memory_store(
            memory_uri,
            self.settings.memory,
            name=memory_name(self.id),
            namespace=namespace,
            detached=detached,
            options=placement_options(placement.memory),
        )
        # Ray's handle typing does not follow .remote on async methods.
        self.router: Any
        self.router = RouterActorRemote.options(  # type: ignore[attr-defined]
            name=router_name(self.id),
            namespace=namespace,
            get_if_exists=True,
            lifetime="detached" if detached else None,
            **placement_options(placement.router),
            # Its persona actors, and theirs, get the plugins' code from it.
            **env_options(self.plugins),
        ).remote(
            str(home),
            runtime_id=self.id,
            namespace=namespace,
            audit_actor=audit_name(self.id),
            router_actor=router_name(self.id),
            memory_actor=memory_name(self.id),
            settings=self.settings,
            scheduler_actor=scheduler_name(self.id),
            plugins=self.plugins,
        )
        # The scheduler holds <home>/schedule.duckdb, as the audit log holds
        # its file: it runs where the audit log does (the home's node).
        self.scheduler: Any = get_or_create_scheduler(
            str(home),
            self.settings,
            name=scheduler_name(self.id),
            namespace=namespace,
            audit_actor=audit_name(self.id),
            router_actor=router_name(self.id),
            detached=detached,
            options=placement_options(placement.audit),
            plugins=self.plugins,
        )
        # The router, the audit log and the scheduler always: the audit log and
        # the scheduler fail at once when another runtime holds the home's
        # DuckDB files, and say so here rather than in the first turn. The
        # memory store when pinned, since then a full node can leave it pending
        # (unpinned, nothing waits for it: it is slow to start).
        waits = [
            (self.router, placement.router, "the router"),
            (self.audit, placement.audit, "the audit log"),
            (self.scheduler, placement.audit, "the scheduler"),
        ]
        if placement.memory.pinned:
            waits.append((self.memory, placement.memory, "the memory store"))
        try:
            await_started(waits)
        except ray.exceptions.RayActorError as exc:
            if not is_lock_conflict(exc):
                raise
            # A runtime here without its audit log is of no use: what this
            # start made on the cluster goes, so the next start makes it anew.
            for handle in (self.router, self.memory, self.scheduler, self.audit):
                ray.kill(handle, no_restart=True)
            raise home_in_use(home, exc) from None
        self.address: str = ray.get_runtime_context().gcs_address
        record_holder(home, address=self.address, detached=detached)
        self.directory: Directory[Any] = Directory(RayPersonaLink(router_name(self.id), namespace))
        # Sync calls run the async delivery on one background loop.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="coterie-runtime", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(
        cls,
        *,
        home: str | os.PathLike[str] | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        settings: RuntimeSettings | None = None,
    ) -> Runtime:
        """Join ``address`` / ``$RAY_ADDRESS``, reuse an initialized Ray, or start one."""
        home_path = resolve_home(home)
        (home_path / "personas").mkdir(parents=True, exist_ok=True)
        settings = settings or load_settings(home_path)
        address = address or os.environ.get("RAY_ADDRESS") or None
        connection = cluster.connect(address, num_cpus=num_cpus)
        try:
            return cls(
                home=home_path,
                namespace=connection.namespace,
                owns_ray=connection.owns_ray,
                detached=connection.detached,
                settings=settings,
            )
        except BaseException:
            if connection.owns_ray:  # nothing of it is left to use
                ray.shutdown()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- messaging -------------------------------------------------------

    def envelope(
        self,
        persona: str,
        text: str,
        *,
        conversation_id: str | None = None,
        sender: str = "user",
        origin: Origin | None = None,
    ) -> MessageEnvelope:
        return MessageEnvelope(
            sender=sender,
            recipient=persona,
            conversation_id=conversation_id or f"{persona}:api",
            text=text,
            origin=origin or Origin(),
        )

    async def stream_async(self, envelope: MessageEnvelope) -> AsyncIterator[StreamItem]:
        """Deliver ``envelope`` and yield the answering turn's events as they
        happen (text deltas, model and tool calls, the turn's end), then its
        :class:`ReplyEnvelope` (``status == "error"`` when the persona died)."""
        try:
            async for item in self.directory.stream(envelope):
                yield item
        except (ray.exceptions.RayError, DeliveryError) as exc:
            if isinstance(exc, DeliveryError) and type(exc) is not DeliveryError:
                raise
            yield ReplyEnvelope.failure(envelope, sender=envelope.recipient, error=str(unwrap(exc)))

    def stream(self, envelope: MessageEnvelope) -> Iterator[StreamItem]:
        """See :meth:`stream_async` (each item as it comes, from this thread)."""
        items = self.stream_async(envelope)

        async def step() -> tuple[bool, StreamItem | None]:
            try:
                return True, await items.__anext__()
            except StopAsyncIteration:
                return False, None

        while True:
            more, item = self._run(step())
            if not more:
                return
            assert item is not None
            yield item

    async def ask_async(
        self,
        persona: str,
        text: str,
        *,
        conversation_id: str | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT,
    ) -> ReplyEnvelope:
        """Send ``text`` and wait for the persona's reply (``asyncio``).

        Unknown personas and broken persona files raise; a turn that fails
        (or a persona that dies mid-turn) comes back as a reply with
        ``status == "error"`` and the reason in ``error``.
        """
        return await self.deliver_async(
            self.envelope(persona, text, conversation_id=conversation_id), timeout=timeout
        )

    async def deliver_async(
        self, envelope: MessageEnvelope, *, timeout: float = DEFAULT_ASK_TIMEOUT
    ) -> ReplyEnvelope:
        """Deliver ``envelope`` and wait for its reply (see :meth:`ask_async`)."""
        persona = envelope.recipient
        try:
            return await self.directory.ask(envelope, timeout=timeout)
        except TimeoutError:
            raise DeliveryError(f"{persona!r} did not reply within {timeout:g} s") from None
        except (ray.exceptions.RayError, DeliveryError) as exc:
            if isinstance(exc, DeliveryError) and type(exc) is not DeliveryError:
                raise  # QueueFullError and friends: the caller's to handle
            return ReplyEnvelope.failure(envelope, sender=persona, error=str(unwrap(exc)))

    def ask(
        self,
        persona: str,
        text: str,
        *,
        conversation_id: str | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT,
    ) -> ReplyEnvelope:
        """Send ``text`` and wait for the persona's reply (see :meth:`ask_async`)."""
        return self._run(
            self.ask_async(persona, text, conversation_id=conversation_id, timeout=timeout)
        )

    async def post_async(self, envelope: MessageEnvelope) -> None:
        """Deliver ``envelope`` without waiting for its turn (``asyncio``).

        Unknown personas and broken persona files raise, as for
        :meth:`ask_async`; whoever set ``envelope.reply_mode`` decides who
        hears the reply (``"none"``: nobody, it stays in the conversation).
        """
        try:
            await self.directory.post(envelope)
        except ray.exceptions.RayError as exc:
            raise DeliveryError(
                f"could not deliver to {envelope.recipient!r}: {unwrap(exc)}"
            ) from None

    def send(self, persona: str, text: str, *, conversation_id: str | None = None) -> None:
        """Queue ``text`` for the persona without waiting for its turn."""
        envelope = self.envelope(persona, text, conversation_id=conversation_id)
        envelope.reply_mode = "none"
        self._run(self.post_async(envelope))

    async def wait_settled_async(
        self, persona: str, conversation_id: str, *, timeout: float = DEFAULT_ASK_TIMEOUT
    ) -> None:
        """Wait until the conversation has nothing in flight: no turn running
        or queued, and no delegated work (subagents, coding agents) still to
        report back — so its wake turns have run too."""
        deadline = time.monotonic() + timeout
        while True:
            handle = await self.directory.resolve(persona)
            try:
                if await remote(handle.settled.remote(conversation_id)):
                    return
            except ActorLostError:
                self.directory.forget(persona)
            if time.monotonic() >= deadline:
                raise DeliveryError(
                    f"{persona!r} still has work in flight on {conversation_id!r} "
                    f"after {timeout:g} s"
                )
            await asyncio.sleep(0.1)

    def wait_settled(
        self, persona: str, conversation_id: str, *, timeout: float = DEFAULT_ASK_TIMEOUT
    ) -> None:
        """See :meth:`wait_settled_async`."""
        self._run(self.wait_settled_async(persona, conversation_id, timeout=timeout))

    async def personas_async(self, offset: int = 0, limit: int | None = None) -> list[PersonaInfo]:
        """Name, description and activity of the personas in the home, by
        name: all of them, or the page ``offset``/``limit``."""
        rows: list[tuple[str, str, bool]] = await self.directory.call_router(
            "persona_rows", offset, limit
        )
        return [PersonaInfo(name=n, description=d, active=a) for n, d, a in rows]

    def personas(self, offset: int = 0, limit: int | None = None) -> list[PersonaInfo]:
        """See :meth:`personas_async`."""
        return self._run(self.personas_async(offset, limit))

    async def persona_count_async(self) -> int:
        """How many personas the home holds."""
        count: int = await self.directory.call_router("count")
        return count

    # -- personas defined in code, and plugins -----------------------------

    def register(self, persona: CodePersona) -> Runtime:
        """Add (or replace) a persona defined in code (``coterie.Persona``):
        it is written into the home as a persona directory, its own tools
        pickled with their code, so that it is as virtual as any other —
        started by its first message on any node, listed, served, evaluated.
        A running persona of that name is stopped, so that its next message
        meets the new definition. Returns the runtime, to chain calls."""
        persona.check_names([*self.plugins.builtin_tools, *self.plugins.tool_plugins])
        write_code_persona(self.home, persona, _dumps_by_value)
        self._run(self._stop_persona(persona.name))
        return self

    def unregister(self, name: str) -> bool:
        """Remove a persona :meth:`register` added (its workspace too); False
        when there is none. A persona written by hand is refused."""
        self._run(self._stop_persona(name))
        return remove_code_persona(self.home, name)

    async def _stop_persona(self, name: str) -> None:
        await self.directory.call_router("stop_persona", name)
        self.directory.forget(name)

    async def plugins_async(self) -> dict[str, Any]:
        """The plugins of this runtime (:attr:`plugins` as JSON, without the
        runtime environment): what each provides, what failed to load."""
        return self.plugins.model_dump(mode="json", exclude={"runtime_env"})

    def eval(
        self,
        task: str | os.PathLike[str],
        *,
        persona: str | None = None,
        model: str | None = None,
        limit: int | None = None,
        epochs: int | None = None,
        workers: int | None = None,
        run_id: str | None = None,
    ) -> RunReport:
        """Run an eval task file on this runtime's cluster, as ``coterie eval``
        does (recorded in ``<home>/evals.duckdb``), and return its report.
        ``persona`` may name a persona :meth:`register` added."""
        from coterie.evals import execute
        from coterie.runtime.eval.plan import RunOptions, plan_run
        from coterie.runtime.eval.store import open_store

        options = RunOptions(persona=persona, model=model, limit=limit, epochs=epochs)
        store = open_store(self.home)
        try:
            plan = plan_run(
                Path(task), self.home, store, options, run_id=run_id, plugins=self.loaded_plugins
            )
            self._run(execute(plan, self, store, workers=workers))
            return store.report(plan.run.run_id)
        finally:
            store.close()

    # -- memory ----------------------------------------------------------

    async def recall_async(
        self, persona: str, query: str = "", *, limit: int = 8
    ) -> list[RecallHit]:
        """The persona's long-term memory hits for ``query``, best first: what
        its own ``recall`` tool would find (memories and ingested knowledge).
        An empty query lists its most important and recent memories.

        Unknown personas raise :class:`UnknownPersonaError`; the persona's
        actor is not started for this (the memory store answers).
        """
        if not await asyncio.to_thread(persona_exists, self.home, persona):
            raise UnknownPersonaError(persona, await asyncio.to_thread(persona_names, self.home))
        client = MemoryClient(memory_backend(self.memory), persona)
        return await client.recall(query=query, limit=limit)

    def recall(self, persona: str, query: str = "", *, limit: int = 8) -> list[RecallHit]:
        """See :meth:`recall_async`."""
        return self._run(self.recall_async(persona, query, limit=limit))

    # -- audit -----------------------------------------------------------

    async def _audit_async(self, method: str, *args: Any) -> Any:
        """Call the audit log; these calls are safe to repeat, so they are made
        again while Ray reports the actor unavailable (it is restarting)."""
        return await remote(read(lambda: getattr(self.audit, method).remote(*args)))

    def _audit(self, method: str, *args: Any) -> Any:
        return self._run(self._audit_async(method, *args))

    async def flush_async(self) -> None:
        """Push every buffered audit event into DuckDB (the personas' and the
        scheduler's), and every process's batched spans to the receiver."""
        await self.directory.call_router("flush_all")
        traced = tracing.tracer()
        if traced.enabled:  # this process's spans (a server's requests, eval samples)
            await asyncio.to_thread(traced.flush)
        try:
            await remote(read(lambda: self.scheduler.flush.remote()))
        except CoterieError as exc:  # restarting: its spool keeps the events for later
            log.warning("the scheduler's audit events could not be flushed now: %s", exc)
        await self._audit_async("flush")

    def flush(self) -> None:
        """See :meth:`flush_async`."""
        self._run(self.flush_async())

    async def query_async(self, sql: str) -> QueryResult:
        """Run a read-only SQL query on the audit store (after a flush)."""
        await self.flush_async()
        result: QueryResult = await self._audit_async("query", sql)
        return result

    def query(self, sql: str) -> QueryResult:
        """See :meth:`query_async`."""
        return self._run(self.query_async(sql))

    async def history_async(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """A conversation's messages as the audit log holds them, oldest first."""
        await self.flush_async()
        messages: list[ChatMessage] = await self._audit_async("history", persona, conversation_id)
        return messages

    def history(self, persona: str, conversation_id: str) -> list[ChatMessage]:
        """See :meth:`history_async`."""
        return self._run(self.history_async(persona, conversation_id))

    async def status_async(self) -> dict[str, Any]:
        """What runs: active personas and their queues, connectors, the audit
        log's backlog, the memory store, the scheduler and the Ray cluster."""
        router: RouterStatus = await self.directory.call_router("status")
        audit = await self._audit_async("stats")
        resources = ray.cluster_resources()
        return {
            "home": str(self.home),
            "runtime_id": self.id,
            "ray": {
                "address": ray.get_runtime_context().gcs_address,
                "nodes": len([n for n in ray.nodes() if n.get("Alive")]),
                "cpus": resources.get("CPU", 0),
            },
            "personas": {
                "registered": router.registered,
                "active": [p.model_dump() for p in router.active],
                "unresponsive": router.unresponsive,
                "activating": router.activating,
                "waiting_to_start": router.waiting_to_start,
                "start_limit": router.start_limit,
            },
            "connectors": [c.model_dump() for c in router.connectors],
            "outbound_waiting": router.outbound_waiting,
            "audit": audit.model_dump(),
            "memory": await self._memory_status(),
            "scheduler": await self._scheduler_status(),
            "plugins": await self.plugins_async(),
        }

    def status(self) -> dict[str, Any]:
        """See :meth:`status_async`."""
        return self._run(self.status_async())

    async def _scheduler_status(self) -> dict[str, Any]:
        """The scheduler's counters, or why there are none (it may be restarting)."""
        try:
            stats: SchedulerStats = await asyncio.wait_for(
                remote(read(lambda: self.scheduler.stats.remote())), SCHEDULER_STATUS_TIMEOUT
            )
        except TimeoutError:
            return {"error": f"the scheduler did not answer within {SCHEDULER_STATUS_TIMEOUT:g} s"}
        except CoterieError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return stats.model_dump(mode="json")

    # -- schedules -------------------------------------------------------

    async def schedules_async(self, persona: str | None = None) -> ScheduleListing:
        """Every heartbeat, cron entry and pending reminder (of one persona):
        next fires in their zones, last outcomes, paused queues, file errors.
        Unknown personas raise :class:`UnknownPersonaError`."""
        if persona is not None and not await asyncio.to_thread(persona_exists, self.home, persona):
            raise UnknownPersonaError(persona, await asyncio.to_thread(persona_names, self.home))
        listing: ScheduleListing = await remote(
            read(lambda: self.scheduler.listing.remote(persona))
        )
        return listing

    def schedules(self, persona: str | None = None) -> ScheduleListing:
        """See :meth:`schedules_async`."""
        return self._run(self.schedules_async(persona))

    # -- approvals -------------------------------------------------------

    async def approvals_async(
        self, persona: str | None = None, state: str | None = "pending"
    ) -> list[ApprovalInfo]:
        """The approvals permission rules asked for (of one persona, in one
        state; ``None``: all), oldest first, from the audit log."""
        return approvals_of(await self.query_async(approvals_sql(persona, state)))

    def approvals(
        self, persona: str | None = None, state: str | None = "pending"
    ) -> list[ApprovalInfo]:
        """See :meth:`approvals_async`."""
        return self._run(self.approvals_async(persona, state))

    async def decide_approval_async(
        self, approval_id: str, answer: str, *, by: str | None = None, via: str = "api"
    ) -> ApprovalInfo:
        """Answer an approval (``approve``, ``deny``, ``always``): the paused
        call runs or is refused and its turn goes on — after a restart too
        (the persona is started and resumes the turn). Raises
        :class:`UnknownApprovalError` or :class:`ApprovalClosedError`."""
        if answer not in ANSWERS:
            raise ApprovalError(f"answer must be one of {', '.join(ANSWERS)}, not {answer!r}")
        found = []
        if valid_approval_id(approval_id):
            found = approvals_of(await self.query_async(approvals_sql(approval_id=approval_id)))
        if not found:
            raise UnknownApprovalError(f"no approval {approval_id!r}")
        info = found[0]
        if info.state != "pending":
            raise ApprovalClosedError(f"approval {approval_id} is {info.state} already")
        data = json.dumps({"id": approval_id, "answer": answer, "by": by, "via": via})
        decided = ApprovalEvent.model_validate_json(
            await self.directory.call_router("decide_approval", info.persona, data)
        )
        return info.model_copy(
            update={
                "state": decided.state,
                "decided_by": decided.decided_by,
                "via": decided.via,
                "decided": datetime.fromtimestamp(decided.ts, UTC).replace(tzinfo=None),
            }
        )

    def decide_approval(
        self, approval_id: str, answer: str, *, by: str | None = None, via: str = "api"
    ) -> ApprovalInfo:
        """See :meth:`decide_approval_async`."""
        return self._run(self.decide_approval_async(approval_id, answer, by=by, via=via))

    async def _memory_status(self) -> dict[str, Any]:
        """The memory store's embedder and why it was chosen — or why there is
        none: a status reports a store that cannot open instead of failing."""
        try:
            choice: EmbedderChoice = await asyncio.wait_for(
                remote(read(lambda: self.memory.embedder_choice.remote())),
                MEMORY_STATUS_TIMEOUT,
            )
        except TimeoutError:
            return {
                "embedder": None,
                "error": f"the memory store did not answer within {MEMORY_STATUS_TIMEOUT:g} s",
            }
        except Exception as exc:  # reported in the status, e.g. minilm not installed
            return {"embedder": None, "error": f"{type(exc).__name__}: {exc}"}
        return {"embedder": choice.model_dump(), "description": choice.describe()}

    # -- the connectors' outbox (the router holds it) ---------------------

    async def connectors_register_async(self, infos: list[ConnectorInfo]) -> None:
        await self.directory.call_router("connectors_register", infos)

    async def connectors_unregister_async(self, ids: list[str]) -> None:
        await self.directory.call_router("connectors_unregister", ids)

    async def connector_take_async(self, connector_id: str, wait: float) -> list[OutboundMessage]:
        messages: list[OutboundMessage] = await self.directory.call_router(
            "connector_take", connector_id, wait
        )
        return messages

    # -- lifecycle -------------------------------------------------------

    def shutdown(self, *, stop_actors: bool | None = None) -> None:
        """Flush everything; stop this runtime's actors unless they are detached.

        Shuts Ray down too when this runtime started it.
        """
        stop = (not self.detached) if stop_actors is None else stop_actors
        try:
            try:
                if stop:  # no fire starts a turn from now on; its file is let go of
                    ray.get(self.scheduler.shutdown.remote())
                else:
                    ray.get(self.scheduler.flush.remote())
            except ray.exceptions.RayError as exc:  # gone or restarting: stop the rest anyway
                log.warning("the scheduler could not be stopped cleanly: %s", unwrap(exc))
            # The router may be restarting; its calls are safe to repeat.
            self._run(self.directory.call_router("flush_all"))
            if stop:
                self._run(self.directory.call_router("stop_all"))
            self._audit("flush")
            if stop:
                ray.get(self.audit.shutdown.remote())
                ray.kill(self.audit)
                ray.kill(self.memory)
                ray.kill(self.scheduler)
                ray.kill(self.router)
                clear_holder(self.home, address=self.address)
        finally:
            # This process's batched spans (an eval run's samples are traced here).
            tracing.tracer().flush()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if self._owns_ray:
                ray.shutdown()


__all__ = ["Runtime"]
