"""One MCP client session (``runtime.mcp.session``), no Ray.

Against real servers written by others: ``mcp-server-time`` and
``mcp-server-git`` (PyPI, stdio) and ``@modelcontextprotocol/server-everything``
(npm, in ``<repo>/.mcp-servers``; over stdio and streamable HTTP). The failure
modes use ``tests/mcp_fixtures/misbehaving_server.py``, built on the SDK's
server side. Timing is only ever checked against generous bounds that prove
"did not hang".
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from coterie.runtime.errors import ToolError
from coterie.runtime.mcp.records import McpCallResult, McpLaunch
from coterie.runtime.mcp.session import McpSession
from coterie.runtime.shell.env import SAFE_PATH
from tests.mcp_fixtures.everything import EVERYTHING, NODE, free_port, serve_everything_http, stop
from tests.mcp_fixtures.misbehaving_server import STARTUP_STDERR

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "mcp_fixtures" / "misbehaving_server.py"
BIN = Path(sys.executable).parent
TIME_SERVER = shutil.which("mcp-server-time", path=str(BIN))
GIT_SERVER = shutil.which("mcp-server-git", path=str(BIN))

# Skipped on a developer machine without them; CI installs them (tests/run.sh)
# and must not pass by skipping, so there they fail instead.
IN_CI = bool(os.environ.get("CI"))
needs_everything = pytest.mark.needs("server-everything")
#: "Did not hang": far above what any of these takes, even on a loaded machine.
HANG_BOUND_S = 30.0


# -- helpers -------------------------------------------------------------------


def _env(home: Path) -> dict[str, str]:
    """A whole, small environment, as the hub's launches carry."""
    dirs = [str(BIN)]
    if NODE is not None:
        dirs.append(str(Path(NODE).parent))
    return {"PATH": ":".join([*dirs, SAFE_PATH]), "HOME": str(home), "LANG": "C.UTF-8"}


def _fixture(tmp_path: Path, *args: str, **fields: Any) -> McpLaunch:
    settings: dict[str, Any] = {
        "name": "fixture",
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(FIXTURE), *args],
        "env": _env(tmp_path),
        "call_timeout": 20.0,
        "startup_timeout": 20.0,
        "stderr_log": str(tmp_path / "logs" / "fixture.log"),
    }
    settings.update(fields)
    return McpLaunch(**settings)


@asynccontextmanager
async def _running(launch: McpLaunch, **options: Any) -> AsyncIterator[McpSession]:
    session = McpSession(launch, **options)
    try:
        status = await session.start()
        assert status.state == "ready", status
        yield session
    finally:
        await session.close()


def _text(result: McpCallResult) -> str:
    return "\n".join(c.text or "" for c in result.content if c.type == "text")


