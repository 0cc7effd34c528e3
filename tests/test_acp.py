"""Coding agents over the Agent Client Protocol (no Ray).

The real-agent tests run Claude Code through ``claude-agent-acp`` (npm,
installed into ``<repo>/.acp-agents`` by ``.ci/run``) against the local
streaming Messages API server; the failure modes and the fs callbacks use a
small agent built on the SDK's agent side (``tests/acp_fixtures``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
import psutil
import pytest
from acp.schema import PermissionOption, ToolCallLocation, ToolCallUpdate

from coterie.runtime.delegation.acp import (
    AcpProtocolError,
    AcpRosterError,
    AcpSession,
    AcpStartError,
    AcpStartupTimeoutError,
    AgentSpec,
    CodingResult,
    MessageEvent,
    PermissionEvent,
    ToolCallEvent,
    changed_files,
    decide_permission,
    load_acp_roster,
    parse_acp_roster,
    resolve_agent_env,
    run_coding_task,
    snapshot_tree,
)
from coterie.runtime.errors import ConfigError, ToolError
from coterie.runtime.shell.sandbox import SandboxChoice, bwrap_available
from tests.fakes.anthropic_stream import (
    AnthropicStreamServer,
    Reply,
    ToolUse,
    When,
    last_tool_results,
)

REPO = Path(__file__).resolve().parents[1]
FAKE_AGENT = Path(__file__).resolve().parent / "acp_fixtures" / "fake_agent.py"
CLAUDE_ACP = Path(
    os.environ.get(
        "COTERIE_CLAUDE_AGENT_ACP",
        REPO / ".acp-agents/node_modules/@zed-industries/claude-agent-acp/dist/index.js",
    )
)
NODE = shutil.which("node")

CLAUDE_MISSING = (
    None
    if NODE is not None and CLAUDE_ACP.is_file()
    else "needs node and @zed-industries/claude-agent-acp "
    "(npm install --prefix .acp-agents @zed-industries/claude-agent-acp@0.23.1)"
)


@pytest.fixture
def claude_installed() -> None:
    """Skip without the agent, except in CI (.ci/run installs it: a skip would hide that)."""
    if CLAUDE_MISSING is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI: {CLAUDE_MISSING}")
    pytest.skip(CLAUDE_MISSING)


needs_claude = pytest.mark.usefixtures("claude_installed")


# -- helpers -------------------------------------------------------------------


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return found


def fake_spec(mode: str, **fields: Any) -> AgentSpec:
    return AgentSpec(command=sys.executable, args=[str(FAKE_AGENT), mode], **fields)


def claude_spec(server: AnthropicStreamServer, **fields: Any) -> AgentSpec:
    assert NODE is not None
    env = {
        "ANTHROPIC_BASE_URL": server.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-fake",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # As root, claude-agent-acp's session/new fails without it.
        "IS_SANDBOX": "1",
    }
    return AgentSpec(command=NODE, args=[str(CLAUDE_ACP)], env=env, **fields)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
async def model_server() -> Any:
    async with AnthropicStreamServer() as server:
        yield server


def session_for(spec: AgentSpec, workspace: Path, name: str = "agent", **kw: Any) -> AcpSession:
    return AcpSession(
        spec,
        name=name,
        workspace=workspace,
        log_path=workspace.parent / "logs" / f"{name}.log",
        agent_home=workspace.parent / "agent-home",
        **kw,
    )


# -- the roster ------------------------------------------------------------------


def test_missing_roster_is_empty(tmp_path: Path) -> None:
    roster = load_acp_roster(tmp_path)
    assert roster.agents == {}
    assert roster.default_name() is None


def test_roster_loads_and_expands_home(tmp_path: Path) -> None:
    (tmp_path / "acp.json").write_text(
        json.dumps(
            {
                "agents": {
                    "claude": {
                        "command": "node",
                        "args": ["${home}/agents/claude/index.js"],
                        "env": {"ANTHROPIC_API_KEY": "${secret:ANTHROPIC_API_KEY}"},
                        "default": True,
                    },
                    "local": {"command": "bin/agent", "permissions": "deny", "cwd": "any-in-rails"},
                }
            }
        )
    )
    roster = load_acp_roster(tmp_path)
    assert roster.names() == ["claude", "local"]
    assert roster.default_name() == "claude"
    claude = roster.get("claude")
    assert claude is not None
    assert claude.args == [f"{tmp_path}/agents/claude/index.js"]
    assert claude.permissions == "workspace" and claude.startup_timeout == 60
    local = roster.get("local")
    assert local is not None and local.command == str(tmp_path / "bin/agent")
    assert local.permissions == "deny" and local.cwd == "any-in-rails"


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ({"command": "x", "permissions": "maybe"}, "agent 'a', field 'permissions'"),
        ({"command": "x", "colour": "red"}, "agent 'a', field 'colour': unknown field"),
        ({"command": "x", "startup_timeout": 0}, "agent 'a', field 'startup_timeout'"),
        ({"args": []}, "agent 'a', field 'command': Field required"),
        ({"command": "x", "env": {"PATH": "/evil"}}, "PATH cannot be set"),
        ({"command": "x", "env": {"K": "${vault:X}"}}, "only ${secret:NAME} and ${env:NAME}"),
    ],
)
def test_bad_roster_names_file_agent_and_field(
    tmp_path: Path, agent: dict[str, Any], expected: str
) -> None:
    path = tmp_path / "acp.json"
    path.write_text(json.dumps({"agents": {"a": agent}}))
    with pytest.raises(AcpRosterError) as info:
        load_acp_roster(tmp_path)
    assert isinstance(info.value, ConfigError)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_roster_rejects_two_defaults_bad_names_and_bad_json(tmp_path: Path) -> None:
    two = {
        "agents": {"a": {"command": "x", "default": True}, "b": {"command": "y", "default": True}}
    }
    with pytest.raises(AcpRosterError, match="more than one default agent: a, b"):
        parse_acp_roster(two, path=tmp_path / "acp.json", home=tmp_path)
    with pytest.raises(AcpRosterError, match="agent name 'Bad Name'"):
        parse_acp_roster(
            {"agents": {"Bad Name": {"command": "x"}}}, path=tmp_path / "acp.json", home=tmp_path
        )
    (tmp_path / "acp.json").write_text("{not json")
    with pytest.raises(AcpRosterError, match="not valid JSON"):
        load_acp_roster(tmp_path)


def test_agent_env_fills_secrets_and_runtime_env(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("GH_TOKEN=ghp_secret\n")
    spec = AgentSpec(
        command="x",
        env={"GH_TOKEN": "${secret:GH_TOKEN}", "KEY": "k-${env:RUNTIME_KEY}", "PLAIN": "1"},
    )
    env = resolve_agent_env(spec, persona_dir=tmp_path, environ={"RUNTIME_KEY": "abc"})
    assert env == {"GH_TOKEN": "ghp_secret", "KEY": "k-abc", "PLAIN": "1"}
    with pytest.raises(ToolError) as info:
        resolve_agent_env(spec, persona_dir=tmp_path, environ={}, agent="claude")
    assert info.value.kind == "missing_secret"
    assert "env:RUNTIME_KEY" in info.value.detail and "'claude'" in info.value.detail


# -- the rails, without a process ---------------------------------------------------


def _options() -> list[PermissionOption]:
    return [
        PermissionOption(option_id="always", name="Always", kind="allow_always"),
        PermissionOption(option_id="once", name="Allow", kind="allow_once"),
        PermissionOption(option_id="no", name="Reject", kind="reject_once"),
    ]


def _call(kind: str | None = "edit", paths: Sequence[str] = (), raw: Any = None) -> ToolCallUpdate:
    return ToolCallUpdate(
        tool_call_id="t1",
        title="Write",
        kind=kind,  # type: ignore[arg-type]
        locations=[ToolCallLocation(path=p) for p in paths] or None,
        raw_input=raw,
    )


def test_workspace_policy(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    root = root.resolve()

    def decide(call: ToolCallUpdate, policy: Any = "workspace") -> tuple[str, str | None]:
        decision, response = decide_permission(
            policy, root=root, tool_call=call, options=_options()
        )
        assert (response.outcome.outcome == "selected") == (decision.option_id is not None)
        return decision.decision, decision.option_id

    assert decide(_call(paths=[str(root / "a.py")])) == ("allow", "once")
    assert decide(_call(raw={"file_path": str(root / "new/b.py")})) == ("allow", "once")
    assert decide(_call(raw={"file_path": "relative.txt"})) == ("allow", "once")
    assert decide(_call(paths=[str(tmp_path / "outside/x")])) == ("deny", "no")
    assert decide(_call(paths=[str(root / "link/x")])) == ("deny", "no")  # symlink out
    assert decide(_call(paths=[str(root / "../outside/x")])) == ("deny", "no")
    assert decide(_call(paths=[str(root / "a.py"), "/etc/passwd"])) == ("deny", "no")
    assert decide(_call(paths=[str(root / ".env")])) == ("deny", "no")
    assert decide(_call(kind="execute", raw={"command": "rm -rf /"})) == ("deny", "no")
    assert decide(_call(kind="think")) == ("allow", "once")
    assert decide(_call(paths=["/etc/passwd"]), "allow") == ("allow", "once")
    assert decide(_call(paths=[str(root / "a.py")]), "deny") == ("deny", "no")
    only_allow = [PermissionOption(option_id="ok", name="OK", kind="allow_once")]
    decision, response = decide_permission("deny", root=root, tool_call=_call(), options=only_allow)
    assert decision.decision == "deny" and response.outcome.outcome == "cancelled"


def test_snapshot_sees_created_modified_deleted(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("a")
    (tmp_path / "change.txt").write_text("a")
    (tmp_path / "gone.txt").write_text("a")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_text("x")
    before, complete = snapshot_tree(tmp_path, limit=100)
    assert complete and ".git/index" not in before
    (tmp_path / "change.txt").write_text("bb")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("n")
    after, _ = snapshot_tree(tmp_path, limit=100)
    assert changed_files(before, after) == ["change.txt", "gone.txt", "sub/new.txt"]
    _, complete = snapshot_tree(tmp_path, limit=1)
    assert not complete


# -- the local Messages API server ----------------------------------------------------


async def test_stream_server_speaks_the_messages_api(model_server: AnthropicStreamServer) -> None:
    model_server.add(
        When(contains="weather", step=1),
        Reply(
            text="Let me check.", tool_calls=[ToolUse(name="get_weather", input={"city": "Oslo"})]
        ),
    )
    model_server.add(When(tool_result_contains="sunny"), Reply(text="It is sunny."))
    client = anthropic.AsyncAnthropic(base_url=model_server.base_url, api_key="sk-fake")
    tools: list[Any] = [
        {"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}
    ]
    messages: list[Any] = [{"role": "user", "content": "What is the weather?"}]
    async with client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=100, messages=messages, tools=tools
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    tool_use = final.content[1]
    assert tool_use.type == "tool_use" and tool_use.input == {"city": "Oslo"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}],
        },
    ]
    reply = await client.messages.create(
        model="claude-sonnet-4-6", max_tokens=100, messages=messages, tools=tools
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "It is sunny."
    count = await client.messages.count_tokens(model="claude-sonnet-4-6", messages=messages)
    assert count.input_tokens > 0
    models = await client.models.list()
    assert any(m.id == "claude-sonnet-4-6" for m in models.data)
    assert [r.rule for r in model_server.message_requests] == ["rule1", "rule2"]
    assert last_tool_results(model_server.message_requests[1].body) == ["sunny"]
    await client.close()


# -- start-up failures ------------------------------------------------------------------


async def test_missing_binary_is_a_readable_error(workspace: Path) -> None:
    session = session_for(AgentSpec(command="no-such-acp-agent-xyz"), workspace)
    with pytest.raises(AcpStartError) as info:
        await session.start()
    await session.close()
    assert info.value.kind == "missing_binary"
    assert "'no-such-acp-agent-xyz' not found" in str(info.value)


async def test_agent_exiting_at_once_is_a_readable_error(workspace: Path) -> None:
    session = session_for(AgentSpec(command="true"), workspace)
    with pytest.raises(AcpStartError) as info:
        await session.start()
    await session.close()
    assert info.value.kind == "exited"
    assert "exited (status 0) before answering initialize" in str(info.value)


async def test_agent_that_never_answers_times_out(workspace: Path) -> None:
    session = session_for(AgentSpec(command="sleep", args=["60"], startup_timeout=1), workspace)
    with pytest.raises(AcpStartupTimeoutError) as info:
        await session.start()
    assert info.value.kind == "startup_timeout"
    assert "did not answer initialize within 1 s" in str(info.value)
    assert session.pid is not None and group_members(session.pid) == []
    await session.close()


async def test_agent_refusing_initialize_is_a_protocol_error(workspace: Path) -> None:
    session = session_for(fake_spec("refuse-init"), workspace)
    with pytest.raises(AcpProtocolError, match="refused initialize: fake agent refuses"):
        await session.start()
    await session.close()


async def test_run_coding_task_turns_start_failures_into_results(workspace: Path) -> None:
    result = await run_coding_task(
        AgentSpec(command="true"),
        "do it",
        name="t",
        workspace=workspace,
        log_path=workspace.parent / "t.log",
    )
    assert isinstance(result, CodingResult) and result.error_kind == "exited"
    result = await run_coding_task(
        AgentSpec(command="true", env={"K": "${secret:NOPE}"}),
        "do it",
        name="t",
        workspace=workspace,
        log_path=workspace.parent / "t.log",
        persona_dir=workspace.parent,
    )
    assert result.error_kind == "missing_secret" and "secret:NOPE" in (result.error or "")


async def test_chatty_stderr_goes_to_the_log_and_does_not_block(workspace: Path) -> None:
    async with session_for(fake_spec("chatty", startup_timeout=20), workspace, "chatty") as s:
        await s.start()
        assert s.agent_info is not None and s.agent_info.name == "fake-agent"
    assert s.log_path.stat().st_size > 2_000_000


# -- the fake agent: env, fs rails, crashes -----------------------------------------------


async def test_agent_env_is_scrubbed(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-runtime-own-key")
    monkeypatch.setenv("SOME_RUNTIME_VAR", "x")
    spec = fake_spec("env", env={"GIVEN": "yes"})
    async with session_for(spec, workspace) as session:
        await session.start()
        result = await session.prompt("env please")
    env = json.loads(result.text)
    assert "ANTHROPIC_API_KEY" not in env and "SOME_RUNTIME_VAR" not in env
    assert env["GIVEN"] == "yes"
    assert env["HOME"] == str(workspace.parent / "agent-home")


async def test_fs_callbacks_stay_inside_the_workspace(workspace: Path, tmp_path: Path) -> None:
    (workspace / "in.txt").write_text("inside text")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside text")
    (workspace / "link").symlink_to(outside)
    ops = [
        {"op": "read", "path": str(workspace / "in.txt")},
        {"op": "read", "path": str(outside / "secret.txt")},
        {"op": "write", "path": str(workspace / "sub" / "out.txt"), "content": "new"},
        {"op": "write", "path": str(outside / "evil.txt"), "content": "x"},
        {"op": "write", "path": str(workspace / "link" / "evil.txt"), "content": "x"},
        {"op": "write", "path": str(workspace / ".env"), "content": "X=1"},
        {"op": "read", "path": "in.txt"},
    ]
    async with session_for(fake_spec("fs"), workspace) as session:
        await session.start()
        result = await session.prompt(json.dumps({"ops": ops}))
    lines = result.text.splitlines()
    assert lines[0] == "ok inside text"
    assert lines[1].startswith("error") and "outside the workspace" in lines[1]
    assert lines[2] == "ok written"
    assert "outside the workspace" in lines[3] and "outside the workspace" in lines[4]
    assert ".env files are off limits" in lines[5]
    assert "not an absolute path" in lines[6]
    assert (workspace / "sub" / "out.txt").read_text() == "new"
    assert not (outside / "evil.txt").exists() and not (workspace / ".env").exists()
    assert result.files_changed == ["sub/out.txt"]
    refused = [e for e in session.events if e.kind == "file" and not e.allowed]
    assert len(refused) == 5


needs_bwrap = pytest.mark.skipif(
    bwrap_available() is None and not os.environ.get("CI"),
    reason="bubblewrap is not installed",
)


def terminal_session(workspace: Path, tmp_path: Path, **kw: Any) -> AcpSession:
    """The fake agent in ``terminal`` mode, its terminals confined as a
    persona's would be (the coterie home and persona directory hidden)."""
    bwrap = bwrap_available()
    assert bwrap is not None, "CI: bubblewrap must be installed"
    sandbox = SandboxChoice(bwrap=bwrap).sandbox(
        workspace, "workspace", tmp_path / "persona", tmp_path / "home"
    )
    return session_for(fake_spec("terminal"), workspace, terminals=sandbox, **kw)


