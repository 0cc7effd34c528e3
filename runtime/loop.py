"""The tool loop: one turn of a persona on one conversation.

1. assemble the request (system prompt, history, filtered tools);
2. call the model;
3. run the reply's tool calls concurrently, results back in call order;
4. repeat until a reply without tool calls, a terminal tool (``end_task``),
   a batch whose every call started pushed work (a subagent, a coding agent:
   their completion comes back as a wake), or ``max_steps`` — after which
   tools are withdrawn and a text summary is required.

Guards: the second identical consecutive call turns thinking on, the third is
blocked (``allow_repeat`` tools are exempt); a background turn (heartbeat,
cron) that ends in plain text gets one forced ``end_task`` follow-up.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from coterie.runtime import catalogue
from coterie.runtime.compaction import Compactor
from coterie.runtime.config import CompactionSettings
from coterie.runtime.context import BACKGROUND_CONTEXTS, EndTask, TurnContext
from coterie.runtime.errors import (
    BudgetExceededError,
    ContextLengthError,
    ContextOverflowError,
    ModelError,
)
from coterie.runtime.messages import (
    AssistantMessage,
    BudgetWarning,
    CallPurpose,
    ChatMessage,
    Compacted,
    HistoryAppended,
    ModelCalled,
    ModelRequest,
    ModelResponse,
    Question,
    TextDelta,
    ToolCall,
    ToolChoice,
    ToolChoiceAuto,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolResultMessage,
    TurnStatus,
    Usage,
    UserMessage,
)
from coterie.runtime.models.base import Model, StreamingModel
from coterie.runtime.models.windows import window_of
from coterie.runtime.runner import ToolOutcome, ToolRunner, error_result
from coterie.runtime.tool import ToolRegistry, ToolSource, ToolSpec
from coterie.runtime.tracing import active
from coterie.runtime.tracing.spans import finish_chat, start_chat
from coterie.runtime.usage.budget import BudgetGuard
from coterie.runtime.usage.prices import PriceTable
from coterie.runtime.usage.tokens import Anchor, TokenEstimator

log = logging.getLogger("coterie.loop")

#: A budget error's period as a warning event names it.
_PERIODS: dict[str, Literal["day", "month", "run"]] = {
    "daily": "day",
    "monthly": "month",
    "run": "run",
}
#: A warning event's period as a log line names it.
_PERIOD_WORDS = {"day": "daily", "month": "monthly", "run": "run"}

#: Refusals of one call (same tool and arguments: permission rules, a person,
#: the repeat guard after them) that end the turn.
MAX_REFUSALS = 3

STEP_LIMIT_NOTE = (
    "[harness] The step limit of this turn ({max_steps} model calls) is reached. "
    "Tools are now disabled: reply with a short text summary of what was done "
    "and what is left."
)
MEMORY_FLUSH_NOTE = (
    "[harness] This conversation is about to be compacted: its older turns will be "
    "replaced by a summary. If it holds durable facts worth keeping beyond this "
    "conversation (decisions, preferences, names, commitments) that memory does not "
    "have yet, save them now with the memory tool; otherwise reply with a short 'ok'."
)
END_TASK_NOTE = (
    "[harness] This background turn ended in plain text. Classify it now by "
    "calling end_task (ok, skipped or failed)."
)


@dataclass
class TurnResult:
    """How a turn ended and what it said."""

    text: str
    status: TurnStatus = "ok"
    steps: int = 0
    summary: str | None = None
    # A soft interrupt stopped the turn after a tool batch; the messages that
    # caused it are answered, with this turn's, by the next turn.
    interrupted: bool = False
    # Every call of the last batch started pushed work: their handles.
    deferred: list[str] = field(default_factory=list)
    # The turn ended asking the person this (ask_user).
    question: Question | None = None
    new_messages: list[ChatMessage] = field(default_factory=list)
    # Compactions this turn made (bounded by compaction.max_per_turn).
    compactions: int = 0


def call_key(call: ToolCall) -> str:
    """Name plus canonical arguments: what makes two calls identical."""
    args = call.arguments
    canon = args if isinstance(args, str) else json.dumps(args, sort_keys=True, default=str)
    return f"{call.name}\x00{canon}"


class RepeatGuard:
    """Counts identical consecutive calls across the steps of one turn."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.count = 0

    def check(
        self, calls: list[ToolCall], tools: dict[str, ToolSpec], ctx: TurnContext
    ) -> dict[int, str]:
        """Update the count; force thinking on a 2nd repeat; block 3rd+."""
        blocked: dict[int, str] = {}
        for i, call in enumerate(calls):
            spec = tools.get(call.name)
            if spec is not None and spec.allow_repeat:
                continue
            key = call_key(call)
            self.count = self.count + 1 if key == self.last else 1
            self.last = key
            if self.count == 2:
                ctx.outputs.force_thinking = True
            elif self.count >= 3:
                refused = ctx.outputs.denials.get(key)
                if refused:
                    # A call permission rules keep refusing: this block counts
                    # as one more refusal (the third ends the turn).
                    ctx.outputs.denials[key] = refused + 1
                    if refused + 1 >= MAX_REFUSALS and ctx.outputs.end_task is None:
                        ctx.outputs.end_task = EndTask(
                            status="failed",
                            reason=f"the same {call.name} call was refused {refused + 1} times",
                        )
                blocked[i] = error_result(
                    "repeated_call",
                    f"identical call to {call.name} made {self.count} times in a row; "
                    "it was not run again. Change the arguments or take another step.",
                )
        return blocked


