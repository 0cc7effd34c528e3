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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from coterie.runtime.context import BACKGROUND_CONTEXTS, TurnContext
from coterie.runtime.errors import ModelError
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
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
    UserMessage,
)
from coterie.runtime.models.base import Model, StreamingModel
from coterie.runtime.runner import ToolOutcome, ToolRunner, error_result
from coterie.runtime.tool import ToolRegistry, ToolSource, ToolSpec

STEP_LIMIT_NOTE = (
    "[harness] The step limit of this turn ({max_steps} model calls) is reached. "
    "Tools are now disabled: reply with a short text summary of what was done "
    "and what is left."
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
    ) -> None:
        self.model = model
        self.registry = registry
        self.runner = runner or ToolRunner()
        self.max_steps = max_steps
        self.max_tokens = max_tokens
        # Tools that come and go (MCP servers'): refreshed before every model call.
        self.sources = list(sources)

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
        result.steps += 1
        # Built from values that are typed already (the history's messages, the
        # specs' definitions): validating them again cost more per call than
        # anything else of ours in the loop, and grows with the history.
        request = ModelRequest.model_construct(
            system=system,
            messages=list(ctx.conversation.history),
            tools=[spec.definition() for spec in tools.values()],
            tool_choice=choice,
            thinking=ctx.thinking_on if thinking is None else thinking,
            max_tokens=self.max_tokens,
            step=result.steps,
            context=ctx.kind,
        )
        started = time.perf_counter()
        try:
            response: ModelResponse = await self._request(model, ctx, request)
        except ModelError as exc:
            self._record_call(model, ctx, result, request, started, error=str(exc))
            raise
        self._record_call(model, ctx, result, request, started, response=response)
        message = response.message
        if choice.kind == "none" and message.tool_calls:
            # Tools were withdrawn; a model that calls one anyway gets its text kept only.
            message = message.model_copy(update={"tool_calls": []})
        self._append(ctx, result, message)
        return message

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
    ) -> None:
        ctx.audit.record(
            ModelCalled(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                provider=response.provider if response else model.provider,
                model=response.model if response else model.name,
                step=result.steps,
                latency_ms=(time.perf_counter() - started) * 1000,
                input_tokens=response.usage.input_tokens if response else 0,
                output_tokens=response.usage.output_tokens if response else 0,
                tool_calls=len(response.message.tool_calls) if response else 0,
                messages=len(request.messages),
                stop_reason=response.stop_reason if response else None,
                error=error,
            )
        )

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


__all__ = ["RepeatGuard", "TurnLoop", "TurnResult", "call_key"]
