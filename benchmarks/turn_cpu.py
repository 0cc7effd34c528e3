"""Where one turn's CPU goes: the turn itself, the SDK, and the Ray shell.

One warm persona, an instant model, ``--in-flight`` turns at a time, no
other load of ours: the CPU per turn of the process doing the work, each
beside the floor that does the same minus coterie, measured in the same run:

* **in-process** (this process): ``PersonaRuntime.handle`` through the
  OpenAI provider to the fake OpenAI server (in its own process) beside the
  SDK call alone, made as the provider makes it (``benchmarks/scale.py``'s
  SDK floor); and a scripted-model persona (no SDK, no HTTP), which is the
  turn's own machinery: audit rows and their spool lines, tool filters,
  history, the reply;
* **through Ray** (the actor's process): the same OpenAI persona as a
  Persona actor called through ``Runtime.ask_async`` beside the SDK-floor
  actor called with ``.remote()``; the scripted persona beside a bare async
  actor whose method returns its argument (Ray's own cost of one call);
  and of each actor's CPU, what its cyclic garbage collector took (timed
  in the actor's process through ``gc.callbacks``).

Turns go to 100 conversations in turn, so each persona's histories grow
over the run (to about ``--rounds x --turns / 100`` exchanges), as in use; the
SDK floor sends one message.

``scale.py`` shows what these costs become with 100 personas on two cores;
this script says which part of them is whose.

    python benchmarks/turn_cpu.py [--turns 2000] [--in-flight 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import ray
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._procs import cpu_of  # noqa: E402
from benchmarks.personas import (  # noqa: E402
    KEY_ENV,
    ServerProcess,
    openai_persona,
    persona_pids,
    write_persona,
)
from benchmarks.scale import SdkActor, SdkRemote  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.runtime.audit import AuditBuffer  # noqa: E402
from coterie.runtime.config import RuntimeSettings, load_persona  # noqa: E402
from coterie.runtime.messages import ConversationRecord, MessageEnvelope  # noqa: E402
from coterie.runtime.models import build_model  # noqa: E402
from coterie.runtime.persona import PersonaHost, PersonaRuntime  # noqa: E402
from coterie.runtime.services import Services  # noqa: E402
from coterie.tools import builtin_registry  # noqa: E402

SCRIPTED = {"description": "Answers at once.", "model": {"provider": "scripted", "default": "pong"}}
NAMES = {"openai": "cpu-openai", "scripted": "cpu-scripted"}


class Echo:
    """Ray's floor for one call: an async method that returns its argument."""

    async def call(self, data: str) -> str:
        return data

    def pid(self) -> int:
        return os.getpid()


EchoRemote = ray.remote(num_cpus=0)(Echo)


async def waves(call: Callable[[int], Awaitable[Any]], turns: int, in_flight: int) -> None:
    for start in range(0, turns, in_flight):
        await asyncio.gather(*(call(start + j) for j in range(min(in_flight, turns - start))))


async def _no_collector() -> float:
    return 0.0


async def per_turn(
    proc: psutil.Process,
    call: Callable[[int], Awaitable[Any]],
    args: argparse.Namespace,
    gc_seconds: Callable[[], Awaitable[float]] = _no_collector,
) -> tuple[float, float]:
    """Medians over ``--rounds``, after a warm-up, of ``proc``'s CPU per turn
    and of the part of it ``gc_seconds`` (the process's cyclic-collector CPU
    so far) counts, both in ms."""
    await waves(call, 100, args.in_flight)
    cpu, collector = [], []
    for _ in range(args.rounds):
        before, gc_before = cpu_of(proc), await gc_seconds()
        await waves(call, args.turns, args.in_flight)
        cpu.append(1000 * (cpu_of(proc) - before) / args.turns)
        collector.append(1000 * (await gc_seconds() - gc_before) / args.turns)
    return statistics.median(cpu), statistics.median(collector)


