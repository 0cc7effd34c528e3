"""How the other commands find the ``coterie serve`` of a home.

- ``<home>/serve.lock`` is held (``flock``) by the serving process for its
  whole life: one ``coterie serve`` per home. A second one is refused before
  it binds its port, so two servers never overwrite each other's state file.
  The kernel lets go of the lock when the process ends, however it ends. The
  file itself stays (removing a lock file races with its next holder); it
  holds the pid of the last server, for the refusal's message.
- ``<home>/serve.json`` says where the server is: its URL, pid, bearer token
  and Ray address. The server writes it (mode 0600, atomically) once it is
  up, and removes it when it stops: a clean exit, SIGTERM or SIGINT.
- A reader trusts ``serve.json`` only while someone holds the lock. A file
  nobody holds the lock for was left by a server that was killed; the reader
  that finds it removes it. (Where locks cannot be taken, the pid decides.)

Only the standard library is used here: a command that goes through the
server loads nothing heavy.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coterie.runtime.errors import ServeError
from coterie.runtime.serve.auth import write_private

STATE_FILE = "serve.json"
LOCK_FILE = "serve.lock"
#: Seconds a starting server keeps trying for the lock (a reader holds it for
#: a moment when it looks at a stale state file).
CLAIM_PATIENCE = 2.0


@dataclass(frozen=True)
class ServerState:
    """What ``<home>/serve.json`` says of a running server."""

    url: str
    pid: int
    token: str
    ray_address: str | None = None
    # Ray's RAY_AUTH_MODE in the server: a driver joining its cluster needs the
    # same (the token itself is in ~/.ray/auth_token, this user's).
    ray_auth_mode: str | None = None

    def join_ray(self) -> str | None:
        """Prepare this process to join the server's Ray cluster; its address.

        Call it before Ray is imported: Ray reads its auth mode at import."""
        if self.ray_auth_mode:
            os.environ.setdefault("RAY_AUTH_MODE", self.ray_auth_mode)
        return self.ray_address

    def page_url(self) -> str:
        """The chat page, with the token in the fragment (never sent to the server)."""
        return f"{self.url}/#token={self.token}"


def state_path(home: Path) -> Path:
    return home / STATE_FILE


def lock_path(home: Path) -> Path:
    return home / LOCK_FILE


def write_state(home: Path, state: ServerState) -> None:
    """Write the state file atomically, readable by this user only."""
    write_private(state_path(home), json.dumps(asdict(state)))


def remove_state(home: Path, pid: int) -> None:
    """Remove the state file if it is this server's (pid)."""
    state = read_state(home)
    if state is not None and state.pid == pid:
        state_path(home).unlink(missing_ok=True)


def read_state(home: Path) -> ServerState | None:
    """What the state file says, whether or not its server still runs."""
    try:
        data = json.loads(state_path(home).read_text(encoding="utf-8"))
        return ServerState(**data)
    except (OSError, ValueError, TypeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def served_state(home: Path) -> ServerState | None:
    """The state of the server running for ``home``, or None; a state file
    left by a server that died is removed on the way (see the module docstring)."""
    state = read_state(home)
    if state is None:
        return None
    try:
        fd = os.open(lock_path(home), os.O_RDONLY)
    except FileNotFoundError:  # written by a server that took no lock: the pid decides
        return state if _alive(state.pid) else None
    except OSError:
        return state if _alive(state.pid) else None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # a server holds it
            return state if _alive(state.pid) else None
        except OSError:  # no locks on this file system
            return state if _alive(state.pid) else None
        # Nobody serves: what is there was left by a server that was killed.
        # Removed under the lock, so that a server starting now cannot have
        # written its own file in between.
        left = read_state(home)
        if left is not None and left.pid == state.pid:
            state_path(home).unlink(missing_ok=True)
        return None
    finally:
        os.close(fd)


class ServeLock:
    """The lock that makes a process the ``coterie serve`` of a home."""

    def __init__(self, home: Path, fd: int) -> None:
        self.home = home
        self._fd: int | None = fd

    @classmethod
    def claim(cls, home: Path) -> ServeLock:
        """Hold the home's lock, or raise :class:`ServeError` naming the
        server that holds it. A state file found then is a dead server's: removed."""
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(home), os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + CLAIM_PATIENCE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                state = read_state(home)
                where = f" at {state.url}" if state is not None else ""
                raise ServeError(
                    f"coterie serve already runs for {home}"
                    + (f" (pid {holder}){where}" if holder else where)
                ) from None
            except OSError:  # no locks on this file system: as before them, unguarded
                break
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        state_path(home).unlink(missing_ok=True)
        return cls(home, fd)

    def release(self) -> None:
        """Let go of the lock (the file stays; see the module docstring)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = [
    "LOCK_FILE",
    "STATE_FILE",
    "ServeLock",
    "ServerState",
    "lock_path",
    "read_state",
    "remove_state",
    "served_state",
    "state_path",
    "write_state",
]
