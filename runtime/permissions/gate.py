"""The permission check before every tool call (DESIGN.md §4).

:class:`PermissionGate` is a persona's rules at work: the runner hands it
each validated call; it resolves the call's effect (the tool's ``effect``),
asks :class:`~runtime.permissions.rules.PermissionRules`, and

- ``allow``: the call runs;
- ``deny``: the model reads ``permission_denied`` naming the rule;
- ``ask``: on a turn a person reads along (a ``user`` turn of the persona
  itself), an approval is requested and the call waits for the answer
  (:mod:`runtime.permissions.approvals`); elsewhere (heartbeat, cron, eval,
  subagents) ``permissions.unattended`` decides.

``always`` writes an ``allow`` rule for exactly that effect into
``<persona>/approved.yaml`` (read before the persona's own rules; a person
removes a line to take it back). The same call refused three times in one
turn ends the turn (``failed``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import shlex
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from coterie.runtime.config import PermissionRule, PermissionSettings
from coterie.runtime.config._strict import Strict, describe_error
from coterie.runtime.connectors.base import APPROVAL_BUTTONS, OutboundMessage
from coterie.runtime.context import EndTask, TurnContext
from coterie.runtime.errors import CoterieError, PersonaConfigError
from coterie.runtime.loop import MAX_REFUSALS, call_key
from coterie.runtime.messages import API_ORIGIN, ApprovalEvent, ToolCall
from coterie.runtime.permissions.approvals import ApprovalDesk, Verdict, new_approval_id
from coterie.runtime.permissions.effects import Effect, agent_request_effect, call_effect
from coterie.runtime.permissions.rules import Decision, PermissionRules, Places
from coterie.runtime.runner import error_result
from coterie.runtime.services import AuditSink, DeliveryService
from coterie.runtime.tool import ToolSpec

log = logging.getLogger("coterie.permissions")

#: The tool name permission rules give a coding agent's own requests.
AGENT_TOOL = "coding_agent"
#: The file ``always`` writes, in the persona's directory.
APPROVED_FILE = "approved.yaml"
#: Origins whose callers hear the turn's events (the approval prompt comes
#: with them); any other connector gets a message with buttons.
_STREAMED = frozenset({API_ORIGIN, "web", "cli"})
_HEADER = (
    "# Rules a person approved with 'always' (coterie). They are read before\n"
    "# persona.yaml's rules; a deny rule anywhere still wins. Remove an entry\n"
    "# to take it back.\n"
)


class ApprovedRules(Strict):
    """The contents of ``approved.yaml``."""

    rules: list[PermissionRule] = []


async def notify(event: ApprovalEvent, deliveries: DeliveryService | None) -> None:
    """Show an approval in the chat its turn came from, with its buttons (a
    connector's chat: Telegram). Streaming callers (``coterie chat``, the
    chat page) hear the ``approval`` event instead; everyone can see it in
    ``GET /v1/approvals``."""
    origin = event.origin
    if deliveries is None or origin.destination is None or origin.connector in _STREAMED:
        return
    message = OutboundMessage(
        connector=origin.connector,
        destination=origin.destination,
        text=f"{event.tool} needs your approval:\n{event.summary}\n({event.rule})",
        persona=event.persona,
        conversation_id=event.conversation_id,
        buttons=[label for label, _ in APPROVAL_BUTTONS],
        expires_at=event.expires_at,
        approval_id=event.approval_id,
    )
    try:
        await deliveries.deliver(message)
    except CoterieError as exc:  # still answerable through the API
        log.warning(
            "%s: approval %s not shown on %s: %s",
            event.persona,
            event.approval_id,
            origin.connector,
            exc,
        )


async def ask_person(
    desk: ApprovalDesk,
    event: ApprovalEvent,
    audit: AuditSink,
    deliveries: DeliveryService | None,
) -> Verdict:
    """Record ``event`` (requested), show it on its origin's chat, and wait
    for its answer or its expiry. Cancelled, the approval stays pending."""
    waiting = asyncio.ensure_future(desk.wait(event, audit))
    try:
        await asyncio.sleep(0)  # requested (recorded) before anyone hears of it
        await notify(event, deliveries)
        return await waiting
    finally:
        if not waiting.done():
            waiting.cancel()


async def agent_permission(
    gate: PermissionGate | None,
    desk: ApprovalDesk,
    *,
    persona: str,
    settings: PermissionSettings,
    ask: Any,
    audit: AuditSink,
    deliveries: DeliveryService | None,
) -> tuple[bool, str]:
    """A coding agent's permission request under ``permissions: ask`` (an
    :class:`~runtime.delegation.records.AgentAsk`): the persona's rules for
    the tool ``coding_agent`` first (deny refuses, allow allows), else a
    person answers it as an approval. Whether it is allowed, and why."""
    question = ask.question
    effect = agent_request_effect(
        question.agent, question.command, question.paths, question.title, question.tool_kind
    )
    decision = gate.rules.decide(AGENT_TOOL, effect) if gate is not None else Decision("allow")
    if decision.action == "deny" and decision.rule is not None:
        return False, f"refused by {decision.rule.describe()}"
    if decision.action == "allow" and decision.rule is not None:
        return True, f"allowed by {decision.rule.describe()}"
    rule = decision.rule.describe() if decision.rule else "acp.json: permissions: ask"
    event = ApprovalEvent(
        persona=persona,
        conversation_id=ask.conversation_id,
        turn_id=ask.turn_id,
        approval_id=new_approval_id(),
        phase="requested",
        state="pending",
        tool=AGENT_TOOL,
        call_id=question.tool_call_id,
        summary=effect.summary,
        rule=rule,
        arguments=question.model_dump(mode="json"),
        expires_at=time.time() + settings.approval_timeout,
        origin=ask.origin,
    )
    verdict = await ask_person(desk, event, audit, deliveries)
    who = f"{verdict.by} via {verdict.via}" if verdict.by else str(verdict.via)
    if verdict.state == "approved":
        if verdict.always and gate is not None:
            gate.always(AGENT_TOOL, effect, decision, verdict)
        return True, f"approved by {who}"
    if verdict.state == "expired":
        return False, f"nobody answered within {settings.approval_timeout:g} s"
    return False, f"denied by {who}"


def load_approved(path: Path) -> list[PermissionRule]:
    """The rules of ``approved.yaml`` (none if it does not exist); raises
    :class:`PersonaConfigError` naming the file and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        raw = yaml.safe_load(text) or {}
        return ApprovedRules.model_validate(raw).rules
    except yaml.YAMLError as exc:
        raise PersonaConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    except ValidationError as exc:
        problems = [describe_error(e) for e in exc.errors()]  # type: ignore[arg-type]
        raise PersonaConfigError(str(path), problems) from None


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def exact_rule(tool: str, effect: Effect, decision: Decision, note: str) -> PermissionRule:
    """An ``allow`` rule for exactly this effect (what ``always`` writes)."""
    if effect.kind == "shell":
        subject = decision.subject or ""
        words = shlex.split(subject) if subject else []
        match = shlex.join(_glob_escape(w) for w in words)
    elif effect.kind == "host":
        match = _glob_escape(str(effect.subjects[0]))
    else:
        match = _glob_escape(str(decision.subject or effect.subjects[0]))
    return PermissionRule(tool=tool, match=match, action="allow", exact=True, reason=note)


