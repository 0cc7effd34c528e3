"""Shell processes: output buffer, environment, secrets, sandbox, process groups.

Plain Python (no Ray). :class:`ProcessHandle` runs one ``/bin/sh -c`` command
in its own process group; :class:`LocalProcesses` is an in-process
:class:`ProcessService` (tests, in-process runs); ``actors.shell`` provides
the Ray implementation, one actor per background process.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets as _secrets
import signal as _signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from runtime.errors import ToolError

DEFAULT_BUFFER_BYTES = 64 * 1024
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Inherited from the runtime's environment when set; nothing else is.
INHERITED_ENV = ("LANG", "LC_ALL", "TERM", "TZ")
BWRAP_PATH = "/usr/bin/bwrap"
KILL_GRACE_S = 2.0
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SignalName = Literal["term", "kill", "int", "hup"]
SIGNALS: dict[str, int] = {
    "term": _signal.SIGTERM,
    "kill": _signal.SIGKILL,
    "int": _signal.SIGINT,
    "hup": _signal.SIGHUP,
}
Access = Literal["full", "workspace", "readonly"]


# -- output ------------------------------------------------------------------


class OutputBuffer:
    """A rolling byte buffer addressed by absolute offsets.

    Offsets count every byte ever appended; only the last ``cap`` bytes are
    kept. ``read(since)`` reports how many requested bytes were already gone.
    """

    def __init__(self, cap: int = DEFAULT_BUFFER_BYTES) -> None:
        if cap <= 0:
            raise ValueError("cap must be positive")
        self.cap = cap
        self._data = bytearray()
        self._start = 0  # absolute offset of _data[0]

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._start + len(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def append(self, chunk: bytes) -> None:
        if not chunk:
            return
        if len(chunk) >= self.cap:
            self._start = self.end + len(chunk) - self.cap
            self._data = bytearray(chunk[-self.cap :])
            return
        self._data += chunk
        excess = len(self._data) - self.cap
        if excess > 0:
            del self._data[:excess]
            self._start += excess

    def read(self, since: int | None = None) -> tuple[bytes, int, int]:
        """``(chunk, next_offset, dropped_bytes)`` from absolute offset ``since``."""
        pos = self._start if since is None else max(0, since)
        dropped = 0
        if pos < self._start:
            dropped = self._start - pos
            pos = self._start
        pos = min(pos, self.end)
        return bytes(self._data[pos - self._start :]), self.end, dropped

    def tail(self, n: int) -> bytes:
        return bytes(self._data[-n:]) if n > 0 else b""


class Redactor:
    """Replaces secret values in a byte stream, even when split across chunks.

    Only a suffix that could begin a secret is held back until more arrives.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        pairs = [(v.encode(), f"[redacted:{k}]".encode()) for k, v in secrets.items() if v]
        self._pairs = sorted(pairs, key=lambda p: -len(p[0]))
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._pairs:
            return chunk
        data = self._replace(self._pending + chunk)
        hold = self._hold(data)
        self._pending = data[len(data) - hold :] if hold else b""
        return data[: len(data) - hold]

    def flush(self) -> bytes:
        out, self._pending = self._pending, b""
        return out

    def _replace(self, data: bytes) -> bytes:
        for value, marker in self._pairs:
            data = data.replace(value, marker)
        return data

    def _hold(self, data: bytes) -> int:
        best = 0
        for value, _ in self._pairs:
            for k in range(min(len(value) - 1, len(data)), best, -1):
                if data.endswith(value[:k]):
                    best = k
                    break
        return best

    def text(self, text: str) -> str:
        for value, marker in self._pairs:
            text = text.replace(value.decode(), marker.decode())
        return text


# -- environment and secrets -------------------------------------------------


def _dropped_env_key(key: str) -> bool:
    upper = key.upper()
    return upper == "PATH" or upper.startswith(("LD_", "DYLD_"))


