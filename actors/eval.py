"""Eval workers on Ray: a pool of actors spread over the cluster's nodes.

Each :class:`EvalWorkerActor` is a thin shell over
:class:`runtime.eval.worker.SampleWorker`: it runs many samples at once (an
async actor), each in a fresh persona of its own with a scratch workspace on
its node's local disk, and sends the samples' audit events to the runtime's
AuditLog actor and their memories to its MemoryStore (a scope per sample).
:class:`RayExecutor` starts the pool (round-robin over the alive nodes),
sends each attempt to the worker with the
fewest in flight, and replaces a worker that died (the attempt is then an
``error``, retried by the runner). A run with ``--max-cost`` has one
:class:`EvalBudgetActor` (a shell over :class:`runtime.eval.budget.RunBudget`)
that every worker's model calls reserve through.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coterie.actors._plugins import env_options, load_here
from coterie.actors._ray import audit_buffer_for, audit_name, memory_backend, memory_name, remote
from coterie.runtime import tracing
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.eval.budget import RunBudget
from coterie.runtime.eval.plan import RunPlan
from coterie.runtime.eval.worker import SampleJob, SampleRun, SampleWorker, SolverSetup
from coterie.runtime.memory import MemoryClient
from coterie.runtime.plugins import PluginSet
from coterie.runtime.plugins.code import load_code_tools
from coterie.runtime.tool import ToolSpec
from coterie.runtime.usage.budget import RouterBudget
from coterie.tools import registry_for


class EvalBudgetActor:
    """An eval run's budget, shared by its workers (methods named like the
    router's, so that :class:`RouterBudget` is its client)."""

    def __init__(self, run_id: str, limit: float, base: float) -> None:
        self.budget = RunBudget(run_id, limit, base=base)

    async def budget_reserve(
        self, payer: str, amount: float | None, model: str, persona: str, conversation_id: str
    ) -> str | None:
        reservation = await self.budget.reserve(
            payer, amount, model=model, persona=persona, conversation_id=conversation_id
        )
        return reservation.ticket

    async def budget_settle(self, ticket: str, cost: float | None) -> list[str]:
        return [w.model_dump_json() for w in await self.budget.settle(ticket, cost)]

    async def budget_charge(
        self, payer: str, cost: float, persona: str, conversation_id: str
    ) -> list[str]:
        warnings = await self.budget.charge(
            payer, cost, persona=persona, conversation_id=conversation_id
        )
        return [w.model_dump_json() for w in warnings]

    async def spent(self) -> float:
        return self.budget.spent


EvalBudgetRemote = ray.remote(num_cpus=0, max_restarts=0)(EvalBudgetActor)


def _budget_client(actor: Any) -> RouterBudget:
    async def call(method: str, *args: Any) -> Any:
        return await remote(getattr(actor, method).remote(*args))

    return RouterBudget(call)


class EvalWorkerActor:
    """Runs sample attempts of one eval run (many concurrently)."""

    def __init__(
        self,
        solvers: dict[str, str],
        *,
        audit_actor: str,
        memory_actor: str,
        namespace: str,
        settings: RuntimeSettings,
        connections: int,
        budget: Any = None,
        plugins: PluginSet | None = None,
    ) -> None:
        # First: a solver's persona may name a plugin's model provider.
        loaded = load_here(plugins)
        # Once per process; a no-op tracer (no SDK imported) unless tracing is on.
        tracing.setup(
            settings.tracing,
            process="eval",
            attributes={"coterie.node.id": ray.get_runtime_context().get_node_id()},
        )
        setups = {name: SolverSetup.model_validate_json(data) for name, data in solvers.items()}
        plugin_tools = list(loaded.tools.values())
        # A solver defined in code brings its own tools, for its samples only.
        registries = {}
        for key, setup in setups.items():
            own: list[ToolSpec] = []
            if setup.persona_dir is not None:
                own = load_code_tools(Path(setup.persona_dir), pickle.loads)[0]
            if own:
                registries[key] = registry_for(plugin_tools, own)
        self.scratch = Path(tempfile.mkdtemp(prefix="coterie-eval-"))
        audit = audit_buffer_for(ray.get_actor(audit_actor, namespace=namespace))
        memory = memory_backend(ray.get_actor(memory_actor, namespace=namespace))
        self.worker = SampleWorker(
            setups,
            registry=registry_for(plugin_tools),
            registries=registries,
            scratch=self.scratch,
            audit=audit,
            settings=settings,
            connections=connections,
            # A sample's scope is new: no read of its (empty) user model.
            memory=lambda scope: MemoryClient(memory, scope, new_scope=True),
            node=ray.get_runtime_context().get_node_id(),
            budget=_budget_client(budget) if budget is not None else None,
        )

    async def run(self, data: str) -> str:
        run = await self.worker.run(SampleJob.model_validate_json(data))
        return run.model_dump_json()

    async def grade(
        self, grader: str, prompt: str, conversation_id: str, trace: dict[str, str] | None
    ) -> str:
        return await self.worker.grade(grader, prompt, conversation_id, trace)

    async def node(self) -> tuple[str | None, int]:
        return self.worker.node, os.getpid()

    async def close(self) -> None:
        await self.worker.aclose()
        shutil.rmtree(self.scratch, ignore_errors=True)
        # Its batched spans (on a thread: the export blocks).
        await asyncio.to_thread(tracing.tracer().shutdown)