def _time_collections(self: object) -> None:
    """Run in an actor's process (by value, from this script): keep the CPU
    its cyclic collections take, in ``gc._bench_seconds``."""
    import gc
    import time

    if hasattr(gc, "_bench_seconds"):
        return
    gc._bench_seconds = 0.0  # type: ignore[attr-defined]
    started = [0.0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            gc._bench_seconds += time.thread_time() - started[0]  # type: ignore[attr-defined]

    gc.callbacks.append(timer)


def _collections_so_far(self: object) -> float:
    import gc

    return float(gc._bench_seconds)  # type: ignore[attr-defined]


def collector_of(actor: Any) -> Callable[[], Awaitable[float]]:
    """The CPU seconds ``actor``'s process has spent in its cyclic collector
    since this was first called for it."""
    ray.get(actor.__ray_call__.remote(_time_collections))

    async def seconds() -> float:
        return float(await actor.__ray_call__.remote(_collections_so_far))

    return seconds


def envelope(name: str, i: int) -> MessageEnvelope:
    return MessageEnvelope(recipient=name, conversation_id=f"c{i % 100}", text=f"ping {i}")


def local_persona(
    home: Path, name: str, spool: str, host: PersonaHost | None = None
) -> tuple[PersonaRuntime, AuditBuffer]:
    """The persona in this process, its audit rows spooled and then dropped."""
    loaded = load_persona(home, name)

    async def discard(rows: list[dict[str, Any]]) -> None:
        return None

    buffer = AuditBuffer(discard, replay=discard, spool_path=home / f"{spool}.spool.jsonl")
    rt = PersonaRuntime(
        loaded,
        model=build_model(loaded.config.model),
        registry=builtin_registry(),
        services=Services(audit=buffer),
        host=host,
    )
    return rt, buffer


async def in_process(home: Path, srv: ServerProcess, args: argparse.Namespace) -> dict[str, float]:
    me = psutil.Process()
    out: dict[str, float] = {}
    for kind, name in NAMES.items():
        rt, buffer = local_persona(home, name, name)

        async def turn(i: int, rt: PersonaRuntime = rt, name: str = name) -> None:
            reply = await rt.handle(envelope(name, i))
            if reply.status != "ok":
                raise RuntimeError(f"{name}: {reply.status}: {reply.text}")

        out[kind], _ = await per_turn(me, turn, args)
        await rt.aclose()
        await buffer.aclose()
    out["fresh"] = await fresh_conversations(home, args)
    sdk = SdkActor(srv.base_url + "/chat/completions")
    out["sdk"], _ = await per_turn(me, sdk.call, args)
    await sdk.session.close()
    return out


async def fresh_conversations(home: Path, args: argparse.Namespace) -> float:
    """The scripted persona, each turn a new conversation, holding as many
    as it keeps (``max_conversations``): every turn makes room by dropping
    the oldest idle one, and asks the (empty) log for the new one's history."""
    name = NAMES["scripted"]

    async def no_history(conversation_id: str) -> ConversationRecord:
        return ConversationRecord()

    settings = RuntimeSettings()
    host = PersonaHost(settings=settings, history=no_history)
    rt, buffer = local_persona(home, name, "fresh", host)
    count = itertools.count()

    async def turn(i: int) -> None:
        envelope = MessageEnvelope(recipient=name, conversation_id=f"f{next(count)}", text="ping")
        reply = await rt.handle(envelope)
        if reply.status != "ok":
            raise RuntimeError(f"{name}: {reply.status}: {reply.text}")

    await waves(turn, settings.max_conversations, args.in_flight)  # up to the cap
    if rt.conversations() != settings.max_conversations:
        raise RuntimeError(f"holds {rt.conversations()} conversations, not the cap")
    ms, _ = await per_turn(psutil.Process(), turn, args)
    await rt.aclose()
    await buffer.aclose()
    return ms


async def through_ray(
    rt: Runtime, srv: ServerProcess, args: argparse.Namespace
) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind, name in NAMES.items():
        await rt.ask_async(name, "hello", conversation_id="warm")
        proc = psutil.Process(next(iter(persona_pids(rt, [name]))))
        gc_seconds = collector_of(ray.get(rt.router.resolve.remote(name)))

        async def ask(i: int, name: str = name) -> None:
            reply = await rt.ask_async(name, f"ping {i}", conversation_id=f"c{i % 100}")
            if reply.status != "ok":
                raise RuntimeError(f"{name}: {reply.status}: {reply.text}")

        out[kind], out[f"{kind}-gc"] = await per_turn(proc, ask, args, gc_seconds)
    data = envelope(NAMES["scripted"], 0).model_dump_json()
    # Each floor actor and what its call takes: the SDK floor a request
    # number, the echo actor an envelope as the persona gets one.
    floors: list[tuple[str, Any, Callable[[int], Any]]] = [
        ("sdk", SdkRemote.remote(srv.base_url + "/chat/completions"), lambda i: i),
        ("echo", EchoRemote.remote(), lambda i: data),
    ]
    for kind, actor, argument in floors:
        proc = psutil.Process(await actor.pid.remote())

        async def call(i: int, actor: Any = actor, argument: Any = argument) -> None:
            await actor.call.remote(argument(i))

        out[kind], out[f"{kind}-gc"] = await per_turn(proc, call, args, collector_of(actor))
        ray.kill(actor)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000, help="turns per round")
    parser.add_argument("--in-flight", type=int, default=10, help="turns at a time")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median kept)")
    args = parser.parse_args()
    if args.turns < 1 or args.in_flight < 1 or args.rounds < 1:
        parser.error("--turns, --in-flight and --rounds must be at least 1")
    os.environ[KEY_ENV] = "sk-bench-dummy"  # the persona actor inherits it
    os.environ.pop("RAY_ADDRESS", None)
    load0 = os.getloadavg()[0]
    started = time.perf_counter()
    srv = ServerProcess(0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            write_persona(home, NAMES["openai"], openai_persona(srv.base_url))
            write_persona(home, NAMES["scripted"], SCRIPTED)
            local = asyncio.run(in_process(home, srv, args))
            rt = Runtime.start(home=home, num_cpus=2)
            try:
                actors = asyncio.run(through_ray(rt, srv, args))
            finally:
                rt.shutdown()
    finally:
        srv.stop()
    table = Table(
        title=(
            f"CPU per turn (ms), {args.turns} turns x {args.rounds} rounds, {args.in_flight} in "
            f"flight ({os.cpu_count()} cores, load {load0:.2f} at start, "
            f"{time.perf_counter() - started:.0f} s)"
        )
    )
    for column in ("figure", "coterie", "floor", "floor is", "ratio", "difference"):
        table.add_column(column, justify="left" if column in ("figure", "floor is") else "right")

    def row(figure: str, ours: float, floor: float | None, what: str, digits: int = 2) -> None:
        if floor is None:
            table.add_row(figure, f"{ours:.{digits}f}", "", what, "", "")
            return
        table.add_row(
            figure,
            f"{ours:.{digits}f}",
            f"{floor:.{digits}f}",
            what,
            f"{ours / floor:.2f}x" if floor > 0 else "",
            f"{ours - floor:.{digits}f}",
        )

    row("in-process: OpenAI persona turn", local["openai"], local["sdk"], "the SDK call alone")
    row("in-process: scripted persona turn", local["scripted"], None, "(no model call)")
    row(
        "  the same, a new conversation each turn, at the cap",
        local["fresh"],
        local["scripted"],
        "100 conversations in turn",
    )
    row("Ray: OpenAI persona, its process", actors["openai"], actors["sdk"], "SDK-floor actor")
    row(
        "  of which its cyclic collector",
        actors["openai-gc"],
        actors["sdk-gc"],
        "the SDK-floor actor's",
        digits=3,
    )
    row("Ray: scripted persona, its process", actors["scripted"], actors["echo"], "echo actor")
    row(
        "  of which its cyclic collector",
        actors["scripted-gc"],
        actors["echo-gc"],
        "the echo actor's",
        digits=3,
    )
    row("Ray shell: scripted persona", actors["scripted"], local["scripted"], "same, in-process")
    Console(width=None if sys.stdout.isatty() else 140).print(table)


if __name__ == "__main__":
    main()
