"""A real OTLP receiver for the tests: Arize Phoenix, run from
``.otlp-receiver/`` (tests/run.sh installs it), read back from its REST API.

The ``phoenix`` fixture (tests/conftest.py) starts one per session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.external import PHOENIX, require
from tests.helpers import poll

Span = dict[str, Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@contextmanager
def running_phoenix(work: Path) -> Iterator[str]:
    """A Phoenix server on free ports, its data in ``work``; its base URL
    (OTLP/HTTP at ``<base>/v1/traces``)."""
    require("phoenix")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (work / "phoenix.log").open("wb")
    server = subprocess.Popen([str(PHOENIX), "serve"], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, (work / "phoenix.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    try:
        poll(healthy, 120, "Phoenix answering /healthz")
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def all_spans(base: str, trace_id: str | None = None) -> list[Span]:
    """Every span Phoenix holds (of ``trace_id`` only, when given)."""
    found: list[Span] = []
    cursor = None
    while True:
        query = "limit=1000" + (f"&cursor={cursor}" if cursor else "")
        page = get_json(f"{base}/v1/projects/default/spans?{query}")
        found += [s for s in page["data"] if trace_id in (None, s["context"]["trace_id"])]
        cursor = page.get("next_cursor")
        if not cursor:
            return found
