"""Subagents: a fresh, tool-restricted helper for one self-contained task.

What a subagent gets, by design:

- a **fresh conversation** (id = its handle, ``sub_…``) holding only the
  task: none of the parent's history, no SOUL, no user model, no memory, no
  other personas (no messenger);
- the parent's **workspace, read-only** (``access: readonly``: file writes and
  shell writes are refused; it reports back in text);
- the tools subagents may have — offered in the ``subagent`` context, allowed
  by the persona's own filter, never a delegation tool (no recursion: depth
  is 1 and nesting is not allowed) — intersected with the call's
  ``allowed_tools``;
- the persona's model, or one of ``subagents.models`` named by the call.

Its model and tool calls are in the audit log under its own conversation id
(the handle), with the parent's persona name; the parent's turn holds a
``delegation`` event linking to it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from coterie.runtime.config import (
    ModelConfig,
    ToolFilter,
    runtime_timezone,
)
from coterie.runtime.context import Conversation, TurnContext, TurnSettings
from coterie.runtime.delegation.records import (
    SubagentLauncher,
    SubagentRequest,
    SubagentSetup,
    Work,
    WorkOutcome,
    WorkStatus,
)
from coterie.runtime.delegation.work import Delegations
from coterie.runtime.errors import ModelError, ToolError
from coterie.runtime.loop import TurnLoop
from coterie.runtime.messages import (
    AssistantMessage,
    HistoryAppended,
    ToolResultMessage,
    TurnEnded,
    TurnStarted,
    UserMessage,
    new_id,
)
from coterie.runtime.models.base import Model
from coterie.runtime.permissions.gate import PermissionGate
from coterie.runtime.permissions.rules import Places
from coterie.runtime.runner import ToolRunner
from coterie.runtime.services import (
    AuditSink,
    BudgetService,
    NullAudit,
    ProcessService,
    Services,
)
from coterie.runtime.tool import Deferred, ToolRegistry, ToolSpec, matches_any
from coterie.runtime.tracing import active
from coterie.runtime.tracing import genai as g
from coterie.runtime.tracing.spans import finish_turn, start_turn
from coterie.runtime.usage.prices import PriceTable

SUBAGENT_PROMPT = """\
You are a subagent working for the persona `{persona}`, which handed you one \
self-contained task. You start fresh: you have none of its conversation, and \
nobody will answer questions, so work it out with the tools you have.
{workspace}
When you are done, reply with a complete, self-contained report of what you \
found or did: it is the only thing `{persona}` will see.