class PermissionGate:
    """A persona's rules and approvals, checked before each tool call."""

    def __init__(
        self,
        persona: str,
        *,
        settings: PermissionSettings,
        layers: Sequence[tuple[str, Sequence[PermissionRule]]],
        places: Places,
        desk: ApprovalDesk | None = None,
        approved_path: Path | None = None,
        attended: bool = True,
    ) -> None:
        """``settings``: unattended and approval_timeout; ``layers``: the
        rules in order, each with where it is written; ``desk``: where
        approvals wait (None: every ask is unattended); ``approved_path``:
        the file ``always`` writes; ``attended``: False for a persona whose
        turns nobody reads (a subagent)."""
        self.persona = persona
        self.settings = settings
        self.places = places
        self.desk = desk
        self.approved_path = approved_path
        self.attended = attended
        self.layers = [(source, list(rules)) for source, rules in layers]
        self.rules = PermissionRules(self.layers, places)

    def refusal(self, tool: str, effect: Effect) -> str | None:
        """Why the rules would not let ``tool`` do ``effect`` without asking
        (a redirect's target: there is no asking mid-call); None if they allow it."""
        decision = self.rules.decide(tool, effect)
        if decision.action == "allow":
            return None
        if decision.rule is not None:
            return f"{effect.summary}: {decision.action} by {decision.rule.describe()}"
        return f"{effect.summary}: {decision.note or decision.action}"

    def layered_rules(self) -> list[tuple[str, list[PermissionRule]]]:
        """The rules as given (a subagent inherits them)."""
        return [(source, list(rules)) for source, rules in self.layers]

    async def effect(
        self, spec: ToolSpec, args: BaseModel, call: ToolCall, ctx: TurnContext
    ) -> Effect:
        """What the call would do, for the rules."""
        if spec.effect is None:
            raw = args.model_dump(mode="json")
            extra = getattr(args, "model_extra", None)
            return call_effect(spec.name, {**raw, **(extra or {})})
        value = spec.effect(args, ctx)
        if inspect.isawaitable(value):
            value = await value
        assert isinstance(value, Effect)
        return value

    async def check(
        self, spec: ToolSpec, args: BaseModel, call: ToolCall, ctx: TurnContext
    ) -> str | None:
        """None when the call may run; else the error result the model reads."""
        if not self.rules.covers(spec.name) or call.id in ctx.outputs.granted:
            return None
        effect = await self.effect(spec, args, call, ctx)
        decision = self.rules.decide(spec.name, effect)
        if decision.action == "allow":
            return None
        if decision.action == "deny":
            assert decision.rule is not None
            return self._refuse(
                call,
                ctx,
                f"{effect.summary}: refused by {decision.rule.describe()}",
                rule=decision.rule.label,
            )
        rule = decision.rule.describe() if decision.rule else (decision.note or "")
        if not (self.attended and ctx.kind == "user" and ctx.depth == 0) or self.desk is None:
            return self._unattended(spec, call, ctx, effect, rule)
        now = time.time()
        event = ApprovalEvent(
            persona=ctx.persona,
            conversation_id=ctx.conversation_id,
            turn_id=ctx.turn_id,
            approval_id=new_approval_id(),
            phase="requested",
            state="pending",
            tool=spec.name,
            call_id=call.id,
            summary=ctx.settings.redact(effect.summary),
            rule=rule,
            arguments=json.loads(ctx.settings.redact(json.dumps(call.arguments, default=str))),
            expires_at=now + self.settings.approval_timeout,
            origin=ctx.origin,
        )
        log.info("%s: %s waits for approval %s", ctx.persona, spec.name, event.approval_id)
        verdict = await ask_person(self.desk, event, ctx.audit, ctx.services.deliveries)
        return self.apply(verdict, event, spec.name, effect, decision, call, ctx)

    def apply(
        self,
        verdict: Verdict,
        event: ApprovalEvent,
        tool: str,
        effect: Effect | None,
        decision: Decision | None,
        call: ToolCall,
        ctx: TurnContext,
    ) -> str | None:
        """What an answered approval means for its call: None (it runs) or
        the refusal the model reads. ``always`` writes its rule."""
        if verdict.state == "approved":
            if verdict.always and effect is not None and decision is not None:
                self.always(tool, effect, decision, verdict)
            return None
        if verdict.state == "expired":
            why = (
                f"nobody answered the approval within {self.settings.approval_timeout:g} s "
                "(permissions.approval_timeout)"
            )
        else:
            who = f" ({verdict.by} via {verdict.via})" if verdict.by else ""
            why = f"a person denied it{who}"
        return self._refuse(call, ctx, f"{event.summary}: {why}", approval=event.approval_id)

    def always(
        self, tool: str, effect: Effect, decision: Decision, verdict: Verdict
    ) -> PermissionRule:
        """Add an ``allow`` rule for exactly ``effect`` to ``approved.yaml``
        (and to the rules in force now)."""
        day = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        who = f"{verdict.by} via {verdict.via}" if verdict.by else f"via {verdict.via}"
        rule = exact_rule(tool, effect, decision, f"approved always by {who}, {day}")
        source, current = self.layers[0] if self.layers else (APPROVED_FILE, [])
        if source != APPROVED_FILE:
            current = []
            self.layers.insert(0, (APPROVED_FILE, current))
        current.append(rule)
        self.rules = PermissionRules(self.layers, self.places)
        if self.approved_path is not None:
            data = {"rules": [r.model_dump(exclude_defaults=True) for r in current]}
            tmp = self.approved_path.with_suffix(".yaml.tmp")
            tmp.write_text(_HEADER + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            tmp.replace(self.approved_path)
        return rule

    async def always_for(
        self, spec: ToolSpec | None, call: ToolCall, ctx: TurnContext, resume: Any
    ) -> None:
        """``always`` answered after a restart: the rule for the call's effect."""
        if spec is None:
            return
        raw = call.arguments
        try:
            args = spec.args_model.model_validate(json.loads(raw) if isinstance(raw, str) else raw)
        except (ValueError, ValidationError):
            return
        effect = await self.effect(spec, args, call, ctx)
        decision = self.rules.decide(spec.name, effect)
        verdict = Verdict("approved", always=True, by=resume.decided_by, via=resume.via)
        self.always(spec.name, effect, decision, verdict)

    def _unattended(
        self, spec: ToolSpec, call: ToolCall, ctx: TurnContext, effect: Effect, rule: str
    ) -> str | None:
        allowed = self.settings.unattended == "allow"
        now = time.time()
        ctx.audit.record(
            ApprovalEvent(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                approval_id=new_approval_id(),
                phase="decided",
                state="approved" if allowed else "denied",
                tool=spec.name,
                call_id=call.id,
                summary=ctx.settings.redact(effect.summary),
                rule=rule,
                expires_at=now,
                origin=ctx.origin,
                decided_by="permissions.unattended",
                via=ctx.kind if ctx.depth == 0 else "subagent",
            )
        )
        if allowed:
            return None
        return self._refuse(
            call,
            ctx,
            f"{effect.summary}: needs a person's approval ({rule}) and this {ctx.kind} turn "
            "has nobody to ask (permissions.unattended: deny)",
            rule=rule,
        )

    def _refuse(self, call: ToolCall, ctx: TurnContext, detail: str, **extra: Any) -> str:
        outputs = ctx.outputs
        key = call_key(call)
        outputs.denials[key] = outputs.denials.get(key, 0) + 1
        if outputs.denials[key] >= MAX_REFUSALS and outputs.end_task is None:
            outputs.end_task = EndTask(
                status="failed",
                reason=f"the same {call.name} call was refused {MAX_REFUSALS} times: {detail}",
            )
        return error_result("permission_denied", ctx.settings.redact(detail), **extra)


def merged_settings(
    own: PermissionSettings | None, runtime: PermissionSettings
) -> PermissionSettings:
    """``unattended`` and ``approval_timeout``: the persona's where its file
    sets them, else ``runtime.yaml``'s (the rules are layered apart)."""
    if own is None:
        return runtime
    return runtime.model_copy(
        update={k: getattr(own, k) for k in own.model_fields_set if k != "rules"}
    )


def persona_gate(
    persona: Any,
    runtime: PermissionSettings,
    *,
    known_tools: Sequence[str],
    desk: ApprovalDesk | None,
) -> PermissionGate | None:
    """The gate of a loaded persona (:class:`~runtime.config.Persona`): its
    ``approved.yaml``, its ``permissions:`` and ``runtime.yaml``'s, in that
    order; None when no rule exists anywhere. A rule naming no known tool
    (a typo would void it) raises :class:`PersonaConfigError`."""
    own: PermissionSettings | None = persona.config.permissions
    approved_path = persona.path / APPROVED_FILE
    approved = load_approved(approved_path)
    settings = merged_settings(own, runtime)
    layers: list[tuple[str, Sequence[PermissionRule]]] = [
        (APPROVED_FILE, approved),
        ("persona.yaml", own.rules if own is not None else []),
        ("runtime.yaml", runtime.rules),
    ]
    rules = PermissionRules(layers, Places())
    problems = rules.unknown_tools([*known_tools, AGENT_TOOL])
    if problems:
        by_file = {
            APPROVED_FILE: str(approved_path),
            "persona.yaml": str(persona.path / "persona.yaml"),
        }
        where = problems[0].split(" rule ", 1)[0]
        path = by_file.get(where, str(persona.path.parent.parent / "runtime.yaml"))
        raise PersonaConfigError(path, [f"permissions.rules: {p}" for p in problems])
    if not rules:
        # Nothing to check, but always-rules may come: a gate only when asked.
        return None
    places = Places(
        workspace=persona.workspace, persona=persona.path, home=persona.path.parent.parent
    )
    return PermissionGate(
        persona.name,
        settings=settings,
        layers=layers,
        places=places,
        desk=desk,
        approved_path=approved_path,
    )


__all__ = [
    "AGENT_TOOL",
    "APPROVED_FILE",
    "ApprovedRules",
    "PermissionGate",
    "agent_permission",
    "ask_person",
    "exact_rule",
    "load_approved",
    "merged_settings",
    "notify",
    "persona_gate",
]
