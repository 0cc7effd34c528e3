"""The three spans of a turn, started and finished with their GenAI attributes.

Each ``start_*`` returns :data:`~coterie.runtime.tracing.NOOP` at once when
the process does not trace, and each ``finish_*`` returns at once for it:
with tracing off the loop pays a function call and an attribute read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from coterie.runtime.tracing import NOOP, ROOT, AttributeValue, Carrier, Span, tracer
from coterie.runtime.tracing import genai as g


def start_turn(
    *,
    persona: str,
    conversation_id: str,
    turn_id: str,
    context: str,
    parent: Carrier | None,
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> Span:
    """An ``invoke_agent {persona}`` span: a child of ``parent`` (the
    envelope's trace context), else the first span of a new trace."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        g.agent_span(persona),
        parent=parent or ROOT,
        attributes={
            g.OPERATION: "invoke_agent",
            g.AGENT_NAME: persona,
            g.CONVERSATION: conversation_id,
            g.TURN_ID: turn_id,
            g.TURN_CONTEXT: context,
            **(attributes or {}),
        },
    )


def finish_turn(span: Span, *, status: str, steps: int, error: BaseException | str | None) -> None:
    """End a turn's span with how the turn ended (``error``: what made it fail)."""
    if not span.recording:
        return
    span.update({g.TURN_STATUS: status, g.TURN_STEPS: steps})
    if isinstance(error, BaseException):
        span.fail(type(error).__name__, str(error))
    elif error is not None or status == "error":
        span.fail("turn_error", error)
    span.end()


