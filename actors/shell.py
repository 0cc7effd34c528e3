"""Shell processes on Ray: a :class:`runtime.shell.ProcessSlot` per actor.

:class:`ShellProcesses` is the persona's process table with one ShellProcess
actor per command, placed on the persona's own node (the workspace is local
disk) and owned by the persona actor, so they die with it.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coterie.actors._ray import remote
from coterie.runtime.errors import ActorLostError, ToolError
from coterie.runtime.shell import (
    ProcessOutput,
    ProcessSlot,
    ProcessStatus,
    ProcessTable,
    SignalResult,
    StartSpec,
)


class ShellProcessActor(ProcessSlot):
    """:class:`~runtime.shell.ProcessSlot` as it runs on Ray (the subclass adds
    nothing but its name: the process shows as ``ray::ShellProcessActor``)."""


ShellProcessActorRemote = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(
    ShellProcessActor
)


class RaySlot:
    """A :class:`~runtime.shell.Slot` held by a ShellProcess actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await remote(getattr(self.actor, method).remote(*args))
        except ActorLostError as exc:
            raise ToolError("not_running", "the process's actor is gone") from exc

    async def start(self, spec: StartSpec, pid_id: str) -> ProcessStatus:
        status: ProcessStatus = await self._call("start", spec, pid_id)
        return status

    async def wait(self, timeout: float | None) -> bool:
        done: bool = await self._call("wait", timeout)
        return done

    async def status(self) -> ProcessStatus:
        status: ProcessStatus = await self._call("status")
        return status

    async def read(self, since: int | None = None) -> ProcessOutput:
        output: ProcessOutput = await self._call("read", since)
        return output

    async def write(self, data: bytes) -> int:
        written: int = await self._call("write", data)
        return written

    async def signal(self, name: str) -> SignalResult:
        result: SignalResult = await self._call("signal", name)
        return result

    async def close(self) -> ProcessStatus:
        status: ProcessStatus = await self._call("close")
        return status

    async def discard(self) -> None:
        # The process group dies with the actor's process.
        ray.kill(self.actor)


class ShellProcesses(ProcessTable):
    """The persona's process table: one ShellProcess actor per command.

    Creating an actor costs a worker process start (about a second), so after
    the first command one spare actor is kept warm (``spares=0`` disables it):
    a persona that never runs a command pays nothing.
    """

    def __init__(
        self,
        *,
        bwrap: str | None = "auto",
        node_id: str | None = None,
        spares: int = 1,
        max_processes: int = 16,
    ) -> None:
        self.node_id = node_id or ray.get_runtime_context().get_node_id()
        super().__init__(self._new_slot, bwrap=bwrap, spares=spares, max_processes=max_processes)

    def _new_slot(self) -> RaySlot:
        actor: Any = ShellProcessActorRemote.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=self.node_id, soft=False),
        ).remote()
        # Without a first call the handle resolves the actor's address only on
        # first use (~200 ms); asking now, in the background, makes that free.
        actor.__ray_ready__.remote()
        return RaySlot(actor)


__all__ = ["RaySlot", "ShellProcessActor", "ShellProcessActorRemote", "ShellProcesses"]
