"""The shell tools over the in-process service (no Ray)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runtime.context import Services, TurnContext
from runtime.errors import ToolError
from runtime.messages import MessageEnvelope
from runtime.shell import LocalProcesses, bwrap_available
from runtime.tool import ToolRegistry
from tests.helpers import make_ctx
from tools.shell import (
    SHELL_TOOLS,
    ProcessArgs,
    ShellExecArgs,
    TaskIdArgs,
    process,
    shell_exec,
    task_cancel,
    task_status,
)

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
        workspace=ws,
        persona_dir=pdir,
        home=tmp_path / "home",
        access=access,
        services=Services(processes=svc, **kw),
    )


async def run(ctx: TurnContext, **args: Any) -> Any:
    return await shell_exec.fn(ShellExecArgs(**args), ctx)


async def proc(ctx: TurnContext, **args: Any) -> Any:
    return await process.fn(ProcessArgs(**args), ctx)


async def test_sync_exit_and_output(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    out = await run(ctx, command="echo hi; pwd; echo oops >&2; exit 4")
    assert out == f"exit=4\nhi\n{ctx.workspace}\noops\n"
    assert await service.list() == []  # finished commands leave no handle


async def test_auto_background_does_not_rerun(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    res = await run(
        ctx, command="echo once >> runs.txt; echo started; sleep 1; echo end", yield_ms=200
    )
    assert res["backgrounded"] and res["running"] and res["id"].startswith("bg_")
    assert res["output_so_far"] == "started\n" and res["next_offset"] == 8
    assert await service.wait(res["id"], 10)
    more = await proc(ctx, action="read", id=res["id"], since=res["next_offset"])
    assert more["chunk"] == "end\n" and more["exit_code"] == 0 and more["dropped_bytes"] == 0
    assert (ctx.workspace / "runs.txt").read_text() == "once\n"  # type: ignore[operator]


async def test_background_stdin_signal_list_remove(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    res = await run(ctx, command="while read l; do echo got:$l; done", background=True)
    pid = res["id"]
    assert (await proc(ctx, action="write", id=pid, data="a"))["written_bytes"] == 2
    await asyncio.sleep(0.3)
    assert (await proc(ctx, action="read", id=pid))["chunk"] == "got:a\n"
    listed = (await proc(ctx, action="list"))["processes"]
    assert [p["id"] for p in listed] == [pid]
    st = await task_status.fn(TaskIdArgs(id=pid), ctx)
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
    res = await run(ctx, command="trap '' TERM; sleep 100 & sleep 100", yield_ms=100)
    out = await task_cancel.fn(TaskIdArgs(id=res["id"]), ctx)
    assert out["cancelled"] == res["id"] and out["exit_code"] == -9
    assert await service.list() == []


async def test_timeout(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    out = await run(ctx, command="echo a; sleep 50", timeout_s=0.3)
    assert out.startswith("exit=-15 (killed: timed out") and out.endswith("\na\n")


async def test_env_and_secrets(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.persona_dir is not None
    (ctx.persona_dir / ".env").write_text("API_KEY=sk-very-secret\nOTHER=o\n", encoding="utf-8")
    out = await run(
        ctx,
        command='echo "k=$API_KEY o=${OTHER:-unset} x=$X p=$PATH"',
        secrets=["API_KEY"],
        env={"X": "1", "PATH": "/evil", "LD_PRELOAD": "/evil.so"},
    )
    assert "sk-very-secret" not in out
    assert "k=[redacted:API_KEY] o=unset x=1 p=/usr/local/sbin" in out
    with pytest.raises(ToolError) as err:
        await run(ctx, command="true", secrets=["API_KEY", "MISSING_ONE"])
    assert err.value.kind == "missing_secret" and "MISSING_ONE" in err.value.detail


async def test_cwd_rails(tmp_path: Path, service: LocalProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.workspace is not None
    (ctx.workspace / "sub").mkdir()
    assert (await run(ctx, command="pwd", cwd="sub")).endswith("/workspace/sub\n")
    for bad in ("..", "/etc", "../../bob"):
        with pytest.raises(ToolError) as err:
            await run(ctx, command="pwd", cwd=bad)
        assert err.value.kind == "path_denied"


async def test_notify_posts_wake(tmp_path: Path, service: LocalProcesses) -> None:
    messenger = FakeMessenger()
    ctx = ctx_for(tmp_path, service, messenger=messenger)
    res = await run(ctx, command="sleep 0.3; echo finished-ok", yield_ms=0, notify=True)
    for _ in range(50):
        if messenger.posted:
            break
        await asyncio.sleep(0.1)
    (env,) = messenger.posted
    assert env.recipient == "ana" and env.sender == "process" and env.source_kind == "wake"
    assert env.reply_mode == "none" and env.conversation_id == ctx.conversation_id
    assert env.text == f"[process {res['id']} finished: exit 0] finished-ok\n"


def visible(ctx: TurnContext) -> set[str]:
    return set(ToolRegistry(SHELL_TOOLS).visible(ctx))


def test_readonly_hidden_without_bwrap(tmp_path: Path) -> None:
    off, on = LocalProcesses(bwrap=None), LocalProcesses(bwrap="/usr/bin/bwrap")
    assert visible(ctx_for(tmp_path, off, "readonly")) == set()
    assert visible(ctx_for(tmp_path, off, "workspace")) == NAMES
    assert visible(ctx_for(tmp_path, off, "full")) == NAMES
    assert visible(ctx_for(tmp_path, on, "readonly")) == NAMES
    assert visible(ctx_for(tmp_path, None, "full")) == set()


def test_results_are_json_serialisable() -> None:
    assert json.loads(ShellExecArgs(command="x").model_dump_json())["yield_ms"] == 5000
    with pytest.raises(ValueError):
        ShellExecArgs(command="x", shell=True)  # type: ignore[call-arg]


@pytest.mark.skipif(bwrap_available() is None, reason="bubblewrap is not installed")
async def test_readonly_with_bwrap_cannot_write(tmp_path: Path) -> None:
    svc = LocalProcesses()
    try:
        ctx = ctx_for(tmp_path, svc, "readonly")
        assert ctx.persona_dir is not None
        (ctx.persona_dir / ".env").write_text("T=abc\n", encoding="utf-8")
        out = await run(ctx, command="echo x > f.txt; echo rc=$?; cat ../.env; ls")
        assert "rc=1" in out or "rc=2" in out
        assert "T=abc" not in out
        ctx2 = ctx_for(tmp_path, svc, "workspace")
        assert (await run(ctx2, command="echo x > f.txt && cat f.txt")) == "exit=0\nx\n"
    finally:
        await svc.close()
