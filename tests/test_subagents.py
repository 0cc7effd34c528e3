"""Subagents and pushed work without Ray: spawn, grouped wakes, limits,
timeouts, crashes, cancel, audit links, and the draft tool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.config import ModelConfig, load_persona
from coterie.runtime.context import TurnSettings
from coterie.runtime.delegation import LocalSubagents, WorkOutcome, render_wake
from coterie.runtime.delegation.work import WAKE_RESULT_CAP, Delegations, cut_report
from coterie.runtime.messages import (
    AssistantMessage,
    DelegationEvent,
    HistoryAppended,
    MessageEnvelope,
    ModelCalled,
    ModelRequest,
    ToolCalled,
    ToolResultMessage,
    TurnEnded,
    UserMessage,
)
from coterie.runtime.models import build_model
from coterie.runtime.models.base import Model
from coterie.runtime.models.scripted import FunctionModel, latest_user_text, tool_call
from coterie.runtime.persona import Launchers, PersonaRuntime
from coterie.runtime.runner import ToolRunner
from coterie.runtime.services import NullAudit, Services
from coterie.runtime.shell import LocalProcesses
from coterie.runtime.tool import ToolRegistry
from coterie.tools import builtin_registry
from coterie.tools.control import DRAFT_ROUNDS, draft
from coterie.tools.tasks import TaskHandleArgs, task_cancel, task_status
from tests.helpers import make_ctx, scripted, write_persona

CONV = "boss:test"


def spawn(task: str, **extra: Any) -> dict[str, Any]:
    return {"name": "spawn_subagent", "arguments": {"task": task, **extra}}


def make(
    tmp_path: Path,
    parent: Model,
    sub: Callable[[ModelConfig], Model] | None = None,
    *,
    config: dict[str, Any] | None = None,
    processes: bool = False,
) -> tuple[PersonaRuntime, NullAudit, list[ModelRequest]]:
    """A persona ``boss`` whose subagents run in-process on ``sub`` models
    (by default from its persona.yaml); the requests subagents made."""
    write_persona(tmp_path, "boss", config or scripted())
    persona = load_persona(tmp_path, "boss")
    audit = NullAudit()
    seen: list[ModelRequest] = []

    def factory(cfg: ModelConfig) -> Model:
        model = sub(cfg) if sub else build_model(cfg)
        inner = model.request

        async def spy(request: ModelRequest) -> Any:
            seen.append(request)
            return await inner(request)

        model.request = spy  # type: ignore[method-assign]
        return model

    registry = builtin_registry()
    launcher = LocalSubagents(registry=registry, model_factory=factory, audit=audit)
    rt = PersonaRuntime(
        persona,
        model=parent,
        registry=registry,
        services=Services(audit=audit, processes=LocalProcesses() if processes else None),
        launchers=Launchers(subagents=launcher),
    )
    return rt, audit, seen


async def settle(rt: PersonaRuntime, conv: str = CONV, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not rt.settled(conv):
            await asyncio.sleep(0.01)


def ask(text: str, conv: str = CONV) -> MessageEnvelope:
    return MessageEnvelope(recipient="boss", conversation_id=conv, text=text)


def wakes(rt: PersonaRuntime, conv: str = CONV) -> list[UserMessage]:
    return [
        m
        for m in rt.conversation(conv).history
        if isinstance(m, UserMessage) and m.source == "delegation"
    ]


def results(rt: PersonaRuntime, name: str, conv: str = CONV) -> list[dict[str, Any]]:
    return [
        json.loads(m.content)
        for m in rt.conversation(conv).history
        if isinstance(m, ToolResultMessage) and m.name == name
    ]


# -- the happy path: two spawns, one grouped wake ------------------------------


DEMO_RULES = scripted(
    [
        {"when": {"context": "subagent", "contains": "alpha"}, "text": "alpha: 42 files"},
        {"when": {"context": "subagent", "contains": "beta"}, "text": "beta: all tests pass"},
        {
            "when": {"turn": 1, "contains": "investigate"},
            "text": "Two helpers are on it.",
            "tool_calls": [spawn("count files (alpha)"), spawn("run the tests (beta)")],
        },
        {"when": {"contains": "have finished"}, "text": "Combined report:\n{input}"},
    ]
)


async def test_two_spawns_end_the_turn_and_report_in_one_grouped_wake(tmp_path: Path) -> None:
    write_persona(tmp_path, "boss", DEMO_RULES)
    parent = build_model(load_persona(tmp_path, "boss").config.model)
    rt, audit, seen = make(tmp_path, parent, config=DEMO_RULES)
    reply = await rt.handle(ask("please investigate"))
    # The turn ended after the batch: one model call, the spawns' results deferred.
    assert reply.text == "Two helpers are on it." and reply.steps == 1
    spawned = results(rt, "spawn_subagent")
    assert [r["deferred"] for r in spawned] == [True, True]
    assert all(r["kind"] == "subagent" and r["handle"].startswith("sub_") for r in spawned)
    await settle(rt)
    (wake,) = wakes(rt)  # one wake for both
    assert wake.text.startswith("[delegation] All 2 tasks you delegated together have finished.")
    for r, report in zip(spawned, ("alpha: 42 files", "beta: all tests pass"), strict=True):
        assert f"## {r['handle']} (subagent) · ok" in wake.text and report in wake.text
    # The wake turn ran: the persona answered with both reports.
    final = rt.conversation(CONV).history[-1]
    assert isinstance(final, AssistantMessage)
    assert "alpha: 42 files" in final.text and "beta: all tests pass" in final.text
    # Each subagent started fresh: its one request held only its task.
    assert sorted(latest_user_text(r) for r in seen) == [
        "count files (alpha)",
        "run the tests (beta)",
    ]
    for request in seen:
        assert [type(m) for m in request.messages] == [UserMessage]
        assert request.context == "subagent" and "You are boss." not in request.system
    # The audit links the parent's turn to each subagent's own conversation.
    delegation = [e for e in audit.events if isinstance(e, DelegationEvent)]
    assert {(e.phase, e.status) for e in delegation} == {("started", None), ("finished", "ok")}
    assert {e.conversation_id for e in delegation} == {CONV}
    assert {e.turn_id for e in delegation} == {reply.turn_id}
    for r in spawned:
        own = [e for e in audit.events if e.conversation_id == r["handle"]]
        kinds = {type(e) for e in own}
        assert {ModelCalled, HistoryAppended, TurnEnded} <= kinds
        assert {e.persona for e in own} == {"boss"}
    await rt.aclose()


async def test_a_mixed_batch_goes_on_and_the_wake_waits_for_the_whole_batch(
    tmp_path: Path,
) -> None:
    gate = asyncio.Event()

    async def slow_sub(request: ModelRequest) -> str:
        if "slow" in latest_user_text(request):
            await gate.wait()
        return f"done: {latest_user_text(request)}"

    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "go":
            return AssistantMessage(
                tool_calls=[
                    tool_call("spawn_subagent", {"task": "fast one"}),
                    tool_call("spawn_subagent", {"task": "slow one"}),
                    tool_call("clock", {}),
                ]
            )
        return AssistantMessage(text=f"step {request.step}")

    rt, _, _ = make(tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(slow_sub))
    reply = await rt.handle(ask("go"))
    # clock was not deferred: the turn went on to a second model call.
    assert reply.steps == 2 and reply.text == "step 2"
    await asyncio.sleep(0.2)
    assert wakes(rt) == [] and not rt.settled(CONV)  # the fast one waits for the slow one
    gate.set()
    await settle(rt)
    (wake,) = wakes(rt)
    assert "done: fast one" in wake.text and "done: slow one" in wake.text
    await rt.aclose()


# -- what a subagent gets -------------------------------------------------------


async def test_subagent_tools_are_restricted_and_never_delegate(tmp_path: Path) -> None:
    def parent(request: ModelRequest) -> AssistantMessage:
        text = latest_user_text(request)
        if request.step == 1 and text.startswith("spawn"):
            extra = json.loads(text.removeprefix("spawn"))
            return AssistantMessage(tool_calls=[tool_call("spawn_subagent", extra)])
        return AssistantMessage(text="ok")

    rt, _, seen = make(
        tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(lambda r: "fine"), processes=True
    )
    await rt.handle(ask('spawn{"task": "look around"}'))
    await settle(rt)
    every = {t.name for t in seen[-1].tools}
    assert {"file_read", "grep", "glob", "clock"} <= every
    # No delegation, no persona messaging, no memory, no writes (read-only workspace).
    for absent in ("spawn_subagent", "ask_persona", "send_to_persona", "memory", "recall"):
        assert absent not in every
    assert "file_write" not in every and "file_edit" not in every
    assert "task_status" not in every  # parent-only tools

    await rt.handle(ask('spawn{"task": "only the clock", "allowed_tools": ["clock", "file_*"]}'))
    await settle(rt)
    assert {t.name for t in seen[-1].tools} == {"clock", "file_read", "file_list"}
    await rt.aclose()


async def test_subagent_reads_the_workspace_but_cannot_write(tmp_path: Path) -> None:
    def sub(request: ModelRequest) -> AssistantMessage:
        if request.step == 1:
            return AssistantMessage(
                tool_calls=[
                    tool_call("file_read", {"path": "notes.txt"}),
                    tool_call("file_write", {"path": "x.txt", "content": "no"}),
                ]
            )
        return AssistantMessage(text=" | ".join(r.content for r in request.messages[-2:]))

    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "read it":
            return AssistantMessage(tool_calls=[tool_call("spawn_subagent", {"task": "read"})])
        return AssistantMessage(text="ok")

    rt, _, _ = make(tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(sub))
    (rt.persona.workspace / "notes.txt").write_text("the secret plan\n")
    await rt.handle(ask("read it"))
    await settle(rt)
    (wake,) = wakes(rt)
    assert "the secret plan" in wake.text
    assert "unknown_tool" in wake.text  # file_write is not among its tools
    assert not (rt.persona.workspace / "x.txt").exists()
    await rt.aclose()


# -- bad inputs and limits -------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "kind", "words"),
    [
        ({"task": "x", "allowed_tools": ["spawn_subagent"]}, "invalid_arguments", "choose from"),
        ({"task": "x", "allowed_tools": ["nope_*"]}, "invalid_arguments", "'nope_*'"),
        ({"task": "x", "model": "gpt-9"}, "invalid_arguments", "names none in subagents.models"),
        ({"task": "x", "timeout_s": 99_999}, "invalid_arguments", "max_timeout_s (1800)"),
        ({"task": ""}, "invalid_arguments", "task"),
    ],
)
async def test_bad_spawn_arguments_are_refused_and_start_nothing(
    tmp_path: Path, arguments: dict[str, Any], kind: str, words: str
) -> None:
    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "go":
            return AssistantMessage(tool_calls=[tool_call("spawn_subagent", arguments)])
        return AssistantMessage(text="noted")

    rt, _, seen = make(tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(lambda r: "x"))
    reply = await rt.handle(ask("go"))
    (result,) = results(rt, "spawn_subagent")
    assert result["error"] == kind and words in json.dumps(result)
    assert reply.steps == 2  # an error is not deferred: the turn went on
    assert rt.delegations.running() == 0 and seen == [] and rt.settled(CONV)
    await rt.aclose()


async def test_named_subagent_models_and_the_running_cap(tmp_path: Path) -> None:
    config = scripted(
        subagents={
            "max_running": 2,
            "models": {"cheap": {"provider": "scripted", "name": "cheap", "default": "cheap!"}},
        }
    )
    gate = asyncio.Event()

    def sub(cfg: ModelConfig) -> Model:
        async def answer(request: ModelRequest) -> str:
            await gate.wait()
            return f"{cfg.name} answered"  # type: ignore[union-attr]

        return FunctionModel(answer, name=cfg.name)  # type: ignore[union-attr]

    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "go":
            return AssistantMessage(
                tool_calls=[
                    tool_call("spawn_subagent", {"task": "a", "model": "cheap"}),
                    tool_call("spawn_subagent", {"task": "b"}),
                    tool_call("spawn_subagent", {"task": "c"}),
                ]
            )
        return AssistantMessage(text="then")

    rt, _, _ = make(tmp_path, FunctionModel(parent), sub, config=config)
    await rt.handle(ask("go"))
    first, second, third = results(rt, "spawn_subagent")
    assert first["deferred"] and second["deferred"]
    assert third["error"] == "limit_reached" and "subagents.max_running is 2" in third["detail"]
    gate.set()
    await settle(rt)
    (wake,) = wakes(rt)
    assert "cheap answered" in wake.text and "scripted answered" in wake.text
    await rt.aclose()


# -- failure modes: timeout, crash, model error, cancel ----------------------------


async def test_timeout_crash_and_model_error_are_reported_in_the_wake(tmp_path: Path) -> None:
    from coterie.runtime.errors import ModelHTTPError

    async def sub(request: ModelRequest) -> str:
        task = latest_user_text(request)
        if task == "hang":
            await asyncio.sleep(3600)
        if task == "crash":
            raise RuntimeError("segfault-ish")
        if task == "model":
            raise ModelHTTPError(529, "overloaded")
        return "fine"

    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "go":
            return AssistantMessage(
                tool_calls=[
                    tool_call("spawn_subagent", {"task": "hang", "timeout_s": 0.5}),
                    tool_call("spawn_subagent", {"task": "crash"}),
                    tool_call("spawn_subagent", {"task": "model"}),
                ]
            )
        return AssistantMessage(text="ok")

    rt, _, _ = make(tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(sub))
    await rt.handle(ask("go"))
    await settle(rt)
    (wake,) = wakes(rt)
    hang, crash, model = results(rt, "spawn_subagent")
    assert f"## {hang['handle']} (subagent) · timeout" in wake.text
    assert "did not finish within 0.5 s and was stopped" in wake.text
    assert f"## {crash['handle']} (subagent) · crashed" in wake.text
    assert "RuntimeError: segfault-ish" in wake.text
    assert f"## {model['handle']} (subagent) · error" in wake.text
    assert "status 529): overloaded" in wake.text
    await rt.aclose()


async def test_task_status_and_task_cancel_on_sub_handles(tmp_path: Path) -> None:
    started = asyncio.Event()

    def sub(request: ModelRequest) -> Any:
        async def answer() -> AssistantMessage:
            if request.step == 1:
                return AssistantMessage(tool_calls=[tool_call("clock", {})])
            started.set()
            await asyncio.sleep(3600)
            return AssistantMessage(text="never")

        return answer()

    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "go":
            return AssistantMessage(tool_calls=[tool_call("spawn_subagent", {"task": "long"})])
        return AssistantMessage(text="ok")

    rt, _, _ = make(tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(sub))
    await rt.handle(ask("go"))
    (spawned,) = results(rt, "spawn_subagent")
    handle = spawned["handle"]
    await asyncio.wait_for(started.wait(), 10)
    ctx = make_ctx(persona="boss", services=rt.services)
    status = await task_status.fn(TaskHandleArgs(handle=handle), ctx)
    assert status["status"] == "running" and status["task"] == "long"
    assert status["progress"]["steps"] == 1 and status["progress"]["last_tool"] == "clock"
    assert (await task_cancel.fn(TaskHandleArgs(handle=handle), ctx))["cancelled"] == handle
    await settle(rt)
    (wake,) = wakes(rt)
    assert f"## {handle} (subagent) · cancelled" in wake.text
    done = await task_status.fn(TaskHandleArgs(handle=handle), ctx)
    assert done["status"] == "cancelled"
    # Bad handles: unknown, finished, not a handle at all.
    from coterie.runtime.errors import ToolError

    with pytest.raises(ToolError, match="no delegated task with handle 'sub_nope'"):
        await task_status.fn(TaskHandleArgs(handle="sub_nope"), ctx)
    with pytest.raises(ToolError, match="already finished"):
        await task_cancel.fn(TaskHandleArgs(handle=handle), ctx)
    with pytest.raises(ToolError, match="not a task handle"):
        await task_cancel.fn(TaskHandleArgs(handle="xyz"), ctx)
    await rt.aclose()


async def test_closing_the_persona_stops_subagents_without_a_wake(tmp_path: Path) -> None:
    stopped = asyncio.Event()

    async def sub(request: ModelRequest) -> str:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()
        return "never"

    def parent(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "go":
            return AssistantMessage(tool_calls=[tool_call("spawn_subagent", {"task": "long"})])
        return AssistantMessage(text="ok")

    rt, _, _ = make(tmp_path, FunctionModel(parent), lambda cfg: FunctionModel(sub))
    await rt.handle(ask("go"))
    # Delegated work running: the persona is not idle, so it is not passivated.
    assert rt.delegations.running() == 1 and rt.idle_for() == 0
    assert not await rt.close_if_idle(0)
    await rt.aclose()
    assert stopped.is_set() and rt.delegations.running() == 0 and wakes(rt) == []


# -- the wake's text -------------------------------------------------------------


def test_a_long_report_is_cut_head_kept_with_a_marker() -> None:
    text = "x" * (WAKE_RESULT_CAP + 500)
    cut = cut_report(text, "sub_1")
    assert cut.startswith("x" * WAKE_RESULT_CAP)
    assert f"{WAKE_RESULT_CAP + 500} characters in all" in cut and "task_status sub_1" in cut
    assert cut_report("short", "sub_1") == "short"


async def test_render_wake_of_one() -> None:
    rt = Delegations(persona="p", deliver=lambda e: None, audit=NullAudit())

    class Done:
        async def result(self) -> WorkOutcome:
            return WorkOutcome(status="ok", text="the answer", data={"steps": 2})

        async def progress(self) -> dict[str, Any]:
            return {}

        async def cancel(self) -> None:
            return None

        async def discard(self) -> None:
            return None

    delivered: list[MessageEnvelope] = []
    rt.deliver = delivered.append
    rt.register(
        handle="sub_a",
        kind="subagent",
        work=Done(),
        conversation_id="c",
        turn_id="t",
        batch_id="",
        timeout=5,
        label="find it",
    )
    async with asyncio.timeout(5):
        while not delivered:
            await asyncio.sleep(0.01)
    (env,) = delivered
    assert env.source_kind == "wake" and env.reply_mode == "none" and env.recipient == "p"
    assert env.text.startswith("Your delegated task has finished.")
    assert "task: find it" in env.text and "steps: 2" in env.text and "the answer" in env.text
    assert render_wake([]) == "All 0 tasks you delegated together have finished."


# -- draft ---------------------------------------------------------------------


def test_draft_is_opt_in_by_name() -> None:
    from coterie.runtime.config import ToolFilter

    registry = ToolRegistry([draft])
    assert registry.visible(make_ctx()) == {}
    named = make_ctx(settings=TurnSettings(tool_filter=ToolFilter(allow=["draft", "*"])))
    assert list(registry.visible(named)) == ["draft"]


async def test_draft_returns_a_checklist_then_soft_lands() -> None:
    from coterie.runtime.config import ToolFilter

    ctx = make_ctx(settings=TurnSettings(tool_filter=ToolFilter(allow=["draft"])))
    tools = ToolRegistry([draft]).visible(ctx)
    runner = ToolRunner()
    outs = []
    empty = await runner.run_calls([tool_call("draft", {"text": ""})], ctx, tools)
    assert empty[0].error_kind == "invalid_arguments" and ctx.outputs.drafts == 0
    for i in range(DRAFT_ROUNDS + 1):
        (out,) = await runner.run_calls([tool_call("draft", {"text": f"answer v{i}"})], ctx, tools)
        outs.append(out.content)
    for i, content in enumerate(outs[:DRAFT_ROUNDS], 1):
        assert content.startswith(f"Draft {i} of {DRAFT_ROUNDS}") and "Claims" in content
        assert "answer v" not in content  # the draft is not echoed back
    assert "Do not call draft again" in outs[-1] and "Claims" not in outs[-1]
    # A new turn has a fresh budget.
    fresh = make_ctx(settings=TurnSettings(tool_filter=ToolFilter(allow=["draft"])))
    (again,) = await runner.run_calls([tool_call("draft", {"text": "v"})], fresh, tools)
    assert again.content.startswith("Draft 1 of")


async def test_spawned_tool_call_is_recorded_for_the_parent(tmp_path: Path) -> None:
    rt, audit, _ = make(
        tmp_path,
        FunctionModel(
            lambda r: (
                AssistantMessage(tool_calls=[tool_call("spawn_subagent", {"task": "t"})])
                if r.step == 1 and latest_user_text(r) == "go"
                else AssistantMessage(text="ok")
            )
        ),
        lambda cfg: FunctionModel(lambda r: "report"),
    )
    await rt.handle(ask("go"))
    await settle(rt)
    calls = [e for e in audit.events if isinstance(e, ToolCalled) and e.conversation_id == CONV]
    assert [c.tool for c in calls] == ["spawn_subagent"]
    await rt.aclose()


# -- work lost in a restart ------------------------------------------------------


def started_event(handle: str, conv: str, turn: str, task: str) -> DelegationEvent:
    return DelegationEvent(
        persona="boss",
        conversation_id=conv,
        turn_id=turn,
        handle=handle,
        work="subagent",
        phase="started",
        child_conversation_id=handle,
        data={"task": task, "timeout_s": 300},
    )


def test_unfinished_delegations_come_from_the_log(tmp_path: Path) -> None:
    from coterie.runtime.audit.rows import event_to_row
    from coterie.runtime.audit.writer import AuditWriter

    a, b, done = (
        started_event("sub_a", CONV, "turn_1", "a"),
        started_event("sub_b", CONV, "turn_1", "b"),
        started_event("sub_done", CONV, "turn_0", "done"),
    )
    finished = done.model_copy(update={"phase": "finished", "status": "ok"})
    other = started_event("sub_other", "x:1", "turn_9", "other").model_copy(
        update={"persona": "someone-else"}
    )
    with AuditWriter(tmp_path / "audit.duckdb") as writer:
        writer.write_rows([event_to_row(e) for e in (done, a, finished, b, other)])
        unfinished = writer.unfinished_delegations("boss")
    assert [e.handle for e in unfinished] == ["sub_a", "sub_b"]
    assert unfinished[0].data["task"] == "a"


def test_recover_reports_lost_work_once_per_batch() -> None:
    audit = NullAudit()
    sent: list[MessageEnvelope] = []
    delegations = Delegations(persona="boss", deliver=sent.append, audit=audit)
    lost = [
        started_event("sub_a", CONV, "turn_1", "first task"),
        started_event("sub_b", CONV, "turn_1", "second task"),
        started_event("sub_c", "boss:other", "turn_2", "third task"),
    ]
    assert delegations.recover(lost) == 2
    by_conv = {e.conversation_id: e for e in sent}
    both = by_conv[CONV].text
    assert both.startswith("All 2 tasks you delegated together have finished.")
    assert "## sub_a (subagent) · crashed" in both and "task: second task" in both
    assert "has restarted" in both
    assert by_conv["boss:other"].text.startswith("Your delegated task has finished.")
    assert all(e.source_kind == "wake" and e.reply_mode == "none" for e in sent)
    finished = [e for e in audit.events if isinstance(e, DelegationEvent)]
    assert sorted((e.handle, e.phase, e.status) for e in finished) == [
        ("sub_a", "finished", "crashed"),
        ("sub_b", "finished", "crashed"),
        ("sub_c", "finished", "crashed"),
    ]
    assert {e.turn_id for e in finished if e.conversation_id == CONV} == {"turn_1"}


async def test_a_restarted_persona_wakes_on_work_its_predecessor_lost(tmp_path: Path) -> None:
    from coterie.runtime.audit.rows import event_to_row
    from coterie.runtime.audit.writer import AuditWriter

    slow = {"provider": "scripted", "name": "slow", "latency_ms": 600_000, "timeout": 900}
    config = scripted(
        [
            {"when": {"contains": "finished"}, "text": "Heard back:\n{input}"},
            {"when": {"turn": 1, "contains": "go"}, "tool_calls": [spawn("hang", model="slow")]},
        ]
    ) | {"subagents": {"models": {"slow": slow}}}
    write_persona(tmp_path, "boss", config)
    model = build_model(load_persona(tmp_path, "boss").config.model)
    first, audit, _ = make(tmp_path, model, config=config)
    await first.handle(ask("go"))
    assert first.delegations.running() == 1
    # The process dies: what it logged is all that is left (no finished event).
    with AuditWriter(tmp_path / "audit.duckdb") as writer:
        writer.write_rows([event_to_row(e) for e in audit.events])
        lost = writer.unfinished_delegations("boss")
    (handle,) = [r["handle"] for r in results(first, "spawn_subagent")]
    assert [e.handle for e in lost] == [handle]
    history = list(first.conversation(CONV).history)
    first.delegations.closed = True  # its wakes go nowhere now
    second, _, _ = make(tmp_path, model, config=config)
    second.conversation(CONV).history = history
    assert second.recover_delegations(lost) == 1
    await settle(second)
    (wake,) = wakes(second)
    assert f"## {handle} (subagent) · crashed" in wake.text
    final = second.conversation(CONV).history[-1]
    assert isinstance(final, AssistantMessage) and final.text.startswith("Heard back:")
    await first.aclose()
    await second.aclose()