class TurnLoop:
    """Runs turns for one persona: model, registry, runner and limits."""

    def __init__(
        self,
        *,
        model: Model,
        registry: ToolRegistry,
        runner: ToolRunner | None = None,
        max_steps: int = 12,
        max_tokens: int = 4096,
        sources: Sequence[ToolSource] = (),
        prices: PriceTable | None = None,
        compaction: CompactionSettings | None = None,
        summarizer: Model | None = None,
    ) -> None:
        """``prices``: what calls cost (default: the built-in table);
        ``compaction``: when and how conversations are compacted (default
        settings); ``summarizer``: the model that writes summaries (default:
        the turn's own)."""
        self.model = model
        self.registry = registry
        self.runner = runner or ToolRunner()
        self.max_steps = max_steps
        self.max_tokens = max_tokens
        # Tools that come and go (MCP servers'): refreshed before every model call.
        self.sources = list(sources)
        self.prices = prices or PriceTable.from_settings({})
        self.compaction = compaction or CompactionSettings()
        self.summarizer = summarizer
        self.budget = BudgetGuard(self.prices)
        # find_tools, offered by the catalogue when it holds tools back.
        self.finder = registry.get(catalogue.FIND_TOOLS)
        # One estimator per model: each learns its provider's ratio.
        self._estimators: dict[tuple[str, str], TokenEstimator] = {}
        # Windows smaller than configured, as providers' errors showed them.
        self._windows: dict[tuple[str, str], int] = {}

    async def _source_specs(self) -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        for source in self.sources:
            await source.refresh()
            specs.extend(source.specs())
        return specs

    async def run(self, ctx: TurnContext, *, system: str, model: Model | None = None) -> TurnResult:
        """Run one turn on ``ctx.conversation`` (its new input already appended).

        ``model``: another model for this turn only (a heartbeat's cheaper
        one); default the loop's."""
        model = model or self.model
        result = TurnResult(text="")
        guard = RepeatGuard()
        last_text = ""
        while True:
            if result.steps >= self.max_steps:
                self._append(
                    ctx,
                    result,
                    UserMessage(
                        text=STEP_LIMIT_NOTE.format(max_steps=self.max_steps), source="harness"
                    ),
                )
                reply = await self._call(model, ctx, system, result, {}, ToolChoiceNone())
                result.text = reply.text or last_text
                return result
            tools = self.registry.visible(ctx, await self._source_specs())
            reply = await self._call(model, ctx, system, result, tools, ToolChoiceAuto())
            if reply.text:
                last_text = reply.text
            if not reply.tool_calls:
                if ctx.kind in BACKGROUND_CONTEXTS and "end_task" in tools:
                    await self._force_end_task(model, ctx, system, result, tools)
                result.text = last_text
                return self._finish(ctx, result)
            blocked = guard.check(reply.tool_calls, tools, ctx)
            outcomes = await self._run_tools(ctx, result, reply.tool_calls, tools, blocked)
            if ctx.outputs.end_task is not None:
                result.text = last_text
                return self._finish(ctx, result)
            if all(o.deferred for o in outcomes):
                # Nothing to do until the pushed work reports back (a wake).
                result.deferred = [o.handle for o in outcomes if o.handle]
                result.text = last_text
                return self._finish(ctx, result)
            if ctx.interrupted():
                result.interrupted = True
                result.text = last_text
                return result

    # ------------------------------------------------------------------

    def _finish(self, ctx: TurnContext, result: TurnResult) -> TurnResult:
        outputs = ctx.outputs
        result.question = outputs.question
        if outputs.end_task is not None:
            result.status = outputs.end_task.status
            result.summary = outputs.end_task.summary or outputs.end_task.reason
            if not result.text and result.summary:
                result.text = result.summary
        return result

    async def _force_end_task(
        self,
        model: Model,
        ctx: TurnContext,
        system: str,
        result: TurnResult,
        tools: dict[str, ToolSpec],
    ) -> None:
        self._append(ctx, result, UserMessage(text=END_TASK_NOTE, source="harness"))
        only = {"end_task": tools["end_task"]}
        reply = await self._call(
            model, ctx, system, result, only, ToolChoiceNamed(name="end_task"), thinking=False
        )
        calls = [c for c in reply.tool_calls if c.name == "end_task"][:1]
        if calls:
            await self._run_tools(ctx, result, calls, only, {})

    async def _run_tools(
        self,
        ctx: TurnContext,
        result: TurnResult,
        calls: list[ToolCall],
        tools: dict[str, ToolSpec],
        blocked: dict[int, str],
    ) -> list[ToolOutcome]:
        # The calls of one assistant message form one batch: the pushed work
        # they start reports back together (one grouped wake).
        ctx.outputs.batch_id = f"{ctx.turn_id}/{result.steps}"
        outcomes = await self.runner.run_calls(calls, ctx, tools, blocked=blocked)
        for outcome in outcomes:
            self._append(
                ctx,
                result,
                ToolResultMessage(
                    call_id=outcome.call.id,
                    name=outcome.call.name,
                    content=outcome.content,
                    error_kind=outcome.error_kind,
                ),
            )
        if ctx.services.delegations is not None:
            # The batch is complete (its results are in the history): its
            # group may report once all of its work is done.
            ctx.services.delegations.seal(ctx.conversation_id, ctx.outputs.batch_id)
        return outcomes

    async def _call(
        self,
        model: Model,
        ctx: TurnContext,
        system: str,
        result: TurnResult,
        tools: dict[str, ToolSpec],
        choice: ToolChoice,
        *,
        thinking: bool | None = None,
    ) -> AssistantMessage:
        """One model call of the turn: the tools it is offered (the
        catalogue), the request fitted to the window (compaction), its
        budget kept; on a provider's context-length error, one compaction
        and one retry."""
        result.steps += 1
        offered = self._offer(ctx, tools, choice)
        definitions = [spec.definition() for spec in offered.values()]
        estimator = self._estimator(model)
        fixed = estimator.fixed_chars(system, definitions)
        window, limit, target = self._limits(model)
        estimated = self._estimate(ctx, estimator, fixed)
        if estimated > target:
            estimated = await self._compact(
                model, ctx, result, estimator, fixed, target, limit, estimated, "threshold"
            )
        retried = False
        while True:
            # Built from values that are typed already (the history's messages, the
            # specs' definitions): validating them again cost more per call than
            # anything else of ours in the loop, and grows with the history.
            request = ModelRequest.model_construct(
                system=system,
                messages=list(ctx.conversation.history),
                tools=definitions,
                tool_choice=choice,
                thinking=ctx.thinking_on if thinking is None else thinking,
                max_tokens=self.max_tokens,
                step=result.steps,
                context=ctx.kind,
            )
            try:
                response = await self._send(
                    model, ctx, result, request, estimated=estimated, purpose="turn"
                )
            except ContextLengthError:
                if retried:
                    raise
                retried = True
                # The model's window is smaller than this request: learn that
                # (for the summarizer too, when it is the same model), then
                # compact and send once more.
                learned = int(estimated * 0.9)
                if learned < window:
                    self._windows[(model.provider, model.name)] = learned
                window, limit, target = self._limits(model)
                ctx.conversation.anchor = None
                estimated = await self._compact(
                    model,
                    ctx,
                    result,
                    estimator,
                    fixed,
                    target,
                    limit,
                    estimated,
                    "context_length_error",
                )
                continue
            break
        before = ctx.conversation.anchor
        ctx.conversation.anchor = estimator.observe(
            request.messages,
            fixed_chars=fixed,
            input_tokens=response.usage.input_tokens,
            anchor=before if isinstance(before, Anchor) else None,
        )
        message = response.message
        if choice.kind == "none" and message.tool_calls:
            # Tools were withdrawn; a model that calls one anyway gets its text kept only.
            message = message.model_copy(update={"tool_calls": []})
        self._append(ctx, result, message)
        return message

    def _offer(
        self, ctx: TurnContext, tools: dict[str, ToolSpec], choice: ToolChoice
    ) -> dict[str, ToolSpec]:
        """The tools whose definitions this call carries (see
        :mod:`runtime.catalogue`); ``find_tools`` searches those held back.
        A call that must use one named tool is offered what it is given."""
        if not tools or choice.kind == "named":
            return tools
        outputs = ctx.outputs
        offered, hidden = catalogue.offer(
            tools,
            tool_filter=ctx.settings.tool_filter,
            finder=self.finder,
            revealed=outputs.revealed,
        )
        outputs.catalogue = hidden
        if hidden and self.finder is not None:
            # The runner may run every allowed tool, find_tools too.
            tools[catalogue.FIND_TOOLS] = self.finder
        return offered

    def _window(self, model: Model) -> int:
        """The model's window: as configured, or smaller when a provider's
        context-length error showed it is."""
        return self._windows.get((model.provider, model.name)) or window_of(model)

    def _limits(self, model: Model) -> tuple[int, int, int]:
        """The window, the most a request may hold (the reply's tokens share
        the window) and where compaction starts."""
        window = self._window(model)
        limit = max(window - self.max_tokens, window // 4)
        return window, limit, min(int(window * self.compaction.threshold), limit)

    def _estimator(self, model: Model) -> TokenEstimator:
        key = (model.provider, model.name)
        estimator = self._estimators.get(key)
        if estimator is None:
            estimator = self._estimators[key] = TokenEstimator()
        return estimator

    def _estimate(self, ctx: TurnContext, estimator: TokenEstimator, fixed: int) -> int:
        anchor = ctx.conversation.anchor
        return estimator.estimate(
            ctx.conversation.history,
            fixed_chars=fixed,
            anchor=anchor if isinstance(anchor, Anchor) else None,
        )

    async def _send(
        self,
        model: Model,
        ctx: TurnContext,
        result: TurnResult,
        request: ModelRequest,
        *,
        estimated: int,
        purpose: CallPurpose,
    ) -> ModelResponse:
        """Send one request within the budget, and record it."""
        try:
            ticket = await self.budget.reserve(
                ctx.services.budget,
                payer=ctx.billed_to,
                provider=model.provider,
                model=model.name,
                input_tokens=estimated,
                max_output_tokens=request.max_tokens,
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
            )
        except BudgetExceededError as exc:
            ctx.audit.record(
                BudgetWarning(
                    persona=ctx.persona,
                    conversation_id=ctx.conversation_id,
                    turn_id=ctx.turn_id,
                    scope=exc.scope,
                    period=_PERIODS.get(exc.period, "day"),
                    limit_usd=exc.limit,
                    spent_usd=round(exc.spent, 6),
                    exceeded=True,
                )
            )
            raise
        span = start_chat(
            provider=model.provider,
            model=model.name,
            max_tokens=request.max_tokens,
            step=result.steps,
            purpose=purpose,
            billed_to=ctx.billed_to,
        )
        started = time.perf_counter()
        with active(span):  # the model_call row carries the span's ids
            try:
                response: ModelResponse = await self._request(model, ctx, request)
            except BaseException as exc:
                await self._settle(ctx, ticket, None)
                cost = None
                if isinstance(exc, ModelError):
                    # A refused request is not billed: 0 for a priced model, still
                    # unknown for one without a price.
                    cost = self.prices.cost(model.provider, model.name, Usage())
                    self._record_call(
                        model,
                        ctx,
                        result,
                        request,
                        started,
                        error=str(exc),
                        cost=cost,
                        estimated=estimated,
                        purpose=purpose,
                    )
                latency = (time.perf_counter() - started) * 1000
                finish_chat(span, cost=cost, latency_ms=latency, error=exc)
                raise
            cost = self.prices.cost(response.provider, response.model, response.usage)
            latency = self._record_call(
                model,
                ctx,
                result,
                request,
                started,
                response=response,
                cost=cost,
                estimated=estimated,
                purpose=purpose,
            )
        finish_chat(span, response=response, cost=cost, latency_ms=latency)
        await self._settle(ctx, ticket, cost)
        return response

    async def _settle(self, ctx: TurnContext, ticket: str | None, cost: float | None) -> None:
        for warning in await self.budget.settle(ctx.services.budget, ticket, cost):
            log.warning(
                "%s: %s has spent $%.4f of its %s budget of $%.2f",
                ctx.persona,
                warning.scope,
                warning.spent_usd,
                _PERIOD_WORDS[warning.period],
                warning.limit_usd,
            )
            ctx.audit.record(warning.model_copy(update={"turn_id": ctx.turn_id}))

    # -- compaction --------------------------------------------------------

    async def _compact(
        self,
        model: Model,
        ctx: TurnContext,
        result: TurnResult,
        estimator: TokenEstimator,
        fixed: int,
        target: int,
        limit: int,
        estimated: int,
        reason: Literal["threshold", "context_length_error"],
    ) -> int:
        """Compact the conversation (see :mod:`runtime.compaction`); the
        estimate of the request after it. Raises
        :class:`ContextOverflowError` past ``compaction.max_per_turn`` or
        when even the current turn alone would not fit."""
        settings = self.compaction
        conversation = ctx.conversation
        history = conversation.history
        if result.compactions >= settings.max_per_turn:
            # No compaction loops: past the bound a request that fits the
            # window goes as it is, one that does not ends the turn.
            if estimated <= limit:
                return estimated
            raise ContextOverflowError(
                f"this turn already compacted its conversation {result.compactions} times "
                f"(compaction.max_per_turn) and its request (about {estimated} tokens) still "
                f"does not fit the {self._window(model)}-token window of {model.name}; it "
                "was not sent"
            )
        turn_start = min(conversation.turn_start, len(history))
        if settings.memory_flush and ctx.services.memory is not None and turn_start > 0:
            await self._memory_flush(model, ctx, result)
        summarizer = self.summarizer or model

        async def summarize(system: str, text: str) -> str:
            request = ModelRequest.model_construct(
                system=system,
                messages=[UserMessage(text=text, source="harness")],
                tools=[],
                tool_choice=ToolChoiceNone(),
                thinking=False,
                max_tokens=settings.summary_max_tokens,
                step=result.steps,
                context=ctx.kind,
            )
            est = int(len(text) / estimator.chars_per_token)
            response = await self._send(
                summarizer, ctx, result, request, estimated=est, purpose="compaction"
            )
            return response.message.text

        compactor = Compactor(
            settings,
            summarize=summarize if settings.enabled else None,
            chunk_tokens=max(
                512, int(self._window(summarizer) * 0.6) - settings.summary_max_tokens
            ),
            timeout=settings.timeout,
            chars_per_token=lambda: estimator.chars_per_token,
        )
        outcome = await compactor.compact(
            history,
            turn_start=turn_start,
            todos=conversation.todos,
            estimate=lambda messages: estimator.estimate(messages, fixed_chars=fixed, anchor=None),
            target=target,
            limit=limit,
            force=reason == "context_length_error",
        )
        if outcome.replaced == 0 and outcome.elided == 0:
            if outcome.tokens_after > limit:
                raise ContextOverflowError(
                    f"the request needs about {outcome.tokens_after} tokens, more than the "
                    f"{limit} the window of {model.name} leaves, and nothing older can be "
                    "compacted; it was not sent"
                )
            return outcome.tokens_after
        result.compactions += 1
        conversation.history = outcome.messages
        conversation.turn_start = outcome.turn_start
        conversation.anchor = None
        ctx.audit.record(
            Compacted(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                method=outcome.method,
                reason=reason,
                summary=outcome.summary,
                replaced=outcome.replaced,
                elided=outcome.elided,
                tokens_before=outcome.tokens_before,
                tokens_after=outcome.tokens_after,
                error=outcome.error,
                messages=outcome.messages,
                turn_start=outcome.turn_start,
            )
        )
        return outcome.tokens_after

    async def _memory_flush(self, model: Model, ctx: TurnContext, result: TurnResult) -> None:
        """One model call with the memory tool alone, before a compaction: the
        persona may save durable facts. Its messages stay out of the history."""
        memory = self.registry.visible(ctx).get("memory")
        if memory is None:
            return
        only = {"memory": memory}
        request = ModelRequest.model_construct(
            system="You keep this persona's long-term memory.",
            messages=[
                *ctx.conversation.history[: ctx.conversation.turn_start],
                UserMessage(text=MEMORY_FLUSH_NOTE, source="harness"),
            ],
            tools=[memory.definition()],
            tool_choice=ToolChoiceAuto(),
            thinking=False,
            max_tokens=min(self.max_tokens, 2048),
            step=result.steps,
            context=ctx.kind,
        )
        estimator = self._estimator(model)
        est = estimator.estimate(
            request.messages,
            fixed_chars=estimator.fixed_chars(request.system, request.tools),
            anchor=None,
        )
        try:
            response = await self._send(
                model, ctx, result, request, estimated=est, purpose="memory_flush"
            )
        except ModelError:
            return  # the compaction goes on without it
        calls = [c for c in response.message.tool_calls if c.name == "memory"]
        if calls:
            await self.runner.run_calls(calls, ctx, only, blocked={})

    async def _request(
        self, model: Model, ctx: TurnContext, request: ModelRequest
    ) -> ModelResponse:
        """The model's answer; streamed when someone listens and the model can."""
        listener = ctx.on_event
        if listener is None or not isinstance(model, StreamingModel):
            return await model.request(request)

        def on_text(text: str) -> None:
            listener(
                TextDelta(
                    persona=ctx.persona,
                    conversation_id=ctx.conversation_id,
                    turn_id=ctx.turn_id,
                    step=request.step,
                    text=text,
                )
            )

        return await model.stream(request, on_text)

    def _record_call(
        self,
        model: Model,
        ctx: TurnContext,
        result: TurnResult,
        request: ModelRequest,
        started: float,
        *,
        response: ModelResponse | None = None,
        error: str | None = None,
        cost: float | None = None,
        estimated: int | None = None,
        purpose: CallPurpose = "turn",
    ) -> float:
        """Record the call; its latency (milliseconds)."""
        usage = response.usage if response else None
        latency = (time.perf_counter() - started) * 1000
        ctx.audit.record(
            ModelCalled(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                provider=response.provider if response else model.provider,
                model=response.model if response else model.name,
                step=result.steps,
                latency_ms=latency,
                input_tokens=usage.input_tokens if usage else 0,
                output_tokens=usage.output_tokens if usage else 0,
                cache_read_tokens=usage.cache_read_tokens if usage else 0,
                cache_write_tokens=usage.cache_write_tokens if usage else 0,
                cost_usd=cost,
                priced=cost is not None,
                context=ctx.kind,
                purpose=purpose,
                billed_to=ctx.billed_to,
                estimated_tokens=estimated,
                tool_calls=len(response.message.tool_calls) if response else 0,
                messages=len(request.messages),
                tools=len(request.tools),
                stop_reason=response.stop_reason if response else None,
                error=error,
            )
        )
        return latency

    def _append(self, ctx: TurnContext, result: TurnResult, message: ChatMessage) -> None:
        ctx.conversation.history.append(message)
        result.new_messages.append(message)
        ctx.audit.record(
            HistoryAppended(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                message=message,
            )
        )


__all__ = ["MAX_REFUSALS", "RepeatGuard", "TurnLoop", "TurnResult", "call_key"]
