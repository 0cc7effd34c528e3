"""The Persona actor: a Ray shell over :class:`runtime.persona.PersonaRuntime`.

It wires the plain runtime to its Ray services — the audit buffer (with a
spool on local disk), the directory of other personas, the memory client and
the ShellProcess actors — and lets an :class:`~runtime.routing.IdleWatcher`
ask the router for passivation. Envelopes cross actor boundaries as JSON
through their TypeAdapter: several times cheaper than pickling the objects.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import pickle
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from coterie.actors._plugins import load_here
from coterie.actors._ray import (
    RayPersonaLink,
    audit_buffer_for,
    cluster_addresses,
    freeze_heap,
    memory_backend,
    read,
    remote,
    scheduler_service,
)
from coterie.actors.coding_agent import RayCodingAgents
from coterie.actors.mcp import RayMcpClients
from coterie.actors.metrics import ray_meter
from coterie.actors.shell import ShellProcesses
from coterie.actors.subagent import RaySubagents
from coterie.runtime import tracing
from coterie.runtime.audit.loader import ConversationLoader
from coterie.runtime.config import RuntimeSettings, load_persona
from coterie.runtime.connectors import ConnectorInfo, OutboundMessage
from coterie.runtime.delegation.records import AgentAsk
from coterie.runtime.heap import HeapTrimmer, malloc_trim
from coterie.runtime.memory import MemoryClient
from coterie.runtime.messages import ConversationRecord, MessageEnvelope, PersonaStats
from coterie.runtime.metrics import EventMetrics
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.persona import Launchers, PersonaHost, PersonaRuntime
from coterie.runtime.plugins import PluginSet
from coterie.runtime.plugins.code import load_code_tools
from coterie.runtime.plugins.report import check_missing, tools_of_persona
from coterie.runtime.routing import Directory, IdleWatcher
from coterie.runtime.services import Services
from coterie.runtime.tool import ToolRegistry
from coterie.runtime.usage.budget import RouterBudget
from coterie.tools import registry_for

if TYPE_CHECKING:
    from coterie.runtime.schedule.service import SchedulerService

log = logging.getLogger("coterie.persona")


class RouterDeliveries:
    """:class:`~runtime.services.DeliveryService` through the router's outbox."""

    def __init__(self, directory: Directory[Any]) -> None:
        self.directory = directory

    async def deliver(self, message: OutboundMessage) -> None:
        await self.directory.call_router("connector_put", message)

    async def connectors(self) -> list[ConnectorInfo]:
        infos: list[ConnectorInfo] = await self.directory.call_router("connectors")
        return infos


def _unique(problems: list[Any]) -> list[Any]:
    return list({str(p): p for p in problems}.values())


def persona_registry(persona: Any, plugins: PluginSet | None) -> ToolRegistry:
    """The built-in tools, the plugins' and the persona's own (defined in
    code), loaded in this process; the tools it names that none of them
    provides are logged (the router refused it under ``plugins.strict``)."""
    loaded = load_here(plugins)
    own, problems = load_code_tools(persona.path, pickle.loads)
    registry = registry_for(loaded.tools.values(), own)
    found = tools_of_persona(
        persona.config.tools,
        persona.path,
        builtin=registry.names(),
        plugin_tools=loaded.tool_plugins,
        problems=_unique([*(plugins.problems if plugins else []), *loaded.problems, *problems]),
    )
    check_missing(persona.name, found, strict=False)
    return registry


def _scheduler(name: str | None, namespace: str) -> SchedulerService | None:
    """The runtime's Scheduler actor as a service (None when the runtime runs
    none: fires are then not deduplicated and the remind tool is not offered)."""
    if name is None:
        return None
    # Its handle is made at the first fire or reminder (a handle loads the
    # scheduler's modules here); gone by then, the call fails as unreachable.
    return scheduler_service(name, namespace)


