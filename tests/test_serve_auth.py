"""The front doors' rules without Ray: where a token comes from and where it is
kept, the home's lock (one ``coterie serve`` per home), the state file that
the other commands find it by — written privately, gone when the server
stops however it stops — and the bearer check both doors share.

``coterie serve`` runs here as :func:`run_server` over a stand-in runtime
(the server's own life needs nothing of a real one), in-process and as a
process that is interrupted or killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.connectors.base import ConnectorInfo, OutboundMessage
from coterie.runtime.errors import ConfigError, ServeError
from coterie.runtime.serve.auth import (
    MCP_DOOR,
    SERVE_DOOR,
    bearer_matches,
    door_auth,
    plain_http_warning,
    request_authorized,
    token_path,
    write_private,
)
from coterie.runtime.serve.client import find_server
from coterie.runtime.serve.discovery import (
    ServerState,
    lock_path,
    read_state,
    served_state,
    state_path,
    write_state,
)
from coterie.runtime.serve.server import StartedRuntime, run_server

ROOT = Path(__file__).resolve().parent.parent


class StandIn:
    """Enough of a runtime for the server to live: the connectors' outbox,
    which waits and has nothing."""

    async def connectors_register_async(self, infos: list[ConnectorInfo]) -> None:
        return None

    async def connectors_unregister_async(self, ids: list[str]) -> None:
        return None

    async def connector_take_async(self, connector_id: str, wait: float) -> list[OutboundMessage]:
        await asyncio.sleep(wait)
        return []


async def start_stand_in() -> StartedRuntime:
    async def close() -> None:
        return None

    return StartedRuntime(door=StandIn(), close=close)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(home: Path, **options: Any) -> AsyncIterator[ServerState]:
    """``coterie serve``'s server for ``home`` over the stand-in; its state."""
    ready, stop = asyncio.Event(), asyncio.Event()
    options.setdefault("environ", {})
    task = asyncio.create_task(
        run_server(
            home,
            start_stand_in,
            port=0,
            ready=ready,
            stop=stop,
            announce=lambda _m: None,
            **options,
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises why it did not start
    state = read_state(home)
    assert state is not None
    try:
        yield state
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def test_a_generated_token_is_kept_across_restarts(tmp_path: Path) -> None:
    async with serving(tmp_path) as first:
        pass
    async with serving(tmp_path) as second:
        pass
    # A client given the token (a bookmarked page, an editor's config) keeps working.
    assert second.token == first.token and len(first.token) >= 32
    kept = token_path(tmp_path, SERVE_DOOR)
    assert kept.read_text().strip() == first.token
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # The environment, or a file the user names, comes first.
    async with serving(tmp_path, environ={"COTERIE_SERVE_TOKEN": "from-the-env-0123456789"}) as s:
        assert s.token == "from-the-env-0123456789"
    given = tmp_path / "given.token"
    write_private(given, "from-a-file-0123456789\n")
    async with serving(tmp_path, token_file=given) as s:
        assert s.token == "from-a-file-0123456789"
    with pytest.raises(ConfigError, match=r"\$COTERIE_SERVE_TOKEN does not hold a usable token"):
        async with serving(tmp_path, environ={"COTERIE_SERVE_TOKEN": "short"}):
            pass


async def test_a_second_server_for_the_home_is_refused_before_it_binds(tmp_path: Path) -> None:
    async with serving(tmp_path) as first:
        with pytest.raises(ServeError, match=f"coterie serve already runs for {tmp_path}") as no:
            async with serving(tmp_path):
                pass
        assert f"(pid {os.getpid()}) at {first.url}" in str(no.value)
        # The first one's state file is untouched, and it is still the one found.
        assert read_state(tmp_path) == first
        client = await asyncio.to_thread(find_server, tmp_path)
        assert client is not None and client.state == first
    # Once it stopped, its state file is gone and the home can be served again.
    assert not state_path(tmp_path).exists()
    async with serving(tmp_path) as again:
        assert read_state(tmp_path) == again and again.token == first.token


def test_a_state_file_is_private_from_its_first_byte(tmp_path: Path) -> None:
    # A world-readable leftover where an earlier writer put its temporary file,
    # and an old state file open to everyone: neither lends its mode.
    for leftover in (tmp_path / "serve.tmp", state_path(tmp_path)):
        leftover.write_text("{}")
        leftover.chmod(0o644)
    state = ServerState(url="http://127.0.0.1:1", pid=os.getpid(), token="t" * 32)
    old_umask = os.umask(0)
    try:
        write_state(tmp_path, state)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(state_path(tmp_path).stat().st_mode) == 0o600
    assert read_state(tmp_path) == state
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".serve.json")]


