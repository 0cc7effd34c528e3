"""Subagents on Ray: one Subagent actor per ``spawn_subagent`` call.

Each actor runs one :class:`runtime.delegation.SubagentRun` and is killed
when it has reported (or timed out, or was cancelled). It is placed on the
persona's own node (it reads the persona's workspace from local disk), owned
by the persona actor (it dies with it), and sends its audit events straight
to the AuditLog actor. Its shell commands run in its own process, so they die
with it too.

Starting an actor costs a worker process (about a second), so after the first
spawn one spare is kept warm (``spares=0`` disables it).
"""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coterie.actors._plugins import env_options, load_here
from coterie.actors._ray import RayPersonaLink, audit_buffer_for, remote
from coterie.runtime import tracing
from coterie.runtime.delegation import SubagentRequest, SubagentRun, Work, WorkOutcome
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.plugins import PluginSet
from coterie.runtime.plugins.code import load_code_tools
from coterie.runtime.shell import LocalProcesses
from coterie.runtime.tool import ToolRegistry
from coterie.runtime.usage.budget import RouterBudget
from coterie.tools import registry_for


class SubagentActor:
    """One subagent's process: runs its task once, then is killed."""

    def __init__(
        self,
        audit_actor: str,
        namespace: str,
        max_processes: int = 16,
        router_actor: str | None = None,
        plugins: PluginSet | None = None,
    ) -> None:
        self.buffer = audit_buffer_for(ray.get_actor(audit_actor, namespace=namespace))
        # Its model calls count against its parent's budget, kept by the router.
        self.budget = (
            RouterBudget(RayPersonaLink(router_actor, namespace).call_router)
            if router_actor is not None
            else None
        )
        # Built now, so that a spare actor is warm when its task comes.
        self.plugin_tools = list(load_here(plugins).tools.values())
        self.registry = registry_for(self.plugin_tools)
        self.max_processes = max_processes
        self.current: SubagentRun | None = None
        self.task: asyncio.Task[WorkOutcome] | None = None

    async def run(self, data: str) -> str:
        """Run the task of a :class:`SubagentRequest` (JSON); its
        :class:`WorkOutcome` (JSON)."""
        if self.current is not None:
            raise RuntimeError("a Subagent actor runs one task only")
        request = SubagentRequest.model_validate_json(data)
        traced = tracing.setup(request.settings.tracing, process="subagent")
        self.current = SubagentRun(
            request,
            model=build_model_or_unavailable(request.model),
            registry=self._registry_for(request),
            audit=self.buffer,
            processes=LocalProcesses(max_processes=self.max_processes),
            budget=self.budget,
        )
        self.task = asyncio.get_running_loop().create_task(self.current.run())
        try:
            outcome = await self.task
        finally:
            await self.current.aclose()
            if traced.enabled:  # killed once it has reported: its spans go first
                await asyncio.to_thread(traced.flush)
        return outcome.model_dump_json()

    def _registry_for(self, request: SubagentRequest) -> ToolRegistry:
        """The tools, with its persona's own when it was defined in code."""
        if request.home is None:
            return self.registry
        own, _ = load_code_tools(Path(request.home) / "personas" / request.persona, pickle.loads)
        return registry_for(self.plugin_tools, own) if own else self.registry

    async def progress(self) -> dict[str, Any]:
        if self.current is None:
            return {"steps": 0, "starting": True}
        return self.current.progress()

    async def stop(self) -> None:
        """Cancel the run and stop its commands (the caller then kills us)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.current is not None:
            await self.current.aclose()

    def pid(self) -> int:
        return os.getpid()


SubagentActorRemote = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(SubagentActor)


class _RayWork:
    """A subagent held by its actor (the :class:`~runtime.delegation.Work`)."""

    def __init__(self, actor: Any, request: SubagentRequest) -> None:
        self.actor = actor
        self.ref = actor.run.remote(request.model_dump_json())

    async def result(self) -> WorkOutcome:
        # An actor that dies mid-run raises ActorLostError: reported "crashed".
        data: str = await remote(self.ref)
        return WorkOutcome.model_validate_json(data)

    async def progress(self) -> dict[str, Any]:
        progress: dict[str, Any] = await remote(self.actor.progress.remote())
        return progress

    async def cancel(self) -> None:
        try:
            await asyncio.wait_for(remote(self.actor.stop.remote()), 10)
        finally:
            ray.kill(self.actor, no_restart=True)

    async def discard(self) -> None:
        ray.kill(self.actor, no_restart=True)


class RaySubagents:
    """The :class:`~runtime.delegation.SubagentLauncher` of a persona actor."""

    def __init__(
        self,
        *,
        audit_actor: str,
        namespace: str,
        router_actor: str | None = None,
        node_id: str | None = None,
        spares: int = 1,
        max_processes: int = 16,
        plugins: PluginSet | None = None,
    ) -> None:
        self.plugins = plugins
        self.audit_actor = audit_actor
        self.router_actor = router_actor
        self.namespace = namespace
        self.node_id = node_id or ray.get_runtime_context().get_node_id()
        self.spares = spares
        self.max_processes = max_processes
        self._spare: list[Any] = []
        self.launched = 0

    def _new_actor(self) -> Any:
        actor: Any = SubagentActorRemote.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=self.node_id, soft=False),
            **env_options(self.plugins),
        ).remote(
            self.audit_actor, self.namespace, self.max_processes, self.router_actor, self.plugins
        )
        actor.__ray_ready__.remote()
        return actor

    async def launch(self, request: SubagentRequest) -> Work:
        actor = self._spare.pop() if self._spare else self._new_actor()
        # The task first: a new worker's start competes for the CPU.
        work = _RayWork(actor, request)
        while len(self._spare) < self.spares:
            self._spare.append(self._new_actor())
        self.launched += 1
        return work

    def close(self) -> None:
        spare, self._spare = self._spare, []
        for actor in spare:
            ray.kill(actor, no_restart=True)


__all__ = ["RaySubagents", "SubagentActor", "SubagentActorRemote"]
