"""Shell processes on Ray: one ``ShellProcessActor`` per command.

:class:`ShellProcesses` is the persona's :class:`~runtime.processes.ProcessService`:
it creates the actors on the persona's own node (the workspace is local
disk), tracks the ``bg_<hex>`` ids and kills the actors on ``remove``. The
actors are owned by the persona actor, so they die with it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, Literal

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.errors import ToolError
from runtime.processes import (
    ProcessHandle,
    SandboxChoice,
    StartSpec,
    bwrap_available,
    new_process_id,
    not_found,
)

log = logging.getLogger("coterie.actors.shell")


class ShellProcessActor:
    """Owns one running command: its buffer, stdin, signals and exit status."""

    def __init__(self) -> None:
        self._handle: ProcessHandle | None = None

    @property
    def handle(self) -> ProcessHandle:
        if self._handle is None:
            raise ToolError("not_running", "this process was never started")
        return self._handle

    async def start(self, spec: StartSpec, pid_id: str) -> dict[str, Any]:
        if self._handle is not None:
            raise RuntimeError("a ShellProcessActor runs one command only")
        self._handle = ProcessHandle(spec, pid_id)
        await self._handle.start()
        return self._handle.status()

    async def wait(self, timeout: float | None) -> bool:
        return await self.handle.wait(timeout)

    async def status(self) -> dict[str, Any]:
        return self.handle.status()

    async def read(self, since: int | None = None) -> dict[str, Any]:
        return self.handle.read(since)

    async def write(self, data: bytes) -> int:
        return await self.handle.write(data)

    async def signal(self, name: str) -> dict[str, Any]:
        sent = self.handle.signal(name)
        return {**self.handle.status(), "signal": name, "delivered": sent}

    async def close(self) -> dict[str, Any]:
        await self.handle.close()
        return self.handle.status()

    async def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    async def os_pid(self) -> int:
        import os

        return os.getpid()


ShellProcessActorRemote = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(
    ShellProcessActor
)


async def _unwrap(ref: Awaitable[Any]) -> Any:
    """Await an actor call; a ToolError raised inside comes back as itself."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, ToolError):
            raise ToolError(cause.kind, cause.detail) from None
        raise
    except ray.exceptions.RayActorError as exc:
        raise ToolError("not_running", "the process's actor is gone") from exc


class ShellProcesses(SandboxChoice):
    """The persona's process service: one :class:`ShellProcessActor` each.

    Creating an actor costs a worker process start (about a second), so after
    the first command one spare actor is kept warm (``spares=0`` disables it):
    a persona that never runs a command pays nothing.
    """

    def __init__(
        self,
        *,
        bwrap: str | Literal["auto"] | None = "auto",
        node_id: str | None = None,
        spares: int = 1,
    ) -> None:
        self.bwrap = bwrap_available() if bwrap == "auto" else bwrap
        self.node_id = node_id or ray.get_runtime_context().get_node_id()
        self.spares = spares
        self._actors: dict[str, Any] = {}
        self._spare: list[Any] = []

    def _new_actor(self) -> Any:
        return ShellProcessActorRemote.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=self.node_id, soft=False),
        ).remote()

    def _take_actor(self) -> Any:
        actor = self._spare.pop() if self._spare else self._new_actor()
        while len(self._spare) < self.spares:
            spare = self._new_actor()  # created in the background
            # Without a first call the handle resolves the actor's address only
            # on first use (~200 ms); pinging now makes that free.
            spare.__ray_ready__.remote()
            self._spare.append(spare)
        return actor

    def _get(self, pid: str) -> Any:
        actor = self._actors.get(pid)
        if actor is None:
            raise not_found(pid)
        return actor

    async def start(self, spec: StartSpec) -> str:
        pid = new_process_id()
        actor = self._take_actor()
        try:
            await _unwrap(actor.start.remote(spec, pid))
        except BaseException:
            ray.kill(actor)
            raise
        self._actors[pid] = actor
        return pid

    async def wait(self, pid: str, timeout: float | None) -> bool:
        done: bool = await _unwrap(self._get(pid).wait.remote(timeout))
        return done

    async def status(self, pid: str) -> dict[str, Any]:
        out: dict[str, Any] = await _unwrap(self._get(pid).status.remote())
        return out

    async def read(self, pid: str, since: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = await _unwrap(self._get(pid).read.remote(since))
        return out

    async def write(self, pid: str, data: bytes) -> int:
        n: int = await _unwrap(self._get(pid).write.remote(data))
        return n

    async def signal(self, pid: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = await _unwrap(self._get(pid).signal.remote(name))
        return out

    async def list(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for pid in list(self._actors):
            try:
                out.append(await self.status(pid))
            except ToolError:
                out.append({"id": pid, "running": False, "exit_code": None, "lost": True})
        return out

    async def remove(self, pid: str) -> dict[str, Any]:
        actor = self._actors.pop(pid, None)
        if actor is None:
            raise not_found(pid)
        status: dict[str, Any] = {"id": pid, "running": False}
        try:
            status = await _unwrap(actor.close.remote())
        except Exception as exc:  # the actor died: its process group went with it
            log.warning("closing %s failed: %s", pid, exc)
        ray.kill(actor)
        return status

    def actor(self, pid: str) -> Any:
        """The actor behind ``pid`` (tests, benchmarks)."""
        return self._get(pid)

    async def close(self) -> None:
        for pid in list(self._actors):
            await self.remove(pid)
        for actor in self._spare:
            ray.kill(actor)
        self._spare.clear()


__all__ = ["ShellProcessActor", "ShellProcessActorRemote", "ShellProcesses"]