Today is {today:%A, %Y-%m-%d}."""


def subagent_context(
    request: SubagentRequest,
    *,
    conversation: Conversation,
    turn_id: str,
    services: Services,
) -> TurnContext:
    """The turn context of a subagent's run (also used to decide, in the
    parent, which tools a subagent can have)."""
    settings = TurnSettings(
        workspace=Path(request.workspace) if request.workspace else None,
        # No persona directory: no .env secrets to pass, no persona files.
        persona_dir=None,
        home=Path(request.home) if request.home else None,
        spill_dir=Path(request.spill_dir),
        access="readonly",
        network=request.network,
        cluster_addresses=frozenset(request.cluster_addresses),
        secrets=dict(request.hidden),
        tool_filter=ToolFilter(allow=list(request.tools), deny=list(request.tool_deny)),
        thinking_mode=request.thinking,
        runtime=request.settings,
    )
    return TurnContext(
        persona=request.persona,
        conversation=conversation,
        turn_id=turn_id,
        kind="subagent",
        depth=1,
        # Who pays for its model calls: its parent, or the persona whose
        # ask_persona chain the parent answers.
        ask_path=[request.payer] if request.payer and request.payer != request.persona else [],
        settings=settings,
        services=services,
    )


def _count(history: Sequence[Any]) -> tuple[int, int, str | None]:
    steps = calls = 0
    last: str | None = None
    for message in history:
        if isinstance(message, AssistantMessage):
            steps += 1
            calls += len(message.tool_calls)
            if message.tool_calls:
                last = message.tool_calls[-1].name
    return steps, calls, last


class SubagentRun:
    """One subagent's run: a fresh conversation and one turn of the loop."""

    def __init__(
        self,
        request: SubagentRequest,
        *,
        model: Model,
        registry: ToolRegistry,
        audit: AuditSink | None = None,
        processes: ProcessService | None = None,
        budget: BudgetService | None = None,
    ) -> None:
        """``budget``: the runtime's budgets (its calls count against the
        persona that spawned it)."""
        self.request = request
        self.model = model
        self.audit: AuditSink = audit or NullAudit()
        self.conversation = Conversation(request.handle)
        self.turn_id = new_id("turn_")
        self.services = Services(audit=self.audit, processes=processes, budget=budget)
        if request.permission_settings is not None:
            # The parent's rules, never more: nobody reads a subagent's turn.
            self.services.permissions = PermissionGate(
                request.persona,
                settings=request.permission_settings,
                layers=request.permissions,
                places=Places(
                    workspace=Path(request.workspace) if request.workspace else None,
                    persona=Path(request.workspace).parent if request.workspace else None,
                    home=Path(request.home) if request.home else None,
                ),
                attended=False,
            )
        self.ctx = subagent_context(
            request, conversation=self.conversation, turn_id=self.turn_id, services=self.services
        )
        self.loop = TurnLoop(
            model=model,
            registry=registry,
            runner=ToolRunner(output_cap=request.output_cap, timeout=request.tool_timeout),
            max_steps=request.max_steps,
            max_tokens=request.max_tokens,
            prices=PriceTable.from_settings(request.settings.prices),
            compaction=request.settings.compaction,
        )
        self.started = time.monotonic()
        self.first_model_call: float | None = None

    def system_prompt(self) -> str:
        where = (
            f"You can read `{self.request.persona}`'s workspace at {self.request.workspace}, "
            "but not change anything in it."
            if self.request.workspace
            else "You have no workspace."
        )
        return SUBAGENT_PROMPT.format(
            persona=self.request.persona,
            workspace=where,
            today=datetime.now(runtime_timezone()),
        )

    def _record(self, event: Any) -> None:
        self.audit.record(event)

    async def run(self) -> WorkOutcome:
        """Run the task to its end; the outcome the parent's wake reports.

        An ``invoke_agent`` span, a child of the ``spawn_subagent`` call's."""
        request = self.request
        span = start_turn(
            persona=request.persona,
            conversation_id=request.handle,
            turn_id=self.turn_id,
            context="subagent",
            parent=request.trace,
            attributes={g.AGENT_ID: request.handle},
        )
        with active(span):
            try:
                outcome = await self._run()
            except BaseException as exc:
                finish_turn(span, status="error", steps=0, error=exc)
                raise
        steps, _, _ = _count(self.conversation.history)
        finish_turn(span, status=outcome.status, steps=steps, error=outcome.error)
        return outcome

    async def _run(self) -> WorkOutcome:
        request = self.request
        self._record(
            TurnStarted(
                persona=request.persona,
                conversation_id=request.handle,
                turn_id=self.turn_id,
                context="subagent",
            )
        )
        task = UserMessage(text=request.task, source=request.persona)
        self.conversation.history.append(task)
        self._record(
            HistoryAppended(
                persona=request.persona,
                conversation_id=request.handle,
                turn_id=self.turn_id,
                message=task,
            )
        )
        begun = time.perf_counter()
        try:
            result = await self.loop.run(self.ctx, system=self.system_prompt())
        except ModelError as exc:
            self._end(begun, "error", str(exc))
            return WorkOutcome(status="error", error=str(exc), data=self._facts())
        self._end(begun, result.status, None)
        text = result.text or result.summary or ""
        status: WorkStatus = "failed" if result.status in ("failed", "error") else "ok"
        data = self._facts()
        if result.status == "skipped":
            data["end_task"] = "skipped"
        return WorkOutcome(status=status, text=text, data=data)

    def _end(self, begun: float, status: Any, error: str | None) -> None:
        steps, _, _ = _count(self.conversation.history)
        self._record(
            TurnEnded(
                persona=self.request.persona,
                conversation_id=self.request.handle,
                turn_id=self.turn_id,
                status=status,
                steps=steps,
                duration_ms=(time.perf_counter() - begun) * 1000,
                error=error,
            )
        )

    def _facts(self) -> dict[str, Any]:
        steps, calls, _ = _count(self.conversation.history)
        return {"steps": steps, "tool_calls": calls, "model": self.model.name}

    def progress(self) -> dict[str, Any]:
        steps, calls, last = _count(self.conversation.history)
        errors = sum(
            1
            for m in self.conversation.history
            if isinstance(m, ToolResultMessage) and m.error_kind is not None
        )
        body: dict[str, Any] = {"steps": steps, "tool_calls": calls, "tool_errors": errors}
        if last is not None:
            body["last_tool"] = last
        return body

    async def aclose(self) -> None:
        """Stop its processes, flush its audit events, close its model."""
        if self.services.processes is not None:
            await self.services.processes.close()
        await self.audit.flush()
        await self.model.aclose()


