"""ShellProcessActor and ShellProcesses on a real Ray session."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coterie.actors.shell import ShellProcesses
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.services import Services
from coterie.tools.shell import ProcessArgs, ShellExecArgs, process, shell_exec
from coterie.tools.tasks import TaskHandleArgs, task_cancel
from tests.helpers import make_ctx

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture
async def service(ray_session: None) -> AsyncIterator[ShellProcesses]:
    svc = ShellProcesses(bwrap=None)
    yield svc
    await svc.close()


def ctx_for(tmp_path: Path, svc: Any) -> TurnContext:
    pdir = tmp_path / "home" / "personas" / "ana"
    ws = pdir / "workspace"
    ws.mkdir(parents=True, exist_ok=True)
    return make_ctx(
        persona="ana",
        services=Services(processes=svc),
        settings=TurnSettings(
            workspace=ws,
            persona_dir=pdir,
            home=tmp_path / "home",
            # These tests run commands unconfined (bwrap=None) on purpose.
            runtime=RuntimeSettings(unsandboxed_shell="allow"),
        ),
    )


async def read_until(ctx: TurnContext, pid: str, expected: str, since: int | None = None) -> Any:
    """``process action=read`` every 0.05 s until the output is ``expected``."""
    deadline = time.monotonic() + 10.0
    while True:
        out = await process.fn(ProcessArgs(action="read", id=pid, since=since), ctx)
        if out["chunk"] == expected:
            return out
        assert expected.startswith(out["chunk"]), f"unexpected output {out['chunk']!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {expected!r}"
        await asyncio.sleep(0.05)


async def test_sync_and_auto_background_without_rerun(
    tmp_path: Path, service: ShellProcesses
) -> None:
    ctx = ctx_for(tmp_path, service)
    assert ctx.settings.workspace is not None
    assert await shell_exec.fn(ShellExecArgs(command="echo hi"), ctx) == "exit=0\nhi\n"
    # It runs until the test creates "go", so it is surely still running after the yield.
    command = "echo once >> runs.txt; echo a; until [ -e go ]; do sleep 0.05; done; echo b"
    res = await shell_exec.fn(ShellExecArgs(command=command, yield_ms=500), ctx)
    assert res["backgrounded"] and res["reason"] == "still running after 500ms"
    assert "a\n".startswith(res["output_so_far"])
    await read_until(ctx, res["id"], "a\n")
    (ctx.settings.workspace / "go").touch()
    assert await service.wait(res["id"], 15)
    read = await process.fn(ProcessArgs(action="read", id=res["id"], since=2), ctx)
    assert read["chunk"] == "b\n" and read["next_offset"] == 4 and read["exit_code"] == 0
    assert (ctx.settings.workspace / "runs.txt").read_text() == "once\n"  # type: ignore[operator]
    await service.remove(res["id"])


async def test_stdin_offsets_list_remove_cancel(tmp_path: Path, service: ShellProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    res = await shell_exec.fn(
        ShellExecArgs(command="while read l; do echo got:$l; done", background=True), ctx
    )
    pid = res["id"]
    await process.fn(ProcessArgs(action="write", id=pid, data="one"), ctx)
    await process.fn(ProcessArgs(action="write", id=pid, data="two"), ctx)
    first = await read_until(ctx, pid, "got:one\ngot:two\n")
    assert first["next_offset"] == 16
    later = await process.fn(ProcessArgs(action="read", id=pid, since=8), ctx)
    assert later["chunk"] == "got:two\n"

    res2 = await shell_exec.fn(
        ShellExecArgs(command="trap '' TERM; sleep 100", background=True), ctx
    )
    listed = (await process.fn(ProcessArgs(action="list"), ctx))["processes"]
    assert {p["id"] for p in listed} == {pid, res2["id"]}
    (shell_pid,) = [p["pid"] for p in listed if p["id"] == res2["id"]]
    # The shell is a child of its ShellProcess actor's worker process, a Ray
    # worker: its parent is the node's raylet (not this test's process).
    worker = psutil.Process(shell_pid).parent()
    assert worker is not None and worker.pid != os.getpid()
    raylet = worker.parent()
    assert raylet is not None and raylet.name() == "raylet"
    cancelled = await task_cancel.fn(TaskHandleArgs(handle=res2["id"]), ctx)
    assert cancelled == {"cancelled": res2["id"], "exit_code": -9}
    assert not psutil.pid_exists(shell_pid) or psutil.Process(shell_pid).status() == "zombie"
    # The actor was killed with its process (ray.kill takes effect shortly after).
    deadline = time.monotonic() + 15
    while not gone(worker):
        assert time.monotonic() < deadline, "the cancelled process's actor kept running"
        await asyncio.sleep(0.05)

    removed = await process.fn(ProcessArgs(action="remove", id=pid), ctx)
    assert removed["removed"] == pid
    assert await service.list() == []
    with pytest.raises(ToolError) as err:
        await process.fn(ProcessArgs(action="read", id=pid), ctx)
    assert err.value.kind == "not_found"


async def test_tool_errors_cross_the_actor(tmp_path: Path, service: ShellProcesses) -> None:
    ctx = ctx_for(tmp_path, service)
    res = await shell_exec.fn(ShellExecArgs(command="true", background=True), ctx)
    assert await service.wait(res["id"], 10)
    with pytest.raises(ToolError) as err:
        await process.fn(ProcessArgs(action="write", id=res["id"], data="x"), ctx)
    assert err.value.kind == "not_running"


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def raylet_of(shell_pid: int) -> int:
    """The raylet (node) whose worker runs the shell: its parent's parent."""
    worker = psutil.Process(shell_pid).parent()
    assert worker is not None
    raylet = worker.parent()
    assert raylet is not None and raylet.name() == "raylet"
    return raylet.pid


@ray.remote(num_cpus=0)
class _Probe:
    """An actor on a given node: reports that node's raylet."""

    def raylet(self) -> int:
        return os.getppid()


async def test_placed_on_the_callers_node(service: ShellProcesses, tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, service)
    res = await shell_exec.fn(ShellExecArgs(command="sleep 30", background=True), ctx)
    here = ray.get_runtime_context().get_node_id()
    probe = _Probe.options(  # type: ignore[attr-defined]
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)
    ).remote()
    try:
        status = await service.status(res["id"])
        assert status.pid is not None
        assert raylet_of(status.pid) == await probe.raylet.remote()
    finally:
        ray.kill(probe)


@ray.remote(num_cpus=0)
class _Owner:
    """Stands in for a persona actor: creates processes from inside an actor."""

    def __init__(self) -> None:
        self.svc = ShellProcesses(bwrap=None)

    async def run(self, cwd: str) -> tuple[int, int]:
        from coterie.runtime.shell import StartSpec, scrubbed_env

        spec = StartSpec("sleep 30", ["/bin/sh", "-c", "sleep 30"], cwd, scrubbed_env(home=cwd))
        pid = await self.svc.start(spec)
        status = await self.svc.status(pid)
        assert status.pid is not None
        child = raylet_of(status.pid)
        await self.svc.remove(pid)
        return child, os.getppid()


async def test_placed_on_the_owning_actors_node(ray_session: None, tmp_path: Path) -> None:
    owner = _Owner.remote()  # type: ignore[attr-defined]
    child, mine = await owner.run.remote(str(tmp_path))
    assert child == mine
    ray.kill(owner)
