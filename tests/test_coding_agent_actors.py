"""Coding agents on Ray: a persona actor's start_coding_agent runs Claude Code
(claude-agent-acp from npm) in a CodingAgent actor, which edits the
persona's workspace; the updates land in DuckDB; a start failure crosses
the actor boundary as the tool's error; what an agent reports it spent is
a model_call row and counts against the persona's budget in the router."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coterie import Runtime
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.messages import ToolResultMessage, UserMessage
from tests.fakes.anthropic_stream import AnthropicStreamServer, Reply, ToolUse, When
from tests.helpers import scripted, write_persona
from tests.test_acp import CLAUDE_ACP, FAKE_AGENT, NODE, claude_installed, needs_claude

__all__ = ["claude_installed"]

pytestmark = pytest.mark.usefixtures("ray_session")


class ServerThread:
    """The streaming Messages API server on its own event loop, in a thread
    (the Runtime API blocks the test's thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = AnthropicStreamServer()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server() -> Iterator[AnthropicStreamServer]:
    running = ServerThread()
    yield running.server
    running.close()


def start(task: str, **extra: Any) -> dict[str, Any]:
    return {"name": "start_coding_agent", "arguments": {"task": task, **extra}}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, server: AnthropicStreamServer) -> Path:
    home = tmp_path_factory.mktemp("coding")
    write_persona(
        home,
        "dev",
        scripted(
            [
                {"when": {"contains": "finished"}, "text": "The agent reported:\n{input}"},
                {
                    "when": {"turn": 1, "contains": "write notes"},
                    "tool_calls": [start("TASK-NOTES: create notes.md")],
                },
                {
                    "when": {"turn": 1, "contains": "use ghost"},
                    "tool_calls": [start("anything", agent="ghost")],
                },
                {"when": {"turn": 2}, "text": "result: {last_tool_result}"},
            ],
            default="ok",
        ),
    )
    agents = {
        "claude": {
            "command": NODE or "node",
            "args": [str(CLAUDE_ACP)],
            "env": {
                "ANTHROPIC_BASE_URL": server.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-fake",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "IS_SANDBOX": "1",
            },
            "default": True,
        },
        "ghost": {"command": "no-such-coding-agent"},
        "metered": {"command": sys.executable, "args": [str(FAKE_AGENT), "usage"]},
        "gated": {
            "command": sys.executable,
            "args": [str(FAKE_AGENT), "permission"],
            "permissions": "ask",
        },
    }
    write_persona(
        home,
        "gatekeeper",
        scripted(
            [
                {"when": {"contains": "finished"}, "text": "The agent reported:\n{input}"},
                {"when": {"turn": 1}, "tool_calls": [start("{input}", agent="gated")]},
                {"when": {"turn": 2}, "text": "started"},
            ],
        ),
    )
    write_persona(
        home,
        "meter",
        scripted(
            [
                {
                    "when": {"turn": 1, "contains": "costs"},
                    "tool_calls": [start("{input}", agent="metered")],
                },
                {"when": {"turn": 2}, "text": "started"},
            ],
            default="noted",
            budget={"daily_usd": 1.0},
        ),
    )
    (home / "acp.json").write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return home


@pytest.fixture(scope="module")
def rt(home: Path) -> Iterator[Runtime]:
    runtime = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None))
    yield runtime
    runtime.shutdown()


