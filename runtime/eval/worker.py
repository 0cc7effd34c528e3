"""Running one eval sample: a fresh persona, a fresh conversation, a scratch
workspace, the sample's limits.

A :class:`SampleWorker` holds what its samples share — the solver's model
(one client per worker), the tool registry, the audit sink, an
:class:`~runtime.eval.limits.AdaptiveGate` per provider — and builds, for
each :class:`SampleJob`, a new :class:`~runtime.persona.PersonaRuntime` of
the solver persona whose directory (and so workspace, spill folder, ``.env``
copy) is a scratch folder removed afterwards, with its own process table
(background commands it leaves are stopped), and, when the worker has a
memory backend, a memory scope of its own (``<persona>@eval/<run>/<sample>/<epoch>``)
so that samples never see each other's memories. The sample's text is the
message of a turn in the ``eval`` context; the sample ends when the
conversation has settled (delegated work reported back too) or a limit
stops it. With a run budget (``--max-cost``: :mod:`runtime.eval.budget`)
every model call of the sample reserves against it; a sample one of whose
calls the budget refused is ``stopped`` (not a result: the run stops). Its
audit events are the transcript: conversation
``eval:<run>:<sample>:<epoch>:<attempt>`` in the audit log (``…@<tag>`` for
the attempts of a resumed run).

The Ray actor (``actors.eval.EvalWorkerActor``) is a thin shell over this
class; ``runtime.eval.runner`` also uses it in-process.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from coterie.runtime.config import Persona, PersonaConfig, RuntimeSettings
from coterie.runtime.errors import BudgetExceededError
from coterie.runtime.eval.limits import AdaptiveGate, LimitedModel
from coterie.runtime.eval.task import Sample, SampleLimits
from coterie.runtime.messages import AssistantMessage, BudgetWarning, MessageEnvelope
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.models.base import Model
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.runner import safe_name
from coterie.runtime.services import (
    AuditSink,
    BudgetService,
    MemoryService,
    NullAudit,
    Reservation,
    Services,
)
from coterie.runtime.shell import LocalProcesses
from coterie.runtime.tool import ToolRegistry

#: How often a finished turn's conversation is checked for settled delegations.
SETTLE_POLL_S = 0.02


class SolverSetup(BaseModel):
    """A persona resolved for an eval (from the home, inline, or with a model
    override): what a worker needs to build it for each sample."""

    name: str
    config: PersonaConfig
    soul: str = ""
    # The persona's own folder: its .env is copied into each sample's scratch folder.
    persona_dir: str | None = None


class SampleJob(BaseModel):
    """One sample × epoch × attempt, as sent to a worker."""

    run_id: str
    sample: Sample
    epoch: int
    attempt: int = 1
    limits: SampleLimits = Field(default_factory=SampleLimits)
    solver: str = "solver"
    # Set when a run is resumed: its attempts get conversations of their own
    # (an attempt cut off by the interruption keeps its transcript apart).
    pass_tag: str = ""
    # The trace context of the sample's span in the driver (W3C fields; None
    # when the driver does not trace): the sample's turn is its child.
    trace: dict[str, str] | None = None

    @property
    def conversation_id(self) -> str:
        tag = f"@{self.pass_tag}" if self.pass_tag else ""
        return f"eval:{self.run_id}:{self.sample.id}:{self.epoch}:{self.attempt}{tag}"


class SampleRun(BaseModel):
    """What one attempt of a sample did (scores are the driver's)."""

    output: str = ""
    status: Literal["ok", "limit", "error"]
    limit: str | None = None
    error: str | None = None
    # "budget": the run's budget refused a call (status "error"; not a
    # result: the runner stops the run and a resume runs the sample again).
    stopped: Literal["budget"] | None = None
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    started_at: float
    ended_at: float
    persona: str
    conversation_id: str
    node: str | None = None


def _build_model(setup: SolverSetup) -> Model:
    return build_model_or_unavailable(setup.config.model)


class SampleWorker:
    """Runs samples of one eval run (many at once, each isolated)."""

    def __init__(
        self,
        solvers: dict[str, SolverSetup],
        *,
        registry: ToolRegistry,
        scratch: Path,
        audit: AuditSink | None = None,
        settings: RuntimeSettings | None = None,
        connections: int = 8,
        memory: Callable[[str], MemoryService] | None = None,
        node: str | None = None,
        model_factory: Callable[[SolverSetup], Model] | None = None,
        budget: BudgetService | None = None,
        registries: Mapping[str, ToolRegistry] | None = None,
    ) -> None:
        self.solvers = solvers
        self.registry = registry
        #: A solver's own registry (one defined in code has its own tools),
        #: by solver key; the others use ``registry``.
        self.registries = dict(registries or {})
        self.scratch = scratch
        self.audit: AuditSink = audit or NullAudit()
        self.settings = settings or RuntimeSettings()
        self.connections = connections
        self.memory = memory
        self.node = node
        self.budget = budget
        self._model_factory = model_factory or _build_model
        self._models: dict[str, Model] = {}
        self.gates: dict[str, AdaptiveGate] = {}
        self.running = 0
        self.samples_run = 0

    def _model(self, solver: str) -> Model:
        model = self._models.get(solver)
        if model is None:
            model = self._models[solver] = self._model_factory(self.solvers[solver])
        return model

    def _gate(self, provider: str) -> AdaptiveGate:
        gate = self.gates.get(provider)
        if gate is None:
            gate = self.gates[provider] = AdaptiveGate(self.connections)
        return gate

    def _persona(self, setup: SolverSetup, root: Path) -> Persona:
        path = root / "personas" / setup.name
        path.mkdir(parents=True)
        if setup.persona_dir is not None:
            dotenv = Path(setup.persona_dir) / ".env"
            if dotenv.is_file():
                shutil.copy2(dotenv, path / ".env")
        return Persona(name=setup.name, path=path, config=setup.config, soul=setup.soul)

    async def run(self, job: SampleJob) -> SampleRun:
        """Run ``job`` to its end; never raises for what the sample did."""
        run, _ = await self._run(job)
        return run

    async def _run(self, job: SampleJob) -> tuple[SampleRun, BudgetExceededError | None]:
        setup = self.solvers[job.solver]
        inner = self._model(job.solver)
        model = LimitedModel(inner, job.limits, self._gate(inner.provider))
        conv = job.conversation_id
        root = self.scratch / safe_name(conv)
        started = time.time()
        self.running += 1
        runtime: PersonaRuntime | None = None
        status: Literal["ok", "limit", "error"] = "ok"
        limit: str | None = None
        error: str | None = None
        reply_text = ""
        budget = _SampleBudget(self.budget) if self.budget is not None else None
        try:
            persona = await asyncio.to_thread(self._persona, setup, root)
            scope = f"{setup.name}@eval/{job.run_id}/{job.sample.id}/{job.epoch}"
            runtime = PersonaRuntime(
                persona,
                model=model,
                registry=self.registries.get(job.solver, self.registry),
                services=Services(
                    audit=_NoFlush(self.audit),
                    memory=self.memory(scope) if self.memory is not None else None,
                    processes=LocalProcesses(max_processes=self.settings.max_background_processes),
                    budget=budget,
                ),
                host=PersonaHost(settings=self.settings),
            )
            envelope = MessageEnvelope(
                sender="eval",
                recipient=setup.name,
                conversation_id=conv,
                text=job.sample.input,
                context="eval",
                trace=job.trace,
            )
            try:
                async with asyncio.timeout(job.limits.time_s):
                    reply = await runtime.handle(envelope)
                    while not runtime.settled(conv):
                        await asyncio.sleep(SETTLE_POLL_S)
            except TimeoutError:
                status, limit = "limit", "time"
                error = f"the sample ran past its time limit ({job.limits.time_s:g} s)"
            else:
                reply_text = reply.text
                if model.hit is not None:
                    status, limit, error = "limit", model.hit.limit, str(model.hit)
                elif reply.status == "error":
                    status, error = "error", reply.error or "the turn failed"
            output = _last_answer(runtime, conv) or reply_text
            if budget is not None and budget.refused is not None:
                status, limit, error = "error", None, str(budget.refused)
        except Exception as exc:  # boundary: a worker bug must not take the run down
            status, error, output = "error", f"{type(exc).__name__}: {exc}", ""
        finally:
            self.running -= 1
            self.samples_run += 1
            if runtime is not None:
                await runtime.aclose()
            await asyncio.to_thread(shutil.rmtree, root, True)
        refused = budget.refused if budget is not None else None
        run = SampleRun(
            output=output,
            status=status,
            limit=limit,
            error=error,
            stopped="budget" if refused is not None else None,
            model_calls=model.model_calls,
            tool_calls=model.tool_calls,
            input_tokens=model.input_tokens,
            output_tokens=model.output_tokens,
            started_at=started,
            ended_at=time.time(),
            persona=setup.name,
            conversation_id=conv,
            node=self.node,
        )
        return run, refused

    async def grade(
        self,
        grader: str,
        prompt: str,
        conversation_id: str,
        trace: dict[str, str] | None = None,
    ) -> str:
        """One turn of the grader persona on ``prompt``; its reply text
        (its span a child of ``trace``, the graded sample's).

        Its conversation is ``eval:grade:<graded conversation>-<nonce>:1:1``;
        raises :class:`BudgetExceededError` when the run's budget refused it."""
        job = SampleJob(
            run_id="grade",
            sample=Sample(id=f"{safe_name(conversation_id)}-{secrets.token_hex(3)}", input=prompt),
            epoch=1,
            solver=grader,
            trace=trace,
        )
        run, refused = await self._run(job)
        if refused is not None:
            raise refused
        if run.status == "error":
            raise RuntimeError(f"the grader {grader!r} failed: {run.error}")
        return run.output

    async def aclose(self) -> None:
        for model in self._models.values():
            await model.aclose()
        self._models.clear()
        await self.audit.flush()


class _NoFlush:
    """The worker's audit sink without the per-sample flush: the buffer
    sends on its own timer, and the worker flushes when it closes."""

    def __init__(self, inner: AuditSink) -> None:
        self._inner = inner

    def record(self, event: object) -> None:
        self._inner.record(event)  # type: ignore[arg-type]

    async def flush(self) -> None:
        return None


class _SampleBudget:
    """The run's budget as one sample sees it: notes a refusal."""

    def __init__(self, inner: BudgetService) -> None:
        self._inner = inner
        self.refused: BudgetExceededError | None = None

    async def reserve(
        self,
        payer: str,
        amount: float | None,
        *,
        model: str,
        persona: str,
        conversation_id: str,
    ) -> Reservation:
        try:
            return await self._inner.reserve(
                payer, amount, model=model, persona=persona, conversation_id=conversation_id
            )
        except BudgetExceededError as exc:
            self.refused = exc
            raise

    async def settle(self, ticket: str, cost: float | None) -> list[BudgetWarning]:
        return await self._inner.settle(ticket, cost)

    async def charge(
        self, payer: str, cost: float, *, persona: str, conversation_id: str
    ) -> list[BudgetWarning]:
        return await self._inner.charge(
            payer, cost, persona=persona, conversation_id=conversation_id
        )


def _last_answer(runtime: PersonaRuntime, conversation_id: str) -> str:
    for message in reversed(runtime.conversation(conversation_id).history):
        if isinstance(message, AssistantMessage) and message.text:
            return message.text
    return ""


__all__ = ["SampleJob", "SampleRun", "SampleWorker", "SolverSetup"]
