"""Coding agents: a persona delegates a coding task to an external agent.

``start_coding_agent`` picks an agent of the roster (``<home>/acp.json``, see
:mod:`runtime.delegation.acp.roster`), starts it — one CodingAgent actor per
delegation, holding one :class:`~runtime.delegation.acp.session.AcpSession` — and
waits for ``initialize`` + ``session/new`` (up to the entry's
``startup_timeout``). Then it returns a ``acp_…`` handle; the task runs on,
its ``session/update`` notifications go to the audit log (in the parent's
turn, as ``delegation`` events: merged agent messages and thoughts, tool
calls, plans, permission decisions) and to ``task_status``, and its end —
stop reason, final message, files changed — comes back as a wake.

What the agent reports its task consumed (ACP's ``PromptResponse.usage``
and the cost in its ``usage_update`` notifications) becomes one
``model_call`` event (``context`` ``coding_agent``, provider ``acp``, the
roster name as the model), billed to the persona that started the work; a
cost in US dollars also counts against that persona's budget once the task
ends (it could not be reserved beforehand: nobody knows it until the agent
says). Nothing is estimated: an agent that reports nothing records nothing.

A start that fails (missing binary, an agent that exits at once, no answer
within the startup timeout, a protocol error, a missing secret) is the
tool's error; a failure later (a crash, a protocol error, the prompt
timeout) is the wake's. The SDK is imported only where a session runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from coterie.runtime.context import TurnContext
from coterie.runtime.delegation.acp.roster import AcpRosterError, resolve_agent_env
from coterie.runtime.delegation.records import (
    CodingRequest,
    CodingSetup,
    Work,
    WorkOutcome,
    WorkStatus,
)
from coterie.runtime.delegation.work import Delegations
from coterie.runtime.errors import CoterieError, ErrorKind, ToolError
from coterie.runtime.messages import BudgetWarning, DelegationEvent, ModelCalled, new_id
from coterie.runtime.services import AuditSink, BudgetService, NullAudit
from coterie.runtime.shell.sandbox import Sandbox, SandboxChoice
from coterie.runtime.tool import Deferred
from coterie.runtime.tracing import NOOP, Span, active
from coterie.runtime.tracing.spans import agent_update, finish_agent_run, start_agent_run

if TYPE_CHECKING:
    from coterie.runtime.delegation.acp.records import AnyEvent, AskPermission, CodingResult
    from coterie.runtime.delegation.acp.session import AcpSession

log = logging.getLogger("coterie.delegation")

#: How long past the roster's prompt_timeout the registry waits before it
#: stops the delegation itself (the session's own timeout comes first).
TIMEOUT_MARGIN_S = 60.0
#: Characters of a message or thought kept per audit event.
EVENT_TEXT_CAP = 4_000

# How an ACP start failure (AcpError.kind) reads as a tool error.
_START_KINDS: dict[str, ErrorKind] = {
    "missing_binary": "agent_start_failed",
    "exited": "agent_start_failed",
    "missing_secret": "missing_secret",
    "startup_timeout": "timeout",
    "protocol_error": "protocol_error",
}


def redact(text: str, hidden: dict[str, str]) -> str:
    for name, value in sorted(hidden.items(), key=lambda kv: -len(kv[1])):
        if value and value in text:
            text = text.replace(value, f"[redacted:{name}]")
    return text


def outcome_of(result: CodingResult, hidden: dict[str, str]) -> WorkOutcome:
    """A :class:`CodingResult` as the wake reports it."""
    status: WorkStatus
    error = result.error
    if result.error_kind == "crashed":
        status = "crashed"
    elif result.error_kind == "timeout":
        status = "timeout"
    elif result.error_kind is not None:
        status = "error"
    elif result.stop_reason == "cancelled":
        status = "cancelled"
    elif result.stop_reason == "end_turn":
        status = "ok"
    else:
        status = "failed"
        error = f"the agent stopped: {result.stop_reason}"
    allowed = sum(p.decision == "allow" for p in result.permissions)
    data: dict[str, Any] = {
        "agent": result.agent,
        "stop_reason": result.stop_reason,
        "files_changed": result.files_changed,
        "tool_calls": result.tool_calls,
        "permissions": f"{allowed} allowed, {len(result.permissions) - allowed} denied",
        "duration_s": result.duration_s,
    }
    if not result.files_changed_complete:
        data["files_changed_complete"] = False
    if result.usage is not None:
        usage = result.usage
        reported: dict[str, Any] = {}
        if usage.tokens_reported:
            reported |= {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
        if usage.cost is not None:
            reported["cost"] = f"{usage.cost:.6g} {usage.currency}"
        if usage.cost_usd is not None:
            reported["cost_usd"] = usage.cost_usd
        data["usage"] = reported
    return WorkOutcome(
        status=status,
        text=redact(result.text, hidden),
        error=redact(error, hidden) if error else None,
        data=data,
    )


def terminal_sandbox(request: CodingRequest) -> Sandbox | None:
    """How the agent's client terminals are confined; ``None`` (no terminals
    offered) without bubblewrap on this node. Under the ``deny`` policy the
    commands may read but not write."""
    choice = SandboxChoice()
    if not choice.sandboxed:
        return None
    return choice.sandbox(
        Path(os.path.realpath(request.cwd)),
        "readonly" if request.spec.permissions == "deny" else "workspace",
        Path(request.persona_dir) if request.persona_dir else None,
        Path(request.home) if request.home else None,
        network=request.network,
    )


class CodingAgentRun:
    """One delegation: an ACP session, its events into the audit log."""

    def __init__(
        self,
        request: CodingRequest,
        *,
        audit: AuditSink | None = None,
        ask: AskPermission | None = None,
    ) -> None:
        """``ask``: where the agent's permission requests go under
        ``permissions: ask`` (the persona's rules, then a person)."""
        from coterie.runtime.delegation.acp.session import AcpSession

        self.request = request
        self.audit: AuditSink = audit or NullAudit()
        self.session: AcpSession = AcpSession(
            request.spec,
            name=request.agent,
            workspace=Path(request.cwd),
            log_path=Path(request.log_path),
            env=request.env,
            on_update=self._on_update,
            terminals=terminal_sandbox(request),
            ask=ask,
        )
        # Consecutive message (or thought) chunks, merged into one event.
        self._merging: tuple[str, list[str]] | None = None
        self.updates = 0
        self.last_tool: str | None = None
        self.plan: list[dict[str, Any]] = []
        #: The agent's ``invoke_agent`` span, from start to the end of its task.
        self.span: Span = NOOP
        self._span_open = False

    async def start(self) -> None:
        """Spawn, ``initialize``, ``session/new``; raises ``AcpError`` (stopped)."""
        request = self.request
        self.span = start_agent_run(
            agent=request.agent,
            handle=request.handle,
            persona=request.persona,
            conversation_id=request.parent_conversation_id,
            parent=request.trace,
        )
        self._span_open = True
        try:
            # The session's reader starts here: its updates are recorded in the span.
            with active(self.span):
                await self.session.start()
        except BaseException as exc:
            self._finish_span(status="error", error=f"{type(exc).__name__}: {exc}")
            raise

    def _finish_span(self, **how: Any) -> None:
        if self._span_open:
            self._span_open = False
            finish_agent_run(self.span, **how)

    def _record(self, phase: Any, data: dict[str, Any]) -> None:
        self.updates += 1
        agent_update(self.span, str(data.get("type", phase)), data)
        self.audit.record(
            DelegationEvent(
                persona=self.request.persona,
                conversation_id=self.request.parent_conversation_id,
                turn_id=self.request.parent_turn_id,
                handle=self.request.handle,
                work="coding_agent",
                phase=phase,
                child_conversation_id=self.request.handle,
                data=data,
            )
        )

    def _flush_text(self) -> None:
        if self._merging is None:
            return
        kind, parts = self._merging
        self._merging = None
        text = redact("".join(parts), self.request.hidden)
        if len(text) > EVENT_TEXT_CAP:
            text = text[:EVENT_TEXT_CAP] + f" [… {len(text) - EVENT_TEXT_CAP} characters more]"
        self._record("update", {"type": kind, "text": text})

    def _on_update(self, event: AnyEvent) -> None:
        kind = event.kind
        if kind in ("message", "thought"):
            text: str = getattr(event, "text", "")
            if self._merging is not None and self._merging[0] == kind:
                self._merging[1].append(text)
            else:
                self._flush_text()
                self._merging = (kind, [text])
            return
        self._flush_text()
        body = event.model_dump(mode="json", exclude={"at"})
        body["type"] = body.pop("kind")
        if kind == "tool_call" and body.get("title"):
            self.last_tool = str(body["title"])
        if kind == "plan":
            self.plan = list(body.get("steps", []))
        self._record("permission" if kind == "permission" else "update", body)

    async def run(self) -> WorkOutcome:
        """Send the task; wait for the end of the turn (never raises for the agent)."""
        with active(self.span):
            result = await self.session.prompt(self.request.task)
            self._flush_text()
            self._record_usage(result)
        outcome = outcome_of(result, self.request.hidden)
        self._finish_span(
            status=outcome.status,
            error=outcome.error,
            usage=result.usage,
            stop_reason=result.stop_reason,
            files_changed=len(result.files_changed),
        )
        return outcome

    def _record_usage(self, result: CodingResult) -> None:
        usage = result.usage
        if usage is None:
            return
        request = self.request
        cost = usage.cost_usd
        error = None
        if usage.cost is not None and cost is None:
            error = f"the agent reported its cost in {usage.currency}, not USD: not counted"
        self.audit.record(
            ModelCalled(
                persona=request.persona,
                conversation_id=request.parent_conversation_id,
                turn_id=request.parent_turn_id,
                provider="acp",
                model=request.agent,
                step=0,
                latency_ms=round(result.duration_s * 1000, 3),
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens + usage.thought_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                cost_usd=cost,
                priced=cost is not None,
                context="coding_agent",
                billed_to=request.payer or request.persona,
                tool_calls=result.tool_calls,
                stop_reason=result.stop_reason,
                error=error,
            )
        )

    def progress(self) -> dict[str, Any]:
        session = self.session
        body: dict[str, Any] = {
            "agent": self.request.agent,
            "cwd": self.request.cwd,
            "updates": self.updates,
            "permissions": len(session.permissions),
        }
        if self.last_tool:
            body["last_tool"] = self.last_tool
        if self.plan:
            body["plan"] = self.plan
        messages = [e for e in session.events if e.kind == "message"]
        if messages:
            body["last_message"] = redact(getattr(messages[-1], "text", ""), self.request.hidden)[
                -500:
            ]
        return body

    async def cancel(self) -> None:
        """``session/cancel``, then the whole process group is stopped."""
        await self.session.cancel()

    async def close(self) -> None:
        self._flush_text()
        await self.session.close()
        await self.audit.flush()
        # Closed before its task ended (cancelled, or its persona stopping).
        self._finish_span(status="cancelled", error="closed before its task ended")


class ChargedWork:
    """A coding delegation whose reported cost (US dollars) counts against
    its payer's budget when it ends; its warnings go to ``audit``."""

    def __init__(
        self,
        work: Work,
        request: CodingRequest,
        budget: BudgetService | None,
        audit: AuditSink | None,
    ) -> None:
        self.work = work
        self.request = request
        self.budget = budget
        self.audit = audit

    async def result(self) -> WorkOutcome:
        outcome = await self.work.result()
        usage = outcome.data.get("usage")
        cost = usage.get("cost_usd") if isinstance(usage, dict) else None
        if self.budget is not None and isinstance(cost, int | float) and cost > 0:
            await self._charge(float(cost))
        return outcome

    async def _charge(self, cost: float) -> None:
        request = self.request
        assert self.budget is not None
        try:
            warnings: list[BudgetWarning] = await self.budget.charge(
                request.payer or request.persona,
                cost,
                persona=request.persona,
                conversation_id=request.parent_conversation_id,
            )
        except Exception:  # boundary: the ledger's host is away; the cost is in the log
            log.exception("coding agent %s: its cost could not be counted", request.handle)
            return
        for warning in warnings:
            log.warning(
                "%s: %s has spent $%.4f of its budget of $%.2f",
                request.persona,
                warning.scope,
                warning.spent_usd,
                warning.limit_usd,
            )
            if self.audit is not None:
                self.audit.record(warning.model_copy(update={"turn_id": request.parent_turn_id}))

    async def progress(self) -> dict[str, Any]:
        return await self.work.progress()

    async def cancel(self) -> None:
        await self.work.cancel()

    async def discard(self) -> None:
        await self.work.discard()


class _LocalWork:
    def __init__(self, run: CodingAgentRun) -> None:
        self.run = run
        self.task = asyncio.get_running_loop().create_task(run.run(), name=run.request.handle)

    async def result(self) -> WorkOutcome:
        return await self.task

    async def progress(self) -> dict[str, Any]:
        return self.run.progress()

    async def cancel(self) -> None:
        await self.run.cancel()

    async def discard(self) -> None:
        await self.run.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.run.close()


class LocalCodingAgents:
    """Coding agents whose sessions run in this process (no Ray)."""

    def __init__(
        self,
        *,
        audit: AuditSink | None = None,
        budget: BudgetService | None = None,
        ask: Callable[[CodingRequest], AskPermission] | None = None,
    ) -> None:
        """``ask(request)``: where that delegation's permission requests go
        under ``permissions: ask``."""
        self.audit = audit
        self.budget = budget
        self.ask = ask
        self.launched = 0

    async def launch(self, request: CodingRequest) -> Work:
        asker = self.ask(request) if self.ask is not None else None
        run = CodingAgentRun(request, audit=self.audit, ask=asker)
        try:
            await run.start()
        except BaseException:
            await run.close()
            raise
        self.launched += 1
        return ChargedWork(_LocalWork(run), request, self.budget, self.audit)


class StartRequest(BaseModel):
    """``start_coding_agent``'s arguments, ``cwd`` already checked by the rails."""

    task: str
    agent: str | None = None
    cwd: Path | None = None


async def start_coding_agent(
    ctx: TurnContext, delegations: Delegations, setup: CodingSetup, args: StartRequest
) -> Deferred:
    """Check the request, start the agent and its session, register; the handle."""
    try:
        roster = await asyncio.to_thread(setup.roster.get)
    except AcpRosterError as exc:
        raise ToolError("unavailable", str(exc)) from None
    names = roster.names()
    if not names:
        raise ToolError("unavailable", f"no coding agents are configured in {setup.roster.path}")
    name = args.agent or roster.default_name()
    if name is None:
        raise ToolError(
            "invalid_arguments", f"agent: name one of {', '.join(names)} (none is the default)"
        )
    spec = roster.get(name)
    if spec is None:
        raise ToolError(
            "invalid_arguments",
            f"agent: {name!r} is not in the roster; choose from {', '.join(names)}",
        )
    settings = ctx.settings
    assert settings.workspace is not None
    workspace = settings.workspace.resolve()
    cwd = args.cwd or workspace
    if cwd != workspace and spec.cwd == "workspace":
        raise ToolError(
            "invalid_arguments",
            f"cwd: agent {name!r} runs in the workspace only (its acp.json entry says "
            'cwd: "workspace"); omit cwd',
        )
    env = await asyncio.to_thread(
        resolve_agent_env,
        spec,
        persona_dir=settings.persona_dir,
        environ=setup.environ(),
        agent=name,
    )
    delegations.check_capacity("coding_agent", "coding_agents.max_running")
    handle = new_id("acp_")
    request = CodingRequest(
        handle=handle,
        persona=ctx.persona,
        payer=ctx.billed_to,
        agent=name,
        spec=spec,
        task=args.task,
        cwd=str(cwd),
        env=env,
        log_path=str(setup.logs / f"{handle}.log"),
        parent_conversation_id=ctx.conversation_id,
        parent_turn_id=ctx.turn_id,
        origin=ctx.origin,
        hidden={**settings.secrets, **{f"agent env {k}": v for k, v in env.items() if len(v) >= 8}},
        persona_dir=str(settings.persona_dir) if settings.persona_dir else None,
        home=str(settings.home) if settings.home else None,
        network=settings.network.shell,
    )
    try:
        work = await setup.launcher.launch(request)
    except CoterieError as exc:
        kind = _START_KINDS.get(str(getattr(exc, "kind", "")), "agent_start_failed")
        raise ToolError(kind, redact(str(exc), request.hidden)) from None
    delegations.register(
        handle=handle,
        kind="coding_agent",
        work=work,
        conversation_id=ctx.conversation_id,
        turn_id=ctx.turn_id,
        batch_id=ctx.outputs.batch_id,
        timeout=spec.prompt_timeout + TIMEOUT_MARGIN_S,
        label=args.task,
        data={"agent": name, "cwd": str(cwd), "permissions": spec.permissions},
    )
    return Deferred.model_validate(
        {
            "kind": "coding_agent",
            "handle": handle,
            "status": "started",
            "agent": name,
            "cwd": str(cwd),
        }
    )


__all__ = [
    "ChargedWork",
    "CodingAgentRun",
    "LocalCodingAgents",
    "StartRequest",
    "outcome_of",
    "start_coding_agent",
]