@needs_bwrap
async def test_terminals_run_inside_the_rails(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / ".env").write_text("TOKEN=terminal-secret-value\n")
    (workspace / "sub").mkdir()
    ops = [
        {"op": "caps"},
        {"op": "run", "command": "echo made > made.txt; echo out; echo err >&2"},
        {"op": "run", "command": "sh", "args": ["-c", f"echo x > {outside}/escape.txt"]},
        {"op": "run", "command": "pwd", "cwd": str(workspace / "sub")},
        {"op": "run", "command": "pwd", "cwd": str(outside)},
        {"op": "run", "command": 'cat .env; echo "[$SESSION_KEY][$FOO]"', "env": {"FOO": "bar"}},
        {"op": "run", "command": "head -c 5000 /dev/zero | tr '\\0' a", "limit": 100},
        {"op": "run", "command": "exit 7"},
    ]
    env = {"SESSION_KEY": "agent-only-value"}
    async with terminal_session(workspace, tmp_path, env=env) as session:
        await session.start()
        result = await session.prompt(json.dumps({"ops": ops}))
    lines = result.text.splitlines()
    assert lines[0] == "terminal True"
    assert lines[1].startswith("exit 0 None truncated=False")
    assert json.loads(lines[1].split(" ", 4)[4]).split() == ["out", "err"]
    assert (workspace / "made.txt").read_text() == "made\n"
    # Writes outside the working directory fail: the file system is read-only there.
    assert not lines[2].startswith("exit 0") and not (outside / "escape.txt").exists()
    assert json.loads(lines[3].split(" ", 4)[4]).strip() == str(workspace / "sub")
    assert lines[4].startswith("error") and "outside the workspace" in lines[4]
    # .env is unreadable; the agent's own environment does not reach commands.
    shown = json.loads(lines[5].split(" ", 4)[4])
    assert "terminal-secret-value" not in shown and "[][bar]" in shown
    assert lines[6].startswith("exit 0 None truncated=True")
    assert json.loads(lines[6].split(" ", 4)[4]) == "a" * 100
    assert lines[7].startswith("exit 7 None")
    assert "made.txt" in result.files_changed
    terminals = [e for e in session.events if e.kind == "terminal"]
    creates = [e for e in terminals if e.op == "create"]
    assert [e.allowed for e in creates] == [True, True, True, False, True, True, True]
    assert "outside the workspace" in creates[3].detail
    assert sum(e.op == "exit" for e in terminals) == 6