def scrubbed_env(
    *,
    home: Path | str,
    extra: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean environment: an allowlist, then secrets, then ``extra`` (wins).

    Nothing of the runtime's own environment leaks but ``INHERITED_ENV``;
    ``extra`` may not set ``PATH``, ``LD_*`` or ``DYLD_*``.
    """
    source = os.environ if parent is None else parent
    env = {"PATH": SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
    for key in INHERITED_ENV:
        if key in source:
            env[key] = source[key]
    for key, value in (secrets or {}).items():
        env[key] = value
    for key, value in (extra or {}).items():
        if _dropped_env_key(key) or not key or "=" in key or "\x00" in key + value:
            continue
        env[key] = value
    return env


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export``, quotes and ``#`` comments tolerated)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return out
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if SECRET_NAME_RE.match(key):
            out[key] = value
    return out


def load_secrets(persona_dir: Path | None, names: Iterable[str], persona: str) -> dict[str, str]:
    """The named secrets from ``persona_dir/.env``; ToolError names any missing."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    bad = [n for n in wanted if not SECRET_NAME_RE.match(n)]
    if bad:
        raise ToolError("invalid_secret", f"not a variable name: {', '.join(bad)}")
    found = read_dotenv(persona_dir / ".env") if persona_dir is not None else {}
    missing = [n for n in wanted if n not in found]
    if missing:
        raise ToolError(
            "missing_secret", f"secret not set for persona {persona}: {', '.join(missing)}"
        )
    return {n: found[n] for n in wanted}


# -- sandbox -----------------------------------------------------------------


def bwrap_available(path: str = BWRAP_PATH) -> str | None:
    """The bubblewrap binary, unless missing or disabled by ``COTERIE_BWRAP=0``."""
    if os.environ.get("COTERIE_BWRAP", "").strip().lower() in ("0", "off", "false", "no"):
        return None
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@dataclass(frozen=True)
class Sandbox:
    """How a persona's commands are confined (``bwrap=None``: not confined)."""

    workspace: Path
    access: Access = "workspace"
    persona_dir: Path | None = None
    home: Path | None = None
    bwrap: str | None = None

    def argv(self, command: str, cwd: Path) -> list[str]:
        shell = ["/bin/sh", "-c", command]
        if self.bwrap is None:
            return shell
        ws = str(self.workspace)
        argv = [self.bwrap, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/"]
        argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        # Hide the runtime user's home, the coterie home (every persona, their
        # .env files) and the persona's own directory, then bring back the workspace.
        hidden: list[str] = []
        for p in (Path.home(), self.home, self.persona_dir):
            if p is not None and p.is_dir() and str(p) != "/":
                hidden.append(str(p.resolve()))
        for h in hidden:
            if not h.startswith("/tmp/") and h != "/tmp":
                argv += ["--tmpfs", h]
        argv += ["--ro-bind" if self.access == "readonly" else "--bind", ws, ws]
        dotenv = self.workspace / ".env"
        if dotenv.exists():
            argv += ["--ro-bind", "/dev/null", str(dotenv)]
        argv += ["--chdir", str(cwd), *shell]
        return argv


# -- one process -------------------------------------------------------------


@dataclass
class StartSpec:
    """Everything needed to start one command (crosses actor boundaries)."""

    command: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    secrets: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    buffer_bytes: int = DEFAULT_BUFFER_BYTES


class ProcessHandle:
    """One command in its own process group, with merged output and stdin."""

    def __init__(self, spec: StartSpec, pid_id: str | None = None) -> None:
        self.id = pid_id or new_process_id()
        self.spec = spec
        self.buffer = OutputBuffer(spec.buffer_bytes)
        self._redactor = Redactor(spec.secrets)
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
        """Send an allowlisted signal to the whole group; False if already gone."""
        if name not in SIGNALS:
            raise ToolError("invalid_signal", f"signal must be one of {', '.join(SIGNALS)}")
        if self.pid is None:
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

    def read(self, since: int | None = None) -> dict[str, Any]:
        chunk, next_offset, dropped = self.buffer.read(since)
        return {
            **self.status(),
            "chunk": chunk.decode("utf-8", errors="replace"),
            "next_offset": next_offset,
            "dropped_bytes": dropped,
        }

    def status(self) -> dict[str, Any]:
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


def _default_signals() -> None:
    """In the child: undo ignored signals inherited from the runtime (Ray
    workers ignore SIGINT, and a shell cannot un-ignore what it inherits)."""
    handled = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGPIPE)
    for sig in handled:
        _signal.signal(sig, _signal.SIG_DFL)
    # A blocked mask is inherited across exec too.
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, handled)