@needs_claude
def test_claude_in_a_coding_agent_actor_edits_the_workspace(
    rt: Runtime, home: Path, server: AnthropicStreamServer
) -> None:
    workspace = (home / "personas" / "dev" / "workspace").resolve()
    target = workspace / "notes.md"
    server.add(
        When(contains="TASK-NOTES", step=1, has_tools=True),
        Reply(
            tool_calls=[
                ToolUse(name="Write", input={"file_path": str(target), "content": "# Notes\n"})
            ]
        ),
    )
    server.add(When(contains="TASK-NOTES", step=2), Reply(text="notes.md is in place."))
    conv = "dev:notes"
    reply = rt.ask("dev", "please write notes", conversation_id=conv)
    assert reply.status == "ok" and reply.steps == 1
    rt.wait_settled("dev", conv, timeout=180)
    assert target.read_text() == "# Notes\n"
    messages = rt.history("dev", conv)
    (started,) = [
        json.loads(m.content)
        for m in messages
        if isinstance(m, ToolResultMessage) and m.name == "start_coding_agent"
    ]
    handle = started["handle"]
    (wake,) = [m.text for m in messages if isinstance(m, UserMessage) and m.source == "delegation"]
    assert f"## {handle} (coding_agent) · ok" in wake
    assert "files_changed: ['notes.md']" in wake and "notes.md is in place." in wake
    # Its session's updates are in DuckDB, in the parent's turn.
    rows = rt.query(
        "select payload->>'phase', payload->'data'->>'type', count(*) from events "
        f"where kind = 'delegation' and call_id = '{handle}' group by 1, 2 order by 1, 2"
    ).rows
    phases = {(phase, kind) for phase, kind, _ in rows}
    assert ("started", None) in phases and ("finished", None) in phases
    assert ("permission", "permission") in phases and ("update", "tool_call") in phases
    assert ("update", "message") in phases
    turns = rt.query(f"select count(distinct turn_id) from events where call_id = '{handle}'").rows
    assert turns == [(1,)]


def test_a_start_failure_in_the_actor_is_the_tool_error(rt: Runtime) -> None:
    conv = "dev:ghost"
    reply = rt.ask("dev", "use ghost please", conversation_id=conv)
    assert reply.steps == 2
    (result,) = [
        json.loads(m.content)
        for m in rt.history("dev", conv)
        if isinstance(m, ToolResultMessage) and m.name == "start_coding_agent"
    ]
    assert result["error"] == "agent_start_failed"
    assert "'no-such-coding-agent' not found" in result["detail"]
    rt.wait_settled("dev", conv, timeout=30)


def test_an_agents_reported_cost_lands_in_duckdb_and_in_the_routers_budget(rt: Runtime) -> None:
    import ray

    from coterie.actors._ray import router_name
    from coterie.runtime.errors import BudgetExceededError

    conv = "meter:costs"
    usage = {"totalTokens": 700, "inputTokens": 500, "outputTokens": 200}
    task = json.dumps({"costs": [[0.9, "USD"]], "usage": usage})
    # The scripted rule passes the whole message on as the task.
    reply = rt.ask("meter", task, conversation_id=conv)
    assert reply.status == "ok", reply
    rt.wait_settled("meter", conv, timeout=60)
    rows = rt.query(
        "select provider, model, input_tokens, output_tokens, cost_usd, billed_to, context "
        f"from events where kind = 'model_call' and conversation_id = '{conv}' "
        "and context = 'coding_agent'"
    ).rows
    assert rows == [("acp", "metered", 500, 200, 0.9, "meter", "coding_agent")]
    # The router's ledger counted it: $0.2 more does not fit in meter's $1 a day.
    router = ray.get_actor(router_name(rt.id), namespace=rt.namespace)
    with pytest.raises(BudgetExceededError, match="persona 'meter'"):
        ray.get(router.budget_reserve.remote("meter", 0.2, "m", "meter", conv))


def test_an_agents_permission_request_is_approved_by_a_person_across_actors(
    rt: Runtime,
) -> None:
    """The agent's process (a CodingAgent actor) asks the persona's actor,
    which holds the approval until a person answers it."""
    conv = "gatekeeper:ask"
    requests = [{"title": "push", "kind": "execute", "command": "git push origin main"}]
    reply = rt.ask("gatekeeper", json.dumps({"requests": requests}), conversation_id=conv)
    assert reply.status == "ok", reply
    deadline = time.monotonic() + 120
    while not (pending := rt.approvals("gatekeeper")):
        assert time.monotonic() < deadline, "no approval was requested"
        time.sleep(0.2)
    (approval,) = pending
    assert approval.tool == "coding_agent" and approval.conversation_id == conv
    assert approval.summary == "gated wants to run 'git push origin main'"
    decided = rt.decide_approval(approval.id, "approve", by="ana", via="http")
    assert decided.state == "approved" and decided.decided_by == "ana"
    rt.wait_settled("gatekeeper", conv, timeout=120)
    last = rt.history("gatekeeper", conv)[-1]
    assert "allowed push" in last.text  # type: ignore[union-attr]
    assert "permissions: 1 allowed, 0 denied" in last.text  # type: ignore[union-attr]