@needs_bwrap
async def test_terminal_kill_and_close_stop_the_commands(workspace: Path, tmp_path: Path) -> None:
    marker = "sleep 271"
    ops = [{"op": "kill", "command": marker}, {"op": "leave", "command": f"{marker}; true"}]

    def sleepers() -> list[psutil.Process]:
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and " ".join(p.info["cmdline"]).startswith(marker)
        ]

    async with terminal_session(workspace, tmp_path) as session:
        await session.start()
        result = await session.prompt(json.dumps({"ops": ops}))
        lines = result.text.splitlines()
        assert lines[0] == "killed None SIGKILL"
        assert lines[1].startswith("left term_")
        # The one left open runs until the session closes.
        for _ in range(100):
            if sleepers():
                break
            await asyncio.sleep(0.1)
        assert len(sleepers()) == 1
    assert sleepers() == []


async def test_no_terminals_without_a_sandbox(workspace: Path) -> None:
    ops = [{"op": "caps"}, {"op": "run", "command": "echo hi > made.txt"}]
    async with session_for(fake_spec("terminal"), workspace) as session:
        await session.start()
        result = await session.prompt(json.dumps({"ops": ops}))
    lines = result.text.splitlines()
    assert lines[0] == "terminal False"
    assert lines[1].startswith("error") and "offers no terminals" in lines[1]
    assert not (workspace / "made.txt").exists()
    unconfined = SandboxChoice(bwrap=None).sandbox(workspace, "workspace", None, None)
    assert (
        AcpSession(
            fake_spec("fs"),
            name="a",
            workspace=workspace,
            log_path=workspace / "l",
            terminals=unconfined,
        ).terminals
        is None
    )


