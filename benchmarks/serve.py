"""The front door: what going through ``coterie serve`` costs.

Starts a real ``coterie serve`` (its own process and Ray) on a scratch home
with two scripted personas (``echo`` answers at once; ``streamer`` streams
a 400-character answer in 8-character pieces, 2 ms apart), then measures,
each figure beside its floor measured in the same run:

1. ``coterie ask echo hi`` through the server, the whole command (a new
   Python process), beside the same interpreter importing ``coterie.cli``
   and exiting: what the command costs above starting Python.
2. ``POST /v1/personas/echo/messages`` (wait for the reply) beside
   ``GET /v1/health`` on the same server (HTTP, auth, JSON, no runtime),
   and beside ``Runtime.ask`` from a driver that joined the server's Ray
   cluster and talks to the same persona actor (no HTTP).
3. ``POST /v1/chat/completions`` through the ``openai`` SDK beside the
   plain message route.
4. A streamed message (SSE): time to the first ``text_delta`` beside the
   time to the whole reply of the same request.

    python benchmarks/serve.py [--asks 10] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coterie.runtime.serve.client import ServerClient, find_server  # noqa: E402


def write_home(home: Path) -> None:
    for name, model in {
        "echo": {"provider": "scripted", "rules": [], "default": "hi back"},
        "streamer": {
            "provider": "scripted",
            "rules": [],
            "default": "x" * 400,
            "stream_chunk_chars": 8,
            "stream_delay_ms": 2,
        },
    }.items():
        path = home / "personas" / name
        path.mkdir(parents=True)
        (path / "persona.yaml").write_text(yaml.safe_dump({"model": model}))
        (path / "SOUL.md").write_text(f"You are {name}.")
    # The benchmark's own requests must not be rate limited.
    (home / "runtime.yaml").write_text(yaml.safe_dump({"serve": {"rate_per_minute": 100_000}}))


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asks", type=int, default=10, help="coterie ask runs")
    parser.add_argument("--requests", type=int, default=200, help="HTTP requests per figure")
    args = parser.parse_args()
    console = Console()
    home = Path(tempfile.mkdtemp(prefix="coterie-bench-serve-"))
    write_home(home)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["COTERIE_HOME"] = str(home)
    server = subprocess.Popen(
        [sys.executable, "-m", "coterie", "serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client: ServerClient | None = None
        while client is None:
            if server.poll() is not None:
                raise SystemExit("coterie serve did not start")
            time.sleep(0.5)
            client = find_server(home)
        rows = measure(client, home, env, args)
    finally:
        server.terminate()
        server.wait(120)
    table = Table(title=f"coterie serve ({os.cpu_count()} cores, load {os.getloadavg()[0]:.2f})")
    for col in ("figure", "coterie", "floor", "floor is", "ratio"):
        table.add_column(col)
    for figure, ours, floor, what in rows:
        table.add_row(
            figure, f"{ours * 1000:.1f} ms", f"{floor * 1000:.1f} ms", what, f"{ours / floor:.2f}×"
        )
    console.print(table)


def measure(
    client: ServerClient, home: Path, env: dict[str, str], args: argparse.Namespace
) -> list[tuple[str, float, float, str]]:
    rows: list[tuple[str, float, float, str]] = []
    client.post("/v1/personas/echo/messages", {"text": "warm up"})  # activate the persona

    def command(*argv: str) -> None:
        subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)

    ask = timed(lambda: command(sys.executable, "-m", "coterie", "ask", "echo", "hi"), args.asks)
    floor = timed(lambda: command(sys.executable, "-c", "import coterie.cli"), args.asks)
    rows.append(
        ("`coterie ask` through the server", p50(ask), p50(floor), "python importing coterie.cli")
    )

    post = timed(lambda: client.post("/v1/personas/echo/messages", {"text": "hi"}), args.requests)
    health = timed(lambda: client.get("/v1/health"), args.requests)
    rows.append(
        ("POST message, wait for the reply (p50)", p50(post), p50(health), "GET /v1/health")
    )

    state = client.state
    address = state.join_ray()  # before Ray is imported: the server's auth mode
    from coterie import Runtime

    rt = Runtime.start(home=home, address=address)  # joins: the server's actors
    rt.ask("echo", "warm up")
    direct = timed(lambda: rt.ask("echo", "hi"), args.requests)
    rt.shutdown()  # a joined runtime leaves the server's actors running
    rows.append(
        (
            "POST message, wait for the reply (p50)",
            p50(post),
            p50(direct),
            "Runtime.ask from a driver on its cluster",
        )
    )

    import openai

    sdk = openai.OpenAI(base_url=state.url + "/v1", api_key=state.token, max_retries=0)
    sdk.chat.completions.create(model="echo", messages=[{"role": "user", "content": "warm"}])
    completions = timed(
        lambda: sdk.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Coterie-Conversation": "bench-openai"},
        ),
        args.requests,
    )
    rows.append(
        (
            "/v1/chat/completions via the openai SDK (p50)",
            p50(completions),
            p50(post),
            "POST message",
        )
    )

    first, whole = [], []
    for _ in range(max(10, args.requests // 10)):
        t = time.perf_counter()
        got_first = None
        for event, _data in client.stream(
            "/v1/personas/streamer/messages", {"text": "go", "stream": True}
        ):
            if event == "text_delta" and got_first is None:
                got_first = time.perf_counter() - t
        whole.append(time.perf_counter() - t)
        first.append(got_first or whole[-1])
    rows.append(
        (
            "SSE: first text_delta (p50)",
            p50(first),
            p50(whole),
            "the whole streamed reply (50 pieces)",
        )
    )
    return rows


if __name__ == "__main__":
    main()
