"""Many personas at once, each figure beside its Ray floor measured in the same run.

One local Ray (``num_cpus=2``), one OpenAI-compatible fake model server in its
own process (1 s latency), and:

1. **the burst**: ``--turns`` concurrent turns over ``--personas`` warm
   personas (OpenAI provider, ``--turns / --personas`` conversations each),
   beside the floor: as many bare async Ray actors (``num_cpus=0``), each
   taking ``--turns / --personas`` concurrent calls from the driver, each call
   awaiting the same server's 1 s reply through the actor's aiohttp session —
   one Ray call per turn, as the personas get. Both warm (connections open),
   best of ``--rounds``; the floor runs first and its actors are gone before
   the personas start, so idle processes of one side never slow the other;
   target ≤ 1.3× the floor; the persona processes' CPU per turn ≤ 5 ms. A
   variant of the floor, one call per actor making all its requests itself,
   shows what the Ray calls cost;
2. **cold start**: activating the personas with one turn each, all at once,
   beside starting as many bare actors (each answering one call); target ≤ 1.5×.
   The router starts ``max_starting_personas`` at a time, so both floors are
   also started that many at a time, for more ratios;
3. **memory**: USS of an active persona (OpenAI SDK loaded, after the bursts)
   beside a bare actor (with its aiohttp session); the router's and the
   audit actor's USS; target ≤ 70 MiB per persona;
4. **where the CPU goes** during the best burst and the cold starts, by
   process kind (driver, personas, router, audit, model server, the rest of
   Ray, other load), and what an idle process costs (a persona's and a bare
   actor's CPU per second of doing nothing: each pays it for as long as a
   burst lasts; target ≤ 2 ms/s);
5. **the SDK's share**: each of the figures above once more for a second
   floor, the same bare actors calling through an openai client built and
   called as the OpenAI provider does (aiohttp transport, no retries). "SDK floor /
   bare" is what the SDK alone costs, and for each target the table says
   whether the SDK floor alone already misses it; "coterie / SDK floor" is
   what is left that is coterie's own. Coterie's actor processes build Ray's
   serialization context without the libraries Ray's add-ons would load
   (``actors._lean``); both floors are also started built that way, for the
   start and memory figures, so the table shows what that saves any actor
   and what is left beside floors built the same (the targets stay against
   the bare floor as Ray builds it);
6. **many registered personas**: a fresh home with ``--registered``
   personas: ``Runtime.personas()`` and the first ``resolve``; target
   ``personas()`` ≤ 1 s;
7. **the peer**: AutoGen AgentChat on the same burst against the same server,
   in the same run (``benchmarks/_autogen_peer.py``: one
   ``OpenAIChatCompletionClient`` per persona, one ``AssistantAgent`` per
   conversation, all run at once in one process), after the floors and before
   the personas start, so it too runs with no other actor processes up; its
   wall beside coterie's burst (target ≤ 1.1×), its whole-process CPU per turn
   beside coterie's whole-runtime CPU per turn, its USS beside the personas'.
   AutoGen is not a dependency: it goes in a virtualenv of its own (see that
   script) named by ``--autogen-python`` (or ``COTERIE_AUTOGEN_PYTHON``);
   without one, the rows say it was not run.

    python benchmarks/scale.py [--personas 100] [--turns 1000] [--rounds 2]
                               [--registered 10000] [--catalogue auto|on|off]
                               [--autogen-python PATH]

``--catalogue`` sets the burst personas' ``tools.catalogue`` (they allow
every built-in tool; ``auto`` offers them the core set and ``find_tools``).

It scales down by flags (``--personas 20 --turns 200 --registered 1000``) and
prints the machine's core count and load; this box is shared, so the "other
load" column says how much of the machine was someone else's. It first
compiles coterie's modules to bytecode, as a regular ``pip install`` does (see
``benchmarks._procs.compile_coterie``): the floors' packages are compiled, and
with ``PYTHONDONTWRITEBYTECODE`` set an editable checkout's are not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
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

from benchmarks._procs import compile_coterie, our_ray_processes, peer_json  # noqa: E402
from benchmarks.personas import (  # noqa: E402
    KEY_ENV,
    CpuMeter,
    ServerProcess,
    actor_pid,
    burst,
    cpu_text,
    handles_for,
    model_names,
    openai_persona,
    persona_pids,
    uss_mib,
    warm_up,
    write_persona,
)
from coterie import Runtime  # noqa: E402
from coterie.runtime.config import RuntimeSettings  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 160)


class BareActor:
    """The floor: an async actor awaiting the model server through aiohttp."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session: Any = None

    async def call(self, n: int) -> str:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession()
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"hi {n}"}]}
        headers = {"Authorization": "Bearer sk-bench-dummy"}
        async with self.session.post(self.url, json=body, headers=headers) as response:
            data = await response.json()
        return str(data["choices"][0]["message"]["content"])

    async def burst(self, calls: int) -> int:
        replies = await asyncio.gather(*(self.call(i) for i in range(calls)))
        return len(replies)

    def pid(self) -> int:
        return os.getpid()


