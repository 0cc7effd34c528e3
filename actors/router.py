"""The Router actor: :class:`runtime.routing.Router` on Ray.

The router's logic — the roster, activating a persona once however many ask,
passivation bookkeeping — is the plain :class:`~runtime.routing.Router`;
this module only says how persona actors are started, asked and stopped on
Ray (:class:`RayPersonaHost`) and finds the persona actors of its runtime by
name when stopping everything.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import ray

from coterie.actors._plugins import builtin_names, env_options, load_here
from coterie.actors._ray import actor_id, persona_actor_name, remote
from coterie.actors.mcp import new_server_actor
from coterie.actors.metrics import ray_meter
from coterie.actors.persona import PersonaActorRemote
from coterie.runtime import tracing
from coterie.runtime.config import (
    Persona,
    Placement,
    RuntimeSettings,
    load_persona,
    runtime_timezone,
)
from coterie.runtime.connectors import ConnectorInfo, OutboundMessage
from coterie.runtime.errors import PlacementError
from coterie.runtime.mcp.records import McpLaunch
from coterie.runtime.messages import PersonaStats
from coterie.runtime.permissions.gate import persona_gate
from coterie.runtime.plugins import PluginSet
from coterie.runtime.plugins.report import check_missing, tools_of_persona
from coterie.runtime.routing import Router, RouterStatus
from coterie.runtime.routing.placement import check_placement, start_timeout_message
from coterie.runtime.usage.budget import BudgetLedger, PersonaBudgets, spent_sql


def placement_options(placement: Placement) -> dict[str, Any]:
    """The ``.options()`` of an actor that must run where ``placement`` says:
    custom ``resources`` held while it lives, a ``label_selector`` of exact values."""
    options: dict[str, Any] = {}
    if placement.resources:
        options["resources"] = dict(placement.resources)
    if placement.node_labels:
        options["label_selector"] = dict(placement.node_labels)
    return options


def await_started(actors: list[tuple[Any, Placement, str]]) -> None:
    """Wait (blocking) until each ``(handle, placement, who)`` actor is up,
    each for its ``placement.start_timeout``; one still pending (its nodes
    are full) is stopped and raises :class:`PlacementError` — it never ran,
    so nothing is lost, and the next start places it anew."""
    began = time.monotonic()
    waits = [(handle.__ray_ready__.remote(), handle, p, who) for handle, p, who in actors]
    for ref, handle, placement, who in waits:
        left = began + placement.start_timeout - time.monotonic()
        try:
            ray.get(ref, timeout=max(left, 0.0))
        except ray.exceptions.GetTimeoutError:
            ray.kill(handle, no_restart=True)
            raise PlacementError(start_timeout_message(placement, who)) from None


def default_start_limit() -> int:
    """Persona actors to start at a time when ``runtime.yaml`` does not say:
    the cluster's CPUs (a GCS call), at least 2. Starting more at once only
    makes each start take longer."""
    return max(2, int(ray.cluster_resources().get("CPU", 0)))


def check_persona(persona: Persona, settings: RuntimeSettings, plugins: PluginSet | None) -> None:
    """Raise what would stop the persona's actor: the :class:`PersonaConfigError`
    of its permission rules (persona.yaml, approved.yaml, runtime.yaml), and
    under ``plugins.strict`` the :class:`PluginError` of a tool it names that
    no built-in, plugin or code tool provides. (A model provider no plugin
    registers failed reading its file: this process loaded the plugins.)"""
    plugins = plugins or PluginSet()
    builtin = builtin_names()
    found = tools_of_persona(
        persona.config.tools,
        persona.path,
        builtin=builtin,
        plugin_tools=plugins.tool_plugins,
        problems=plugins.problems,
    )
    known = [*builtin, *found.plugin_tools, *plugins.tool_plugins]
    persona_gate(persona, settings.permissions, known_tools=known, desk=None)
    if plugins.strict:
        check_missing(persona.name, found, strict=True)


def check_cluster_placement(placement: Placement, who: str) -> None:
    """:func:`~runtime.routing.placement.check_placement` against the alive
    nodes of the cluster (a GCS call: run it off an event loop)."""
    if placement.pinned:
        check_placement(placement, ray.nodes(), who)


class RayPersonaHost:
    """:class:`~runtime.routing.PersonaHost` for PersonaActors."""

    def __init__(
        self,
        home: Path,
        *,
        runtime_id: str,
        namespace: str,
        audit_actor: str,
        router_actor: str,
        memory_actor: str,
        settings: RuntimeSettings,
        scheduler_actor: str | None = None,
        plugins: PluginSet | None = None,
    ) -> None:
        self.home = home
        self.plugins = plugins
        self.runtime_id = runtime_id
        self.namespace = namespace
        self.audit_actor = audit_actor
        self.router_actor = router_actor
        self.memory_actor = memory_actor
        self.scheduler_actor = scheduler_actor
        self.settings = settings
        #: The placement each persona's actor was started with (Ray keeps it
        #: for the actor's restarts).
        self.placements: dict[str, Placement] = {}

    async def start(self, name: str, roster: list[tuple[str, str]]) -> Any:
        persona = load_persona(self.home, name)
        # Rules that would not load stop it here, with their own error (its
        # actor would fail to start on them).
        check_persona(persona, self.settings, self.plugins)
        placement = persona.config.placement
        self.placements[name] = placement
        who = f"persona {name!r}"
        # Ray would leave an actor no node can hold pending forever.
        await asyncio.to_thread(check_cluster_placement, placement, who)
        handle: Any = PersonaActorRemote.options(  # type: ignore[attr-defined]
            name=persona_actor_name(self.runtime_id, name),
            namespace=self.namespace,
            get_if_exists=True,
            # Detached, so a persona is not owned by (and does not die with)
            # the router; stop_all and passivation end them.
            lifetime="detached",
            **placement_options(placement),
            # The plugins' code, on whichever node it lands.
            **env_options(self.plugins),
        ).remote(
            name,
            str(self.home),
            audit_actor=self.audit_actor,
            router_actor=self.router_actor,
            memory_actor=self.memory_actor,
            namespace=self.namespace,
            roster=roster,
            settings=self.settings,
            scheduler_actor=self.scheduler_actor,
            plugins=self.plugins,
        )
        # Bounded only when pinned: an unpinned persona fits any node, so a slow
        # start is load (a hundred starting at once), not a placement no node
        # has room for.
        limit = placement.start_timeout if placement.pinned else None
        try:
            await asyncio.wait_for(remote(handle.ping.remote()), limit)
        except TimeoutError:
            # Still pending (its nodes are full): stop it, so that the next
            # message places it anew, with the persona's placement as it is then.
            ray.kill(handle, no_restart=True)
            raise PlacementError(start_timeout_message(placement, who)) from None
        return handle

    async def deliver(self, handle: Any, data: str) -> str:
        reply: str = await remote(handle.handle.remote(data))
        return reply

    async def prepare_passivation(self, handle: Any, idle_timeout: float) -> bool:
        ready: bool = await remote(handle.prepare_passivation.remote(idle_timeout))
        return ready

    async def flush(self, handle: Any) -> None:
        await remote(handle.flush.remote())

    async def shutdown(self, handle: Any) -> None:
        await remote(handle.shutdown.remote())

    async def activity(self, handle: Any) -> PersonaStats:
        stats: PersonaStats = await remote(handle.activity.remote())
        return stats

    def stop(self, handle: Any) -> None:
        ray.kill(handle, no_restart=True)

    def actor_id(self, handle: Any) -> str:
        return actor_id(handle)

    def named_personas(self) -> dict[str, Any]:
        """Every live persona actor of this runtime, found by name."""
        prefix = persona_actor_name(self.runtime_id, "")
        found: dict[str, Any] = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] == self.namespace and entry["name"].startswith(prefix):
                try:
                    found[entry["name"][len(prefix) :]] = ray.get_actor(
                        entry["name"], namespace=self.namespace
                    )
                except ValueError:
                    continue  # gone meanwhile
        return found


class RouterActor:
    """Activates, tracks and passivates the persona actors of one runtime."""

    def __init__(
        self,
        home: str,
        *,
        runtime_id: str,
        namespace: str,
        audit_actor: str,
        router_actor: str,
        memory_actor: str,
        settings: RuntimeSettings,
        scheduler_actor: str | None = None,
        plugins: PluginSet | None = None,
    ) -> None:
        # Before the roster reads a persona file: their providers are registered.
        load_here(plugins)
        # Once per process; a no-op tracer (no SDK imported) unless tracing is on.
        tracing.setup(
            settings.tracing, process="router", attributes={"coterie.runtime": runtime_id}
        )
        self.runtime_id = runtime_id
        self.host = RayPersonaHost(
            Path(home),
            runtime_id=runtime_id,
            namespace=namespace,
            audit_actor=audit_actor,
            router_actor=router_actor,
            memory_actor=memory_actor,
            settings=settings,
            scheduler_actor=scheduler_actor,
            plugins=plugins,
        )
        self.router: Router[Any] = Router(
            Path(home),
            self.host,
            idle_timeout=settings.idle_timeout,
            start_limit=settings.max_starting_personas or default_start_limit(),
            on_change=lambda live: ray_meter().gauge(
                "coterie_personas_live", live, {"runtime": runtime_id}
            ),
        )
        # After a restart the persona actors are still running: take them on,
        # so that flushing, passivating and stopping reach them.
        self.router.adopt(self.host.named_personas())
        self._mcp_shared: dict[str, tuple[McpLaunch, Any]] = {}
        # The runtime's budgets: every persona's model calls reserve here.
        self._audit_actor = audit_actor
        self._namespace = namespace
        self.budgets = BudgetLedger(
            runtime=settings.budget,
            limits_of=PersonaBudgets(Path(home)),
            spent_since=self._spent_since,
            tz=runtime_timezone(),
        )

    async def _spent_since(self, payer: str | None, since: datetime) -> float:
        audit = ray.get_actor(self._audit_actor, namespace=self._namespace)
        result = await remote(audit.query.remote(spent_sql(payer, since)))
        return float(result.rows[0][0] or 0.0)

    async def budget_reserve(
        self,
        payer: str,
        amount: float | None,
        model: str,
        persona: str,
        conversation_id: str,
    ) -> str | None:
        """Hold a model call's worst-case cost (see runtime.usage.budget)."""
        reservation = await self.budgets.reserve(
            payer, amount, model=model, persona=persona, conversation_id=conversation_id
        )
        return reservation.ticket

    async def budget_settle(self, ticket: str, cost: float | None) -> list[str]:
        """Settle a held call; the warnings due, as JSON."""
        return [w.model_dump_json() for w in await self.budgets.settle(ticket, cost)]

    async def budget_charge(
        self, payer: str, cost: float, persona: str, conversation_id: str
    ) -> list[str]:
        """Count a cost spent without a reservation; the warnings due, as JSON."""
        warnings = await self.budgets.charge(
            payer, cost, persona=persona, conversation_id=conversation_id
        )
        return [w.model_dump_json() for w in warnings]

    async def resolve(self, name: str, trace: dict[str, str] | None = None) -> Any:
        """The actor handle of persona ``name``, activating it if needed
        (traced as a child of ``trace``, the caller's context)."""
        handle = await self.router.resolve(name, trace)
        # A pinned persona whose nodes are all gone: say so now. Its actor,
        # waiting to restart, would hold a new caller's messages until one is back.
        placement = self.host.placements.get(name)
        if placement is not None and placement.pinned:
            await asyncio.to_thread(check_cluster_placement, placement, f"persona {name!r}")
        return handle

    async def decide_approval(self, persona: str, data: str) -> str:
        """Answer an approval of ``persona`` (activating it: an approval
        answered after a restart resumes its turn); the decided event (JSON)."""
        handle = await self.resolve(persona)
        result: str = await remote(handle.decide_approval.remote(data))
        return result

    async def deliver(self, data: str) -> str:
        """Deliver an envelope (JSON) through the router; the reply (JSON)."""
        return await self.router.deliver(data)

    async def passivate(self, name: str) -> bool:
        """Stop persona ``name``'s actor if it is still idle (it asked for this)."""
        return await self.router.passivate(name)

    async def was_passivated(self, actor_id: str) -> bool:
        return self.router.was_passivated(actor_id)

    async def active(self) -> list[str]:
        return self.router.active()

    async def persona_rows(
        self, offset: int = 0, limit: int | None = None
    ) -> list[tuple[str, str, bool]]:
        return await self.router.persona_rows(offset, limit)

    async def count(self) -> int:
        return self.router.count()

    async def flush_all(self) -> int:
        flushed = await self.router.flush_all()
        traced = tracing.tracer()
        if traced.enabled:  # its own spans too (on a thread: the export blocks)
            await asyncio.to_thread(traced.flush)
        return flushed

    async def stop_persona(self, name: str) -> bool:
        return await self.router.stop(name)

    async def stop_all(self) -> int:
        """Stop every persona actor of this runtime, those this router did not
        start too (it may have been restarted)."""
        return await self.router.stop_all(self.host.named_personas())

    async def status(self) -> RouterStatus:
        return await self.router.status()

    # -- the connectors' outbox (coterie serve takes, personas' tools put) --

    async def connectors_register(self, infos: list[ConnectorInfo]) -> None:
        self.router.outbox.register(infos)

    async def connectors_unregister(self, ids: list[str]) -> None:
        self.router.outbox.unregister(ids)

    async def connectors(self) -> list[ConnectorInfo]:
        return self.router.outbox.connectors()

    async def connector_put(self, message: OutboundMessage) -> None:
        self.router.outbox.put(message)

    async def connector_take(self, connector_id: str, wait: float) -> list[OutboundMessage]:
        return await self.router.outbox.take(connector_id, wait)

    # -- MCP servers every persona shares (shared: true in <home>/mcp.json) --

    async def mcp_shared(self, launch: str) -> Any:
        """The McpServer actor of a shared server (``launch``: its McpLaunch as
        JSON), started on first use and owned by the router. An entry whose
        configuration changed gets a new actor; the old one is stopped."""
        parsed = McpLaunch.model_validate_json(launch)
        current = self._mcp_shared.get(parsed.name)
        if current is not None and current[0] == parsed:
            return current[1]
        if current is not None:
            ray.kill(current[1])
        handle = new_server_actor(parsed)
        self._mcp_shared[parsed.name] = (parsed, handle)
        return handle

    async def ping(self) -> str:
        return self.runtime_id


RouterActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(RouterActor)

__all__ = [
    "RayPersonaHost",
    "RouterActor",
    "RouterActorRemote",
    "await_started",
    "check_cluster_placement",
    "check_persona",
    "default_start_limit",
    "placement_options",
]
