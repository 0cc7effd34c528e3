"""One shell command in its own process group, with merged output and stdin."""

from __future__ import annotations

import asyncio
import os
import secrets as _secrets
import signal as _signal
import time
from typing import Any, Literal

from coterie.runtime.errors import ToolError
from coterie.runtime.shell.output import OutputBuffer, Redactor
from coterie.runtime.shell.records import ProcessOutput, ProcessStatus, StartSpec

KILL_GRACE_S = 2.0

SignalName = Literal["term", "kill", "int", "hup"]
SIGNALS: dict[str, int] = {
    "term": _signal.SIGTERM,
    "kill": _signal.SIGKILL,
    "int": _signal.SIGINT,
    "hup": _signal.SIGHUP,
}


def new_process_id() -> str:
    return f"bg_{_secrets.token_hex(4)}"


class ProcessHandle:
    """One command in its own process group, with merged output and stdin."""

    def __init__(self, spec: StartSpec, pid_id: str | None = None) -> None:
        self.id = pid_id or new_process_id()
        self.spec = spec
        self.buffer = OutputBuffer(spec.buffer_bytes)
        self._redactor = Redactor({**spec.redact, **spec.secrets})
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.started_at = 0.0
        self.finished_at: float | None = None
        self.exit_code: int | None = None
        self.timed_out = False
        self.finished = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and not self.finished.is_set()

    async def start(self) -> None:
        self.started_at = time.time()
        self._proc = await asyncio.create_subprocess_exec(
            *self.spec.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.spec.cwd,
            env=self.spec.env,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_default_signals,
        )
        pump = asyncio.create_task(self._pump())
        self._tasks = [pump, asyncio.create_task(self._reap(pump))]
        if self.spec.timeout_s is not None:
            self._tasks.append(asyncio.create_task(self._deadline(self.spec.timeout_s)))

    async def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            chunk = await self._proc.stdout.read(65536)
            if not chunk:
                break
            self.buffer.append(self._redactor.feed(chunk))
        self.buffer.append(self._redactor.flush())

    async def _reap(self, pump: asyncio.Task[None]) -> None:
        assert self._proc is not None
        code = await self._proc.wait()
        # Children that kept the pipe open must not hold the status back.
        try:
            await asyncio.wait_for(asyncio.shield(pump), 0.5)
        except (TimeoutError, asyncio.CancelledError):
            pass
        self.exit_code = code
        self.finished_at = time.time()
        self.finished.set()

    async def _deadline(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if not self.finished.is_set():
            self.timed_out = True
            await self.stop()

    def signal(self, name: str) -> bool:
        """Send an allowlisted signal to the whole group; False if already gone.

        Once no process is left in the group its id may be given to another
        process, so nothing is sent then: a signal can only reach our group.
        """
        if name not in SIGNALS:
            raise ToolError("invalid_arguments", f"signal must be one of {', '.join(SIGNALS)}")
        if self.pid is None or not group_alive(self.pid):
            return False
        try:
            os.killpg(self.pid, SIGNALS[name])
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def stop(self, grace: float = KILL_GRACE_S) -> None:
        """TERM the group, then KILL it if the shell outlives ``grace``."""
        if self.pid is None:
            return
        if not self.finished.is_set():
            self.signal("term")
            try:
                await asyncio.wait_for(self.finished.wait(), grace)
            except TimeoutError:
                pass
        # Leftover group members (a trapped TERM, a backgrounded child) go too.
        self.signal("kill")
        try:
            await asyncio.wait_for(self.finished.wait(), 5.0)
        except TimeoutError:
            pass

    async def write(self, data: bytes) -> int:
        if self._proc is None or self._proc.stdin is None or self.finished.is_set():
            raise ToolError("not_running", f"{self.id} has exited; stdin is closed")
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ToolError("not_running", f"{self.id}: stdin is closed") from exc
        return len(data)

    async def wait(self, timeout: float | None) -> bool:
        try:
            await asyncio.wait_for(self.finished.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def read(self, since: int | None = None) -> ProcessOutput:
        chunk, next_offset, dropped = self.buffer.read(since)
        return ProcessOutput(
            **self._status_fields(),
            chunk=chunk.decode("utf-8", errors="replace"),
            next_offset=next_offset,
            dropped_bytes=dropped,
        )

    def status(self) -> ProcessStatus:
        return ProcessStatus(**self._status_fields())

    def _status_fields(self) -> dict[str, Any]:
        end = self.finished_at or time.time()
        return {
            "id": self.id,
            "command": self.spec.command,
            "running": self.running,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "pid": self.pid,
            "runtime_s": round(end - self.started_at, 3) if self.started_at else 0.0,
            "output_bytes": self.buffer.end,
        }

    async def close(self) -> None:
        await self.stop(grace=0.5)
        for task in self._tasks:
            task.cancel()


def group_members(pgid: int, *, zombies: bool = True) -> list[int] | None:
    """The pids in process group ``pgid`` (without zombies unless
    ``zombies``), read from ``/proc``; ``None`` where there is no ``/proc``.
    Blocking: call it off the event loop where that matters."""
    try:
        entries = os.scandir("/proc")
    except OSError:
        return None
    members: list[int] = []
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # gone meanwhile
            # "pid (comm) state ppid pgrp …": comm may hold spaces and parentheses.
            fields = stat[stat.rfind(b")") + 2 :].split()
            dead = fields[0] in (b"Z", b"X") if fields else False
            if len(fields) > 2 and int(fields[2]) == pgid and (zombies or not dead):
                members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any process (a zombie included) is in process group ``pgid``.

    While one is, the kernel gives that id to no new process, so signalling
    the group cannot reach a stranger. Where there is no ``/proc``, the
    group counts as alive.
    """
    members = group_members(pgid)
    return members is None or bool(members)


def _default_signals() -> None:
    """In the child: undo ignored signals inherited from the runtime (Ray
    workers ignore SIGINT, and a shell cannot un-ignore what it inherits)."""
    handled = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGPIPE)
    for sig in handled:
        _signal.signal(sig, _signal.SIG_DFL)
    # A blocked mask is inherited across exec too.
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, handled)


__all__ = [
    "KILL_GRACE_S",
    "SIGNALS",
    "ProcessHandle",
    "SignalName",
    "group_alive",
    "group_members",
    "new_process_id",
]