class SpawnRequest(BaseModel):
    """The arguments of ``spawn_subagent``, as the tool validated them."""

    task: str
    allowed_tools: list[str] | None = None
    model: str | None = None
    timeout_s: float | None = None


def subagent_tools(
    registry: ToolRegistry, parent: TurnContext, probe: Callable[[ToolSpec], bool]
) -> list[str]:
    """Names of the tools a subagent of ``parent`` may have: offered in the
    ``subagent`` context, allowed by the persona's filter, not delegation,
    and available (``probe``: the tool's own ``available`` on a subagent's
    context)."""
    names: list[str] = []
    allow, deny = parent.settings.tool_filter.allow, parent.settings.tool_filter.deny
    for name in registry.names():
        spec = registry.get(name)
        assert spec is not None
        if spec.delegation or not spec.offered_in("subagent"):
            continue
        if not matches_any(name, allow) or matches_any(name, deny):
            continue
        if probe(spec):
            names.append(name)
    return names


def choose_tools(possible: list[str], allowed: list[str] | None) -> list[str]:
    """``possible`` ∩ ``allowed`` (names or ``*`` patterns); an entry that
    matches nothing is an ``invalid_arguments`` error naming the choices."""
    if allowed is None:
        return possible
    chosen: list[str] = []
    for entry in allowed:
        hits = [n for n in possible if fnmatch.fnmatchcase(n, entry)]
        if not hits:
            raise ToolError(
                "invalid_arguments",
                f"allowed_tools: {entry!r} is not a tool a subagent can have; "
                f"choose from: {', '.join(possible) or '(none)'}",
            )
        chosen.extend(h for h in hits if h not in chosen)
    return chosen


def _inherited_permissions(ctx: TurnContext) -> dict[str, Any]:
    """The parent's permission rules, for its subagent's request."""
    gate = ctx.services.permissions
    if not isinstance(gate, PermissionGate):
        return {}
    return {"permissions": gate.layered_rules(), "permission_settings": gate.settings}