def test_two_starts_generating_a_token_at_once_end_up_with_one(tmp_path: Path) -> None:
    one = door_auth(tmp_path, MCP_DOOR, env_var="NONE", host="127.0.0.1", environ={})
    two = door_auth(tmp_path, MCP_DOOR, env_var="NONE", host="127.0.0.1", environ={})
    assert one.token != two.token and one.write_to == two.write_to
    assert one.publish().token == one.token
    # The second adopts the first's token instead of overwriting the file.
    adopted = two.publish()
    assert adopted.token == one.token and "kept by another start" in adopted.source
    assert token_path(tmp_path, MCP_DOOR).read_text().strip() == one.token


def run_stand_in_process(home: Path) -> subprocess.Popen[str]:
    """``coterie serve``'s server over the stand-in, in a process of its own."""
    code = (
        "import asyncio, sys; from pathlib import Path; "
        "from coterie.runtime.serve.server import run_server; "
        "from tests.test_serve_auth import start_stand_in; "
        "asyncio.run(run_server(Path(sys.argv[1]), start_stand_in, port=0, environ={}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(home)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while read_state(home) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not start: {proc.communicate()[0]}")
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_state_file_goes_when_the_server_is_stopped(tmp_path: Path, sig: int) -> None:
    proc = run_stand_in_process(tmp_path)
    state = read_state(tmp_path)
    assert state is not None and state.pid == proc.pid
    assert find_server(tmp_path) is not None
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert not state_path(tmp_path).exists()
    assert find_server(tmp_path) is None


def test_a_killed_servers_state_file_is_ignored_and_removed(tmp_path: Path) -> None:
    proc = run_stand_in_process(tmp_path)
    proc.kill()
    proc.wait(30)
    assert state_path(tmp_path).exists()  # nobody removed it: it was killed
    assert find_server(tmp_path) is None
    assert not state_path(tmp_path).exists()  # the reader did
    # A state file naming a live process (its pid reused) that holds no lock
    # is a dead server's too.
    write_state(tmp_path, ServerState(url="http://127.0.0.1:9", pid=os.getpid(), token="t" * 32))
    assert lock_path(tmp_path).exists() and served_state(tmp_path) is None
    assert not state_path(tmp_path).exists()


def test_the_bearer_check_and_the_loopback_rules() -> None:
    token = "the-token-0123456789"
    assert bearer_matches(f"Bearer {token}", token)
    assert bearer_matches(f"bearer  {token} ".encode(), token)
    for wrong in ("", "Bearer", f"Basic {token}", f"Bearer {token}x", f"Bearer{token}"):
        assert not bearer_matches(wrong, token), wrong
    # serve.loopback_without_token: loopback peers only, and only when on.
    assert request_authorized("", "127.0.0.1", token, loopback_without_token=True)
    assert request_authorized("", "::1", token, loopback_without_token=True)
    assert not request_authorized("", "127.0.0.1", token)
    assert not request_authorized("", "10.0.0.2", token, loopback_without_token=True)
    # --no-auth binds loopback only; plain HTTP beyond it is said out loud.
    with pytest.raises(ConfigError, match=r"--no-auth is refused on --host 0\.0\.0\.0"):
        door_auth(Path("/nonexistent"), MCP_DOOR, env_var="X", host="0.0.0.0", no_auth=True)
    assert plain_http_warning("serve", "localhost") is None
    warning = plain_http_warning("serve", "0.0.0.0")
    assert warning is not None and "unencrypted" in warning
