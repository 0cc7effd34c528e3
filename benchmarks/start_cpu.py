"""Where one persona's start goes: Ray's worker, coterie, the SDK, the first turn.

``scale.py`` starts a hundred personas at once on two cores, where the
start is bound by CPU: what each process spends decides the wall time. This
script starts one actor at a time on a quiet runtime (router, audit log and
memory store up and warm), each figure beside the two floors of
``scale.py`` measured in the same run (the bare actor with its aiohttp
session, and the SDK-floor actor calling through an openai client built as
the OpenAI provider builds it), median of ``--rounds``:

* **by phase, in the actor's process** (CPU ms): a probe actor does in
  stages what a starting persona's process does: Ray's worker up to the
  actor's ``__init__``; aiohttp, which all three import (the bare floor's
  client, the SDK's transport, coterie's web tools); coterie's modules
  (``import coterie.actors.persona``); the ``PersonaActor`` set-up, the same class
  with the arguments the router gives it; the SDK's modules (``import
  openai``); the first turn, which builds the SDK client; and a second,
  warm turn. The floors' probes do their own stages the same way;
* **end to end**: a persona activated by its first message through the
  router, as ``scale.py``'s cold start activates each of its hundred,
  beside creating each floor actor and making its first call: seconds to
  the first reply, the CPU of the actor's process from its birth, and the
  CPU of the rest of the runtime meanwhile, by process kind.

The floors' classes are sent to their workers by value, so that those
workers import neither coterie nor this script's other imports.

    python benchmarks/start_cpu.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import ray
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchmarks.scale  # noqa: E402
from benchmarks._procs import compile_coterie, cpu_of  # noqa: E402
from benchmarks.personas import (  # noqa: E402
    KEY_ENV,
    CpuMeter,
    ServerProcess,
    actor_pid,
    cpu_text,
    openai_persona,
    persona_pids,
    write_persona,
)
from benchmarks.scale import BareActor, SdkActor  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.actors._ray import audit_name, memory_name, router_name  # noqa: E402

# The floors' workers get BareActor and SdkActor themselves, not an import
# of benchmarks.scale (which imports coterie).
ray.cloudpickle.register_pickle_by_value(benchmarks.scale)

WORKER = "Ray's worker, to the actor's __init__"
AIOHTTP = "aiohttp (all three import it)"
COTERIE = "coterie's modules (import coterie.actors.persona)"
SETUP = "the PersonaActor set-up"
SDK = "the SDK's modules (import openai)"
FIRST = "first turn / first call"
GAPS = "between the stages (Ray's call, its arguments, its threads)"
WARM = "second turn / call (warm)"
PHASES = (WORKER, AIOHTTP, COTERIE, SETUP, SDK, FIRST, GAPS)


class Probe:
    """Does in stages what an actor's process does from its birth to its
    first reply; ``stages`` gives the CPU (s) of each. Every import is
    inside a method, so that the worker imports nothing of ours before the
    first stamp."""

    def __init__(self) -> None:
        self.born = time.process_time()
        self.persona: Any = None

    async def recover_lost_work(self) -> int:
        # PersonaActor.__init__ calls this on the actor it runs in.
        return 0 if self.persona is None else int(await self.persona.recover_lost_work())

    async def stages(self, kind: str, url: str, persona: dict[str, Any]) -> dict[str, float]:
        out = {WORKER: self.born}
        last = time.process_time()

        def lap(stage: str) -> None:
            nonlocal last
            now = time.process_time()
            out[stage] = now - last
            last = now

        import aiohttp  # noqa: F401

        lap(AIOHTTP)
        if kind == "persona":
            from coterie.actors.persona import PersonaActor
            from coterie.runtime.config import RuntimeSettings
            from coterie.runtime.messages import MessageEnvelope

            lap(COTERIE)
            # The settings come as JSON: unpickling the model would have
            # imported coterie before the first stamp.
            settings = RuntimeSettings.model_validate_json(persona["settings"])
            self.persona = PersonaActor(
                persona["name"], persona["home"], settings=settings, **persona["kwargs"]
            )
            lap(SETUP)

            async def call(n: int) -> None:
                data = MessageEnvelope(
                    recipient=persona["name"], conversation_id="c", text=f"hello {n}"
                ).model_dump_json()
                reply = await self.persona.handle(data)
                if '"status":"ok"' not in reply:
                    raise RuntimeError(f"probe persona: {reply[:300]}")

        else:
            actor = SdkActor(url) if kind == "sdk" else BareActor(url)

            async def call(n: int) -> None:
                await actor.call(n)

        if kind != "bare":
            import openai  # noqa: F401

            lap(SDK)
        await call(0)
        lap(FIRST)
        # All of the process's CPU so far: the stages, and what ran between
        # them (Ray taking this call and decoding its arguments, its threads).
        out[GAPS] = time.process_time() - sum(out.values())
        await call(1)
        lap(WARM)
        return out


ProbeRemote: Any = ray.remote(num_cpus=0)(Probe)
FLOORS: dict[str, Any] = {
    "sdk": ray.remote(num_cpus=0)(SdkActor),
    "bare": ray.remote(num_cpus=0)(BareActor),
}


def end_to_end(
    rt: Runtime, kind: str, name: str, url: str, roles: dict[str, set[int]]
) -> dict[str, Any]:
    """One actor started by its first message: seconds to the reply, its
    process's CPU since birth, and the CPU of the rest meanwhile."""
    meter = CpuMeter(roles)
    meter.start()
    t0 = time.perf_counter()
    actor: Any = None
    if kind == "persona":
        reply = rt.ask(name, "hello")
        wall = time.perf_counter() - t0
        if reply.status != "ok":
            raise RuntimeError(f"{name}: {reply.status}: {reply.error}")
        pid = next(iter(persona_pids(rt, [name])))
    else:
        actor = FLOORS[kind].remote(url)
        ray.get(actor.call.remote(0))
        wall = time.perf_counter() - t0
        pid = int(ray.get(actor.pid.remote()))
    own = cpu_of(psutil.Process(pid))
    spent = meter.stop()
    # The new process shows under its actor class, or as "ray system" while it
    # was still a pooled worker: count it once, from its birth, apart.
    for key in ("PersonaActor", "SdkActor", "BareActor"):
        spent.pop(key, None)
    spent.pop("stolen (hypervisor)", None)
    if actor is not None:
        ray.kill(actor)
    return {"wall": wall, "own": own, "rest": spent}