async def start_subagent(
    ctx: TurnContext, delegations: Delegations, setup: SubagentSetup, args: SpawnRequest
) -> Deferred:
    """``spawn_subagent``: check the request, launch, register; the handle."""
    settings = setup.config.subagents
    if args.model is not None and args.model not in settings.models:
        names = ", ".join(sorted(settings.models))
        raise ToolError(
            "invalid_arguments",
            f"model: {args.model!r} is not one of this persona's subagent models"
            + (f" ({names})" if names else " (it names none in subagents.models: omit model)"),
        )
    timeout = args.timeout_s if args.timeout_s is not None else settings.timeout_s
    if timeout > settings.max_timeout_s:
        raise ToolError(
            "invalid_arguments",
            f"timeout_s: {timeout:g} is above subagents.max_timeout_s ({settings.max_timeout_s:g})",
        )
    delegations.check_capacity("subagent", "subagents.max_running")
    handle = new_id("sub_")
    config = setup.config
    given = ctx.settings
    request = SubagentRequest(
        handle=handle,
        persona=ctx.persona,
        payer=ctx.billed_to,
        task=args.task,
        model=settings.models[args.model] if args.model else config.model,
        tools=[],
        tool_deny=list(given.tool_filter.deny),
        workspace=str(given.workspace) if given.workspace else None,
        home=str(given.home) if given.home else None,
        spill_dir=str(given.spill_dir),
        hidden=dict(given.secrets),
        settings=given.runtime,
        network=given.network,
        cluster_addresses=sorted(given.cluster_addresses),
        thinking=config.thinking,
        max_steps=settings.max_steps,
        max_tokens=config.model.max_tokens,
        output_cap=config.output_cap,
        tool_timeout=config.tool_timeout,
        **_inherited_permissions(ctx),
    )
    # Decide the tools on a context like the subagent's own (the parent's
    # process service stands in for the one the subagent will have).
    probe_ctx = subagent_context(
        request,
        conversation=Conversation(handle),
        turn_id="",
        services=Services(processes=ctx.services.processes),
    )
    possible = subagent_tools(
        setup.registry, ctx, lambda spec: spec.available is None or spec.available(probe_ctx)
    )
    request.tools = choose_tools(possible, args.allowed_tools)
    work = await setup.launcher.launch(request)
    delegations.register(
        handle=handle,
        kind="subagent",
        work=work,
        conversation_id=ctx.conversation_id,
        turn_id=ctx.turn_id,
        batch_id=ctx.outputs.batch_id,
        timeout=timeout,
        label=args.task,
        data={"tools": request.tools, "model": request.model.name},
    )
    return Deferred.model_validate(
        {"kind": "subagent", "handle": handle, "tools": request.tools, "timeout_s": timeout}
    )


class _LocalWork:
    """A subagent running as a task of this process's event loop."""

    def __init__(self, run: SubagentRun) -> None:
        self.run = run
        self.task = asyncio.get_running_loop().create_task(run.run(), name=run.request.handle)

    async def result(self) -> WorkOutcome:
        return await self.task

    async def progress(self) -> dict[str, Any]:
        return self.run.progress()

    async def cancel(self) -> None:
        self.task.cancel()

    async def discard(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.run.aclose()


class LocalSubagents:
    """Subagents as tasks in this process: in-process runtimes and tests.

    ``model_factory`` builds each subagent's model from its config;
    ``processes`` gives each its own process service (or none: no shell).
    """

    def __init__(
        self,
        *,
        registry: ToolRegistry,
        model_factory: Callable[[ModelConfig], Model],
        audit: AuditSink | None = None,
        processes: Callable[[], ProcessService] | None = None,
        budget: BudgetService | None = None,
    ) -> None:
        self.registry = registry
        self.model_factory = model_factory
        self.audit = audit
        self.processes = processes
        self.budget = budget
        self.launched = 0

    async def launch(self, request: SubagentRequest) -> Work:
        self.launched += 1
        run = SubagentRun(
            request,
            model=self.model_factory(request.model),
            registry=self.registry,
            audit=self.audit,
            processes=self.processes() if self.processes else None,
            budget=self.budget,
        )
        return _LocalWork(run)

    def close(self) -> None:
        return None


__all__ = [
    "SUBAGENT_PROMPT",
    "LocalSubagents",
    "SpawnRequest",
    "SubagentLauncher",
    "SubagentRequest",
    "SubagentRun",
    "SubagentSetup",
    "choose_tools",
    "start_subagent",
    "subagent_context",
    "subagent_tools",
]