EvalWorkerRemote = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(EvalWorkerActor)


class RayExecutor:
    """The runner's :class:`~runtime.eval.runner.Executor` over worker actors."""

    def __init__(
        self,
        solvers: dict[str, SolverSetup],
        *,
        workers: int,
        audit_actor: str,
        memory_actor: str,
        namespace: str,
        settings: RuntimeSettings,
        max_connections: int,
        budget: Any = None,
        plugins: PluginSet | None = None,
    ) -> None:
        self._plugins = plugins
        self._args: dict[str, Any] = {
            "audit_actor": audit_actor,
            "memory_actor": memory_actor,
            "namespace": namespace,
            "settings": settings,
            # Each worker gets its share of the per-provider connections.
            "connections": max(1, max_connections // workers),
            # The run's EvalBudgetActor (--max-cost), or None.
            "budget": budget,
            "plugins": plugins,
        }
        self._solvers = {name: s.model_dump_json() for name, s in solvers.items()}
        # Round-robin over the nodes alive now; a replacement goes where Ray
        # finds room (its node may be the one that went away).
        self._nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        self._actors = [self._start(i) for i in range(workers)]
        self._load = [0] * workers

    def _start(self, index: int, *, replacing: bool = False) -> Any:
        strategy: Any = "SPREAD"
        if self._nodes and not replacing:
            node = self._nodes[index % len(self._nodes)]
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        return EvalWorkerRemote.options(  # type: ignore[attr-defined]
            scheduling_strategy=strategy, **env_options(self._plugins)
        ).remote(self._solvers, **self._args)

    @classmethod
    def for_runtime(
        cls, plan: RunPlan, rt: Any, *, workers: int | None = None, budget: Any = None
    ) -> RayExecutor:
        """Workers for ``plan`` on a runtime (``coterie.Runtime``: its id,
        namespace and settings): ``workers``, or two per alive node (no more
        than the task's ``max_samples``), using its audit and memory actors
        (and ``budget``, an :class:`EvalBudgetActor`)."""
        alive = sum(1 for n in ray.nodes() if n.get("Alive"))
        count = workers or max(1, min(2 * alive, plan.task.max_samples))
        return cls(
            plan.solvers,
            workers=count,
            audit_actor=audit_name(rt.id),
            memory_actor=memory_name(rt.id),
            namespace=rt.namespace,
            settings=rt.settings,
            max_connections=plan.task.max_connections,
            budget=budget,
            plugins=rt.plugins,
        )

    @property
    def size(self) -> int:
        return len(self._actors)

    async def nodes(self) -> list[str | None]:
        """The node each worker runs on (waits until all are up)."""
        return [(await remote(a.node.remote()))[0] for a in self._actors]

    def _pick(self) -> int:
        return min(range(len(self._actors)), key=self._load.__getitem__)

    async def run(self, job: SampleJob) -> SampleRun:
        index = self._pick()
        actor = self._actors[index]
        self._load[index] += 1
        ref = actor.run.remote(job.model_dump_json())
        try:
            data: str = await remote(ref)
            return SampleRun.model_validate_json(data)
        except asyncio.CancelledError:
            # The run is stopping (Ctrl-C): the sample stops in its worker too.
            ray.cancel(ref)
            raise
        except Exception as exc:  # boundary: the worker died or Ray failed the call
            if self._actors[index] is actor:
                self._actors[index] = self._start(index, replacing=True)
            now = time.time()
            return SampleRun(
                status="error",
                error=f"the eval worker failed: {type(exc).__name__}: {exc}",
                started_at=now,
                ended_at=now,
                persona=job.solver,
                conversation_id=job.conversation_id,
            )
        finally:
            self._load[index] -= 1

    async def grade(
        self, grader: str, prompt: str, conversation_id: str, trace: dict[str, str] | None = None
    ) -> str:
        actor = self._actors[self._pick()]
        text: str = await remote(actor.grade.remote(grader, prompt, conversation_id, trace))
        return text

    async def aclose(self) -> None:
        for actor in self._actors:
            try:
                await remote(actor.close.remote())
            except Exception:  # boundary: already gone
                pass
            ray.kill(actor, no_restart=True)
        self._actors = []


__all__ = [
    "EvalBudgetActor",
    "EvalBudgetRemote",
    "EvalWorkerActor",
    "EvalWorkerRemote",
    "RayExecutor",
]