BareRemote = ray.remote(num_cpus=0)(BareActor)


class SdkActor(BareActor):
    """The floor with the SDK: the same calls through the openai client, built
    and called as the OpenAI provider does (aiohttp transport, no retries). What it
    costs beyond the bare actor is the SDK's share, which no persona avoids
    while it holds its own client."""

    async def call(self, n: int) -> str:
        import openai

        if self.session is None:
            self.session = openai.AsyncOpenAI(
                api_key="sk-bench-dummy",
                base_url=self.url.removesuffix("/chat/completions"),
                max_retries=0,
                http_client=openai.DefaultAioHttpClient(timeout=60.0),
            )
        # The call the provider makes (runtime/models/openai_chat.py): the
        # body through the client's post, as chat.completions.create ends in,
        # the answer handed back decoded (no ChatCompletion built).
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"hi {n}"}]}
        reply = await self.session.post(
            "/chat/completions",
            body=body,
            cast_to=object,
            options={"security": {"bearer_auth": True}},
        )
        return str(reply["choices"][0]["message"]["content"])


SdkRemote = ray.remote(num_cpus=0)(SdkActor)


def built_as_coterie(cls: type) -> Any:
    """``cls`` as a Ray actor whose process builds its serialization context as
    coterie's actors do, without the libraries Ray's add-ons would load
    (``actors._lean``, which imports nothing else of coterie's). The class
    holds that module, so Ray imports it when it loads the class, before it
    decodes the actor's arguments; the floor's code is unchanged."""
    import coterie.actors._lean as lean

    return ray.remote(num_cpus=0)(type(f"Lean{cls.__name__}", (cls,), {"_lean": lean}))


LeanBareRemote = built_as_coterie(BareActor)
LeanSdkRemote = built_as_coterie(SdkActor)


def start_bare(
    n: int, url: str, roles: dict[str, set[int]], kind: Any = BareRemote
) -> tuple[float, list[Any], dict[str, float]]:
    """Seconds to start ``n`` bare actors of ``kind`` and have each answer one
    model call, the actors, and the CPU spent meanwhile by process kind."""
    meter = CpuMeter(roles)
    meter.start()
    t0 = time.perf_counter()
    actors = [kind.remote(url) for _ in range(n)]
    ray.get([a.call.remote(0) for a in actors])
    return time.perf_counter() - t0, actors, meter.stop()


def stop_actors(actors: list[Any], pids: set[int]) -> None:
    """Kill ``actors`` and wait (up to 30 s) until their processes ``pids`` are gone."""
    for actor in actors:
        ray.kill(actor)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.2)  # let their processes go