async def _wait_until(check: Callable[[], bool], what: str, timeout: float = HANG_BOUND_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _children() -> set[int]:
    """Our live descendants (a reaped or zombie child is not one)."""
    return {p.pid for p in psutil.Process().children(recursive=True) if _alive(p.pid)}


@pytest.fixture(scope="module")
def everything_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = serve_everything_http(port, _env(tmp_path_factory.mktemp("everything-home")))
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


# -- real servers ----------------------------------------------------------------


@pytest.mark.skipif(TIME_SERVER is None and not IN_CI, reason="needs mcp-server-time (PyPI)")
async def test_time_server_lists_and_calls_over_stdio(tmp_path: Path) -> None:
    assert TIME_SERVER is not None
    before = _children()
    launch = McpLaunch(name="time", transport="stdio", command=TIME_SERVER, env=_env(tmp_path))
    async with _running(launch) as session:
        status = session.status()
        assert status.tools_version == 1 and status.restarts == 0
        assert status.server_info is not None and status.server_info.startswith("mcp-time ")
        tools = {t.name: t for t in await session.tools()}
        current = tools["get_current_time"]
        # the schema is the server's, unchanged; the hints are snake_case
        assert current.input_schema["required"] == ["timezone"]
        assert "timezone" in current.input_schema["properties"]
        assert current.annotations["read_only_hint"] is True

        result = await session.call_tool("get_current_time", {"timezone": "UTC"})

        assert not result.is_error
        answer = json.loads(_text(result))
        assert answer["timezone"] == "UTC"
        assert datetime.fromisoformat(answer["datetime"]).utcoffset() == timedelta(0)
        assert result.structured is not None and result.structured["timezone"] == "UTC"
    assert _children() <= before


@pytest.mark.skipif(GIT_SERVER is None and not IN_CI, reason="needs mcp-server-git (PyPI)")
async def test_git_server_reports_status_of_a_repository(tmp_path: Path) -> None:
    assert GIT_SERVER is not None
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("hello\n")
    launch = McpLaunch(
        name="git",
        transport="stdio",
        command=GIT_SERVER,
        args=["--repository", str(repo)],
        env=_env(tmp_path),
        cwd=str(repo),
    )
    async with _running(launch) as session:
        assert "git_status" in {t.name for t in await session.tools()}

        result = await session.call_tool("git_status", {"repo_path": str(repo)})

        assert not result.is_error
        text = _text(result)
        assert "Untracked files" in text and "notes.txt" in text


@needs_everything
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_everything_server_tools_resources_prompts(
    transport: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if transport == "stdio":
        assert NODE is not None
        launch = McpLaunch(
            name="everything",
            transport="stdio",
            command=NODE,
            args=[str(EVERYTHING), "stdio"],
            env=_env(tmp_path),
            stderr_log=str(tmp_path / "everything.log"),
        )
    else:
        url = request.getfixturevalue("everything_url")
        launch = McpLaunch(
            name="everything", transport="http", url=url, headers={"X-Coterie-Test": "1"}
        )
    async with _running(launch) as session:
        status = session.status()
        assert status.has_resources and status.has_prompts
        assert status.server_info == "mcp-servers/everything 2.0.0"
        tools = {t.name: t for t in await session.tools()}
        assert tools["echo"].title == "Echo Tool"
        assert tools["echo"].annotations == {
            "read_only_hint": True,
            "destructive_hint": False,
            "idempotent_hint": True,
            "open_world_hint": False,
        }

        echo = await session.call_tool("echo", {"message": "hello there"})
        assert _text(echo) == "Echo: hello there" and not echo.is_error

        image = await session.call_tool("get-tiny-image", {})
        [picture] = [c for c in image.content if c.type == "image"]
        assert picture.mime_type == "image/png"
        assert base64.b64decode(picture.data or "").startswith(b"\x89PNG")

        weather = await session.call_tool("get-structured-content", {"location": "Chicago"})
        assert tools["get-structured-content"].output_schema is not None
        assert weather.structured == json.loads(_text(weather))
        assert set(weather.structured) == {"temperature", "conditions", "humidity"}

        links = await session.call_tool("get-resource-links", {"count": 2})
        linked = [c for c in links.content if c.type == "resource_link"]
        assert len(linked) == 2
        assert all(c.uri and c.uri.startswith("demo://") and c.name for c in linked)

        reference = await session.call_tool(
            "get-resource-reference", {"resourceType": "Text", "resourceId": 1}
        )
        [embedded] = [c for c in reference.content if c.type == "resource"]
        assert embedded.uri == "demo://resource/dynamic/text/1"
        assert embedded.text is not None and embedded.text.startswith("Resource 1")

        # this server reports an unknown tool in the result, not as a JSON-RPC error
        unknown = await session.call_tool("no-such-tool", {})
        assert unknown.is_error and "no-such-tool" in _text(unknown)

        resources = {r.name: r for r in await session.list_resources()}
        architecture = resources["architecture.md"]
        assert architecture.mime_type == "text/markdown"
        [document] = await session.read_resource(architecture.uri)
        assert document.type == "resource" and document.uri == architecture.uri
        assert document.text is not None and "Architecture" in document.text
        [blob] = await session.read_resource("demo://resource/dynamic/blob/3")
        assert blob.text is None and base64.b64decode(blob.data or "").startswith(b"Resource 3")
        with pytest.raises(ToolError) as missing:
            await session.read_resource("demo://resource/no/such/thing")
        assert missing.value.kind == "mcp_error"

        prompts = {p.name: p for p in await session.list_prompts()}
        arguments = [(a.name, a.required) for a in prompts["args-prompt"].arguments]
        assert arguments == [("city", True), ("state", False)]
        filled = await session.get_prompt("args-prompt", {"city": "Paris"})
        assert filled.messages[0].role == "user"
        assert "Paris" in (filled.messages[0].content.text or "")
        with_resource = await session.get_prompt(
            "resource-prompt", {"resourceType": "Text", "resourceId": "2"}
        )
        assert any(
            m.content.type == "resource" and m.content.uri == "demo://resource/dynamic/text/2"
            for m in with_resource.messages
        )
        assert session.status().restarts == 0


@needs_everything
async def test_http_server_lost_mid_call_then_reachable_again(tmp_path: Path) -> None:
    port = free_port()
    proc = serve_everything_http(port, _env(tmp_path))
    launch = McpLaunch(
        name="remote", transport="http", url=f"http://127.0.0.1:{port}/mcp", call_timeout=60.0
    )
    session = McpSession(launch, backoff=(0.2, 1.0))
    try:
        assert (await session.start()).state == "ready"
        call = asyncio.create_task(
            session.call_tool("trigger-long-running-operation", {"duration": 60, "steps": 60})
        )
        await asyncio.sleep(1.0)  # the call is in flight
        stop(proc)

        with pytest.raises(ToolError) as lost:
            await asyncio.wait_for(call, HANG_BOUND_S)
        assert lost.value.kind == "server_crashed"
        assert "server 'remote' dropped the connection" in lost.value.detail
        # while it is down, restarts fail (with backoff) and calls fail at once
        await _wait_until(
            lambda: "cannot reach" in (session.status().error or ""), "a failed restart"
        )
        assert session.status().state == "restarting"
        with pytest.raises(ToolError) as down:
            await session.call_tool("echo", {"message": "anyone?"})
        assert down.value.kind == "server_unavailable" and "cannot reach" in down.value.detail

        proc = serve_everything_http(port, _env(tmp_path))
        await _wait_until(lambda: session.status().state == "ready", "the reconnect")
        assert _text(await session.call_tool("echo", {"message": "back"})) == "Echo: back"
        assert session.status().restarts >= 2
    finally:
        await session.close()
        stop(proc)


# -- the misbehaving fixture -------------------------------------------------------


async def test_environment_cwd_stderr_and_error_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COTERIE_MCP_LEAK", "from the runtime's own environment")
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "logs" / "deeper" / "fixture.log"  # parents are created
    launch = _fixture(
        tmp_path,
        env={**_env(tmp_path), "COTERIE_MCP_PROBE": "given"},
        cwd=str(work),
        stderr_log=str(log),
    )
    async with _running(launch) as session:

        async def env(name: str) -> str:
            return _text(await session.call_tool("env", {"name": name}))

        # exactly launch.env: nothing of ours is merged in
        assert await env("COTERIE_MCP_PROBE") == "given"
        assert await env("COTERIE_MCP_LEAK") == "<unset>"
        assert await env("HOME") == str(tmp_path)
        assert Path(_text(await session.call_tool("cwd", {}))) == work.resolve()

        failed = await session.call_tool("fail", {})
        assert failed.is_error and "deliberate failure" in _text(failed)

        with pytest.raises(ToolError) as refused:
            await session.call_tool("refuse", {})
        assert refused.value.kind == "mcp_error"
        assert "refused on purpose" in refused.value.detail
        assert session.status().state == "ready" and session.status().restarts == 0

    assert STARTUP_STDERR in log.read_text()
    out, err = capfd.readouterr()
    assert STARTUP_STDERR not in out and STARTUP_STDERR not in err


async def test_timeout_recycles_the_session(tmp_path: Path) -> None:
    async with _running(_fixture(tmp_path)) as session:
        first_pid = int(_text(await session.call_tool("pid", {})))
        started = time.monotonic()
        hang = asyncio.create_task(session.call_tool("hang", {}, timeout=2.0))

        # a hanging call holds up no other
        assert _text(await session.call_tool("ok", {"text": "meanwhile"})) == "ok meanwhile"
        assert not hang.done()

        with pytest.raises(ToolError) as timed_out:
            await hang
        assert time.monotonic() - started < 10 * 2.0
        assert timed_out.value.kind == "timeout"
        assert "did not answer call_tool 'hang' within 2 s" in timed_out.value.detail
        assert "the session was restarted" in timed_out.value.detail

        status = session.status()
        assert status.state == "ready" and status.restarts == 1
        assert _text(await session.call_tool("ok", {})) == "ok"
        assert int(_text(await session.call_tool("pid", {}))) != first_pid
        assert not _alive(first_pid)


async def test_crash_restarts_after_backoff_and_refreshes_tools(tmp_path: Path) -> None:
    changes: list[int] = []
    # A long first pause, so "restarting" can be seen before the restart.
    options: dict[str, Any] = {"on_change": lambda: changes.append(1), "backoff": (2.0, 4.0)}
    async with _running(_fixture(tmp_path), **options) as session:
        first_pid = int(_text(await session.call_tool("pid", {})))
        await session.call_tool("add_tool", {"name": "ephemeral"})
        await _wait_until(lambda: session.status().tools_version == 2, "the added tool")

        with pytest.raises(ToolError) as crashed:
            await session.call_tool("crash", {})

        assert crashed.value.kind == "server_crashed"
        assert "server 'fixture' exited with status 1" in crashed.value.detail
        assert "call_tool 'crash'" in crashed.value.detail
        status = session.status()
        assert status.state == "restarting" and "exited with status 1" in (status.error or "")
        with pytest.raises(ToolError) as down:
            await session.call_tool("ok", {})
        assert down.value.kind == "server_unavailable"
        assert "exited with status 1" in down.value.detail

        await _wait_until(lambda: session.status().state == "ready", "the restart")
        assert _text(await session.call_tool("ok", {})) == "ok"
        assert session.status().restarts == 1
        assert int(_text(await session.call_tool("pid", {}))) != first_pid
        assert not _alive(first_pid)
        # the new process never had the added tool: the list was refreshed
        assert "ephemeral" not in {t.name for t in await session.tools()}
        assert session.status().tools_version == 3 and len(changes) == 2


async def test_a_crash_after_a_long_run_logs_the_backoff_it_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The first crash waits 0.2 s and doubles the pause; a server that then ran
    # for the longest pause (1 s) crashes "fresh": 0.2 s again, and the log says so.
    caplog.set_level("WARNING", logger="coterie.mcp")
    async with _running(_fixture(tmp_path), backoff=(0.2, 1.0)) as session:
        for restarts in (1, 2):
            with pytest.raises(ToolError):
                await session.call_tool("crash", {})
            await _wait_until(lambda: session.status().state == "ready", "the restart")
            assert session.status().restarts == restarts
            await asyncio.sleep(1.2)
    pauses = [r.getMessage() for r in caplog.records if "; restarting it in " in r.getMessage()]
    assert len(pauses) == 2, pauses
    assert all(p.endswith("restarting it in 0.2 s") for p in pauses), pauses


async def test_list_changed_relists_without_restart(tmp_path: Path) -> None:
    changes: list[int] = []
    async with _running(_fixture(tmp_path), on_change=lambda: changes.append(1)) as session:
        before = session.status().tools_version
        assert "late_tool" not in {t.name for t in await session.tools()}

        added = await session.call_tool("add_tool", {"name": "late_tool"})

        assert _text(added) == "added late_tool"
        await _wait_until(lambda: session.status().tools_version > before, "tools/list_changed")
        late = {t.name: t for t in await session.tools()}["late_tool"]
        assert late.description == "added at run time: late_tool"
        assert _text(await session.call_tool("late_tool", {})) == "late_tool answers"
        assert changes == [1]
        assert session.status().tools_version == before + 1
        assert session.status().restarts == 0


async def test_server_without_resources_or_prompts(tmp_path: Path) -> None:
    async with _running(_fixture(tmp_path, "--tools-only")) as session:
        status = session.status()
        assert not status.has_resources and not status.has_prompts
        assert [t.name for t in await session.tools()] == ["only"]
        assert _text(await session.call_tool("only", {})) == "only"
        for call in (
            session.list_resources(),
            session.read_resource("file:///x"),
            session.list_prompts(),
            session.get_prompt("p", {}),
        ):
            with pytest.raises(ToolError) as absent:
                await call
            assert absent.value.kind == "not_found"
            assert absent.value.detail.startswith("server 'fixture' has no ")


@pytest.mark.parametrize(
    "case",
    [
        "missing_command",
        "exits_at_once",
        "exits_with_stderr",
        "missing_cwd",
        "never_answers",
        "closed_port",
        "closed_ipv6_port",
    ],
)
async def test_a_failed_start_is_a_readable_status(case: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    stdio: dict[str, Any] = {
        "name": "broken",
        "transport": "stdio",
        "env": env,
        "startup_timeout": 1.5,
        "stderr_log": str(tmp_path / "broken.log"),
    }
    match case:
        case "missing_command":
            launch = McpLaunch(**stdio, command="no-such-mcp-server")
            expected = "server 'broken': command 'no-such-mcp-server' not found"
        case "exits_at_once":
            launch = McpLaunch(**stdio, command=shutil.which("false") or "/bin/false")
            expected = "server 'broken' exited with status 1 before it initialized"
        case "exits_with_stderr":
            script = "import sys; print('bad config: no token', file=sys.stderr); sys.exit(3)"
            launch = McpLaunch(**stdio, command=sys.executable, args=["-c", script])
            expected = "exited with status 3 before it initialized; stderr: bad config: no token"
        case "missing_cwd":
            gone = str(tmp_path / "gone")
            launch = McpLaunch(**stdio, command=sys.executable, args=[str(FIXTURE)], cwd=gone)
            expected = f"server 'broken': working directory {gone!r} does not exist"
        case "never_answers":
            launch = McpLaunch(**stdio, command="sleep", args=["600"])
            expected = "server 'broken' did not initialize within 1.5 s"
        case "closed_port":
            url = f"http://127.0.0.1:{free_port()}/mcp?token=secret-value"
            launch = McpLaunch(name="broken", transport="http", url=url, startup_timeout=1.5)
            expected = f"server 'broken': cannot reach {url.split('?')[0]}"
        case "closed_ipv6_port":  # the host keeps its brackets
            url = f"http://[::1]:{free_port()}/mcp?token=secret-value"
            launch = McpLaunch(name="broken", transport="http", url=url, startup_timeout=1.5)
            expected = f"server 'broken': cannot reach {url.split('?')[0]}"
        case _:
            raise AssertionError(case)
    before = _children()
    session = McpSession(launch)
    started = time.monotonic()

    status = await session.start()

    assert time.monotonic() - started < HANG_BOUND_S
    assert status.state == "failed"
    assert status.error is not None and expected in status.error
    assert "\n" not in status.error and "secret-value" not in status.error
    assert await session.tools() == []
    with pytest.raises(ToolError) as unavailable:
        await session.call_tool("anything", {})
    assert unavailable.value.kind == "server_unavailable" and expected in unavailable.value.detail
    assert _children() <= before  # whatever was spawned is gone
    await session.close()
    assert session.status().state == "closed"


async def test_close_stops_the_process_group_and_is_final(tmp_path: Path) -> None:
    session = McpSession(_fixture(tmp_path))
    assert (await session.start()).state == "ready"
    server_pid = int(_text(await session.call_tool("pid", {})))
    child_pid = int(_text(await session.call_tool("spawn_child", {})))
    assert _alive(server_pid) and _alive(child_pid)

    await session.close()

    assert not _alive(server_pid)
    assert not _alive(child_pid)  # left behind by the server, stopped with its group
    await session.close()  # idempotent
    assert session.status().state == "closed"
    assert await session.tools() == []
    with pytest.raises(ToolError) as closed:
        await session.call_tool("ok", {})
    assert closed.value.kind == "server_unavailable" and "closed" in closed.value.detail
    assert (await session.start()).state == "closed"
