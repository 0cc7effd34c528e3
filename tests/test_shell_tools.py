"""The shell tools over the in-process service (no Ray)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from coterie.runtime.config import RuntimeSettings
from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.messages import MessageEnvelope
from coterie.runtime.services import Services
from coterie.runtime.shell import SAFE_PATH, LocalProcesses
from coterie.runtime.tool import ToolRegistry
from coterie.tools.shell import SHELL_TOOLS, ProcessArgs, ShellExecArgs, process, shell_exec
from coterie.tools.tasks import TASK_TOOLS, TaskHandleArgs, task_cancel, task_status
from tests.helpers import make_ctx

NAMES = {"shell_exec", "process", "task_status", "task_cancel"}


class FakeMessenger:
    def __init__(self) -> None:
        self.posted: list[MessageEnvelope] = []

    async def ask(self, envelope: MessageEnvelope, *, timeout: float) -> Any:
        raise NotImplementedError

    async def post(self, envelope: MessageEnvelope) -> None:
        self.posted.append(envelope)


@pytest.fixture
async def service() -> AsyncIterator[LocalProcesses]:
    svc = LocalProcesses(bwrap=None)
    yield svc
    await svc.close()


def ctx_for(tmp_path: Path, svc: Any, access: str = "workspace", **kw: Any) -> TurnContext:
    pdir = tmp_path / "home" / "personas" / "ana"
    ws = pdir / "workspace"
    ws.mkdir(parents=True, exist_ok=True)
    return make_ctx(
        persona="ana",
        services=Services(processes=svc, **kw),
        settings=TurnSettings(
            workspace=ws,
            persona_dir=pdir,
            home=tmp_path / "home",
            access=access,
            # These tests run commands unconfined (bwrap=None) on purpose.
            runtime=RuntimeSettings(unsandboxed_shell="allow"),
        ),
    )


async def run(ctx: TurnContext, **args: Any) -> Any:
    return await shell_exec.fn(ShellExecArgs(**args), ctx)


async def proc(ctx: TurnContext, **args: Any) -> Any:
    return await process.fn(ProcessArgs(**args), ctx)


async def until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``cond`` every 0.05 s until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def read_until(ctx: TurnContext, pid: str, expected: str, since: int | None = None) -> Any:
    """``process action=read`` until the output is ``expected`` (failing on anything else)."""
    deadline = time.monotonic() + 10.0
    while True:
        out = await proc(ctx, action="read", id=pid, since=since)
        if out["chunk"] == expected:
            return out
        assert expected.startswith(out["chunk"]), f"unexpected output {out['chunk']!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {expected!r}"
        await asyncio.sleep(0.05)


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ignores_term(pid: int) -> bool:
    """Whether the process ignores SIGTERM (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (15 - 1)))
    raise AssertionError("no SigIgn line")


