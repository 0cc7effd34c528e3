"""Running the tool calls of one assistant message.

The reliability contract: every outcome is a string the model can read, and
no tool can wedge a turn. Failures come back as JSON error strings:

``timeout``, ``crashed``, ``unknown_tool``, ``invalid_arguments`` (with the
schema echoed), ``repeated_call`` (blocked by the loop's guard) and
``runner_exception`` (the runner itself failed) and ``permission_denied`` (a
permission rule or a person refused the call, see :mod:`runtime.permissions`). A tool raising
:class:`~runtime.errors.ToolError` reports its own kind and detail.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.messages import ToolCall, ToolCalled, ToolFinished
from coterie.runtime.tool import Deferred, ToolSpec
from coterie.runtime.tracing import active
from coterie.runtime.tracing.spans import finish_tool, start_tool

log = logging.getLogger("coterie.tools")

DEFAULT_OUTPUT_CAP = 16_000


@dataclass
class ToolOutcome:
    """The result of one call, in the string form the model reads."""

    call: ToolCall
    content: str
    error_kind: str | None = None
    duration_ms: float = 0.0
    terminal: bool = False
    # The handle of the pushed work the tool started (it returned a
    # Deferred): its completion comes back later as a wake.
    handle: str | None = None

    @property
    def deferred(self) -> bool:
        return self.handle is not None


def error_result(kind: str, detail: Any = None, **extra: Any) -> str:
    """The JSON string for a failed call: ``{"error": kind, "detail": …}``."""
    body: dict[str, Any] = {"error": kind}
    if detail is not None:
        body["detail"] = detail
    body.update(extra)
    return json.dumps(body, ensure_ascii=False, default=str)


def to_text(value: Any) -> str:
    """A tool's return value as the string the model will read."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if value is None:
        return "ok"
    return json.dumps(value, ensure_ascii=False, default=str)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def safe_name(raw: str) -> str:
    """``raw`` (an id a model server chose) as a plain file name.

    Anything but letters, digits, ``_`` and ``-`` becomes ``_`` (no ``/``,
    no ``..``); a changed or over-long name gets a short hash of the original,
    so that two ids never share a file.
    """
    clean = _UNSAFE.sub("_", raw)[:64]
    if clean == raw and clean:
        return clean
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{clean}-{digest}"


def remove_old_spills(spill_dir: Path, *, older_than: float, now: float | None = None) -> int:
    """Delete the turn folders of ``spill_dir`` not touched for ``older_than``
    seconds; returns how many went."""
    cutoff = (time.time() if now is None else now) - older_than
    removed = 0
    try:
        entries = list(os.scandir(spill_dir))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry.path)
                removed += 1
        except OSError as exc:  # in use, or gone meanwhile: the next sweep tries again
            log.warning("could not remove old spill folder %s: %s", entry.path, exc)
    return removed


def cap_output(text: str, *, cap: int, spill_path: Path) -> str:
    """Keep head and tail of an over-long result; spill the whole to disk.

    The marker names how many characters were cut, from where, and the file
    that holds the full text.
    """
    if len(text) <= cap:
        return text
    spill_path.parent.mkdir(parents=True, exist_ok=True)
    spill_path.write_text(text, encoding="utf-8")
    head = int(cap * 0.6)
    tail = cap - head
    cut = len(text) - head - tail
    marker = (
        f"\n\n[... {cut} of {len(text)} characters cut from the middle "
        f"(kept the first {head} and the last {tail}); full output: {spill_path} ...]\n\n"
    )
    return text[:head] + marker + text[-tail:]


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": ".".join(str(p) for p in e["loc"]) or "(arguments)", "msg": e["msg"]}
        for e in exc.errors()
    ]


