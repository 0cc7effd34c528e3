"""Runtime overhead per turn: through the actors vs the same loop in-process.

Three scripted personas (instant model): one answers with plain text, one
makes two concurrent tool calls and then answers, one does the same under six
permission rules (each call checked before it runs). Each is driven for N sequential
turns in-process (the floor: PersonaRuntime called directly) and through the
router and persona actors on a local Ray, in the same run. Also reports the
idle PersonaActor's memory (USS).

The overhead (actors minus in-process) holds Ray's own round trip. Its floor,
measured in the same run: a bare async actor that hands back the envelope's
JSON, called as ``Runtime.ask`` calls a persona (from the caller's thread
through a background event loop awaiting the call). "Coterie's share" is the
overhead minus that floor: the persona actor's audit rows, spool and metrics,
the envelope and reply (de)serialization, the directory's lookup.

A second table is tracing's cost (docs/watching.md): the two-tool turn
in-process with tracing off (the floor: what a turn costs without it), on
with an exporter that drops every span, and on exporting over OTLP/HTTP to a
local receiver (``--otlp URL``, else the Phoenix that tests/run.sh installs
in .otlp-receiver/, started here), in alternating rounds.

    python benchmarks/turn_overhead.py [--turns 500] [--otlp http://host:port/v1/traces]

Targets: at most 3 ms p50 above the floor; an idle persona at most 70 MiB USS;
tracing off costs nothing measurable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import ray
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coterie import Runtime  # noqa: E402
from coterie.runtime import tracing  # noqa: E402
from coterie.runtime.config import TracingSettings, load_persona  # noqa: E402
from coterie.runtime.messages import MessageEnvelope  # noqa: E402
from coterie.runtime.models import build_model  # noqa: E402
from coterie.runtime.persona import PersonaRuntime  # noqa: E402
from coterie.tools import builtin_registry  # noqa: E402

PERSONAS = {
    "bench-plain": {"model": {"provider": "scripted", "default": "pong"}},
    "bench-tools": {
        "model": {
            "provider": "scripted",
            "rules": [
                {
                    "when": {"turn": 1},
                    "tool_calls": [
                        {"name": "clock", "arguments": {}},
                        {"name": "todo_read", "arguments": {}},
                    ],
                },
                {"when": {"turn": 2}, "text": "done: {last_tool_result}"},
            ],
        }
    },
}
# The same two calls, each checked by permission rules first (the gate reads
# the calls' effects and the rules; both end in allow).
PERSONAS["bench-rules"] = {
    **PERSONAS["bench-tools"],
    "permissions": {
        "rules": [
            {"tool": "shell_exec", "match": "rm -rf", "action": "deny"},
            {"tool": "shell_exec", "match": "git push", "action": "ask"},
            {"tool": ["file_write", "file_edit"], "match": "!{workspace}", "action": "ask"},
            {"tool": "web_fetch", "match": "10.0.0.0/8", "action": "deny"},
            {"tool": "clock", "action": "allow"},
            {"tool": "todo_*", "match": "*", "action": "allow"},
        ]
    },
}
IDLE = "bench-idle"
CONVERSATIONS = 10


def persona_uss(rt: Runtime, persona: str) -> float:
    """Unique set size (MiB) of a persona's actor process."""
    handle = ray.get_actor(f"coterie:{rt.id}:persona:{persona}", namespace=rt.namespace)
    pid = ray.get(handle.stats.remote())["pid"]
    return float(psutil.Process(pid).memory_full_info().uss / 2**20)


def write_home(home: Path) -> None:
    for name, body in [*PERSONAS.items(), (IDLE, PERSONAS["bench-plain"])]:
        path = home / "personas" / name
        path.mkdir(parents=True)
        (path / "persona.yaml").write_text(yaml.safe_dump(body))
        (path / "SOUL.md").write_text("Benchmark persona.")