class PersonaActor:
    """One persona: its conversations and turns. Created by the router."""

    def __init__(
        self,
        name: str,
        home: str,
        *,
        audit_actor: str,
        router_actor: str,
        memory_actor: str,
        namespace: str,
        roster: list[tuple[str, str]],
        settings: RuntimeSettings,
        scheduler_actor: str | None = None,
        plugins: PluginSet | None = None,
    ) -> None:
        load_here(plugins)  # first: persona.yaml may name a plugin's model provider
        # Once per process; a no-op tracer (no SDK imported) unless tracing is on.
        tracing.setup(
            settings.tracing,
            process="persona",
            attributes={
                "coterie.persona": name,
                "coterie.node.id": ray.get_runtime_context().get_node_id(),
            },
        )
        persona = load_persona(Path(home), name)
        self._audit_handle = ray.get_actor(audit_actor, namespace=namespace)
        # One spool per persona on local disk: a restarted actor resends what
        # its killed predecessor recorded but had not delivered yet.
        # Its events counted in Ray metrics; the gauges read at each turn's start and end.
        self.buffer = audit_buffer_for(
            self._audit_handle,
            spool_path=Path(home) / "spool" / f"{name}.audit.jsonl",
            observer=EventMetrics(ray_meter(), sample=lambda: self._gauges(name)),
        )
        # A conversation this process does not hold (new, or from before a
        # restart) is read from the log: one read for all that wait at once.
        self.conversations = ConversationLoader(self._read_conversations, self.buffer)
        self.directory: Directory[Any] = Directory(RayPersonaLink(router_actor, namespace))
        memory = MemoryClient(
            memory_backend(ray.get_actor(memory_actor, namespace=namespace)), name
        )
        self.runtime = PersonaRuntime(
            persona,
            model=build_model_or_unavailable(persona.config.model),
            registry=persona_registry(persona, plugins),
            services=Services(
                audit=self.buffer,
                messenger=self.directory,
                memory=memory,
                # One actor per command, on this node, owned by this actor.
                processes=ShellProcesses(max_processes=settings.max_background_processes),
                deliveries=RouterDeliveries(self.directory),
                # Fires are accepted and finished there; the remind tool uses it.
                scheduler=_scheduler(scheduler_actor, namespace),
                # Budgets are kept by the router, for every persona at once.
                budget=RouterBudget(self.directory.call_router),
            ),
            launchers=Launchers(
                # One Subagent actor per spawn, on this node, owned by this actor.
                subagents=RaySubagents(
                    audit_actor=audit_actor,
                    router_actor=router_actor,
                    namespace=namespace,
                    max_processes=settings.max_background_processes,
                    plugins=plugins,
                ),
                # One CodingAgent actor per delegation, likewise.
                coding_agents=RayCodingAgents(
                    audit_actor=audit_actor,
                    namespace=namespace,
                    budget=RouterBudget(self.directory.call_router),
                    audit=self.buffer,
                    # An agent's requests under permissions: ask come back here.
                    asker=ray.get_runtime_context().current_actor,
                    traced=settings.tracing,
                ),
                # One McpServer actor per server, on this node; shared ones from the router.
                mcp_clients=RayMcpClients(
                    lambda launch: self.directory.call_router(
                        "mcp_shared", launch.model_dump_json()
                    )
                ),
            ),
            host=PersonaHost(
                settings=settings,
                roster=roster,
                cluster_addresses=cluster_addresses(),
                history=self.conversations.load,
                # Its own process: what a burst of turns freed goes back.
                heap=HeapTrimmer(malloc_trim()),
            ),
        )
        self.watcher: IdleWatcher | None = None
        if settings.idle_timeout is not None:
            self.watcher = IdleWatcher(
                idle_for=self.runtime.idle_for,
                on_idle=lambda: self.directory.call_router("passivate", name),
                idle_timeout=settings.idle_timeout,
                stopped=lambda: self.runtime.closing,
            )
        # Work a killed predecessor delegated is reported lost, and approvals
        # it asked for are parked (an answer resumes their turn), once we are up.
        self.runtime.approvals.expect_parked()
        ray.get_runtime_context().current_actor.recover_lost_work.remote()
        # What is alive now lives as long as the process; the SDK comes with
        # the first turn (see _after_turn).
        self._heap_settled = False
        freeze_heap()

    def _after_turn(self) -> None:
        if not self._heap_settled and self.runtime.turns_run:
            self._heap_settled = True
            freeze_heap()

    async def _read_conversations(self, conversation_ids: list[str]) -> list[ConversationRecord]:
        records: list[ConversationRecord] = await remote(
            read(
                lambda: self._audit_handle.conversations.remote(self.runtime.name, conversation_ids)
            )
        )
        return records

    def _gauges(self, name: str) -> dict[str, tuple[dict[str, str], float]]:
        """This persona's gauges now (runtime.metrics.EventMetrics samples them)."""
        persona = {"persona": name}
        gauges: dict[str, tuple[dict[str, str], float]] = {
            "coterie_audit_backlog": ({"process": f"persona:{name}"}, self.buffer.pending)
        }
        runtime = getattr(self, "runtime", None)  # None: still being built
        if runtime is not None:
            gauges["coterie_messages_queued"] = (persona, runtime.queues.queued())
        return gauges

    async def recover_lost_work(self) -> int:
        """Wake the conversations whose delegations an earlier process of this
        persona started and never reported (a crash, a forced stop); the
        number of wakes. Called by the actor itself when it starts."""
        try:
            await self.buffer.flush()  # what the predecessor spooled, first
            started = await remote(
                read(lambda: self._audit_handle.unfinished_delegations.remote(self.runtime.name))
            )
            woken = self.runtime.recover_delegations(started)
        except Exception:  # boundary: a failed check must not take the persona down
            log.exception("%s: no check for lost delegations", self.runtime.name)
            woken = 0
        try:
            requested = await remote(
                read(lambda: self._audit_handle.pending_approvals.remote(self.runtime.name))
            )
            self.runtime.park_approvals(requested)
        except Exception:  # boundary, likewise: answers then find no approval
            log.exception("%s: no check for pending approvals", self.runtime.name)
            self.runtime.approvals.recovered()
        return woken

    def _admit(self, data: str) -> MessageEnvelope:
        if self.watcher is not None:
            self.watcher.start()  # on the actor's loop, which __init__ does not run on
        return MessageEnvelope.model_validate_json(data)

    async def handle(self, data: str) -> str:
        """Answer one message envelope (JSON) with a reply envelope (JSON)."""
        reply = await self.runtime.handle(self._admit(data))
        self._after_turn()
        return reply.model_dump_json()

    async def stream(self, data: str) -> AsyncIterator[str]:
        """Answer one envelope (JSON), yielding the turn's events and then the
        reply (JSON each) as they happen — a Ray streaming generator."""
        async for item in self.runtime.stream(self._admit(data)):
            yield item.model_dump_json()
        self._after_turn()

    async def post(self, data: str) -> None:
        """Queue an envelope (JSON) without waiting for its turn (a fire of
        the scheduler once this persona accepted it)."""
        self._after_turn()  # one posted earlier may have run
        await self.runtime.receive(self._admit(data))

    async def agent_permission(self, data: str) -> list[Any]:
        """A coding agent's permission request (an ``AgentAsk``, JSON) under
        ``permissions: ask``: ``[allowed, reason]`` once rules or a person
        decide."""
        allowed, reason = await self.runtime.agent_permission(AgentAsk.model_validate_json(data))
        return [allowed, reason]

    async def decide_approval(self, data: str) -> str:
        """Answer one of this persona's approvals: ``{"id", "answer", "by",
        "via"}`` (JSON); its ``decided`` event (JSON)."""
        request = json.loads(data)
        event = await self.runtime.decide_approval(
            request["id"], request["answer"], by=request.get("by"), via=request["via"]
        )
        return event.model_dump_json()

    async def prepare_passivation(self, idle_timeout: float) -> bool:
        """Close if still idle (the router then kills us); whether we did.

        The watcher that asked stops by itself: the runtime is closing.
        """
        if not await self.runtime.close_if_idle(idle_timeout):
            return False
        await self.buffer.aclose()
        return True

    async def activity(self) -> PersonaStats:
        """What runs in this persona now."""
        return self.runtime.stats()

    async def settled(self, conversation_id: str) -> bool:
        """Whether the conversation has no turn and no delegated work in flight."""
        return self.runtime.settled(conversation_id)

    async def flush(self) -> int:
        await self.buffer.flush()
        traced = tracing.tracer()
        if traced.enabled:  # its batched spans too (on a thread: the export blocks)
            await asyncio.to_thread(traced.flush)
        return self.buffer.events_sent

    async def stats(self) -> dict[str, Any]:
        return {
            "persona": self.runtime.name,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "sdks_loaded": sorted(m for m in ("openai", "anthropic", "mcp") if m in sys.modules),
            "turns": self.runtime.turns_run,
            "busy": self.runtime.busy(),
            "idle_for": self.runtime.idle_for(),
            "audit_recorded": self.buffer.events_recorded,
            "audit_sent": self.buffer.events_sent,
            "audit_failures": self.buffer.failures,
            "conversation_reads": self.conversations.reads,
            "heap_frozen": gc.get_freeze_count(),
        }

    async def ping(self) -> str:
        # The first call after a restart: deliver what the spool recovered.
        await self.buffer.flush()
        return self.runtime.name

    async def shutdown(self) -> None:
        if self.watcher is not None:
            await self.watcher.aclose()
        await self.runtime.aclose()
        await self.buffer.aclose()
        await asyncio.to_thread(tracing.tracer().shutdown)


PersonaActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(PersonaActor)

__all__ = ["PersonaActor", "PersonaActorRemote"]
