"""ProcessSlot: the owner of one command, from start to close.

The ShellProcess actor runs one slot per background command; in-process
services use slots directly. A slot is created empty (so a spare can be kept
warm before its command is known) and starts exactly one command.
"""

from __future__ import annotations

from coterie.runtime.errors import ToolError
from coterie.runtime.shell.handle import ProcessHandle
from coterie.runtime.shell.records import ProcessOutput, ProcessStatus, SignalResult, StartSpec


class ProcessSlot:
    """Owns one running command: its buffer, stdin, signals and exit status."""

    def __init__(self) -> None:
        self._handle: ProcessHandle | None = None

    @property
    def handle(self) -> ProcessHandle:
        if self._handle is None:
            raise ToolError("not_running", "this process was never started")
        return self._handle

    async def start(self, spec: StartSpec, pid_id: str) -> ProcessStatus:
        if self._handle is not None:
            raise RuntimeError("a ProcessSlot runs one command only")
        self._handle = ProcessHandle(spec, pid_id)
        await self._handle.start()
        return self._handle.status()

    async def wait(self, timeout: float | None) -> bool:
        return await self.handle.wait(timeout)

    async def status(self) -> ProcessStatus:
        return self.handle.status()

    async def read(self, since: int | None = None) -> ProcessOutput:
        return self.handle.read(since)

    async def write(self, data: bytes) -> int:
        return await self.handle.write(data)

    async def signal(self, name: str) -> SignalResult:
        sent = self.handle.signal(name)
        return SignalResult(**self.handle.status().model_dump(), signal=name, delivered=sent)

    async def close(self) -> ProcessStatus:
        """Stop the command's whole process group (TERM, then KILL)."""
        await self.handle.close()
        return self.handle.status()

    async def discard(self) -> None:
        """Release the slot: a command still running is stopped first."""
        if self._handle is not None and self._handle.running:
            await self._handle.close()


__all__ = ["ProcessSlot"]