async def test_crash_mid_prompt_is_an_error_with_stderr(workspace: Path) -> None:
    async with session_for(fake_spec("crash"), workspace) as session:
        await session.start()
        result = await session.prompt("go")
    assert result.error_kind == "crashed"
    assert "status 3" in (result.error or "") and "fake agent: boom" in (result.error or "")


async def test_orphaned_child_is_killed_with_the_group(workspace: Path) -> None:
    async with session_for(fake_spec("orphan"), workspace) as session:
        await session.start()
        assert session.pid is not None
        result = await session.prompt("go")
        assert result.error_kind == "crashed" and "status 4" in (result.error or "")
        assert group_members(session.pid) == []


async def test_cancel_a_deaf_agent_kills_the_group(workspace: Path) -> None:
    async with session_for(fake_spec("deaf"), workspace) as session:
        await session.start()
        assert session.pid is not None
        prompt = asyncio.create_task(session.prompt("go"))
        await asyncio.sleep(0.5)
        await session.cancel(grace=0.5)
        result = await asyncio.wait_for(prompt, 5)
        assert result.stop_reason == "cancelled" and result.killed and result.error is None
        assert group_members(session.pid) == []


async def test_prompt_timeout_cancels(workspace: Path) -> None:
    async with session_for(fake_spec("stall"), workspace) as session:
        await session.start()
        result = await session.prompt("go", timeout=0.5)
    assert result.error_kind == "timeout" and result.stop_reason == "cancelled"