def envelope(persona: str, i: int) -> MessageEnvelope:
    return MessageEnvelope(
        recipient=persona, conversation_id=f"{persona}:bench:{i % CONVERSATIONS}", text=f"ping {i}"
    )


@ray.remote(num_cpus=0)
class Echo:
    """Ray's floor of one ask: an async actor returning what it was sent."""

    async def handle(self, data: str) -> str:
        return data


def ray_floor(turns: int) -> list[float]:
    """Round trips (ms) to :class:`Echo` with an envelope's JSON, made as
    ``Runtime.ask`` makes them: the calling thread hands a coroutine to a
    background event loop, which awaits the actor call."""
    echo = Echo.remote()  # type: ignore[attr-defined]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def call(data: str) -> str:
        reply: str = await echo.handle.remote(data)
        return reply

    try:
        samples = []
        for i in range(20 + turns):
            data = envelope("bench-plain", i).model_dump_json()
            t0 = time.perf_counter()
            asyncio.run_coroutine_threadsafe(call(data), loop).result()
            if i >= 20:  # after a warm-up, as the personas get
                samples.append((time.perf_counter() - t0) * 1000)
        return samples
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        ray.kill(echo)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def in_process(home: Path, persona: str, turns: int) -> list[float]:
    loaded = load_persona(home, persona)
    rt = PersonaRuntime(loaded, model=build_model(loaded.config.model), registry=builtin_registry())
    for i in range(20):  # warm-up
        await rt.handle(envelope(persona, i))
    samples = []
    for i in range(turns):
        env = envelope(persona, i)
        t0 = time.perf_counter()
        reply = await rt.handle(env)
        samples.append((time.perf_counter() - t0) * 1000)
        assert reply.status == "ok", reply
    return samples


def through_actors(rt: Runtime, persona: str, turns: int) -> list[float]:
    for i in range(20):
        env = envelope(persona, i)
        rt.ask(persona, env.text, conversation_id=env.conversation_id)
    samples = []
    for i in range(turns):
        env = envelope(persona, i)
        t0 = time.perf_counter()
        reply = rt.ask(persona, env.text, conversation_id=env.conversation_id)
        samples.append((time.perf_counter() - t0) * 1000)
        assert reply.status == "ok", reply
    return samples


