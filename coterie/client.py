"""Finding and calling a running ``coterie serve`` from the command line.

``coterie serve`` writes ``<home>/serve.json`` (its URL, pid, token and Ray
address; readable by this user only) once it is up and removes it when it
stops. The other commands read it and, when the server answers its health
check, go through it over HTTP — no Ray start, well under a second. Only the
standard library is used here, so that a command that goes through the
server imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "serve.json"
#: Seconds the health check of a found server may take.
HEALTH_TIMEOUT = 2.0


class ServerError(Exception):
    """The server answered with an error (``kind`` and ``status`` from its body)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


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


def write_state(home: Path, state: ServerState) -> None:
    """Write the state file atomically, readable by this user only."""
    path = state_path(home)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(state.__dict__, out)
    os.replace(tmp, path)


def remove_state(home: Path, pid: int) -> None:
    """Remove the state file if it is this server's (pid)."""
    state = read_state(home)
    if state is not None and state.pid == pid:
        state_path(home).unlink(missing_ok=True)


def read_state(home: Path) -> ServerState | None:
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


def find_server(home: Path) -> ServerClient | None:
    """A client of the server running for ``home``, or None when none answers."""
    state = read_state(home)
    if state is None or not _alive(state.pid):
        return None
    client = ServerClient(state)
    try:
        client.get("/v1/health", timeout=HEALTH_TIMEOUT)
    except (OSError, ServerError):
        return None
    return client


class ServerClient:
    """Calls the server's HTTP API (JSON in and out, SSE for streams)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def _request(self, method: str, path: str, body: Any = None, *, accept: str = "") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.state.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.state.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if accept:
            request.add_header("Accept", accept)
        return request

    def _open(self, request: urllib.request.Request, timeout: float | None) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read() or b"{}").get("error", {})
            except ValueError:
                error = {}
            raise ServerError(
                exc.code, str(error.get("type", "http_error")), str(error.get("message", exc))
            ) from None

    def get(self, path: str, *, timeout: float | None = 30.0) -> Any:
        with self._open(self._request("GET", path), timeout) as response:
            return json.loads(response.read())

    def post(self, path: str, body: Any, *, timeout: float | None = None) -> Any:
        with self._open(self._request("POST", path, body), timeout) as response:
            return json.loads(response.read())

    def stream(self, path: str, body: Any) -> Iterator[tuple[str, Any]]:
        """POST ``body`` and yield each server-sent event as ``(event, data)``."""
        request = self._request("POST", path, body, accept="text/event-stream")
        with self._open(request, None) as response:
            event, data = "message", ""
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, json.loads(data)
                    event, data = "message", ""
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()


__all__ = [
    "ServerClient",
    "ServerError",
    "ServerState",
    "find_server",
    "read_state",
    "remove_state",
    "state_path",
    "write_state",
]