def new_process_id() -> str:
    return f"bg_{_secrets.token_hex(4)}"


# -- the service -------------------------------------------------------------


class ProcessService(Protocol):
    """A persona's shell processes, addressed by ``bg_<hex>`` ids.

    Unknown ids raise ``ToolError("not_found", …)``.
    """

    @property
    def sandboxed(self) -> bool:
        """Whether commands run inside bubblewrap."""
        ...

    def sandbox(
        self, workspace: Path, access: Access, persona_dir: Path | None, home: Path | None
    ) -> Sandbox: ...

    async def start(self, spec: StartSpec) -> str: ...

    async def wait(self, pid: str, timeout: float | None) -> bool: ...

    async def status(self, pid: str) -> dict[str, Any]: ...

    async def read(self, pid: str, since: int | None = None) -> dict[str, Any]: ...

    async def write(self, pid: str, data: bytes) -> int: ...

    async def signal(self, pid: str, name: str) -> dict[str, Any]: ...

    async def list(self) -> list[dict[str, Any]]: ...

    async def remove(self, pid: str) -> dict[str, Any]: ...


def not_found(pid: str) -> ToolError:
    return ToolError("not_found", f"no process {pid!r} (see process action=list)")


class SandboxChoice:
    """Whether a process service wraps commands in bubblewrap, and how."""

    bwrap: str | None

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    def sandbox(
        self, workspace: Path, access: Access, persona_dir: Path | None, home: Path | None
    ) -> Sandbox:
        return Sandbox(workspace, access, persona_dir, home, self.bwrap)


class LocalProcesses(SandboxChoice):
    """In-process :class:`ProcessService` (no Ray): tests and local runs."""

    def __init__(self, *, bwrap: str | Literal["auto"] | None = "auto") -> None:
        self.bwrap = bwrap_available() if bwrap == "auto" else bwrap
        self._procs: dict[str, ProcessHandle] = {}

    def _get(self, pid: str) -> ProcessHandle:
        handle = self._procs.get(pid)
        if handle is None:
            raise not_found(pid)
        return handle

    async def start(self, spec: StartSpec) -> str:
        handle = ProcessHandle(spec)
        await handle.start()
        self._procs[handle.id] = handle
        return handle.id

    async def wait(self, pid: str, timeout: float | None) -> bool:
        return await self._get(pid).wait(timeout)

    async def status(self, pid: str) -> dict[str, Any]:
        return self._get(pid).status()

    async def read(self, pid: str, since: int | None = None) -> dict[str, Any]:
        return self._get(pid).read(since)

    async def write(self, pid: str, data: bytes) -> int:
        return await self._get(pid).write(data)

    async def signal(self, pid: str, name: str) -> dict[str, Any]:
        handle = self._get(pid)
        sent = handle.signal(name)
        return {**handle.status(), "signal": name, "delivered": sent}

    async def list(self) -> list[dict[str, Any]]:
        return [h.status() for h in self._procs.values()]

    async def remove(self, pid: str) -> dict[str, Any]:
        handle = self._procs.pop(pid, None)
        if handle is None:
            raise not_found(pid)
        await handle.close()
        return handle.status()

    async def close(self) -> None:
        for pid in list(self._procs):
            await self.remove(pid)


__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "SAFE_PATH",
    "SIGNALS",
    "LocalProcesses",
    "OutputBuffer",
    "ProcessHandle",
    "ProcessService",
    "Redactor",
    "Sandbox",
    "StartSpec",
    "bwrap_available",
    "load_secrets",
    "read_dotenv",
    "scrubbed_env",
]
