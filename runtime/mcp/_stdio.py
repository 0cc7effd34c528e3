"""The stdio transport of :mod:`runtime.mcp.session`: spawning an MCP server,
pumping its JSON-RPC lines, and stopping it with its whole process group.

It is our own small transport rather than the SDK's ``stdio_client``, for
three reasons: the server gets exactly ``launch.env`` (the SDK merges in
``HOME``, ``PATH``, … of our own environment), its stderr is appended to
``launch.stderr_log`` (or discarded), and we know its process, so teardown
can stop its whole process group: stdin closed, a grace, SIGTERM, SIGKILL,
until no member is left (the SDK leaves a gracefully exited server's
children alive on purpose). The line framing and the JSON-RPC parsing are
the SDK's own.

:func:`stdio_transport` yields the (read, write) streams a ``ClientSession``
takes and records what the session needs to word an error in a
:class:`StdioChild`; a server that closed or broke its stdout, or stopped
reading its stdin, is reported through ``on_lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import anyio
from mcp import types as mt
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from coterie.runtime.errors import ConfigError
from coterie.runtime.mcp._convert import STDERR_HINT_CHARS, one_line
from coterie.runtime.mcp.records import McpLaunch
from coterie.runtime.shell.handle import group_members

if TYPE_CHECKING:
    # The (read, write) pair a transport yields; only the protocol is public.
    from mcp.client._transport import TransportStreams

log = logging.getLogger("coterie.mcp")

#: Bytes of one line from a stdio server (an image result is one line).
STDIO_LIMIT_BYTES = 50 * 1024 * 1024
#: Seconds a stdio server gets to exit after its stdin closed, on close().
CLOSE_GRACE_S = 2.0
#: The same after a crash or a timeout (the server is dead or stuck anyway).
RECYCLE_GRACE_S = 0.5
#: Seconds a TERMed process group gets before KILL.
KILL_GRACE_S = 2.0
#: Seconds between looks at whether a process has exited.
EXIT_POLL_S = 0.02

_STREAM_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class SpawnError(ConfigError):
    """The server could not even be spawned: its configured command is not
    found or not executable, or its working directory does not exist (the
    message is the status error, naming the server and the command)."""


@dataclass(eq=False)
class StdioChild:
    """One spawn of a stdio server: its process, whether its stdout ended,
    its own status when it ended, and where its part of the stderr log starts."""

    proc: asyncio.subprocess.Process | None = None
    stdout_closed: bool = False
    exit_status: int | None = None
    stderr_offset: int = 0


@contextlib.asynccontextmanager
async def stdio_transport(
    launch: McpLaunch,
    child: StdioChild,
    *,
    on_lost: Callable[[str], None],
    closed: Callable[[], bool],
) -> AsyncIterator[TransportStreams]:
    """Spawn ``launch``'s server and yield its (read, write) streams.

    Raises :class:`SpawnError` when it cannot be spawned. ``on_lost`` gets a
    sentence when the server ends the connection from its side; ``closed``
    says, at teardown, whether the session is being closed (a longer grace
    to exit on its own) rather than recycled or restarted.
    """
    name = launch.name
    log_file, child.stderr_offset = await asyncio.to_thread(_open_stderr_log, launch)
    try:
        proc = await asyncio.create_subprocess_exec(
            launch.command,
            *launch.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file if log_file is not None else asyncio.subprocess.DEVNULL,
            env=dict(launch.env),
            cwd=launch.cwd,
            start_new_session=True,
            limit=STDIO_LIMIT_BYTES,
        )
    except OSError as exc:
        raise SpawnError(_spawn_error(launch, exc)) from None
    finally:
        if log_file is not None:
            log_file.close()
    child.proc = proc
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def pump_stdout() -> None:
        ended = f"server {name!r} closed its stdout"
        async with to_session:
            while True:
                try:
                    line = await stdout.readline()
                except (ValueError, OSError) as exc:  # a line over the limit, a broken pipe
                    ended = f"server {name!r} broke its stdout: {one_line(exc)}"
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    item: SessionMessage | Exception = SessionMessage(
                        mt.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    )
                except ValidationError as exc:
                    item = exc
                try:
                    await to_session.send(item)
                except _STREAM_GONE:
                    return
        child.stdout_closed = True
        on_lost(ended)

    async def pump_stdin() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write(data.encode() + b"\n")
                    await stdin.drain()
        except (ConnectionError, OSError):
            # The server stopped reading: end the read side so nothing hangs.
            await to_session.aclose()
            on_lost(f"server {name!r} stopped reading its stdin")

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump_stdout)
        tg.start_soon(pump_stdin)
        try:
            yield read, write
        finally:
            with anyio.CancelScope(shield=True):
                write.close()
                read.close()
                grace = CLOSE_GRACE_S if closed() else RECYCLE_GRACE_S
                await _stop_process(name, child, proc, grace)
            tg.cancel_scope.cancel()


async def stderr_hint(launch: McpLaunch, offset: int) -> str:
    """``"; stderr: <its last line since offset>"``, or ``""`` when there is none."""
    path = launch.stderr_log
    if path is None:
        return ""
    tail = await asyncio.to_thread(_last_line, Path(path), offset)
    return f"; stderr: {tail}" if tail else ""


async def _stop_process(
    name: str, child: StdioChild, proc: asyncio.subprocess.Process, grace: float
) -> None:
    """Close stdin, give the server ``grace`` to exit, then stop its whole group."""
    if proc.stdin is not None:
        proc.stdin.close()
    await _wait_exit(proc, grace)
    child.exit_status = proc.returncode  # before we signal it: its own status
    pgid = proc.pid
    if proc.returncode is None or await asyncio.to_thread(_group_lives, pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        await _wait_exit(proc, KILL_GRACE_S)
        deadline = time.monotonic() + KILL_GRACE_S
        while await asyncio.to_thread(_group_lives, pgid) and time.monotonic() < deadline:
            await asyncio.sleep(EXIT_POLL_S * 5)
    deadline = time.monotonic() + KILL_GRACE_S * 2
    while proc.returncode is None or await asyncio.to_thread(_group_lives, pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        if time.monotonic() > deadline:
            log.warning("MCP server %s: process group %s survives SIGKILL", name, pgid)
            break
        await asyncio.sleep(EXIT_POLL_S)
    # With the group gone the pipes close and the subprocess transport ends.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_GRACE_S)


def _open_stderr_log(launch: McpLaunch) -> tuple[IO[bytes] | None, int]:
    """The server's stderr log opened for appending, and where this run starts (blocking)."""
    if launch.stderr_log is None:
        return None, 0
    path = Path(launch.stderr_log)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "ab")  # noqa: SIM115 - handed to the child, closed after spawn
    offset = f.seek(0, os.SEEK_END)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    f.write(f"--- coterie {stamp}: MCP server {launch.name}: {launch.command}\n".encode())
    f.flush()
    return f, offset