async def test_sync_exit_and_output(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    out = await run(ctx, command="echo hi; pwd; echo oops >&2; exit 4")
    assert out == f"exit=4\nhi\n{ctx.settings.workspace}\noops\n"
    assert await service.list() == []  # finished commands leave no handle


async def test_auto_background_does_not_rerun(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.settings.workspace is not None
    # It runs until the test creates "go", so it is surely still running after the yield.
    command = "echo once >> runs.txt; echo started; until [ -e go ]; do sleep 0.05; done; echo end"
    res = await run(ctx, command=command, yield_ms=200)
    assert res["backgrounded"] and res["running"] and res["id"].startswith("bg_")
    assert res["reason"] == "still running after 200ms"
    # Whatever had arrived within the yield, and its end offset.
    so_far = res["output_so_far"]
    assert "started\n".startswith(so_far) and res["next_offset"] == len(so_far)
    first = await read_until(ctx, res["id"], "started\n")
    assert first["running"] and first["next_offset"] == 8
    (ctx.settings.workspace / "go").touch()
    assert await service.wait(res["id"], 10)
    more = await proc(ctx, action="read", id=res["id"], since=8)
    assert more["chunk"] == "end\n" and more["exit_code"] == 0 and more["dropped_bytes"] == 0
    assert (ctx.settings.workspace / "runs.txt").read_text() == "once\n"  # type: ignore[operator]


async def test_background_stdin_signal_list_remove(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    res = await run(ctx, command="while read l; do echo got:$l; done", background=True)
    pid = res["id"]
    assert (await proc(ctx, action="write", id=pid, data="a"))["written_bytes"] == 2
    await read_until(ctx, pid, "got:a\n")
    listed = (await proc(ctx, action="list"))["processes"]
    assert [p["id"] for p in listed] == [pid]
    st = await task_status.fn(TaskHandleArgs(handle=pid), ctx)
    assert st["running"] and st["output_tail"] == "got:a\n"
    sig = await proc(ctx, action="signal", id=pid, signal="term")
    assert sig["delivered"]
    assert await service.wait(pid, 5)
    assert (await proc(ctx, action="status", id=pid))["exit_code"] == -15
    assert (await proc(ctx, action="remove", id=pid))["removed"] == pid
    with pytest.raises(ToolError) as err:
        await proc(ctx, action="status", id=pid)
    assert err.value.kind == "not_found"
    with pytest.raises(ToolError):
        await proc(ctx, action="read")


async def test_task_cancel_stops_group(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.settings.workspace is not None
    pidfile = ctx.settings.workspace / "bg.pid"
    # The child ignores TERM and does not hold the output pipe: only a kill of
    # the whole group ends it.
    command = "trap '' TERM; sleep 100 >/dev/null 2>&1 & echo $! > bg.pid; wait"
    res = await run(ctx, command=command, background=True)
    await until(lambda: pidfile.exists() and pidfile.read_text().endswith("\n"), "bg.pid")
    child = psutil.Process(int(pidfile.read_text()))
    try:
        await until(lambda: child.name() == "sleep", "the background sleep to start")
        # The premise: a child that outlives a TERM, not the shell's direct target.
        shell = (await service.status(res["id"])).pid
        assert child.ppid() == shell and ignores_term(child.pid)
        out = await task_cancel.fn(TaskHandleArgs(handle=res["id"]), ctx)
        assert out == {"cancelled": res["id"], "exit_code": -9}
        assert await service.list() == []
        await until(lambda: not alive(child), "the background child to be killed")
    finally:
        if alive(child):
            child.kill()


async def test_timeout(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    # Long enough that "a" is printed even on a loaded machine.
    out = await run(ctx, command="echo a; sleep 50", timeout_s=2)
    assert re.fullmatch(r"exit=-15 \(killed: timed out after [0-9.]+s\)\na\n", out), out


async def test_env_and_secrets(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.settings.persona_dir is not None
    (ctx.settings.persona_dir / ".env").write_text(
        "API_KEY=sk-very-secret\nOTHER=o\n", encoding="utf-8"
    )
    out = await run(
        ctx,
        command='echo "k=$API_KEY o=${OTHER:-unset} x=$X l=${LD_PRELOAD:-unset} p=$PATH"',
        secrets=["API_KEY"],
        env={"X": "1", "PATH": "/evil", "LD_PRELOAD": "/evil.so"},
    )
    assert "sk-very-secret" not in out
    assert out == f"exit=0\nk=[redacted:API_KEY] o=unset x=1 l=unset p={SAFE_PATH}\n"
    with pytest.raises(ToolError) as err:
        await run(ctx, command="true", secrets=["API_KEY", "MISSING_ONE"])
    assert err.value.kind == "missing_secret" and "MISSING_ONE" in err.value.detail


async def test_cwd_rails(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.settings.workspace is not None
    (ctx.settings.workspace / "sub").mkdir()
    assert (await run(ctx, command="pwd", cwd="sub")).endswith("/workspace/sub\n")
    for bad in ("..", "/etc", "../../bob"):
        with pytest.raises(ToolError) as err:
            await run(ctx, command="pwd", cwd=bad)
        assert err.value.kind == "path_denied"


async def test_notify_posts_wake(tmp_path: Path, service: LocalProcesses) -> None:
    messenger = FakeMessenger()
    ctx = ctx_for(tmp_path, service, messenger=messenger)
    res = await run(ctx, command="sleep 0.3; echo finished-ok", yield_ms=0, notify=True)
    await until(lambda: bool(messenger.posted), "the wake message")
    (env,) = messenger.posted
    assert env.recipient == "ana" and env.sender == "process" and env.source_kind == "wake"
    assert env.reply_mode == "none" and env.conversation_id == ctx.conversation_id
    assert env.text == f"[process {res['id']} finished: exit 0] finished-ok\n"


def visible(ctx: TurnContext) -> set[str]:
    return set(ToolRegistry([*SHELL_TOOLS, *TASK_TOOLS]).visible(ctx))


def test_readonly_hidden_without_bwrap(tmp_path: Path) -> None:
    off, on = LocalProcesses(bwrap=None), LocalProcesses(bwrap="/usr/bin/bwrap")
    assert visible(ctx_for(tmp_path, off, "readonly")) == set()
    assert visible(ctx_for(tmp_path, off, "workspace")) == NAMES
    assert visible(ctx_for(tmp_path, off, "full")) == NAMES
    assert visible(ctx_for(tmp_path, on, "readonly")) == NAMES
    assert visible(ctx_for(tmp_path, None, "full")) == set()


async def test_results_are_json_serialisable(tmp_path: Path, service: LocalProcesses) -> None:
    assert json.loads(ShellExecArgs(command="x").model_dump_json())["yield_ms"] == 5000
    with pytest.raises(ValueError):
        ShellExecArgs(command="x", shell=True)  # type: ignore[call-arg]

    ctx = ctx_for(tmp_path, service)
    results: list[Any] = [await run(ctx, command="echo done")]
    started = await run(ctx, command="while read l; do echo got:$l; done", background=True)
    pid = started["id"]
    results.append(started)
    results.append(await proc(ctx, action="write", id=pid, data="x"))
    results.append(await read_until(ctx, pid, "got:x\n"))
    results.append(await proc(ctx, action="status", id=pid))
    listed = await proc(ctx, action="list")
    assert [p["id"] for p in listed["processes"]] == [pid]
    results.append(listed)
    status = await task_status.fn(TaskHandleArgs(handle=pid), ctx)
    assert status["id"] == pid and status["output_tail"] == "got:x\n"
    results.append(status)
    results.append(await proc(ctx, action="signal", id=pid, signal="term"))
    assert await service.wait(pid, 10)
    results.append(await proc(ctx, action="remove", id=pid))
    other = await run(ctx, command="sleep 100", background=True)
    results.append(await task_cancel.fn(TaskHandleArgs(handle=other["id"]), ctx))
    for result in results:
        # Plain JSON types only: serialisable, and unchanged by the round trip.
        assert json.loads(json.dumps(result)) == result


@pytest.mark.needs("bubblewrap")
async def test_readonly_with_bwrap_cannot_write(tmp_path: Path) -> None:
    svc = LocalProcesses()
    try:
        ctx = ctx_for(tmp_path, svc, "readonly")
        assert ctx.settings.persona_dir is not None
        assert ctx.settings.workspace is not None
        (ctx.settings.persona_dir / ".env").write_text("T=abc\n", encoding="utf-8")
        probe = (
            "echo x > f.txt; echo rc=$?; "
            "if cat ../.env 2>/dev/null; then echo env=readable; else echo env=hidden; fi; ls -A"
        )
        out = await run(ctx, command=probe)
        # The write fails because the workspace is mounted read-only (EROFS),
        # the persona's .env cannot be read, and the workspace stays empty.
        pattern = r"exit=0\n[^\n]*f\.txt: Read-only file system\nrc=[12]\nenv=hidden\n"
        assert re.fullmatch(pattern, out), out
        assert "T=abc" not in out and not (ctx.settings.workspace / "f.txt").exists()
        # The same probe, unconfined, does see both (so the markers mean something).
        loose = LocalProcesses(bwrap=None)
        try:
            free = await run(ctx_for(tmp_path, loose, "workspace"), command=probe)
        finally:
            await loose.close()
        assert free == "exit=0\nrc=0\nT=abc\nenv=readable\nf.txt\n"
        (ctx.settings.workspace / "f.txt").unlink()
        ctx2 = ctx_for(tmp_path, svc, "workspace")
        assert (await run(ctx2, command="echo x > f.txt && cat f.txt")) == "exit=0\nx\n"
    finally:
        await svc.close()


@pytest.mark.needs("bubblewrap")
async def test_sandboxed_shell_network_follows_the_persona_setting(tmp_path: Path) -> None:
    # Imported here, not at the top: this test was appended to the file.
    import dataclasses
    import shlex
    import socket

    from coterie.runtime.config import NetworkSettings

    svc = LocalProcesses()
    try:
        with socket.socket() as listener:  # a runtime port on loopback, as Ray's are
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            code = (
                "import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), 2)\n"
                "    print('connected')\n"
                "except OSError as exc:\n"
                "    print('no-connect', type(exc).__name__)\n"
            )
            probe = f"python3 -c {shlex.quote(code)}"
            ctx = ctx_for(tmp_path, svc)
            assert ctx.settings.network.shell is False  # the default
            closed = await run(ctx, command=probe)
            shell_net = dataclasses.replace(ctx.settings, network=NetworkSettings(shell=True))
            ctx = dataclasses.replace(ctx, settings=shell_net)
            opened = await run(ctx, command=probe)
        assert re.fullmatch(r"exit=0\nno-connect \w+\n", closed), closed
        assert opened == "exit=0\nconnected\n"
    finally:
        await svc.close()
