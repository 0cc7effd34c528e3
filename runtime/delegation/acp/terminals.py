"""Client terminals for an ACP agent (``terminal/*``), inside the rails.

An agent offered the client ``terminal`` capability may run commands through
the client instead of on its own. coterie offers it only when it can confine
them the way the shell tools do (:class:`runtime.shell.Sandbox` under
bubblewrap): each command runs under ``/bin/sh`` in the agent's working
directory or below, with the scrubbed environment (the agent's own keys do
not reach it, the variables the request names do, except ``PATH``/``LD_*``),
no network unless the persona's shell has it, the coterie home and the
persona's directory hidden, ``.env`` unreadable, and write access to the
agent's working directory only. Without bubblewrap the capability is not
advertised.

A terminal's output (stdout and stderr merged) keeps the last
``output_byte_limit`` bytes (default and ceiling :data:`MAX_OUTPUT_BYTES`),
cut at a character boundary and flagged ``truncated``. ``kill`` stops the
command's whole process group and keeps the output; ``release`` kills it
too and forgets it. Closing the session kills every terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

import acp
from acp.schema import EnvVariable, TerminalExitStatus

from coterie.runtime.delegation.acp.rails import inside_root
from coterie.runtime.shell.env import scrubbed_env
from coterie.runtime.shell.sandbox import Sandbox

MAX_OUTPUT_BYTES = 1_000_000
MAX_TERMINALS = 16
_READ_CHUNK = 64 * 1024


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass
class Terminal:
    """One command and what it printed."""

    id: str
    command: str
    cwd: Path
    proc: asyncio.subprocess.Process
    limit: int
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    pump: asyncio.Task[None] | None = None

    async def _pump(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        while chunk := await stream.read(_READ_CHUNK):
            self.output += chunk
            excess = len(self.output) - self.limit
            if excess > 0:
                # Never start in the middle of a UTF-8 character.
                while excess < len(self.output) and (self.output[excess] & 0xC0) == 0x80:
                    excess += 1
                del self.output[:excess]
                self.truncated = True

    @property
    def exit_status(self) -> TerminalExitStatus | None:
        code = self.proc.returncode
        if code is None:
            return None
        if code < 0:
            return TerminalExitStatus(exit_code=None, signal=_signal_name(code))
        return TerminalExitStatus(exit_code=code, signal=None)

    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")

    async def wait(self) -> TerminalExitStatus:
        await self.proc.wait()
        if self.pump is not None:
            await asyncio.wait({self.pump}, timeout=2.0)
        status = self.exit_status
        assert status is not None
        return status

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 5.0)
        if self.pump is not None:
            # Whatever else held the pipe went with the group.
            await asyncio.wait({self.pump}, timeout=2.0)
            self.pump.cancel()


class Terminals:
    """The terminals of one ACP session, confined by ``sandbox``.

    ``root`` is the agent's working directory, resolved; commands may run in
    it or below. Methods raise ``acp.RequestError`` for what the agent got
    wrong (the SDK sends it back as the JSON-RPC error).
    """

    def __init__(self, sandbox: Sandbox, root: Path, *, max_terminals: int = MAX_TERMINALS) -> None:
        if sandbox.bwrap is None:
            raise ValueError("client terminals need a confining sandbox (bubblewrap)")
        self.sandbox = sandbox
        self.root = root
        self.max_terminals = max_terminals
        self._terminals: dict[str, Terminal] = {}
        self._ids = itertools.count(1)
        self.started = 0

    def _get(self, terminal_id: str) -> Terminal:
        term = self._terminals.get(terminal_id)
        if term is None:
            raise acp.RequestError(
                -32602, f"no terminal {terminal_id!r} (released, or never created)"
            )
        return term

    async def create(
        self,
        command: str,
        args: list[str] | None,
        env: list[EnvVariable] | None,
        cwd: str | None,
        output_byte_limit: int | None,
    ) -> Terminal:
        """Start ``command`` (with ``args``: that exact argv; without: a shell line)."""
        if not command.strip():
            raise acp.RequestError(-32602, "terminal/create: command is empty")
        if len(self._terminals) >= self.max_terminals:
            raise acp.RequestError(
                -32603,
                f"terminal/create: {self.max_terminals} terminals are open; release one first",
            )
        where = self.root if not cwd else await asyncio.to_thread(inside_root, self.root, cwd)
        if where is None:
            raise acp.RequestError(
                -32602, f"terminal/create: cwd {cwd} is outside the workspace {self.root}"
            )
        if not where.is_dir():
            raise acp.RequestError(-32602, f"terminal/create: cwd {cwd} is not a directory")
        if output_byte_limit is not None and output_byte_limit < 0:
            raise acp.RequestError(-32602, "terminal/create: outputByteLimit must be >= 0")
        limit = min(output_byte_limit or MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES)
        line = shlex.join([command, *args]) if args else command
        variables = {v.name: v.value for v in env or []}
        proc = await asyncio.create_subprocess_exec(
            *self.sandbox.argv(line, where),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(where),
            env=scrubbed_env(home=self.root, extra=variables),
            start_new_session=True,
        )
        term_id = f"term_{next(self._ids)}"
        term = Terminal(id=term_id, command=line, cwd=where, proc=proc, limit=limit)
        term.pump = asyncio.create_task(term._pump())
        self._terminals[term.id] = term
        self.started += 1
        return term

    def output(self, terminal_id: str) -> Terminal:
        return self._get(terminal_id)

    async def wait(self, terminal_id: str) -> tuple[Terminal, TerminalExitStatus]:
        term = self._get(terminal_id)
        return term, await term.wait()

    async def kill(self, terminal_id: str) -> Terminal:
        term = self._get(terminal_id)
        await term.kill()
        return term

    async def release(self, terminal_id: str) -> Terminal:
        term = self._get(terminal_id)
        await term.kill()
        del self._terminals[terminal_id]
        return term

    async def close(self) -> None:
        terms, self._terminals = list(self._terminals.values()), {}
        await asyncio.gather(*(t.kill() for t in terms), return_exceptions=True)


__all__ = ["MAX_OUTPUT_BYTES", "MAX_TERMINALS", "Terminal", "Terminals"]