# -- Claude Code through claude-agent-acp ---------------------------------------------------


@needs_claude
async def test_claude_writes_a_file_in_the_workspace(
    workspace: Path, model_server: AnthropicStreamServer
) -> None:
    target = workspace / "hello.txt"
    model_server.add(
        When(contains="TASK-WRITE", step=1, has_tools=True),
        Reply(
            text="Writing the file.",
            tool_calls=[ToolUse(name="Write", input={"file_path": str(target), "content": "hi\n"})],
        ),
    )
    model_server.add(When(contains="TASK-WRITE", step=2), Reply(text="Done: hello.txt written."))
    seen: list[Any] = []
    async with session_for(claude_spec(model_server), workspace, on_update=seen.append) as s:
        await s.start()
        result = await s.prompt("TASK-WRITE: create hello.txt saying hi")
    assert result.ok, result
    assert target.read_text() == "hi\n"
    assert result.files_changed == ["hello.txt"]
    assert result.text == "Done: hello.txt written."
    assert result.tool_calls == 1
    assert [(p.decision, p.paths) for p in result.permissions] == [("allow", [str(target)])]
    assert any(isinstance(e, PermissionEvent) for e in seen)
    statuses = [e.status for e in seen if isinstance(e, ToolCallEvent)]
    assert "completed" in statuses
    assert any(isinstance(e, MessageEvent) for e in s.events)
    assert [r.rule for r in model_server.message_requests] == ["rule1", "rule2"]
    assert "created successfully" in last_tool_results(model_server.message_requests[1].body)[0]
    # The runtime's environment never reached the agent's requests.
    assert all(r.headers.get("x-api-key") == "sk-ant-fake" for r in model_server.message_requests)


