"""The reference "everything" MCP server (npm) over streamable HTTP, for the tests.

Installed by .ci/run into ``.mcp-servers/``; started here as a child process
on a free port of 127.0.0.1.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVERYTHING = (
    REPO / ".mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
NODE = shutil.which("node")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_everything_http(
    port: int, env: dict[str, str], *, bound: float = 30.0
) -> subprocess.Popen[bytes]:
    """Start the server on ``port`` and wait (at most ``bound`` s) until it listens."""
    assert NODE is not None, "node is not installed"
    proc = subprocess.Popen(
        [NODE, str(EVERYTHING), "streamableHttp"],
        env={**env, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + bound
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("server-everything did not listen") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)
