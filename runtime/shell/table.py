"""ProcessTable: a persona's :class:`~runtime.services.ProcessService`.

It hands out ``bg_<hex>`` ids, keeps one :class:`Slot` per running command
and can keep spare slots warm. Where a slot lives is the caller's choice:
:class:`LocalProcesses` runs them in this process; the actor runtime gives
each its own ShellProcess actor on the persona's node (``actors.shell``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from coterie.runtime.errors import ToolError
from coterie.runtime.shell.handle import new_process_id
from coterie.runtime.shell.records import ProcessOutput, ProcessStatus, SignalResult, StartSpec
from coterie.runtime.shell.sandbox import SandboxChoice
from coterie.runtime.shell.slot import ProcessSlot


class Slot(Protocol):
    """Where one command runs (a :class:`ProcessSlot`, or an actor holding one).

    Failures the model should read are :class:`~runtime.errors.ToolError`;
    a slot whose owner is gone raises ``ToolError("not_running", …)``.
    """

    async def start(self, spec: StartSpec, pid_id: str) -> ProcessStatus: ...

    async def wait(self, timeout: float | None) -> bool: ...

    async def status(self) -> ProcessStatus: ...

    async def read(self, since: int | None = None) -> ProcessOutput: ...

    async def write(self, data: bytes) -> int: ...

    async def signal(self, name: str) -> SignalResult: ...

    async def close(self) -> ProcessStatus: ...

    async def discard(self) -> None:
        """Release the slot and whatever holds it (stops a running command)."""
        ...


def not_found(pid: str) -> ToolError:
    return ToolError("not_found", f"no process {pid!r} (see process action=list)")


class ProcessTable(SandboxChoice):
    """The processes of one persona, addressed by ``bg_<hex>`` ids.

    ``new_slot`` makes an empty slot; ``spares`` slots are kept ready after
    the first start (worth it when a slot is costly to create, like an actor).
    At most ``max_processes`` are held at once (running or finished but not
    removed); one more is refused with ``limit_reached``.
    """

    def __init__(
        self,
        new_slot: Callable[[], Slot],
        *,
        bwrap: str | None = "auto",
        spares: int = 0,
        max_processes: int = 16,
    ) -> None:
        super().__init__(bwrap=bwrap)
        if spares < 0 or max_processes < 1:
            raise ValueError("need spares >= 0 and max_processes >= 1")
        self._new_slot = new_slot
        self.spares = spares
        self.max_processes = max_processes
        self._slots: dict[str, Slot] = {}
        self._spare: list[Slot] = []

    def _take_slot(self) -> Slot:
        slot = self._spare.pop() if self._spare else self._new_slot()
        while len(self._spare) < self.spares:
            self._spare.append(self._new_slot())
        return slot

    def _get(self, pid: str) -> Slot:
        slot = self._slots.get(pid)
        if slot is None:
            raise not_found(pid)
        return slot

    def __len__(self) -> int:
        return len(self._slots)

    async def start(self, spec: StartSpec) -> str:
        if len(self._slots) >= self.max_processes:
            raise ToolError(
                "limit_reached",
                f"this persona already holds {len(self._slots)} processes "
                f"(max_background_processes: {self.max_processes}); remove finished ones "
                "with process action=remove, or cancel one with task_cancel",
            )
        pid = new_process_id()
        slot = self._take_slot()
        try:
            await slot.start(spec, pid)
        except BaseException:
            await slot.discard()
            raise
        self._slots[pid] = slot
        return pid

    async def wait(self, pid: str, timeout: float | None) -> bool:
        return await self._get(pid).wait(timeout)

    async def status(self, pid: str) -> ProcessStatus:
        return await self._get(pid).status()

    async def read(self, pid: str, since: int | None = None) -> ProcessOutput:
        return await self._get(pid).read(since)

    async def write(self, pid: str, data: bytes) -> int:
        return await self._get(pid).write(data)

    async def signal(self, pid: str, name: str) -> SignalResult:
        return await self._get(pid).signal(name)

    async def list(self) -> list[ProcessStatus]:
        out: list[ProcessStatus] = []
        for pid in list(self._slots):
            try:
                out.append(await self.status(pid))
            except ToolError:
                out.append(ProcessStatus(id=pid, running=False, lost=True))
        return out

    async def running(self) -> bool:
        """Whether any command is still running."""
        return any(p.running for p in await self.list())

    async def remove(self, pid: str) -> ProcessStatus:
        """Stop the command (its whole group) and forget the id."""
        slot = self._slots.pop(pid, None)
        if slot is None:
            raise not_found(pid)
        try:
            status = await slot.close()
        except ToolError:  # its owner is gone, and the process group with it
            status = ProcessStatus(id=pid, running=False, lost=True)
        await slot.discard()
        return status

    async def close(self) -> None:
        for pid in list(self._slots):
            await self.remove(pid)
        spare, self._spare = self._spare, []
        for slot in spare:
            await slot.discard()


class LocalProcesses(ProcessTable):
    """A :class:`ProcessTable` whose commands run in this process (no Ray)."""

    def __init__(self, *, bwrap: str | None = "auto", max_processes: int = 16) -> None:
        super().__init__(ProcessSlot, bwrap=bwrap, max_processes=max_processes)


__all__ = ["LocalProcesses", "ProcessTable", "Slot", "not_found"]