@needs_claude
async def test_claude_write_outside_the_workspace_is_denied(
    workspace: Path, tmp_path: Path, model_server: AnthropicStreamServer
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    direct, via_link = outside / "evil.txt", workspace / "link" / "evil2.txt"
    model_server.add(
        When(contains="TASK-ESCAPE", step=1),
        Reply(tool_calls=[ToolUse(name="Write", input={"file_path": str(direct), "content": "x"})]),
    )
    model_server.add(
        When(contains="TASK-ESCAPE", step=2),
        Reply(
            tool_calls=[ToolUse(name="Write", input={"file_path": str(via_link), "content": "x"})]
        ),
    )
    model_server.add(When(contains="TASK-ESCAPE", step=3), Reply(text="I was not allowed."))
    async with session_for(claude_spec(model_server), workspace) as session:
        await session.start()
        result = await session.prompt("TASK-ESCAPE: write outside")
    assert result.stop_reason == "end_turn" and result.error is None
    assert not direct.exists() and not (outside / "evil2.txt").exists()
    assert [p.decision for p in result.permissions] == ["deny", "deny"]
    assert all("outside the workspace" in p.reason for p in result.permissions)
    assert result.files_changed == []
    refusal = last_tool_results(model_server.message_requests[1].body)[0]
    assert "refused permission" in refusal.lower() or "denied" in refusal.lower()


@needs_claude
async def test_claude_cancel_mid_prompt_stops_the_group(
    workspace: Path, model_server: AnthropicStreamServer
) -> None:
    model_server.add(When(contains="TASK-SLOW"), Reply(text="never", stall=120))
    async with session_for(claude_spec(model_server), workspace) as session:
        await session.start()
        assert session.pid is not None
        pgid = session.pid
        assert len(group_members(pgid)) >= 1
        prompt = asyncio.create_task(session.prompt("TASK-SLOW: take your time"))
        await asyncio.wait_for(model_server.stalling.wait(), 20)
        await session.cancel()
        result = await asyncio.wait_for(prompt, 15)
        # claude-agent-acp acknowledges session/cancel at once.
        assert result.stop_reason == "cancelled" and result.error is None
        assert group_members(pgid) == []


@needs_claude
async def test_claude_dying_mid_prompt_is_a_crash(
    workspace: Path, model_server: AnthropicStreamServer
) -> None:
    model_server.add(When(contains="TASK-DIE"), Reply(text="never", stall=120))
    async with session_for(claude_spec(model_server), workspace) as session:
        await session.start()
        assert session.pid is not None
        pgid = session.pid
        prompt = asyncio.create_task(session.prompt("TASK-DIE: go"))
        await asyncio.wait_for(model_server.stalling.wait(), 20)
        os.kill(pgid, signal.SIGKILL)  # the adapter only; its Claude Code child is orphaned
        result = await asyncio.wait_for(prompt, 15)
        assert result.error_kind == "crashed" and "status -9" in (result.error or "")
        assert group_members(pgid) == []
