"""start_coding_agent / cancel_coding_agent on a persona (no Ray): a real
Claude Code (claude-agent-acp from npm) edits the workspace; start failures
are tool errors, later failures are in the wake; cancel stops the group;
what an agent reports it spent is a model_call billed to the persona and
counted against its budget."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from coterie.runtime import tracing
from coterie.runtime.config import BudgetSettings, RuntimeSettings, load_persona
from coterie.runtime.delegation.coding import LocalCodingAgents
from coterie.runtime.errors import BudgetExceededError
from coterie.runtime.messages import (
    AssistantMessage,
    DelegationEvent,
    MessageEnvelope,
    ModelCalled,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
)
from coterie.runtime.models.scripted import FunctionModel, latest_user_text, tool_call
from coterie.runtime.persona import Launchers, PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.runtime.shell.sandbox import bwrap_available
from coterie.runtime.usage.budget import BudgetLedger
from coterie.tools import builtin_registry
from tests.fakes.anthropic_stream import AnthropicStreamServer, Reply, ToolUse, When
from tests.helpers import scripted, write_persona
from tests.test_acp import CLAUDE_ACP, FAKE_AGENT, NODE, claude_installed, needs_claude

__all__ = ["claude_installed"]  # the fixture needs_claude uses

CONV = "coder:test"
TOOLS = {"start_coding_agent", "cancel_coding_agent"}


def claude_entry(server: AnthropicStreamServer, **fields: Any) -> dict[str, Any]:
    return {
        "command": NODE,
        "args": [str(CLAUDE_ACP)],
        "env": {
            "ANTHROPIC_BASE_URL": server.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-fake",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "IS_SANDBOX": "1",
        },
        **fields,
    }


def fake_entry(mode: str, **fields: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FAKE_AGENT), mode], **fields}


def write_roster(home: Path, agents: dict[str, Any] | str) -> None:
    text = agents if isinstance(agents, str) else json.dumps({"agents": agents})
    (home / "acp.json").write_text(text, encoding="utf-8")


def delegate(request: ModelRequest) -> AssistantMessage:
    """Step 1 of ``delegate {json args}``: one start_coding_agent call;
    ``cancel <handle>``: cancel_coding_agent; anything else: echo."""
    text = latest_user_text(request)
    if request.step == 1 and text.startswith("delegate "):
        return AssistantMessage(
            tool_calls=[tool_call("start_coding_agent", json.loads(text.removeprefix("delegate ")))]
        )
    if request.step == 1 and text.startswith("cancel "):
        handle = text.removeprefix("cancel ")
        return AssistantMessage(tool_calls=[tool_call("cancel_coding_agent", {"handle": handle})])
    return AssistantMessage(text=f"heard: {text[:2000]}")


def make(home: Path) -> tuple[PersonaRuntime, NullAudit]:
    write_persona(home, "coder", scripted())
    audit = NullAudit()
    rt = PersonaRuntime(
        load_persona(home, "coder"),
        model=FunctionModel(delegate),
        registry=builtin_registry(),
        services=Services(audit=audit),
        launchers=Launchers(coding_agents=LocalCodingAgents(audit=audit)),
    )
    return rt, audit


def ask(text: str) -> MessageEnvelope:
    return MessageEnvelope(recipient="coder", conversation_id=CONV, text=text)


def order(**args: Any) -> str:
    return "delegate " + json.dumps(args)


async def settle(rt: PersonaRuntime, timeout: float = 120) -> None:
    async with asyncio.timeout(timeout):
        while not rt.settled(CONV):
            await asyncio.sleep(0.05)


def tool_results(rt: PersonaRuntime, name: str) -> list[dict[str, Any]]:
    return [
        json.loads(m.content)
        for m in rt.conversation(CONV).history
        if isinstance(m, ToolResultMessage) and m.name == name
    ]


def the_wake(rt: PersonaRuntime) -> str:
    wakes = [
        m.text
        for m in rt.conversation(CONV).history
        if isinstance(m, UserMessage) and m.source == "delegation"
    ]
    assert len(wakes) == 1, wakes
    return wakes[0]


def processes_in(path: Path) -> list[psutil.Process]:
    """Live processes whose working directory is ``path`` (the agent's)."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and Path(proc.cwd()) == path:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
async def server() -> Any:
    async with AnthropicStreamServer() as running:
        yield running


# -- the happy path with a real agent ---------------------------------------------


@needs_claude
async def test_claude_edits_a_file_for_the_persona(
    tmp_path: Path, server: AnthropicStreamServer
) -> None:
    rt, audit = make(tmp_path)
    workspace = rt.persona.workspace.resolve()
    target = workspace / "hello.txt"
    server.add(
        When(contains="TASK-WRITE", step=1, has_tools=True),
        Reply(
            text="Writing it.",
            tool_calls=[ToolUse(name="Write", input={"file_path": str(target), "content": "hi\n"})],
        ),
    )
    server.add(When(contains="TASK-WRITE", step=2), Reply(text="Done: hello.txt written."))
    write_roster(tmp_path, {"claude": claude_entry(server)})
    reply = await rt.handle(ask(order(task="TASK-WRITE: create hello.txt saying hi")))
    assert reply.steps == 1  # the turn ended on the deferred call
    (started,) = tool_results(rt, "start_coding_agent")
    assert started["deferred"] is True and started["kind"] == "coding_agent"
    assert started["handle"].startswith("acp_") and started["status"] == "started"
    assert started["agent"] == "claude" and started["cwd"] == str(workspace)
    await settle(rt)
    assert target.read_text() == "hi\n"  # written by Claude Code's own Write tool
    wake = the_wake(rt)
    assert f"## {started['handle']} (coding_agent) · ok" in wake
    assert "stop_reason: end_turn" in wake and "files_changed: ['hello.txt']" in wake
    assert "permissions: 1 allowed, 0 denied" in wake and "Done: hello.txt written." in wake
    last = rt.conversation(CONV).history[-1]
    assert isinstance(last, AssistantMessage) and "Done: hello.txt written." in last.text
    # Its updates are in the audit log, in the parent's turn: the permission
    # asked and answered by policy, the tool call, the merged messages.
    events = [e for e in audit.events if isinstance(e, DelegationEvent)]
    assert {e.turn_id for e in events} == {reply.turn_id}
    assert {e.handle for e in events} == {started["handle"]}
    (permission,) = [e for e in events if e.phase == "permission"]
    decision = permission.data["decision"]
    assert decision["decision"] == "allow" and decision["paths"] == [str(target)]
    updates = [e.data for e in events if e.phase == "update"]
    assert any(u["type"] == "tool_call" and u.get("status") == "completed" for u in updates)
    assert {"type": "message", "text": "Done: hello.txt written."} in updates
    (finished,) = [e for e in events if e.phase == "finished"]
    assert finished.status == "ok" and finished.data["files_changed"] == ["hello.txt"]
    assert processes_in(workspace) == []  # the agent's group is gone
    # What Claude Code reported its prompt consumed (the local server's
    # usage blocks, summed by the agent): one model_call, billed to coder.
    (call,) = agent_calls(audit)
    assert (call.provider, call.model, call.billed_to) == ("acp", "claude", "coder")
    assert call.input_tokens > 0 and call.output_tokens > 0 and call.turn_id == reply.turn_id
    await rt.aclose()


@needs_claude
async def test_cancel_coding_agent_mid_prompt_stops_the_group(
    tmp_path: Path, server: AnthropicStreamServer
) -> None:
    rt, _ = make(tmp_path)
    workspace = rt.persona.workspace.resolve()
    server.add(When(contains="TASK-SLOW"), Reply(text="never", stall=120))
    write_roster(tmp_path, {"claude": claude_entry(server)})
    await rt.handle(ask(order(task="TASK-SLOW: take your time")))
    (started,) = tool_results(rt, "start_coding_agent")
    await asyncio.wait_for(server.stalling.wait(), 60)
    assert processes_in(workspace) != []  # the adapter and its claude child
    await rt.handle(ask(f"cancel {started['handle']}"))
    (cancelled,) = tool_results(rt, "cancel_coding_agent")
    assert cancelled["cancelled"] == started["handle"]
    await settle(rt)
    wake = the_wake(rt)
    assert f"## {started['handle']} (coding_agent) · cancelled" in wake
    assert "stop_reason: cancelled" in wake
    assert processes_in(workspace) == []
    await rt.aclose()


# -- visibility ---------------------------------------------------------------------


async def test_tools_hidden_without_a_roster_and_shown_for_a_wrong_one(tmp_path: Path) -> None:
    rt, _ = make(tmp_path)
    seen: list[set[str]] = []
    described: list[str] = []

    def spy(request: ModelRequest) -> AssistantMessage:
        seen.append({t.name for t in request.tools} & TOOLS)
        described.extend(t.description for t in request.tools if t.name == "start_coding_agent")
        return AssistantMessage(text="ok")

    rt.loop.model = FunctionModel(spy)
    await rt.handle(ask("no roster"))
    write_roster(tmp_path, {})
    await rt.handle(ask("empty roster"))
    write_roster(tmp_path, {"fake": fake_entry("fs", description="a test agent")})
    await rt.handle(ask("one agent"))
    write_roster(tmp_path, "{not json")
    await rt.handle(ask("broken roster"))
    assert seen == [set(), set(), TOOLS, TOOLS]
    # The roster's agents are named in the description (not for the broken file).
    assert described[0].endswith("Agents:\n- fake (default): a test agent")
    assert "Agents:" not in described[1]
    # A call against the broken file says what is wrong with it.
    rt.loop.model = FunctionModel(delegate)
    await rt.handle(ask(order(task="x")))
    (result,) = tool_results(rt, "start_coding_agent")
    assert result["error"] == "unavailable" and "acp.json" in result["detail"]
    assert "not valid JSON" in result["detail"]
    await rt.aclose()


# -- bad inputs and start failures: the tool's error, nothing left running ---------


@pytest.mark.parametrize(
    ("roster", "arguments", "kind", "words"),
    [
        ({"a": fake_entry("fs")}, {"agent": "b"}, "invalid_arguments", "choose from a"),
        (
            {"a": fake_entry("fs"), "b": fake_entry("fs")},
            {},
            "invalid_arguments",
            "name one of a, b",
        ),
        ({"a": fake_entry("fs")}, {"cwd": "/tmp"}, "path_denied", "outside"),
        ({"a": fake_entry("fs")}, {"cwd": "sub"}, "invalid_arguments", 'cwd: "workspace"'),
        ({"a": {"command": "no-such-agent-xyz"}}, {}, "agent_start_failed", "not found"),
        ({"a": {"command": "true"}}, {}, "agent_start_failed", "exited (status 0)"),
        (
            {"a": {"command": "sleep", "args": ["60"], "startup_timeout": 1}},
            {},
            "timeout",
            "within 1 s",
        ),
        ({"a": fake_entry("refuse-init")}, {}, "protocol_error", "refused initialize"),
        (
            {"a": fake_entry("fs", env={"TOKEN": "${secret:NOPE}"})},
            {},
            "missing_secret",
            "secret:NOPE",
        ),
    ],
)
async def test_start_failures_are_tool_errors(
    tmp_path: Path, roster: dict[str, Any], arguments: dict[str, Any], kind: str, words: str
) -> None:
    rt, _ = make(tmp_path)
    (rt.persona.workspace / "sub").mkdir()
    write_roster(tmp_path, roster)
    reply = await rt.handle(ask(order(task="do it", **arguments)))
    (result,) = tool_results(rt, "start_coding_agent")
    assert result["error"] == kind, result
    assert words in result["detail"]
    assert reply.steps == 2  # not deferred: the turn went on
    assert rt.delegations.running() == 0 and rt.settled(CONV)
    assert processes_in(rt.persona.workspace.resolve()) == []
    await rt.aclose()


async def test_any_in_rails_agent_may_work_in_a_subfolder(tmp_path: Path) -> None:
    rt, _ = make(tmp_path)
    sub = rt.persona.workspace / "proj"
    sub.mkdir()
    write_roster(tmp_path, {"a": fake_entry("env", cwd="any-in-rails")})
    await rt.handle(ask(order(task="{}", cwd="proj")))
    (started,) = tool_results(rt, "start_coding_agent")
    assert started["cwd"] == str(sub.resolve())
    await settle(rt)
    assert "· ok" in the_wake(rt)
    await rt.aclose()


@pytest.mark.skipif(
    bwrap_available() is None and not os.environ.get("CI"), reason="bubblewrap is not installed"
)
@pytest.mark.parametrize("policy", ["workspace", "deny"])
async def test_a_persona_agent_s_terminals_are_confined(tmp_path: Path, policy: str) -> None:
    rt, audit = make(tmp_path)
    write_roster(tmp_path, {"t": fake_entry("terminal", permissions=policy)})
    (rt.persona.path / ".env").write_text("PERSONA_TOKEN=persona-secret-value\n")
    ops = [
        {"op": "caps"},
        {"op": "run", "command": "echo made > made.txt && echo wrote"},
        {"op": "run", "command": f"cat {tmp_path}/acp.json {rt.persona.path}/.env"},
    ]
    await rt.handle(ask(order(task=json.dumps({"ops": ops}))))
    await settle(rt)
    wake = the_wake(rt)
    assert "terminal True" in wake
    made = rt.persona.workspace / "made.txt"
    if policy == "workspace":
        assert made.read_text() == "made\n" and '"wrote\\n"' in wake
    else:  # deny: commands may read the workspace, not write it
        assert not made.exists() and '"wrote\\n"' not in wake
        assert "Read-only file system" in wake
    # The coterie home and the persona's directory are hidden from commands.
    assert "persona-secret-value" not in wake and '"agents"' not in wake
    creates = [
        e
        for e in audit.events
        if isinstance(e, DelegationEvent)
        and e.data.get("type") == "terminal"
        and e.data.get("op") == "create"
    ]
    assert len(creates) == 2 and all(e.data["allowed"] for e in creates)
    await rt.aclose()


# -- failures after the start: in the wake -----------------------------------------


async def test_crash_and_prompt_timeout_are_reported_in_the_wake(tmp_path: Path) -> None:
    rt, _ = make(tmp_path)
    write_roster(
        tmp_path,
        {"crashy": fake_entry("crash"), "slow": fake_entry("stall", prompt_timeout=1)},
    )
    reply = await rt.handle(ask("two"))
    assert reply.text == "heard: two"

    def both(request: ModelRequest) -> AssistantMessage:
        if request.step == 1 and latest_user_text(request) == "both":
            return AssistantMessage(
                tool_calls=[
                    tool_call("start_coding_agent", {"task": "go", "agent": "crashy"}),
                    tool_call("start_coding_agent", {"task": "go", "agent": "slow"}),
                ]
            )
        return AssistantMessage(text="noted")

    rt.loop.model = FunctionModel(both)
    await rt.handle(ask("both"))
    crashy, slow = tool_results(rt, "start_coding_agent")
    await settle(rt)
    wake = the_wake(rt)  # one wake for the two
    assert f"## {crashy['handle']} (coding_agent) · crashed" in wake
    assert "died mid-task (status 3)" in wake
    assert f"## {slow['handle']} (coding_agent) · timeout" in wake
    assert "did not finish within 1 s" in wake
    await rt.aclose()


async def test_cancel_coding_agent_unknown_handle(tmp_path: Path) -> None:
    rt, _ = make(tmp_path)
    write_roster(tmp_path, {"a": fake_entry("fs")})
    await rt.handle(ask("cancel acp_nope"))
    (result,) = tool_results(rt, "cancel_coding_agent")
    assert result == {
        "error": "not_found",
        "detail": "no coding agent task with handle 'acp_nope'",
    }
    await rt.aclose()


# -- what the agent reports it spent -------------------------------------------------

CHEAP = {"priced-*": {"input": 1, "output": 1}}  # $1 per million tokens


def billed(home: Path, budget: BudgetLedger) -> tuple[PersonaRuntime, NullAudit]:
    write_persona(home, "coder", scripted(budget={"daily_usd": 1.0}))
    audit = NullAudit()
    rt = PersonaRuntime(
        load_persona(home, "coder"),
        model=FunctionModel(delegate, name="priced-coder"),
        registry=builtin_registry(),
        services=Services(audit=audit, budget=budget),
        host=PersonaHost(settings=RuntimeSettings(prices=CHEAP)),
        launchers=Launchers(coding_agents=LocalCodingAgents(audit=audit, budget=budget)),
    )
    return rt, audit


def books() -> BudgetLedger:
    """The runtime's budgets: coder may spend $1 a day."""

    async def limits_of(name: str) -> BudgetSettings:
        return BudgetSettings(daily_usd=1.0) if name == "coder" else BudgetSettings()

    async def spent_since(payer: str | None, since: datetime) -> float:
        return 0.0

    return BudgetLedger(
        runtime=BudgetSettings(), limits_of=limits_of, spent_since=spent_since, tz=UTC
    )


def agent_calls(audit: NullAudit) -> list[ModelCalled]:
    return [e for e in audit.events if isinstance(e, ModelCalled) and e.context == "coding_agent"]


async def test_a_coding_agents_reported_usage_is_a_model_call_billed_to_its_persona(
    tmp_path: Path,
) -> None:
    ledger = books()
    rt, audit = billed(tmp_path, ledger)
    write_roster(tmp_path, {"metered": fake_entry("usage")})
    usage = {
        "totalTokens": 1820,
        "inputTokens": 1000,
        "outputTokens": 400,
        "thoughtTokens": 100,
        "cachedReadTokens": 300,
        "cachedWriteTokens": 20,
    }
    # The session's cumulative cost, as the agent reports it along the way.
    task = json.dumps({"costs": [[0.05, "USD"], [0.9, "USD"]], "usage": usage})
    await rt.handle(ask(order(task=task)))
    await settle(rt)
    assert "· ok" in the_wake(rt)
    (call,) = agent_calls(audit)
    assert (call.provider, call.model, call.conversation_id) == ("acp", "metered", CONV)
    # ACP's inputTokens are the uncached part; thoughts are output.
    assert (call.input_tokens, call.output_tokens) == (1320, 500)
    assert (call.cache_read_tokens, call.cache_write_tokens) == (300, 20)
    assert call.cost_usd == pytest.approx(0.9) and call.priced
    assert call.billed_to == "coder" and call.error is None
    # It counts against the persona's daily $1: a call that the $0.9 leaves
    # no room for is refused now.
    with pytest.raises(BudgetExceededError, match="persona 'coder'"):
        await ledger.reserve("coder", 0.2, model="m", persona="coder", conversation_id=CONV)
    await rt.aclose()


async def test_a_cost_in_another_currency_is_recorded_unpriced_and_not_counted(
    tmp_path: Path,
) -> None:
    ledger = books()
    rt, audit = billed(tmp_path, ledger)
    write_roster(tmp_path, {"metered": fake_entry("usage")})
    await rt.handle(ask(order(task=json.dumps({"costs": [[5, "EUR"]], "usage": None}))))
    await settle(rt)
    (call,) = agent_calls(audit)
    assert call.cost_usd is None and not call.priced
    assert call.error is not None and "EUR" in call.error
    assert (call.input_tokens, call.output_tokens) == (0, 0)  # it sent no token counts
    # Nothing was counted: $0.2 still fits in the $1.
    await ledger.reserve("coder", 0.2, model="m", persona="coder", conversation_id=CONV)
    await rt.aclose()


async def test_an_agent_that_reports_nothing_records_no_model_call(tmp_path: Path) -> None:
    rt, audit = billed(tmp_path, books())
    write_roster(tmp_path, {"quiet": fake_entry("fs")})
    await rt.handle(ask(order(task=json.dumps({"ops": []}))))
    await settle(rt)
    assert "· ok" in the_wake(rt)
    assert agent_calls(audit) == []
    await rt.aclose()


# -- permissions: ask -------------------------------------------------------------


async def test_an_agents_permission_requests_go_to_the_rules_and_a_person(
    tmp_path: Path,
) -> None:
    """``permissions: ask``: the persona's rules for ``coding_agent`` answer
    what they cover; a person answers the rest as approvals."""
    write_persona(
        tmp_path,
        "coder",
        scripted(
            permissions={
                "rules": [
                    {"tool": "coding_agent", "match": "git status", "action": "allow"},
                    {"tool": "coding_agent", "match": "rm -rf", "action": "deny"},
                ]
            }
        ),
    )
    audit = NullAudit()
    rt = PersonaRuntime(
        load_persona(tmp_path, "coder"),
        model=FunctionModel(delegate),
        registry=builtin_registry(),
        services=Services(audit=audit),
    )
    write_roster(tmp_path, {"fake": fake_entry("permission", permissions="ask")})
    workspace = rt.persona.workspace.resolve()
    requests = [
        {"title": "status", "kind": "execute", "command": "git status"},
        {"title": "wipe", "kind": "execute", "command": "bash -c 'rm -rf build'"},
        {"title": "edit", "kind": "edit", "paths": [str(workspace / "a.py")]},
        {"title": "fetch", "kind": "execute", "command": "curl -u s3cr3t-value-123 example.org"},
    ]
    # A secret in the agent's request is never shown to the person or kept.
    (tmp_path / "personas" / "coder" / ".env").write_text("TOKEN=s3cr3t-value-123\n")
    reply = await rt.handle(ask(order(task=json.dumps({"requests": requests}))))
    assert reply.steps == 1
    answers = iter([("approve", "edit"), ("deny", "fetch")])
    async with asyncio.timeout(120):
        while not rt.settled(CONV):
            pending = rt.approvals.pending()
            if pending:
                (approval,) = pending
                answer, expected = next(answers)
                assert approval.tool == "coding_agent" and approval.conversation_id == CONV
                assert expected in str(approval.arguments)
                if expected == "fetch":
                    assert approval.summary == (
                        "fake wants to run 'curl -u [redacted:TOKEN] example.org'"
                    )
                    assert "s3cr3t" not in json.dumps(approval.model_dump(mode="json"))
                await rt.decide_approval(approval.approval_id, answer, by="ana", via="test")
            await asyncio.sleep(0.05)
    wake = the_wake(rt)
    assert "allowed status" in wake and "denied wipe" in wake
    assert "allowed edit" in wake and "denied fetch" in wake
    assert "permissions: 2 allowed, 2 denied" in wake
    decisions = [
        e.data["decision"]
        for e in audit.events
        if isinstance(e, DelegationEvent) and e.phase == "permission"
    ]
    reasons = [d["reason"] for d in decisions]
    assert reasons[0].startswith("allowed by persona.yaml rule 1")
    assert reasons[1].startswith("refused by persona.yaml rule 2")
    assert reasons[2:] == ["approved by ana via test", "denied by ana via test"]
    await rt.aclose()


@needs_claude
async def test_claude_asks_before_its_shell_command_and_a_person_approves(
    tmp_path: Path, server: AnthropicStreamServer
) -> None:
    """The real claude-agent-acp under ``permissions: ask``: its Bash call's
    permission request becomes an approval; approved, the command runs."""
    write_persona(
        tmp_path,
        "coder",
        scripted(
            permissions={"rules": [{"tool": "coding_agent", "match": "rm", "action": "deny"}]}
        ),
    )
    rt = PersonaRuntime(
        load_persona(tmp_path, "coder"),
        model=FunctionModel(delegate),
        registry=builtin_registry(),
        services=Services(audit=NullAudit()),
    )
    workspace = rt.persona.workspace.resolve()
    command = f"echo approved > {workspace / 'bash.txt'}"
    server.add(
        When(contains="TASK-BASH", step=1, has_tools=True),
        Reply(
            text="Running it.",
            tool_calls=[ToolUse(name="Bash", input={"command": command, "description": "write"})],
        ),
    )
    server.add(When(contains="TASK-BASH", step=2), Reply(text="Done: the command ran."))
    write_roster(tmp_path, {"claude": claude_entry(server, permissions="ask")})
    await rt.handle(ask(order(task="TASK-BASH: write bash.txt with the shell")))
    seen: list[str] = []
    async with asyncio.timeout(180):
        while not rt.settled(CONV):
            for approval in rt.approvals.pending():
                seen.append(approval.summary)
                await rt.decide_approval(approval.approval_id, "approve", by="ana", via="test")
            await asyncio.sleep(0.05)
    assert seen and command in seen[0], seen
    assert (workspace / "bash.txt").read_text() == "approved\n"
    wake = the_wake(rt)
    assert "Done: the command ran." in wake
    assert re.search(r"permissions: [1-9]\d* allowed, 0 denied", wake), wake
    await rt.aclose()


# -- traced ------------------------------------------------------------------


@needs_claude
async def test_a_coding_agent_is_a_child_span_with_its_updates_as_events(
    tmp_path: Path, spans: Any
) -> None:
    async with AnthropicStreamServer() as server:
        rt, audit = make(tmp_path)
        target = rt.persona.workspace.resolve() / "hello.txt"
        server.add(
            When(contains="TASK-WRITE", step=1, has_tools=True),
            Reply(
                text="Writing it.",
                tool_calls=[
                    ToolUse(name="Write", input={"file_path": str(target), "content": "hi\n"})
                ],
            ),
        )
        server.add(When(contains="TASK-WRITE", step=2), Reply(text="Done: hello.txt written."))
        write_roster(tmp_path, {"claude": claude_entry(server)})
        await rt.handle(ask(order(task="TASK-WRITE: create hello.txt saying hi")))
        await settle(rt)
        await rt.aclose()
    assert target.read_text() == "hi\n"
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    parent = {s.context.span_id: s.parent.span_id if s.parent else None for s in finished}
    (started,) = [s for s in finished if s.name == "execute_tool start_coding_agent"]
    (agent,) = [s for s in finished if s.name == "invoke_agent claude"]
    assert parent[agent.context.span_id] == started.context.span_id
    attrs = agent.attributes
    assert attrs["gen_ai.provider.name"] == "acp"
    assert attrs["gen_ai.agent.id"].startswith("acp_")
    assert attrs["coterie.turn.status"] == "ok" and agent.status.is_ok
    assert attrs["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert attrs["coterie.acp.files_changed"] == 1
    (call,) = agent_calls(audit)
    # The tokens the agent reported, as the audit log has them.
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (
        call.input_tokens,
        call.output_tokens,
    )
    kinds = [e.name for e in agent.events]
    assert "acp.tool_call" in kinds and "acp.permission" in kinds and "acp.message" in kinds
    (message,) = [
        e for e in agent.events if e.attributes.get("coterie.acp.text", "").startswith("Done")
    ]
    assert message.attributes["coterie.acp.update"] == "message"
    # The turn its report woke is a child of the call that started it too.
    woken = [
        s
        for s in finished
        if s.name == "invoke_agent coder" and parent[s.context.span_id] == started.context.span_id
    ]
    assert len(woken) == 1