def start_chat(
    *, provider: str, model: str, max_tokens: int, step: int, purpose: str, billed_to: str | None
) -> Span:
    """A ``chat {model}`` span (a child of the running turn's)."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        g.chat_span(model),
        kind="client",
        attributes={
            g.OPERATION: "chat",
            g.PROVIDER: provider,
            g.REQUEST_MODEL: model,
            g.REQUEST_MAX_TOKENS: max_tokens,
            g.STEP: step,
            g.PURPOSE: purpose,
            g.BILLED_TO: billed_to,
        },
    )


def finish_chat(
    span: Span,
    *,
    response: Any = None,
    cost: float | None,
    latency_ms: float,
    error: BaseException | None = None,
) -> None:
    """End a model call's span: the response's model, tokens and stop
    reason (a :class:`~runtime.messages.ModelResponse`), its cost when the
    model has a price, or the error that failed it."""
    if not span.recording:
        return
    span.update({g.LATENCY_MS: round(latency_ms, 3), g.COST_USD: cost})
    if response is not None:
        usage = response.usage
        span.update(
            {
                g.RESPONSE_MODEL: response.model,
                g.INPUT_TOKENS: usage.input_tokens,
                g.OUTPUT_TOKENS: usage.output_tokens,
                g.CACHE_READ_TOKENS: usage.cache_read_tokens,
                g.CACHE_WRITE_TOKENS: usage.cache_write_tokens,
                g.FINISH_REASONS: [response.stop_reason] if response.stop_reason else None,
            }
        )
    if error is not None:
        span.fail(type(error).__name__, str(error))
    span.end()


def start_tool(*, name: str, call_id: str, arguments: Any, redact: Any) -> Span:
    """An ``execute_tool {name}`` span (a child of the running turn's); the
    arguments only under ``tracing.capture_content``, through ``redact``
    (the turn's :meth:`~runtime.context.TurnSettings.redact`)."""
    active = tracer()
    if not active.enabled:
        return NOOP
    attributes: dict[str, AttributeValue | None] = {
        g.OPERATION: "execute_tool",
        g.TOOL_NAME: name,
        g.TOOL_CALL_ID: call_id,
        g.TOOL_TYPE: "function",
    }
    if active.capture_content:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
        attributes[g.TOOL_ARGUMENTS] = redact(text)
    return active.start(g.tool_span(name), attributes=attributes)


def finish_tool(span: Span, *, error_kind: str | None, duration_ms: float, result: str) -> None:
    """End a tool call's span: its duration, its error kind, and (under
    ``capture_content``) its result, already redacted by the runner."""
    if not span.recording:
        return
    span.set(g.DURATION_MS, round(duration_ms, 3))
    if tracer().capture_content:
        span.set(g.TOOL_RESULT, result)
    if error_kind is not None:
        span.fail(error_kind)
    span.end()


def start_activation(*, persona: str, parent: Carrier | None) -> Span:
    """An ``activate_persona {persona}`` span in the router: starting a
    persona's actor for the message that needed it (its first span, its
    ``parent``: the caller's trace context), until the actor answers."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        g.activation_span(persona),
        parent=parent or ROOT,
        attributes={g.OPERATION: "activate_persona", g.AGENT_NAME: persona},
    )


def start_fire(
    *,
    persona: str,
    kind: str,
    name: str,
    fire_id: str,
    instant: str,
    late: bool,
    manual: bool,
) -> Span:
    """A ``schedule_fire {kind} {name}`` span in the scheduler: sending one
    fire to its persona, the first span of its trace (the turn it starts is
    its child)."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        g.fire_span(kind, name),
        parent=ROOT,
        kind="producer",
        attributes={
            g.OPERATION: "schedule_fire",
            g.AGENT_NAME: persona,
            g.SCHEDULE_KIND: kind,
            g.SCHEDULE_NAME: name,
            g.SCHEDULE_FIRE: fire_id,
            g.SCHEDULE_INSTANT: instant,
            g.SCHEDULE_LATE: late,
            g.SCHEDULE_MANUAL: manual,
        },
    )


def start_mcp(*, method: str, target: str, server: str) -> Span:
    """A ``{method} {target}`` client span for one request to an MCP server
    (``tools/call`` a tool, ``resources/read`` a URI, ``prompts/get`` a
    prompt), a child of the running tool call's span."""
    active = tracer()
    if not active.enabled:
        return NOOP
    attributes: dict[str, AttributeValue | None] = {g.MCP_METHOD: method, g.MCP_SERVER: server}
    if method == "tools/call":
        attributes |= {g.OPERATION: "execute_tool", g.TOOL_NAME: target}
    elif method == "resources/read":
        attributes[g.MCP_RESOURCE_URI] = target
    elif method == "prompts/get":
        attributes[g.PROMPT_NAME] = target
    return active.start(f"{method} {target}", kind="client", attributes=attributes)


def finish_mcp(span: Span, *, error: BaseException | None = None, is_error: bool = False) -> None:
    """End an MCP request's span: a :class:`~runtime.errors.ToolError`'s kind
    (``timeout``, ``server_crashed``, ...) or ``tool_error`` for a result the
    server marked ``isError``."""
    if not span.recording:
        return
    if error is not None:
        span.fail(str(getattr(error, "kind", None) or type(error).__name__), str(error))
    elif is_error:
        span.fail("tool_error")
    span.end()


def start_agent_run(
    *, agent: str, handle: str, persona: str, conversation_id: str, parent: Carrier | None
) -> Span:
    """An ``invoke_agent {agent}`` client span for one coding-agent
    delegation (an external agent over ACP): a child of the
    ``start_coding_agent`` call (``parent``, the request's trace context)."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        g.agent_span(agent),
        parent=parent or ROOT,
        kind="client",
        attributes={
            g.OPERATION: "invoke_agent",
            g.PROVIDER: "acp",
            g.AGENT_NAME: agent,
            g.AGENT_ID: handle,
            g.CONVERSATION: conversation_id,
            g.TURN_CONTEXT: "coding_agent",
            g.SENDER: persona,
        },
    )


def agent_update(span: Span, kind: str, body: Mapping[str, Any]) -> None:
    """One session update of a coding agent as an event on its span: its
    type, a tool call's title and status; text (already redacted) only
    under ``tracing.capture_content``."""
    if not span.recording:
        return
    attributes: dict[str, AttributeValue | None] = {g.ACP_UPDATE: kind}
    for key, name in (("title", g.ACP_TITLE), ("status", g.ACP_STATUS)):
        value = body.get(key)
        if isinstance(value, str):
            attributes[name] = value
    text = body.get("text")
    if isinstance(text, str) and tracer().capture_content:
        attributes[g.ACP_TEXT] = text
    span.event(f"acp.{kind}", attributes)


def finish_agent_run(
    span: Span,
    *,
    status: str,
    error: str | None,
    usage: Any = None,
    stop_reason: str | None = None,
    files_changed: int | None = None,
) -> None:
    """End a coding agent's span: how it ended, the tokens and cost it
    reported (an ACP usage record, when it sent one)."""
    if not span.recording:
        return
    span.update(
        {
            g.TURN_STATUS: status,
            g.FINISH_REASONS: [stop_reason] if stop_reason else None,
            g.ACP_FILES_CHANGED: files_changed,
        }
    )
    if usage is not None:
        span.update(
            {
                g.INPUT_TOKENS: usage.input_tokens,
                g.OUTPUT_TOKENS: usage.output_tokens + usage.thought_tokens,
                g.CACHE_READ_TOKENS: usage.cache_read_tokens,
                g.CACHE_WRITE_TOKENS: usage.cache_write_tokens,
                g.COST_USD: usage.cost_usd,
            }
        )
    if status != "ok":
        span.fail(status, error)
    span.end()


def start_sample(*, run_id: str, task: str, sample_id: str, epoch: int) -> Span:
    """An ``eval_sample {task}`` span: one sample in one epoch, its attempts
    and its scoring (the first span of its own trace: an eval run has many)."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        g.sample_span(task),
        parent=ROOT,
        attributes={
            g.OPERATION: "eval_sample",
            g.EVAL_RUN: run_id,
            g.EVAL_TASK: task,
            g.EVAL_SAMPLE: sample_id,
            g.EVAL_EPOCH: epoch,
        },
    )


