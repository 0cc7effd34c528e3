"""What a long conversation and a persona's tools put in each request.

Three measurements, in-process (no Ray), each beside its baseline from the
same run:

1. **A 200-turn conversation**: tokens per request (mean, p95, max, as the
   model's own usage counts them) of one conversation whose model has a
   16,000-token window, with compaction (the default) and without it (the
   same persona with ``compaction.enabled: false`` and a window so large
   that nothing is cut). The user's messages and the model's answers have
   realistic lengths (~500 and ~900 characters).
2. **Tool definitions per request**, on a local Ray: each bundled persona
   (``configs/personas``, its model switched to an OpenAI-compatible local
   server that keeps every request body) and one allowing every built-in
   tool, with ``tools.catalogue: off`` and with the default (``auto``): the
   tools its first request carried, their JSON bytes as the OpenAI client
   sent them and their estimated tokens (3.5 characters a token), and the
   whole request's bytes.
3. **Persona CPU per turn** on Ray (the persona actor process's CPU time ÷
   sequential turns, the server answering at once) for the all-tools
   persona, catalogue off and on.

    python benchmarks/context.py [--turns 200] [--cpu-turns 300] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil
import ray
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.personas import KEY_ENV  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.actors import persona_actor_name  # noqa: E402
from coterie.runtime.config import RuntimeSettings, load_persona  # noqa: E402
from coterie.runtime.messages import Compacted, MessageEnvelope, ModelCalled  # noqa: E402
from coterie.runtime.models import build_model  # noqa: E402
from coterie.runtime.persona import PersonaRuntime  # noqa: E402
from coterie.runtime.services import NullAudit, Services  # noqa: E402
from coterie.runtime.usage.tokens import DEFAULT_CHARS_PER_TOKEN  # noqa: E402
from coterie.tools import builtin_registry  # noqa: E402
from tests.fakes.servers import FakeOpenAIServer  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 140)

WINDOW = 16_000
ANSWER = (
    "Here is what I found. The figures you asked about line up with last week's notes, "
    "with two exceptions worth a second look. "
) * 7  # ~900 characters
QUESTION = "Turn {n}: please look into item {n} of the list and tell me what changed. " * 6


def p95(values: list[int]) -> float:
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def write(home: Path, name: str, body: dict[str, Any]) -> None:
    path = home / "personas" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "persona.yaml").write_text(yaml.safe_dump(body), encoding="utf-8")
    (path / "SOUL.md").write_text(f"You are {name}, a careful assistant.", encoding="utf-8")


# -- 1. a long conversation --------------------------------------------------------


async def long_conversation(home: Path, name: str, turns: int) -> dict[str, Any]:
    persona = load_persona(home, name)
    audit = NullAudit()
    rt = PersonaRuntime(
        persona,
        model=build_model(persona.config.model),
        registry=builtin_registry(),
        services=Services(audit=audit),
    )
    conv = f"{name}:long"
    try:
        for n in range(1, turns + 1):
            text = QUESTION.format(n=n)
            if n == 1:
                text = "Remember: the door code is 4711. " + text
            reply = await rt.handle(
                MessageEnvelope(recipient=name, conversation_id=conv, text=text)
            )
            if reply.status != "ok":
                raise RuntimeError(f"turn {n} failed: {reply.error}")
    finally:
        await rt.aclose()
    calls = [e for e in audit.events if isinstance(e, ModelCalled) and e.purpose == "turn"]
    sizes = [c.input_tokens for c in calls]
    compactions = [e for e in audit.events if isinstance(e, Compacted)]
    return {
        "requests": len(sizes),
        "mean": statistics.fmean(sizes),
        "p95": p95(sizes),
        "max": max(sizes),
        "compactions": len(compactions),
        "summary_calls": sum(
            1 for e in audit.events if isinstance(e, ModelCalled) and e.purpose == "compaction"
        ),
    }


def conversation_personas(home: Path) -> None:
    model = {"provider": "scripted", "default": ANSWER, "max_tokens": 400}
    write(
        home,
        "long-compacted",
        {"model": {**model, "context_window": WINDOW}, "tools": {"allow": ["clock"]}},
    )
    write(
        home,
        "long-uncut",
        {
            "model": {**model, "context_window": 10_000_000},
            "tools": {"allow": ["clock"]},
            "compaction": {"enabled": False},
        },
    )


# -- 2 and 3: on Ray, through a local OpenAI-compatible server -----------------------


class ServerThread:
    """The OpenAI-compatible fake server (it keeps each request's body) on
    its own event loop, in a thread: the Runtime API blocks this one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = FakeOpenAIServer()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def openai_body(source: dict[str, Any], base_url: str, model: str, mode: str) -> dict[str, Any]:
    """A persona.yaml body answering through the server, ``tools.catalogue: mode``."""
    body = {k: v for k, v in source.items() if k not in ("model", "compaction")}
    body["model"] = {
        "provider": "openai",
        "name": model,
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_retries": 0,
    }
    body["tools"] = {**source.get("tools", {}), "catalogue": mode}
    return body


def wire_home(home: Path, base_url: str) -> list[str]:
    """``<bundled persona>-off`` / ``-auto`` (and ``all-tools-…``) answering
    through the server; the bundled ones keep their tools, skills and SOUL."""
    bundled = ROOT / "configs" / "personas"
    sources: dict[str, tuple[dict[str, Any], Path | None]] = {"all-tools": ({}, None)}
    for path in sorted(bundled.iterdir()):
        if (path / "persona.yaml").is_file():
            body = yaml.safe_load((path / "persona.yaml").read_text(encoding="utf-8"))
            sources[path.name] = (body, path)
    names = []
    for name, (body, path) in sources.items():
        for mode in ("off", "auto"):
            variant = f"{name}-{mode}"
            if path is not None:
                shutil.copytree(path, home / "personas" / variant)
            write(home, variant, openai_body(body, base_url, variant, mode))
            names.append(variant)
    return names


def on_ray(cpu_turns: int) -> tuple[list[tuple[str, int, int, int, int, int, int]], float, float]:
    """Tool counts and bytes of each persona's first request (off, auto),
    and the all-tools persona's CPU per turn (off, on)."""
    os.environ[KEY_ENV] = "sk-bench-dummy"  # persona actors inherit the driver's env
    os.environ.pop("RAY_ADDRESS", None)
    running = ServerThread()
    server = running.server
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="coterie-context-ray-") as tmp:
            home = Path(tmp)
            names = wire_home(home, server.base_url)
            write(home, "all-tools-on", openai_body({}, server.base_url, "all-tools-on", "on"))
            rt = Runtime.start(home=home, num_cpus=2, settings=RuntimeSettings(idle_timeout=None))
            try:
                for name in names:
                    reply = rt.ask(name, "hello", conversation_id=f"{name}:first")
                    if reply.status != "ok":
                        raise RuntimeError(f"{name}: {reply.error}")
                first: dict[str, dict[str, Any]] = {}
                for body in server.requests:
                    first.setdefault(str(body.get("model")), body)

                def sizes(variant: str) -> tuple[int, int, int]:
                    body = first[variant]
                    tools = body.get("tools") or []
                    return len(tools), len(json.dumps(tools).encode()), len(json.dumps(body))

                for name in dict.fromkeys(n.rsplit("-", 1)[0] for n in names):
                    off, auto = sizes(f"{name}-off"), sizes(f"{name}-auto")
                    rows.append((name, *off, *auto))
                cpu = {
                    mode: persona_cpu(rt, f"all-tools-{mode}", cpu_turns) for mode in ("off", "on")
                }
            finally:
                rt.shutdown()
    finally:
        running.close()
    return rows, cpu["off"], cpu["on"]


