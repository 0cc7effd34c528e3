"""A persona's turn, assembled around the tool loop.

:class:`TurnBuilder` takes a :class:`~runtime.persona.queues.Batch` (the
messages one turn answers) and makes a turn of it: its
:class:`~runtime.context.TurnContext` (the persona's
:class:`~runtime.context.TurnSettings`, built once, with its secrets read
again each turn so ``.env`` edits apply; the services; fresh outputs; the
streaming listeners), its input appended to the history (and recorded, so the
conversation can be rebuilt), its system prompt (with the user model, when
memory answers, and the skills, looked at again at each turn's start: see
:mod:`~coterie.runtime.skills`), then the loop's run, between a ``turn_started`` and a
``turn_ended`` event. A turn the scheduler started (a heartbeat, a cron entry, a
reminder) runs on the fire's own model when it has one (a light heartbeat on SOUL
alone), is left out of the history when it found nothing to do, and ends its fire:
see :mod:`~coterie.runtime.persona.scheduled`. Old spill files are swept at most
once an hour.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from coterie.runtime.config import Persona, runtime_timezone
from coterie.runtime.context import TurnContext, TurnOutputs, TurnSettings
from coterie.runtime.errors import CoterieError
from coterie.runtime.loop import TurnLoop, TurnResult
from coterie.runtime.memory.records import UserModelRow
from coterie.runtime.messages import (
    ChatMessage,
    HistoryAppended,
    Question,
    QuestionSet,
    ResumeCall,
    StreamItem,
    ToolResultMessage,
    TurnEnded,
    TurnEvent,
    TurnStarted,
    TurnStatus,
    UserMessage,
    new_id,
)
from coterie.runtime.permissions.gate import PermissionGate
from coterie.runtime.persona.history import (
    last_tool_calls,
    render_input,
    trim_history,
    unanswered_calls,
)
from coterie.runtime.persona.host import PersonaHost
from coterie.runtime.persona.queues import Batch, queue_wait_ms
from coterie.runtime.persona.scheduled import ScheduledTurns, light_system_prompt, schedule_of
from coterie.runtime.prompt import build_system_prompt
from coterie.runtime.runner import error_result, remove_old_spills
from coterie.runtime.services import AuditSink, Services
from coterie.runtime.shell.env import secrets_to_hide
from coterie.runtime.skills import SkillCatalog, SkillPrompt, SkillSet
from coterie.runtime.tool import matches_any
from coterie.runtime.tracing import active
from coterie.runtime.tracing import genai as g
from coterie.runtime.tracing.spans import finish_turn, start_turn

log = logging.getLogger("coterie.persona")

#: Seconds between two sweeps of old spill files.
SPILL_SWEEP_INTERVAL = 3600.0


class _TeeSink:
    """A turn's audit sink while someone listens: every event is recorded
    as usual and also handed to the listeners."""

    def __init__(self, audit: AuditSink, emit: Callable[[StreamItem], None]) -> None:
        self.audit = audit
        self.emit = emit

    def record(self, event: TurnEvent) -> None:
        self.audit.record(event)
        self.emit(event)

    async def flush(self) -> None:
        await self.audit.flush()


def _fan_out(listeners: list[Callable[[StreamItem], None]]) -> Callable[[StreamItem], None]:
    def emit(item: StreamItem) -> None:
        for listener in listeners:
            listener(item)

    return emit


def team_roster(
    name: str, roster: Sequence[tuple[str, str]], team: Sequence[str] | None
) -> list[tuple[str, str]]:
    """The part of ``roster`` persona ``name`` may message: itself and its
    ``team`` (names or patterns); all of it without a team."""
    if team is None:
        return list(roster)
    return [(n, d) for n, d in roster if n == name or matches_any(n, team)]


class TurnBuilder:
    """Builds and runs the turns of one persona on the loop it is given."""

    def __init__(
        self, persona: Persona, *, loop: TurnLoop, services: Services, host: PersonaHost
    ) -> None:
        self.persona = persona
        self.loop = loop
        self.services = services
        self.host = host
        self.turns_run = 0
        cfg = persona.config
        self.spill_dir = persona.path / ".spill"
        # What no tool result may show: every value of the persona's .env and
        # the runtime's provider keys (see _settings).
        self._key_vars = [host.settings.memory.openai_api_key_env]
        model_key = getattr(cfg.model, "api_key_env", None)
        if model_key:
            self._key_vars.append(model_key)
        self._settings = TurnSettings(
            workspace=persona.workspace,
            persona_dir=persona.path,
            home=persona.path.parent.parent,
            spill_dir=self.spill_dir,
            access=cfg.access,
            network=cfg.network,
            cluster_addresses=host.cluster_addresses,
            tool_filter=cfg.tools,
            team=tuple(cfg.team) if cfg.team is not None else None,
            thinking_mode=cfg.thinking,
            runtime=host.settings,
        )
        # The personas it may message: its team (and itself), else everyone.
        self.roster = team_roster(persona.name, host.roster, cfg.team)
        # Its skills: looked at again at each turn's start (a few stats), listed
        # in the system prompt under the runtime's budget.
        self.skills = SkillCatalog(
            home=persona.path.parent.parent, persona_dir=persona.path, only=cfg.skills
        )
        self.skill_prompt = SkillPrompt(persona.name, budget=host.settings.skills.prompt_budget)
        # The scheduler's fires: their model, their end, the turns left out.
        self.scheduled = ScheduledTurns(persona.name, services)
        self._spills_swept = 0.0
        self._sweep_spills()

    def turn_settings(self) -> TurnSettings:
        """The settings of the next turn: the persona's, with its secrets
        read again (``.env`` edits apply to the next turn) and its skills as
        last refreshed; the same object as long as they did not change."""
        secrets = secrets_to_hide(self.persona.path, key_vars=self._key_vars)
        skills = self.skills.current
        if secrets != self._settings.secrets or skills is not self._settings.skills:
            self._settings = dataclasses.replace(self._settings, secrets=secrets, skills=skills)
        return self._settings

    def context(self, batch: Batch, turn_id: str) -> TurnContext:
        """The turn context for ``batch``."""
        first = batch.answers[0].envelope
        ask_path = list(dict.fromkeys(name for p in batch.answers for name in p.envelope.ask_path))
        listeners = [p.listener for p in batch.answers if p.listener is not None]
        on_event = _fan_out(listeners) if listeners else None
        return TurnContext(
            persona=self.persona.name,
            conversation=batch.conversation,
            turn_id=turn_id,
            kind=first.context,
            roster=self.roster,
            ask_path=ask_path,
            origin=first.origin,
            settings=self.turn_settings(),
            services=self.services,
            outputs=TurnOutputs(),
            interrupted=batch.interrupted,
            sink=_TeeSink(self.services.audit, on_event) if on_event else None,
            on_event=on_event,
        )

    async def system_prompt(self, skills: SkillSet | None = None) -> str:
        """SOUL, today's date, the user model, the skills (``skills``: the
        turn's snapshot; default the latest) and the other personas."""
        user_model = await self._user_model()
        return build_system_prompt(
            self.persona,
            roster=self.roster,
            user_model=user_model,
            tz=runtime_timezone(),
            skills=self.skill_prompt.listing(
                self._settings.skills if skills is None else skills
            ).text,
        )

    async def run(self, batch: Batch) -> tuple[TurnResult, str]:
        """Run the turn that answers ``batch``: how it ended, and its id.

        The turn is an ``invoke_agent`` span, a child of the span that sent
        its first message (another persona's ``ask_persona`` call, a
        subagent's wake) or the first of a new trace."""
        turn_id = new_id("turn_")
        first = batch.answers[0].envelope
        fire = first.schedule
        span = start_turn(
            persona=self.persona.name,
            conversation_id=batch.conversation.id,
            turn_id=turn_id,
            context=first.context,
            parent=first.trace,
            attributes={
                g.SENDER: first.sender,
                g.MESSAGE_IDS: [p.envelope.id for p in batch.answers],
                g.SCHEDULE_KIND: fire.kind if fire else None,
                g.SCHEDULE_NAME: fire.name if fire else None,
            },
        )
        with active(span):
            try:
                result = await self._run(batch, turn_id)
            except BaseException as exc:
                finish_turn(span, status="error", steps=0, error=exc)
                raise
        finish_turn(span, status=result.status, steps=result.steps, error=None)
        return result, turn_id

    async def _run(self, batch: Batch, turn_id: str) -> TurnResult:
        conversation = batch.conversation
        envelopes = [p.envelope for p in batch.answers]
        schedule = schedule_of(envelopes)
        await self.skills.refresh()
        ctx = self.context(batch, turn_id)
        started = time.perf_counter()
        ctx.audit.record(
            TurnStarted(
                persona=ctx.persona,
                conversation_id=conversation.id,
                turn_id=turn_id,
                context=ctx.kind,
                message_ids=[p.envelope.id for p in batch.answers],
                queue_wait_ms=queue_wait_ms(batch.new),
            )
        )
        listed = self.skill_prompt.report(
            ctx.settings.skills, conversation_id=conversation.id, turn_id=turn_id
        )
        if listed is not None:  # a new listing of skills: what it holds and leaves out
            ctx.audit.record(listed)
        resumes = {e.resume.call_id: e.resume for e in envelopes if e.resume is not None}
        resumed = False
        if batch.rebuilt or resumes:
            # The persona died mid-tool-call: its calls get a result, or no
            # provider would accept the conversation again. A call a person
            # approved since runs now; one they refused is refused.
            resumed = await self._complete_calls(ctx, resumes)
        if resumes and not resumed:
            # The conversation went on without the call: nothing to resume.
            self._record_end(ctx, started, "skipped", 0, None, False)
            return TurnResult(text="", status="skipped")
        # Where this turn's own messages start (a compaction moves it).
        conversation.turn_start = len(conversation.history)
        for pending in batch.new:
            env = pending.envelope
            if env.resume is not None:
                continue  # the turn goes on from its call: no new message
            text = render_input(env)
            if conversation.question is not None and env.source_kind == "user":
                text = self._answering(ctx, env.text)
            self._append(ctx, UserMessage(text=text, source=env.sender))
        try:
            if schedule is not None and schedule.light:
                system = light_system_prompt(self.persona)
            else:
                system = await self.system_prompt(ctx.settings.skills)
            result = await self.loop.run(ctx, system=system, model=self.scheduled.model(schedule))
        except Exception as exc:
            # Every started turn ends in the log, however it failed.
            error = f"{type(exc).__name__}: {exc}"
            self._record_end(ctx, started, "error", 0, error, False)
            await self.scheduled.finish(envelopes, "error", turn_id=turn_id, reason=error)
            raise
        self._record_end(ctx, started, result.status, result.steps, None, result.interrupted)
        if result.question is not None:
            self._set_question(ctx, result.question)
        self.scheduled.drop_turn(
            conversation.history,
            conversation.turn_start,
            schedule,
            result,
            conversation_id=conversation.id,
            turn_id=turn_id,
        )
        conversation.history = trim_history(
            conversation.history, self.host.settings.max_history_messages
        )
        if not result.interrupted:  # else the next turn answers its messages, and ends the fire
            await self.scheduled.finish(envelopes, result.status, turn_id=turn_id)
        self._sweep_spills()
        return result

    async def _complete_calls(self, ctx: TurnContext, resumes: dict[str, ResumeCall]) -> bool:
        """Give each call of the last assistant message without a result one:
        a call whose approval ``resumes`` holds runs (approved) or is refused;
        any other an ``interrupted`` result (it may or may not have run: it
        is never run again). Whether a resumed call was among them."""
        missing = unanswered_calls(ctx.conversation.history)
        if not missing:
            return False
        calls = {c.id: c for c in last_tool_calls(ctx.conversation.history)}
        resumed = False
        for placeholder in missing:
            resume = resumes.get(placeholder.call_id)
            call = calls.get(placeholder.call_id)
            if resume is None or call is None:
                self._append(ctx, placeholder)
                continue
            resumed = True
            if resume.state == "approved":
                ctx.outputs.granted.add(call.id)
                gate = self.services.permissions
                tools = self.loop.registry.visible(ctx)
                if resume.always and isinstance(gate, PermissionGate):
                    await gate.always_for(tools.get(call.name), call, ctx, resume)
                outcome = (await self.loop.runner.run_calls([call], ctx, tools))[0]
                result = ToolResultMessage(
                    call_id=call.id,
                    name=call.name,
                    content=outcome.content,
                    error_kind=outcome.error_kind,
                )
            else:
                why = (
                    "nobody answered the approval in time"
                    if resume.state == "expired"
                    else f"a person denied it ({resume.decided_by or 'someone'} via {resume.via})"
                )
                result = ToolResultMessage(
                    call_id=call.id,
                    name=call.name,
                    content=error_result("permission_denied", why, approval=resume.approval_id),
                    error_kind="permission_denied",
                )
            self._append(ctx, result)
        return resumed

    def _append(self, ctx: TurnContext, message: ChatMessage) -> None:
        """Add a message to the conversation and to the audit log (which rebuilds it)."""
        ctx.conversation.history.append(message)
        ctx.audit.record(
            HistoryAppended(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                message=message,
            )
        )

    def _set_question(self, ctx: TurnContext, question: Question | None) -> None:
        """Set (or clear) the conversation's pending question, and record it so
        that it comes back with the conversation after a restart."""
        ctx.conversation.question = question
        ctx.audit.record(
            QuestionSet(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                question=question,
            )
        )

    def _answering(self, ctx: TurnContext, text: str) -> str:
        """The model's view of a person's message that answers the pending
        question (which it clears): the question is named, and whether it had
        expired when the answer came."""
        question = ctx.conversation.question
        assert question is not None
        self._set_question(ctx, None)
        if question.expired():
            return f'[reply after your question "{question.text}" expired] {text}'
        return f'[answer to your question "{question.text}"] {text}'

    def _record_end(
        self,
        ctx: TurnContext,
        started: float,
        status: TurnStatus,
        steps: int,
        error: str | None,
        interrupted: bool,
    ) -> None:
        self.turns_run += 1
        ctx.audit.record(
            TurnEnded(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                status=status,
                steps=steps,
                duration_ms=(time.perf_counter() - started) * 1000,
                error=error,
                interrupted=interrupted,
            )
        )

    async def _user_model(self) -> list[UserModelRow]:
        """The user model for the prompt; without it when memory is unreachable.

        A turn should not fail because the memory store is restarting: it goes
        on without the user model (logged), and the next turn asks again.
        """
        memory = self.services.memory
        if memory is None:
            return []
        try:
            return await memory.user_model()
        except CoterieError as exc:
            log.warning("%s: user model unavailable for this turn: %s", self.persona.name, exc)
            return []

    def _sweep_spills(self) -> None:
        """Delete cut tool results older than ``spill_retention_days`` (at most
        once an hour)."""
        now = time.time()
        if now - self._spills_swept < SPILL_SWEEP_INTERVAL:
            return
        self._spills_swept = now
        retention = self.host.settings.spill_retention_days * 86_400
        remove_old_spills(self.spill_dir, older_than=retention)


__all__ = ["SPILL_SWEEP_INTERVAL", "TurnBuilder"]