def probe(kind: str, url: str, persona: dict[str, Any]) -> dict[str, float]:
    actor = ProbeRemote.remote()
    try:
        stages: dict[str, float] = ray.get(actor.stages.remote(kind, url, persona))
        return stages
    finally:
        ray.kill(actor)


def median_of(samples: list[dict[str, float]], key: str) -> float | None:
    values = [s[key] for s in samples if key in s]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median kept)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    os.environ[KEY_ENV] = "sk-bench-dummy"  # the persona actors inherit it
    os.environ.pop("RAY_ADDRESS", None)
    compiled = compile_coterie()
    load0 = os.getloadavg()[0]
    started = time.perf_counter()
    kinds = ("persona", "sdk", "bare")
    phases: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    e2e: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    srv = ServerProcess(0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            url = srv.base_url + "/chat/completions"
            names = ["warm"]
            for r in range(args.rounds):
                names += [f"start-{r}", f"probe-{r}"]
            for name in names:
                write_persona(home, name, openai_persona(srv.base_url))
            rt = Runtime.start(home=home, num_cpus=2)
            try:
                rt.ask("warm", "hello")  # the router, audit log and memory store are up
                roles = {
                    "router": {actor_pid("RouterActor")},
                    "audit": {actor_pid("AuditLogActor")},
                    "model server": {srv.pid},
                }
                kwargs = {
                    "audit_actor": audit_name(rt.id),
                    "router_actor": router_name(rt.id),
                    "memory_actor": memory_name(rt.id),
                    "namespace": rt.namespace,
                    # What the router gives a persona it starts: every (name, description).
                    "roster": [(p.name, p.description) for p in rt.personas()],
                }
                for r in range(args.rounds):
                    # Rotate the order, so that none is always first after a kill.
                    for kind in kinds[r % 3 :] + kinds[: r % 3]:
                        e2e[kind].append(end_to_end(rt, kind, f"start-{r}", url, roles))
                        persona = {
                            "name": f"probe-{r}",
                            "home": str(home),
                            "settings": rt.settings.model_dump_json(),
                            "kwargs": kwargs,
                        }
                        # Only the persona's probe gets them: plain data all.
                        phases[kind].append(probe(kind, url, persona if kind == "persona" else {}))
                        time.sleep(1.0)  # let the killed actors' processes go
            finally:
                rt.shutdown()
    finally:
        srv.stop()
    console = Console(width=None if sys.stdout.isatty() else 160)
    title = (
        f"one actor's start, quiet, median of {args.rounds} ({os.cpu_count()} cores, load "
        f"{load0:.2f} at start, {time.perf_counter() - started:.0f} s; {compiled})"
    )
    table = Table(title=title)
    for column in ("figure", "persona", "SDK floor", "bare floor", "persona - SDK", "SDK / bare"):
        table.add_column(column, justify="left" if column == "figure" else "right")

    def row(figure: str, values: list[float | None], unit: str, digits: int) -> None:
        ours, sdk, bare = values
        cells = [f"{v:.{digits}f} {unit}" if v is not None else "—" for v in values]
        diff = f"{ours - sdk:+.{digits}f} {unit}" if ours is not None and sdk is not None else ""
        # No ratio over a floor too small to divide by (the bare actor's warm call).
        big = bare is not None and bare >= (0.1 if unit == "s" else 10.0)
        ratio = f"{sdk / bare:.2f}x" if sdk is not None and bare is not None and big else ""
        table.add_row(figure, *cells, diff, ratio)

    table.add_row("[b]in the actor's process, by phase (CPU)[/]")
    for phase in (*PHASES, WARM):
        values = [median_of(phases[k], phase) for k in kinds]
        row("  " + phase, [None if v is None else 1000 * v for v in values], "ms", 0)
    totals = [
        statistics.median(sum(s.get(p, 0.0) for p in PHASES) for s in phases[k]) for k in kinds
    ]
    row("  to the first reply", [1000 * t for t in totals], "ms", 0)
    table.add_row("[b]end to end: started by its first message[/]")
    row("  seconds to the first reply", [median_of(e2e[k], "wall") for k in kinds], "s", 2)
    own = [statistics.median(1000 * s["own"] for s in e2e[k]) for k in kinds]
    row("  the actor's process CPU from its birth", own, "ms", 0)
    rest = [statistics.median(1000 * sum(s["rest"].values()) for s in e2e[k]) for k in kinds]
    row("  CPU of the rest meanwhile", rest, "ms", 0)
    for kind in kinds:
        best = min(e2e[kind], key=lambda s: sum(s["rest"].values()))
        table.add_row(
            f"    {kind}, by kind (least of {args.rounds})", cpu_text(best["rest"], best["wall"])
        )
    console.print(table)


if __name__ == "__main__":
    main()