def _last_line(path: Path, start: int) -> str:
    """The last non-empty stderr line written since ``start`` (blocking)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - 8 * STDERR_HINT_CHARS))
            data = f.read()
    except OSError:
        return ""
    lines = [
        ln.strip()
        for ln in data.decode("utf-8", errors="replace").splitlines()
        if ln.strip() and not ln.startswith("--- coterie ")
    ]
    return lines[-1][:STDERR_HINT_CHARS] if lines else ""


def _spawn_error(launch: McpLaunch, exc: OSError) -> str:
    name, command = launch.name, launch.command
    if isinstance(exc, FileNotFoundError):
        if launch.cwd is not None and exc.filename == launch.cwd:
            return f"server {name!r}: working directory {launch.cwd!r} does not exist"
        return f"server {name!r}: command {command!r} not found"
    if isinstance(exc, PermissionError):
        return f"server {name!r}: command {command!r} is not executable (permission denied)"
    return f"server {name!r}: cannot run {command!r}: {exc.strerror or exc}"


async def _wait_exit(proc: asyncio.subprocess.Process, timeout: float) -> None:
    """Wait until ``proc`` exited, at most ``timeout`` s.

    Not ``proc.wait()``: that also waits for the pipes to close, which a
    child that inherited them may never do.
    """
    deadline = time.monotonic() + timeout
    while proc.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(EXIT_POLL_S)


def _group_lives(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie (blocking)."""
    return bool(group_members(pgid, zombies=False))


__all__ = [
    "CLOSE_GRACE_S",
    "EXIT_POLL_S",
    "KILL_GRACE_S",
    "RECYCLE_GRACE_S",
    "STDIO_LIMIT_BYTES",
    "SpawnError",
    "StdioChild",
    "stderr_hint",
    "stdio_transport",
]