class ToolRunner:
    """Runs calls concurrently, each under its own timeout, in call order."""

    def __init__(self, *, output_cap: int = DEFAULT_OUTPUT_CAP, timeout: float | None = None):
        self.output_cap = output_cap
        # Overrides every tool's own timeout when set (persona tool_timeout).
        self.timeout = timeout

    async def run_calls(
        self,
        calls: Sequence[ToolCall],
        ctx: TurnContext,
        tools: Mapping[str, ToolSpec],
        *,
        blocked: Mapping[int, str] | None = None,
    ) -> list[ToolOutcome]:
        """Run ``calls`` concurrently; results return in the original order.

        ``blocked`` maps a call's index to a ready error result (the repeat
        guard); those calls do not run.
        """
        blocked = blocked or {}
        jobs = [
            self._blocked(call, blocked[i]) if i in blocked else self._guarded(call, ctx, tools)
            for i, call in enumerate(calls)
        ]
        return list(await asyncio.gather(*jobs))

    async def _blocked(self, call: ToolCall, content: str) -> ToolOutcome:
        return ToolOutcome(call=call, content=content, error_kind=json.loads(content)["error"])

    async def _guarded(
        self, call: ToolCall, ctx: TurnContext, tools: Mapping[str, ToolSpec]
    ) -> ToolOutcome:
        started = time.perf_counter()
        span = start_tool(
            name=call.name, call_id=call.id, arguments=call.arguments, redact=ctx.settings.redact
        )
        with active(span):
            # Inside the span: its rows carry its ids, and what the tool sends
            # (an ask_persona's envelope, a subagent's request) its context.
            outcome = await self._traced(call, ctx, tools, started)
        finish_tool(
            span,
            error_kind=outcome.error_kind,
            duration_ms=outcome.duration_ms,
            result=outcome.content,
        )
        return outcome

    async def _traced(
        self, call: ToolCall, ctx: TurnContext, tools: Mapping[str, ToolSpec], started: float
    ) -> ToolOutcome:
        ctx.audit.record(
            ToolCalled(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                call_id=call.id,
                tool=call.name,
                arguments=call.arguments,
            )
        )
        try:
            outcome = await self._run_one(call, ctx, tools)
        except Exception as exc:  # the runner's own failure, never the tool's
            log.exception("tool runner failed on %s", call.name)
            outcome = ToolOutcome(
                call=call,
                content=error_result("runner_exception", f"{type(exc).__name__}: {exc}"),
                error_kind="runner_exception",
            )
        settings = ctx.settings
        if settings.secrets:
            # No tool result shows a secret, whatever the tool read or printed.
            outcome.content = settings.redact(outcome.content)
        outcome.duration_ms = (time.perf_counter() - started) * 1000
        ctx.audit.record(
            ToolFinished(
                persona=ctx.persona,
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                call_id=call.id,
                tool=call.name,
                duration_ms=outcome.duration_ms,
                error_kind=outcome.error_kind,
                result=outcome.content,
            )
        )
        return outcome

    async def _run_one(
        self, call: ToolCall, ctx: TurnContext, tools: Mapping[str, ToolSpec]
    ) -> ToolOutcome:
        spec = tools.get(call.name)
        if spec is None:
            detail = f"no tool named {call.name!r}; available: {', '.join(sorted(tools))}"
            return ToolOutcome(call, error_result("unknown_tool", detail), "unknown_tool")

        raw = call.arguments
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as exc:
                return self._invalid(call, spec, f"arguments are not valid JSON: {exc}")
        if not isinstance(raw, dict):
            return self._invalid(call, spec, "arguments must be a JSON object")
        try:
            args = spec.args_model.model_validate(raw)
        except ValidationError as exc:
            return self._invalid(call, spec, _validation_detail(exc))

        gate = ctx.services.permissions
        if gate is not None:
            # Before the timeout starts: a person may take a while to answer.
            refusal = await gate.check(spec, args, call, ctx)
            if refusal is not None:
                return ToolOutcome(call, refusal, "permission_denied")
        timeout = self.timeout or spec.timeout
        task = asyncio.ensure_future(spec.fn(args, ctx))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            # Cancel without awaiting: a tool that swallows cancellation must
            # not hold the turn hostage.
            task.cancel()
            task.add_done_callback(_consume)
            detail = f"{call.name} did not finish within {timeout:g} s"
            return ToolOutcome(call, error_result("timeout", detail), "timeout")
        if task.cancelled():
            return ToolOutcome(call, error_result("crashed", "the tool was cancelled"), "crashed")
        failure = task.exception()
        if isinstance(failure, ToolError):
            return ToolOutcome(call, error_result(failure.kind, failure.detail), failure.kind)
        if failure is not None:
            detail = f"{type(failure).__name__}: {failure}"
            return ToolOutcome(call, error_result("crashed", detail), "crashed")
        value = task.result()
        if inspect.isawaitable(value):  # a tool that returned a coroutine by mistake
            value = await value
        text = cap_output(
            ctx.settings.redact(to_text(value)),
            cap=self.output_cap,
            spill_path=ctx.settings.spill_dir
            / safe_name(ctx.turn_id)
            / f"{safe_name(call.id)}.txt",
        )
        handle = value.handle if isinstance(value, Deferred) else None
        return ToolOutcome(call, text, None, terminal=spec.terminal, handle=handle)

    def _invalid(self, call: ToolCall, spec: ToolSpec, detail: Any) -> ToolOutcome:
        content = error_result("invalid_arguments", detail, schema=spec.schema())
        return ToolOutcome(call, content, "invalid_arguments")


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


__all__ = [
    "ToolOutcome",
    "ToolRunner",
    "cap_output",
    "error_result",
    "remove_old_spills",
    "safe_name",
    "to_text",
]