def start_bare_paced(n: int, url: str, at_once: int, kind: Any = BareRemote) -> float:
    """Seconds to start ``n`` actors of ``kind``, each answering one model call, with
    at most ``at_once`` starting at a time, as the router starts personas: a
    start ends when the actor answers, and its model call is made after, free
    to overlap with the next starts. The actors are stopped after."""

    async def run() -> tuple[float, list[Any]]:
        slots = asyncio.Semaphore(at_once)
        actors: list[Any] = []

        async def one() -> None:
            async with slots:
                actor: Any = kind.remote(url)
                actors.append(actor)
                await actor.pid.remote()  # up: the router's ping
            await actor.call.remote(0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t0, actors

    wall, actors = asyncio.run(run())
    stop_actors(actors, {int(p) for p in ray.get([a.pid.remote() for a in actors])})
    return wall


def bare_burst(
    actors: list[Any], per_actor: int, roles: dict[str, set[int]], *, batched: bool = False
) -> dict[str, Any]:
    """The floor's burst: ``per_actor`` concurrent calls into each actor, each
    awaiting one model reply, all submitted at once from the driver, as the
    personas' turns are. ``batched``: one call per actor making ``per_actor``
    concurrent requests itself (no Ray call per request)."""
    meter = CpuMeter(roles)
    meter.start()
    t0 = time.perf_counter()
    if batched:
        done = sum(ray.get([a.burst.remote(per_actor) for a in actors]))
    else:
        done = len(ray.get([a.call.remote(i) for i in range(per_actor) for a in actors]))
    wall = time.perf_counter() - t0
    return {"wall": wall, "n": done, "cpu": meter.stop()}


def floor_group(
    kind: Any,
    role: str,
    n: int,
    url: str,
    per: int,
    roles: dict[str, set[int]],
    rounds: int,
    *,
    batched: bool = False,
) -> dict[str, Any]:
    """Start ``n`` actors of ``kind``, run ``rounds`` bursts on them (and the
    batched variant if asked), measure their memory and idle CPU, then kill
    them and wait for their processes to go."""
    with console.status(f"starting {n} {role}"):
        start, actors, start_cpu = start_bare(n, url, roles, kind)
    pids = {int(p) for p in ray.get([a.pid.remote() for a in actors])}
    group_roles = {**roles, role: pids}
    out: dict[str, Any] = {"start": start, "start_cpu": start_cpu, "bursts": []}
    for _ in range(rounds):
        with console.status(f"burst on {role}"):
            out["bursts"].append(bare_burst(actors, per, group_roles))
    if batched:
        with console.status(f"burst on {role}, batched"):
            out["batched"] = min(
                (bare_burst(actors, per, group_roles, batched=True) for _ in range(rounds)),
                key=lambda r: r["wall"],
            )
    out["best"] = min(out["bursts"], key=lambda r: r["wall"])
    out["burst"] = out["best"]["wall"]
    out["uss"] = statistics.mean(uss_mib(p) for p in pids)
    out["idle"] = idle_cpu(pids)
    out["cpu_per_call"] = out["best"]["cpu"].get(role, 0.0) * 1000 / max(1, out["best"]["n"])
    stop_actors(actors, pids)
    return out


def sdk_reach(over: bool) -> str:
    """The verdict cell of an SDK-floor row: whether the SDK alone misses the target."""
    return "[yellow]the SDK alone misses it[/]" if over else "the SDK alone is within it"


def idle_cpu(pids: set[int], seconds: float = 5.0) -> float:
    """CPU milliseconds per second that each of ``pids`` spends doing nothing."""
    procs = [psutil.Process(p) for p in pids]

    def total() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    before = total()
    time.sleep(seconds)
    return (total() - before) * 1000 / seconds / max(1, len(procs))


def autogen_python(given: str | None) -> str | None:
    """The interpreter that has AutoGen AgentChat: ``given``, else
    ``COTERIE_AUTOGEN_PYTHON``, else this one if it can import it."""
    given = given or os.environ.get("COTERIE_AUTOGEN_PYTHON")
    if given:
        return given
    probe = subprocess.run(
        [sys.executable, "-c", "import autogen_agentchat, autogen_ext.models.openai"],
        capture_output=True,
    )
    return sys.executable if probe.returncode == 0 else None


def autogen_run(
    python: str | None, base_url: str, personas: int, turns: int, rounds: int
) -> dict[str, Any] | str:
    """The peer's burst (``benchmarks/_autogen_peer.py``), or why it was not run."""
    if python is None:
        return "AutoGen not installed (see benchmarks/_autogen_peer.py; --autogen-python)"
    cmd = [
        python,
        str(ROOT / "benchmarks" / "_autogen_peer.py"),
        "--url",
        base_url,
        "--personas",
        str(personas),
        "--turns",
        str(turns),
        "--rounds",
        str(rounds),
        "--json",
    ]
    return peer_json(cmd)


def runtime_cpu(spent: dict[str, float]) -> float:
    """CPU seconds of the whole runtime: every process of this session but the model server
    (and the rest of the machine)."""
    outside = ("model server", "other load", "stolen (hypervisor)")
    return sum(secs for role, secs in spent.items() if role not in outside)


def write_home(home: Path, personas: int, base_url: str, catalogue: str) -> list[str]:
    names = model_names(personas)
    body = openai_persona(base_url)
    # Every built-in tool allowed (the default), offered as --catalogue says.
    body["tools"] = {"catalogue": catalogue}
    for name in names:
        write_persona(home, name, body)
    return names


class Rows:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []

    def add(
        self, figure: str, ours: str, floor: str = "", ratio: str = "", verdict: str = ""
    ) -> None:
        self.rows.append((figure, ours, floor, ratio, verdict))

    def compare(
        self,
        figure: str,
        ours: float,
        floor: float,
        unit: str,
        target: float | None,
        *,
        limit: float | None = None,
        verdict: str = "",
    ) -> None:
        """A figure beside its floor; ``target`` bounds the ratio, ``limit`` the
        figure; without either, ``verdict`` is the last column as given."""
        ratio = ours / floor if floor else float("nan")
        if target is not None:
            verdict = "[green]met[/]" if ratio <= target else f"[red]missed (≤ {target:g}×)[/]"
        elif limit is not None:
            verdict = "[green]met[/]" if ours <= limit else f"[red]missed (≤ {limit:g} {unit})[/]"
        self.add(figure, f"{ours:.2f} {unit}", f"{floor:.2f} {unit}", f"{ratio:.2f}×", verdict)

    def table(self, title: str) -> Table:
        table = Table(title=title)
        for col in ("figure", "coterie", "floor / peer", "ratio", "target"):
            table.add_column(col)
        for row in self.rows:
            table.add_row(*row)
        return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--personas", type=int, default=100)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=1.0, help="model latency (s)")
    parser.add_argument("--rounds", type=int, default=2, help="bursts per side (best kept)")
    parser.add_argument("--registered", type=int, default=10_000)
    parser.add_argument(
        "--autogen-python",
        help="a Python with AutoGen AgentChat installed (default: COTERIE_AUTOGEN_PYTHON)",
    )
    parser.add_argument(
        "--catalogue",
        choices=("auto", "on", "off"),
        default="auto",
        help="the personas' tools.catalogue (auto, the default, is on for all tools)",
    )
    args = parser.parse_args()
    os.environ[KEY_ENV] = "sk-bench-dummy"  # persona actors inherit the driver's env
    os.environ.pop("RAY_ADDRESS", None)
    per = max(1, args.turns // args.personas)
    rows = Rows()
    compiled = compile_coterie()
    load0 = os.getloadavg()[0]
    started = time.perf_counter()
    srv = ServerProcess(args.latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / "main"
            names = write_home(home, args.personas, srv.base_url, args.catalogue)
            with console.status("starting Ray"):
                # Never passivated: on a slow or busy box the cold start of 100
                # can outlast the idle timeout, and the first ones would be gone.
                rt = Runtime.start(
                    home=home, num_cpus=2, settings=RuntimeSettings(idle_timeout=None)
                )
            try:
                measure(rt, srv, names, per, args, rows)
            finally:
                ray_procs = [
                    p for p in psutil.Process().children(recursive=True) if p.pid != srv.pid
                ]
                rt.shutdown()
            # The persona processes take a while to go on 2 cores: the roster's
            # figures are measured without them.
            with console.status("waiting for the persona processes to go"):
                psutil.wait_procs(ray_procs, timeout=180)
            registered(Path(tmp) / "registered", args.registered, rows)
    finally:
        srv.stop()
        if ray.is_initialized():
            ray.shutdown()
    title = (
        f"coterie at scale ({os.cpu_count()} cores, tools.catalogue {args.catalogue}, "
        f"load {load0:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end, {time.perf_counter() - started:.0f} s; {compiled})"
    )
    console.print(rows.table(title))


def measure(
    rt: Runtime,
    srv: ServerProcess,
    names: list[str],
    per: int,
    args: argparse.Namespace,
    rows: Rows,
) -> None:
    url = srv.base_url.rstrip("/") + "/chat/completions"
    n = len(names)
    roles: dict[str, set[int]] = {
        "router": {actor_pid("RouterActor")},
        "audit": {actor_pid("AuditLogActor")},
        "model server": {srv.pid},
    }
    # The floors first, each alone: its actors are gone before the next group
    # starts, so no side's idle processes slow another's (on 2 cores, 100 idle
    # Ray workers cost ~0.4 cores).
    bare = floor_group(BareRemote, "bare actors", n, url, per, roles, args.rounds, batched=True)
    sdk = floor_group(SdkRemote, "SDK actors", n, url, per, roles, args.rounds)
    # Both again, built as coterie's actors are (no serializer add-ons): how
    # much of what coterie's actors save there a bare actor would save too.
    lean_bare = floor_group(LeanBareRemote, "lean bare actors", n, url, per, roles, 1)
    lean_sdk = floor_group(LeanSdkRemote, "lean SDK actors", n, url, per, roles, 1)
    # The peer, alone too: no actor process is up while it runs.
    with console.status("AutoGen AgentChat on the same burst"):
        peer = autogen_run(
            autogen_python(args.autogen_python), srv.base_url, n, n * per, args.rounds
        )
    bare_start, bare_start_cpu = bare["start"], bare["start_cpu"]
    # The router starts only a few personas at a time (max_starting_personas):
    # both floors started the same way too.
    at_once = ray.get(rt.router.status.remote()).start_limit
    with console.status(f"starting {n} bare and {n} SDK actors, {at_once} at a time"):
        paced = start_bare_paced(n, url, at_once)
        sdk_paced = start_bare_paced(n, url, at_once, SdkRemote)
    floors, batched = bare["bursts"], bare["batched"]

    def beside_sdk(
        ours: float, key: str, unit: str, target: float | None = None, limit: float | None = None
    ) -> None:
        # The same figure for the SDK floor: how much of the gap to the bare
        # floor is the SDK's, and how much is left that is coterie's own.
        # Whether the target is within reach of anything that holds the SDK.
        reach = ""
        if target is not None or limit is not None:
            over = sdk[key] / bare[key] > target if target is not None else sdk[key] > limit
            reach = sdk_reach(over)
        rows.compare(
            "  SDK floor (bare actor + openai client) / bare",
            sdk[key],
            bare[key],
            unit,
            None,
            verdict=reach,
        )
        rows.compare("  coterie / SDK floor", ours, sdk[key], unit, None)

    def beside_lean(ours: float, key: str, unit: str) -> None:
        # The floors built as coterie's actors are: coterie's share without
        # what leaving Ray's serializer add-ons out saves every actor.
        rows.compare(
            "  bare built as coterie's actors / bare", lean_bare[key], bare[key], unit, None
        )
        rows.compare(
            "  SDK floor built so / bare built so", lean_sdk[key], lean_bare[key], unit, None
        )
        rows.compare("  coterie / SDK floor built so", ours, lean_sdk[key], unit, None)

    with console.status(f"activating {n} personas (one turn each)"):
        meter = CpuMeter(roles)
        meter.start()
        cold, failed = warm_up(rt, names)
        cold_cpu = meter.stop()
    rows.compare(f"cold start: {n} personas, first turn each", cold, bare_start, "s", 1.5)
    beside_sdk(cold, "start", "s", target=1.5)
    rows.compare(
        f"  SDK floor started {at_once} at a time / bare",
        sdk_paced,
        bare_start,
        "s",
        None,
        verdict=sdk_reach(sdk_paced / bare_start > 1.5),
    )
    rows.compare(f"  coterie / SDK floor started {at_once} at a time", cold, sdk_paced, "s", None)
    rows.compare(f"  coterie / bare actors started {at_once} at a time", cold, paced, "s", None)
    beside_lean(cold, "start", "s")
    # New processes have no role yet: they show by their actor class (and a
    # worker not yet an actor as "ray system").
    rows.add("  CPU during the cold start (core-s)", cpu_text(cold_cpu, cold))
    rows.add("  CPU during the floor's start", cpu_text(bare_start_cpu, bare_start))
    if failed:
        rows.add(f"  first-try failures of the cold start: {len(failed)}", failed[0][1][:60])
    roles["personas"] = persona_pids(rt, names)
    ours: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        with console.status("coterie burst"):
            ours.append(burst(rt, srv, names, n * per, roles))
    best = min(ours, key=lambda r: r["wall"])
    floor = bare["best"]
    rows.compare(
        f"burst: {n * per} turns over {n} warm personas, {args.latency:g} s model",
        best["wall"],
        floor["wall"],
        "s",
        1.3,
    )
    beside_sdk(best["wall"], "burst", "s", target=1.3)
    if isinstance(peer, str):
        rows.add("  coterie / AutoGen AgentChat", "", "not run", "", peer)
    else:
        rows.compare(
            f"  coterie / AutoGen AgentChat {peer['autogen_agentchat']} (one process)",
            best["wall"],
            peer["wall"],
            "s",
            1.1,
        )
        rows.add(
            "  AutoGen runs, replies ok",
            "",
            ", ".join(f"{w:.2f}" for w in peer["walls"]) + f" s; {peer['ok']} / {peer['n']}",
        )
    rows.add(
        "  coterie runs / floor runs",
        ", ".join(f"{r['wall']:.2f}" for r in ours) + " s",
        ", ".join(f"{r['wall']:.2f}" for r in floors) + " s",
    )
    rows.add("  replies ok", f"{best['ok']} / {best['n']}", f"{floor['n']} / {n * per}")
    rows.add("  CPU during the best burst (core-s)", cpu_text(best["cpu"], best["wall"]))
    rows.add("  CPU during the floor's best burst", cpu_text(floor["cpu"], floor["wall"]))
    rows.add(
        f"  floor variant: one call per actor making {per} requests",
        "",
        f"{batched['wall']:.2f} s",
    )
    persona_cpu = best["cpu"].get("personas", 0.0) * 1000 / best["n"]
    rows.compare(
        "  persona-process CPU per turn", persona_cpu, bare["cpu_per_call"], "ms", None, limit=5
    )
    beside_sdk(persona_cpu, "cpu_per_call", "ms", limit=5)
    if not isinstance(peer, str):
        # Everything each side spends on a turn but the model server's share:
        # coterie's driver, personas, router, audit and the rest of Ray,
        # against AutoGen's one process (its SDK and HTTP client included).
        rows.compare(
            "  whole-runtime CPU per turn / AutoGen's process",
            runtime_cpu(best["cpu"]) * 1000 / best["n"],
            peer["cpu_per_turn_ms"],
            "ms",
            None,
        )
    # What every Ray worker costs while idle, whatever it hosts: paid by each
    # process for the whole length of a burst.
    persona_idle = idle_cpu(roles["personas"])
    rows.compare("  idle CPU per process", persona_idle, bare["idle"], "ms/s", None, limit=2)
    beside_sdk(persona_idle, "idle", "ms/s", limit=2)
    # Memory.
    stats = ray.get([handles_for(rt, p).stats.remote() for p in names])
    uss = statistics.mean(uss_mib(int(s["pid"])) for s in stats)
    rows.compare(
        "USS per active persona (openai SDK loaded)", uss, bare["uss"], "MiB", None, limit=70
    )
    beside_sdk(uss, "uss", "MiB", limit=70)
    beside_lean(uss, "uss", "MiB")
    if not isinstance(peer, str):
        rows.add(
            "  AutoGen's one process after its bursts (with AutoGen imported, before)",
            "",
            f"{peer['uss_mib']:.1f} MiB ({peer['uss_bare_mib']:.1f} MiB)",
        )
    rows.add(
        "  router / audit actor USS",
        f"{uss_mib(next(iter(roles['router']))):.1f} / "
        f"{uss_mib(next(iter(roles['audit']))):.1f} MiB",
    )


def registered(home: Path, n: int, rows: Rows) -> None:
    for i in range(n):
        write_persona(
            home,
            f"p-{i:05d}",
            {"description": f"registered persona {i}", "model": {"provider": "scripted"}},
        )
    with console.status(f"a home with {n:,} registered personas"):
        rt = Runtime.start(home=home, num_cpus=2)
        try:
            t0 = time.perf_counter()
            listed = rt.personas()
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            rt.personas()
            second = time.perf_counter() - t0
            t0 = time.perf_counter()
            ray.get(rt.router.resolve.remote("p-00042" if n > 42 else "p-00000"))
            resolve = time.perf_counter() - t0
            processes = len(our_ray_processes("PersonaActor"))
            # Every description read and cached by now.
            router = uss_mib(actor_pid("RouterActor"))
        finally:
            rt.shutdown()
    ok = first <= 1.0 and len(listed) == n
    rows.add(
        f"personas() with {n:,} registered: first / second call",
        f"{first:.2f} / {second:.2f} s",
        "",
        "",
        "[green]met[/]" if ok else "[red]missed (≤ 1 s)[/]",
    )
    rows.add("  first resolve (starts one persona process)", f"{resolve:.2f} s")
    rows.add("  persona processes after it", str(processes))
    rows.add("  router USS, every description cached", f"{router:.1f} MiB")


if __name__ == "__main__":
    main()