def persona_cpu(rt: Runtime, name: str, turns: int) -> float:
    """CPU milliseconds per turn of ``name``'s actor process (sequential turns)."""
    for i in range(10):  # warm: the SDK imported, connections open
        rt.ask(name, "warm up", conversation_id=f"{name}:w{i}")
    handle = ray.get_actor(persona_actor_name(rt.id, name), namespace=rt.namespace)
    proc = psutil.Process(ray.get(handle.stats.remote())["pid"])
    before = sum(proc.cpu_times()[:2])
    for i in range(turns):
        reply = rt.ask(name, f"ping {i}", conversation_id=f"{name}:c{i % 10}")
        if reply.status != "ok":
            raise RuntimeError(f"{name}: {reply.error}")
    return (sum(proc.cpu_times()[:2]) - before) / turns * 1000


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


async def conversations(turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="coterie-context-") as tmp:
        home = Path(tmp)
        conversation_personas(home)
        compacted = await long_conversation(home, "long-compacted", turns)
        uncut = await long_conversation(home, "long-uncut", turns)
    table = Table(
        title=f"Tokens per request over a {turns}-turn conversation "
        f"(window {WINDOW:,} tokens; the model's usage counts)"
    )
    for column in ("", "requests", "mean", "p95", "max", "compactions", "summary calls"):
        table.add_column(column, justify="left" if not column else "right")
    for label, r in (("with compaction", compacted), ("without (floor: nothing cut)", uncut)):
        table.add_row(
            label,
            str(r["requests"]),
            f"{r['mean']:,.0f}",
            f"{r['p95']:,.0f}",
            f"{r['max']:,}",
            str(r["compactions"]),
            str(r["summary_calls"]),
        )
    table.add_row(
        "ratio",
        "",
        ratio(compacted["mean"], uncut["mean"]),
        ratio(compacted["p95"], uncut["p95"]),
        ratio(compacted["max"], uncut["max"]),
        "",
        "",
    )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="turns of the long conversation")
    parser.add_argument("--cpu-turns", type=int, default=300, help="turns timed for CPU")
    parser.add_argument("--quick", action="store_true", help="60 turns, 100 CPU turns")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.cpu_turns = 60, 100
    asyncio.run(conversations(args.turns))
    rows, off, on = on_ray(args.cpu_turns)
    table = Table(
        title="A persona's first request on Ray, catalogue off vs auto (JSON bytes the "
        f"OpenAI client sent; tokens estimated at {DEFAULT_CHARS_PER_TOKEN} chars each)"
    )
    for column in (
        "persona",
        "tools off",
        "tool bytes off",
        "≈tokens off",
        "tools auto",
        "tool bytes auto",
        "≈tokens auto",
        "auto / off",
        "request bytes off → auto",
    ):
        table.add_column(column, justify="left" if column == "persona" else "right")
    for name, n_off, b_off, r_off, n_auto, b_auto, r_auto in rows:
        table.add_row(
            name,
            str(n_off),
            f"{b_off:,}",
            f"{b_off / DEFAULT_CHARS_PER_TOKEN:,.0f}",
            str(n_auto),
            f"{b_auto:,}",
            f"{b_auto / DEFAULT_CHARS_PER_TOKEN:,.0f}",
            ratio(b_auto, b_off),
            f"{r_off:,} → {r_auto:,}",
        )
    console.print(table)

    table = Table(
        title=f"Persona process CPU per turn on Ray, all tools allowed ({args.cpu_turns} "
        "sequential turns, instant model server)"
    )
    for column in ("catalogue", "CPU ms / turn", "vs off"):
        table.add_column(column, justify="left" if column == "catalogue" else "right")
    table.add_row("off (floor: every definition on every request)", f"{off:.3f}", "1.00×")
    table.add_row("on", f"{on:.3f}", ratio(on, off))
    console.print(table)


if __name__ == "__main__":
    main()
