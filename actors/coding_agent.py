"""Coding agents on Ray: one CodingAgent actor per ``start_coding_agent`` call.

The actor holds one :class:`runtime.delegation.coding.CodingAgentRun` (an ACP
session with an external agent process, in its own process group), on the
persona's node (the agent works in the persona's workspace on local disk),
owned by the persona actor. Its audit events go straight to the AuditLog
actor. It is killed once the delegation has reported; the agent's process
group is stopped before that (and ``--die-with-parent`` is not needed: the
session stops the group on every way out).
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coterie.actors._ray import audit_buffer_for, remote
from coterie.runtime import tracing
from coterie.runtime.delegation import Work, WorkOutcome
from coterie.runtime.delegation.acp.records import AgentPermission, AskPermission
from coterie.runtime.delegation.coding import ChargedWork, CodingAgentRun
from coterie.runtime.delegation.records import AgentAsk, CodingRequest
from coterie.runtime.services import AuditSink, BudgetService
from coterie.runtime.tracing.settings import TracingSettings


def _ask_through(asker: Any, request: CodingRequest) -> AskPermission:
    """Put the agent's permission requests to the persona actor ``asker``."""

    async def ask(question: AgentPermission) -> tuple[bool, str]:
        data = AgentAsk.of(request, question).model_dump_json()
        allowed, reason = await remote(asker.agent_permission.remote(data))
        return bool(allowed), str(reason)

    return ask


class CodingAgentActor:
    """One delegation's process: start the session, run the task once."""

    def __init__(
        self, audit_actor: str, namespace: str, traced: TracingSettings | None = None
    ) -> None:
        # Once per process; a no-op tracer (no SDK imported) unless tracing is on.
        tracing.setup(traced or TracingSettings(enabled=False), process="coding_agent")
        self.buffer = audit_buffer_for(ray.get_actor(audit_actor, namespace=namespace))
        self.current: CodingAgentRun | None = None

    async def start(self, data: str, asker: Any = None) -> None:
        """Start the agent and its session; raises the ``AcpError`` that stopped it.

        ``asker``: the persona actor that answers the agent's permission
        requests under ``permissions: ask``."""
        if self.current is not None:
            raise RuntimeError("a CodingAgent actor runs one task only")
        request = CodingRequest.model_validate_json(data)
        ask = _ask_through(asker, request) if asker is not None else None
        self.current = CodingAgentRun(request, audit=self.buffer, ask=ask)
        try:
            await self.current.start()
        except BaseException:
            await self.current.close()
            raise

    async def run(self) -> str:
        """Send the task and wait for its end; the :class:`WorkOutcome` (JSON)."""
        assert self.current is not None
        outcome = await self.current.run()
        await self.buffer.flush()
        return outcome.model_dump_json()

    async def progress(self) -> dict[str, Any]:
        return self.current.progress() if self.current is not None else {"starting": True}

    async def cancel(self) -> None:
        if self.current is not None:
            await self.current.cancel()

    async def close(self) -> None:
        if self.current is not None:
            await self.current.close()
        await self.buffer.aclose()
        # Killed once it has reported: its spans go first (the export blocks).
        await asyncio.to_thread(tracing.tracer().shutdown)


CodingAgentActorRemote = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(
    CodingAgentActor
)


class _RayWork:
    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.ref = actor.run.remote()

    async def result(self) -> WorkOutcome:
        # The actor dying mid-task raises ActorLostError: reported "crashed".
        data: str = await remote(self.ref)
        return WorkOutcome.model_validate_json(data)

    async def progress(self) -> dict[str, Any]:
        progress: dict[str, Any] = await remote(self.actor.progress.remote())
        return progress

    async def cancel(self) -> None:
        # session/cancel, then the agent's whole process group is stopped.
        await asyncio.wait_for(remote(self.actor.cancel.remote()), 30)

    async def discard(self) -> None:
        try:
            await asyncio.wait_for(remote(self.actor.close.remote()), 30)
        finally:
            ray.kill(self.actor, no_restart=True)


class RayCodingAgents:
    """The :class:`~runtime.delegation.records.CodingAgentLauncher` of a persona actor."""

    def __init__(
        self,
        *,
        audit_actor: str,
        namespace: str,
        node_id: str | None = None,
        budget: BudgetService | None = None,
        audit: AuditSink | None = None,
        asker: Any = None,
        traced: TracingSettings | None = None,
    ) -> None:
        """``asker``: the persona actor an agent's permission requests go to
        under ``permissions: ask`` (its ``agent_permission`` method);
        ``traced``: the runtime's tracing settings, for each agent's actor."""
        self.asker = asker
        self.traced = traced
        self.audit_actor = audit_actor
        self.namespace = namespace
        # The persona's budgets and audit buffer: an agent's reported cost
        # counts against its payer when the task ends.
        self.budget = budget
        self.audit = audit
        self.node_id = node_id or ray.get_runtime_context().get_node_id()
        self.launched = 0

    async def launch(self, request: CodingRequest) -> Work:
        actor: Any = CodingAgentActorRemote.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=self.node_id, soft=False),
        ).remote(self.audit_actor, self.namespace, self.traced)
        try:
            await remote(actor.start.remote(request.model_dump_json(), self.asker))
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        self.launched += 1
        return ChargedWork(_RayWork(actor), request, self.budget, self.audit)


__all__ = ["CodingAgentActor", "CodingAgentActorRemote", "RayCodingAgents"]