@contextmanager
def local_phoenix() -> Iterator[str | None]:
    """The traces URL of a Phoenix started from .otlp-receiver/ (None without one)."""
    phoenix = ROOT / ".otlp-receiver/bin/phoenix"
    if not phoenix.is_file():
        yield None
        return
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as work:
        env = {
            **os.environ,
            "PHOENIX_WORKING_DIR": work,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(ports[0]),
            "PHOENIX_GRPC_PORT": str(ports[1]),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        server = subprocess.Popen(
            [str(phoenix), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        base = f"http://127.0.0.1:{ports[0]}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("Phoenix did not start") from None
                    time.sleep(0.5)
            yield f"{base}/v1/traces"
        finally:
            server.terminate()
            server.wait(timeout=20)


def tracer_for(mode: str, otlp: str | None) -> tracing.Tracer:
    if mode == "off":
        return tracing.Tracer()
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from coterie.runtime.tracing.otel import OtelTracer

    class Dropping(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    settings = TracingSettings(enabled=True, endpoint=otlp or "http://127.0.0.1:9/v1/traces")
    exporter = Dropping() if mode == "no-op exporter" else None
    return OtelTracer(settings, process="bench", attributes={}, exporter=exporter)


def tracing_cost(
    home: Path, turns: int, otlp: str | None, rounds: int = 3
) -> dict[str, list[float]]:
    """In-process two-tool turns per tracing mode, the modes alternating by round."""
    modes = ["off", "no-op exporter"] + (["OTLP to a local receiver"] if otlp else [])
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            tracer = tracer_for(mode, otlp)
            old = tracing.install(tracer)
            try:
                samples[mode] += asyncio.run(in_process(home, "bench-tools", turns))
            finally:
                tracing.install(old)
                tracer.shutdown()  # exports what is batched (outside the timed turns)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--otlp", help="an OTLP/HTTP traces URL (default: a local Phoenix)")
    args = parser.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 160)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        write_home(home)
        floors = {p: asyncio.run(in_process(home, p, args.turns)) for p in PERSONAS}
        with console.status("starting Ray"):
            rt = Runtime.start(home=home, num_cpus=2)
        try:
            actor = {p: through_actors(rt, p, args.turns) for p in PERSONAS}
            echo = ray_floor(args.turns)
            # A persona that answered one message, next to the two that hold
            # the conversations of the whole run.
            rt.ask(IDLE, "hello")
            time.sleep(2.0)  # let every persona go idle
            uss = {p: persona_uss(rt, p) for p in [*PERSONAS, IDLE]}
        finally:
            rt.shutdown()

    table = Table(title=f"turn overhead, {args.turns} sequential turns each (ms)")
    for col in [
        "case",
        "in-process p50",
        "in-process p99",
        "actors p50",
        "actors p99",
        "overhead p50",
        "ratio p50",
        "coterie's share p50",
        "persona USS MiB",
    ]:
        table.add_column(col, justify="right")
    labels = {
        "bench-plain": "no tools",
        "bench-tools": "two concurrent tools",
        "bench-rules": "the same, 6 permission rules",
    }
    e50 = statistics.median(echo)
    for persona in PERSONAS:
        f50, f99 = statistics.median(floors[persona]), pct(floors[persona], 0.99)
        a50, a99 = statistics.median(actor[persona]), pct(actor[persona], 0.99)
        table.add_row(
            labels[persona],
            f"{f50:.3f}",
            f"{f99:.3f}",
            f"{a50:.3f}",
            f"{a99:.3f}",
            f"{a50 - f50:.3f}",
            f"{a50 / f50:.1f}x",
            f"{a50 - f50 - e50:.3f}",
            f"{uss[persona]:.1f}",
        )
    table.add_row(
        "Ray's floor: an echo actor, called as ask calls",
        "",
        "",
        f"{e50:.3f}",
        f"{pct(echo, 0.99):.3f}",
        f"{e50:.3f}",
        "",
        "0",
        "",
    )
    table.add_row("idle persona, one turn", *[""] * 7, f"{uss[IDLE]:.1f}")
    console.print(table)
    console.print(
        "targets: overhead p50 <= 1.5 ms; idle persona USS <= 70 MiB. The first two rows' "
        f"USS includes the {args.turns + 20} turns of history those personas hold. "
        "Ray's floor is its own share of every overhead: coterie's share is what is left."
    )

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        write_home(home)
        with console.status("tracing: starting a receiver, then the rounds"):
            if args.otlp:
                cost = tracing_cost(home, args.turns, args.otlp)
            else:
                with local_phoenix() as url:
                    cost = tracing_cost(home, args.turns, url)
    table = Table(
        title=f"tracing cost, two concurrent tools in-process, 3 x {args.turns} turns each (ms)"
    )
    for col in ["tracing", "p50", "p99", "p50 - off", "ratio p50"]:
        table.add_column(col, justify="right")
    off = statistics.median(cost["off"])
    for mode, values in cost.items():
        p50 = statistics.median(values)
        table.add_row(
            mode, f"{p50:.3f}", f"{pct(values, 0.99):.3f}", f"{p50 - off:.3f}", f"{p50 / off:.2f}x"
        )
    console.print(table)
    if len(cost) < 3:
        console.print(
            "no OTLP receiver: give --otlp URL, or run tests/run.sh --setup-only (Phoenix)"
        )
    console.print(
        "off is the floor: with tracing off a span is the shared no-op one and nothing of "
        "the OpenTelemetry SDK is imported (tests/test_tracing.py checks that)."
    )


if __name__ == "__main__":
    main()