def finish_sample(
    span: Span,
    *,
    status: str,
    attempts: int,
    limit: str | None,
    error: str | None,
    scorer: str | None,
    score: float | None,
) -> None:
    """End a sample's span with its result: status (``ok``, ``limit``,
    ``error``), the attempts it took, and its first scorer's value."""
    if not span.recording:
        return
    span.update(
        {
            g.EVAL_STATUS: status,
            g.EVAL_ATTEMPTS: attempts,
            g.EVAL_LIMIT: limit,
            g.EVAL_SCORER: scorer,
            g.EVAL_SCORE: score,
        }
    )
    if status == "error":
        span.fail("sample_error", error)
    span.end()


def start_request(*, method: str, route: str | None, path: str, parent: Carrier | None) -> Span:
    """A server span ``{method} {route}`` for one HTTP request to ``coterie
    serve`` (``{method}`` alone when no route matched): a child of the
    caller's trace context (:func:`incoming`), else the first span of a new
    trace."""
    active = tracer()
    if not active.enabled:
        return NOOP
    return active.start(
        f"{method} {route}" if route is not None else method,
        parent=parent or ROOT,
        kind="server",
        attributes={g.HTTP_METHOD: method, g.HTTP_ROUTE: route, g.URL_PATH: path},
    )


def finish_request(span: Span, *, status: int) -> None:
    """End a request's span with its response status (a 5xx fails it)."""
    if not span.recording:
        return
    span.set(g.HTTP_STATUS, status)
    if status >= 500:
        span.fail(str(status))
    span.end()


__all__ = [
    "agent_update",
    "finish_agent_run",
    "finish_chat",
    "finish_mcp",
    "finish_request",
    "finish_sample",
    "finish_tool",
    "finish_turn",
    "start_activation",
    "start_agent_run",
    "start_chat",
    "start_fire",
    "start_mcp",
    "start_request",
    "start_sample",
    "start_tool",
    "start_turn",
]
