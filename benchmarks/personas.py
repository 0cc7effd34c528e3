"""Personas at scale: delivery paths, throughput, 1,000 concurrent turns, memory.

Measured in one run on a local Ray (``num_cpus=2``) and printed as one table:

1. ask round-trip p50/p99 with an instant scripted persona, N sequential asks
   per path, the paths interleaved: (a) through the router
   (``router.deliver``: driver -> router -> persona), (b) the runtime's
   default path (``Runtime.ask``: handle resolved once via the router, then
   direct), (c) a direct call on the persona's actor handle;
2. throughput with 64 asks in flight for the same three paths (asyncio, one
   worker per conversation over a few personas), and routed/direct ratios;
3. 1,000 concurrent turns over 100 warm personas (10 conversations each)
   against an OpenAI-compatible fake server with 1 s latency, running in its
   own process on 127.0.0.1;
4. memory: USS of the active persona processes and of the router; then a
   fresh home with 10,000 registered (scripted) personas, none active: the
   persona processes, the router's USS, ``Runtime.personas()`` and the first
   ``resolve``.

    python benchmarks/personas.py [--asks 500] [--messages 3000]
                                  [--personas 100] [--turns 1000] [--registered 10000]

To say where the time goes, section 3 also reports a floor (a bare
PersonaRuntime's CPU per turn in this process, before Ray starts), when the
model requests reached the server, and, for each timed interval, the CPU
seconds spent by each process (driver, personas, router, audit, model server,
the rest of Ray) and by the rest of the machine ("other load": this box is
shared).

Process memory and CPU come from psutil. Persona pids come from
``PersonaActor.stats()``. The router and the audit actor have no pid-reporting
method, so their processes are found by Ray proctitle (``ray::RouterActor``,
``ray::AuditLogActor``) among the descendants of this driver only (the raylet
and its workers are our children), which keeps other Ray sessions on a shared
machine out of the count.

The sections can be scaled down, e.g. ``--personas 20 --turns 200
--registered 1000``: starting 100 persona processes takes minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import ray
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._procs import our_ray_processes  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.actors import persona_actor_name  # noqa: E402
from coterie.runtime.config import RuntimeSettings, load_persona  # noqa: E402
from coterie.runtime.messages import MessageEnvelope, ReplyEnvelope  # noqa: E402
from coterie.runtime.models import build_model  # noqa: E402
from coterie.runtime.persona import PersonaRuntime  # noqa: E402
from coterie.tools import builtin_registry  # noqa: E402
from tests.fakes.servers import FakeOpenAIServer  # noqa: E402

KEY_ENV = "COTERIE_BENCH_OPENAI_KEY"
SCRIPTED = {"model": {"provider": "scripted", "default": "pong"}}
SEQ_CONVERSATIONS = 10
WARMUP_ASKS = 20
MiB = 2**20

# Wide enough for the table when the output is piped to a file.
console = Console(width=None if sys.stdout.isatty() else 150)


# -- rows of the table ----------------------------------------------------------


class Report:
    """The rows of the one summary table."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, label: str, value: str, target: str = "", verdict: str | None = None) -> None:
        self.rows.append((label, value, target, verdict or ("info" if not target else "")))

    def check(self, label: str, value: str, target: str, ok: bool) -> None:
        self.add(label, value, target, "[green]met[/]" if ok else "[red]MISSED[/]")

    def section(self, title: str) -> None:
        self.rows.append((f"[bold]{title}[/]", "", "", ""))

    def table(self, title: str) -> Table:
        table = Table(title=title)
        table.add_column("measure")
        table.add_column("value", justify="right")
        table.add_column("target", justify="right")
        table.add_column("verdict")
        for row in self.rows:
            table.add_row(*row)
        return table


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the fake model server, in its own process ---------------------------------


class _TimedOpenAIServer(FakeOpenAIServer):
    """Records when each request arrived and when its reply left (wall clock)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrivals: list[float] = []
        self.departures: list[float] = []

    async def _handle(self, http_request: Any) -> Any:
        self.arrivals.append(time.time())
        try:
            return await super()._handle(http_request)
        finally:
            self.departures.append(time.time())


def _serve(conn: Any, latency: float) -> None:
    """Child process: serve until told to stop (or the parent goes away).

    The server stands in for a remote provider, but here it shares the cores
    with what is measured. With 1,000 requests in flight, each holding a
    persona's parsed tool schemas for the 1 s of latency, its cyclic garbage
    collector kept walking those bodies: 0.44 ms of CPU per request against
    0.21 with it off (12 kB bodies; a bare request's body, 0.14 against
    0.09). The bodies hold no cycles and go by reference counting; what
    else needs the collector is collected on each ``stats`` call, between
    bursts, before the answer goes back.
    """
    gc.disable()

    async def main() -> None:
        # Nothing reads the bodies here (``stats`` reports times only); kept,
        # they made the server's CPU per request with a persona's tool
        # schemas about twice what it is without them.
        async with _TimedOpenAIServer(latency=latency, default_text="pong", record=False) as srv:
            conn.send(srv.base_url)
            loop = asyncio.get_running_loop()
            while True:
                try:
                    command = await loop.run_in_executor(None, conn.recv)
                except (EOFError, OSError):
                    return
                if command != "stats":
                    return
                gc.collect()
                conn.send((srv.arrivals, srv.departures, srv.max_in_flight))
                srv.arrivals, srv.departures, srv.max_in_flight = [], [], 0

    asyncio.run(main())


class ServerProcess:
    """A FakeOpenAIServer in a separate (spawned) process on 127.0.0.1."""

    def __init__(self, latency: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, latency), daemon=True)
        self._proc.start()
        child.close()
        try:
            if not self._conn.poll(60):
                raise RuntimeError("the fake model server did not start within 60 s")
            self.base_url: str = self._conn.recv()
        except BaseException:
            self.stop()
            raise
        self.pid: int = self._proc.pid or 0

    def stats(self) -> tuple[list[float], list[float], int]:
        """(arrival times, departure times, max in flight) since the last call."""
        self._conn.send("stats")
        result: tuple[list[float], list[float], int] = self._conn.recv()
        return result

    def stop(self) -> None:
        try:
            self._conn.send("stop")
        except (OSError, ValueError):
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()


# -- processes and memory --------------------------------------------------------


def uss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_full_info().uss / MiB)


def actor_pid(title: str, wait: float = 10.0) -> int:
    """The pid of this session's only ``ray::<title>`` process.

    Ray sets the proctitle once the actor is up; give it a moment.
    """
    deadline = time.monotonic() + wait
    while True:
        procs = our_ray_processes(title)
        if len(procs) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if len(procs) != 1:
        raise RuntimeError(f"expected one ray::{title} process, found {len(procs)}")
    return procs[0].pid


def router_uss(rt: Runtime) -> tuple[float, int]:
    """(USS MiB, pid) of the router."""
    ray.get(rt.router.ping.remote())
    pid = actor_pid("RouterActor")
    return uss_mib(pid), pid


def named_persona_actors(rt: Runtime) -> list[str]:
    prefix = persona_actor_name(rt.id, "")
    return [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["name"].startswith(prefix)
    ]


class CpuMeter:
    """CPU seconds spent by this session's processes, by role, over an interval.

    ``roles`` maps a role (personas, router, audit, model server) to its pids;
    the driver (with the runtime's background thread) is this process; every
    other descendant (raylet, GCS, agents, idle workers) is "ray system", and
    the rest of the machine's busy time is "other load".
    """

    # Other users' CPU over every measured interval, for the summary.
    other_total = 0.0
    wall_total = 0.0

    def __init__(self, roles: dict[str, set[int]]) -> None:
        self.roles = roles
        self._start: dict[str, float] = {}
        self._t0 = 0.0

    def _sample(self) -> dict[str, float]:
        used = dict.fromkeys([*self.roles, "driver", "ray system"], 0.0)
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            role = next((r for r, pids in self.roles.items() if proc.pid in pids), "ray system")
            if proc.pid == me.pid:
                role = "driver"
            try:
                if role == "ray system":
                    role = _other_actor(proc) or role
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            used[role] = used.get(role, 0.0) + times.user + times.system
        machine = psutil.cpu_times()
        # Busy time of the whole machine; steal (a hypervisor running someone
        # else on our cores) is kept apart: it is capacity we never had.
        used["machine"] = sum(
            getattr(machine, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq")
        )
        used["stolen"] = getattr(machine, "steal", 0.0)
        return used

    def start(self) -> None:
        self._start = self._sample()
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        end = self._sample()
        spent = {k: max(0.0, end[k] - self._start.get(k, 0.0)) for k in end}
        machine, stolen = spent.pop("machine"), spent.pop("stolen")
        spent["other load"] = max(0.0, machine - sum(spent.values()))
        spent["stolen (hypervisor)"] = stolen
        CpuMeter.other_total += spent["other load"]
        CpuMeter.wall_total += time.perf_counter() - self._t0
        return spent


_RAY_INTERNAL = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _other_actor(proc: psutil.Process) -> str | None:
    """Another actor of the runtime (not given a role), named by its class."""
    cmdline = proc.cmdline()
    title = cmdline[0] if cmdline else ""
    if not title.startswith("ray::") or title.startswith(_RAY_INTERNAL):
        return None
    return title[len("ray::") :].split(".")[0].split(" ")[0]


def persona_pids(rt: Runtime, names: list[str]) -> set[int]:
    stats = ray.get([handles_for(rt, p).stats.remote() for p in names])
    return {int(s["pid"]) for s in stats}


def cpu_text(spent: dict[str, float], wall: float, per: float = 1.0, unit: str = "s") -> str:
    """``role n, …`` (largest first) and the budget: cores x wall; divided by ``per``."""
    parts = [
        f"{role} {secs / per:.2f}"
        for role, secs in sorted(spent.items(), key=lambda kv: -kv[1])
        if secs / per >= 0.005
    ]
    cores = os.cpu_count() or 2
    budget = f"of {cores} x {wall / per:.2f} = {cores * wall / per:.2f} core-{unit}"
    return f"{', '.join(parts)} ({budget})"


# -- homes ----------------------------------------------------------------------


def write_persona(home: Path, name: str, body: dict[str, Any]) -> None:
    path = home / "personas" / name
    path.mkdir(parents=True)
    (path / "persona.yaml").write_text(yaml.safe_dump(body))
    (path / "SOUL.md").write_text("Benchmark persona.")


def scripted_names(n: int) -> list[str]:
    return [f"bench-{i}" for i in range(n)]


def model_names(n: int) -> list[str]:
    return [f"model-{i:03d}" for i in range(n)]


def openai_persona(base_url: str) -> dict[str, Any]:
    """A persona.yaml body answering through the fake OpenAI server."""
    return {
        "description": "Answers through the fake OpenAI server.",
        "model": {
            "provider": "openai",
            "name": "fake-model",
            "base_url": base_url,
            "api_key_env": KEY_ENV,
            "max_tokens": 64,
            "timeout": 60,
            # A failure shows up as a non-ok reply instead of a hidden retry.
            "max_retries": 0,
        },
    }


def write_main_home(home: Path, args: argparse.Namespace, base_url: str) -> None:
    for name in scripted_names(args.tp_personas):
        write_persona(home, name, SCRIPTED)
    for name in model_names(args.personas):
        write_persona(home, name, openai_persona(base_url))


# -- 1. sequential round trips --------------------------------------------------


def sequential(rt: Runtime, persona: str, asks: int) -> dict[str, list[float]]:
    """Interleaved sequential asks on the three paths; milliseconds per ask."""
    handle = ray.get(rt.router.resolve.remote(persona))

    def via_router(cid: str, text: str) -> ReplyEnvelope:
        data = rt.envelope(persona, text, conversation_id=cid).model_dump_json()
        return ReplyEnvelope.model_validate_json(ray.get(rt.router.deliver.remote(data)))

    def via_runtime(cid: str, text: str) -> ReplyEnvelope:
        return rt.ask(persona, text, conversation_id=cid)

    def direct(cid: str, text: str) -> ReplyEnvelope:
        data = rt.envelope(persona, text, conversation_id=cid).model_dump_json()
        return ReplyEnvelope.model_validate_json(ray.get(handle.handle.remote(data)))

    paths: dict[str, Callable[[str, str], ReplyEnvelope]] = {
        "router": via_router,
        "runtime": via_runtime,
        "direct": direct,
    }
    samples: dict[str, list[float]] = {p: [] for p in paths}
    order = list(paths)
    for i in range(WARMUP_ASKS + asks):
        order = order[1:] + order[:1]  # rotate, so no path always goes first
        for path in order:
            cid = f"{persona}:seq-{path}:{i % SEQ_CONVERSATIONS}"
            t0 = time.perf_counter()
            reply = paths[path](cid, f"ping {i}")
            elapsed = (time.perf_counter() - t0) * 1000
            if reply.status != "ok":
                raise RuntimeError(f"{path}: {reply.status} {reply.error}")
            if i >= WARMUP_ASKS:
                samples[path].append(elapsed)
    return samples


# -- 2. throughput ---------------------------------------------------------------


async def throughput(
    rt: Runtime,
    path: str,
    personas: list[str],
    handles: dict[str, Any],
    messages: int,
    window: int,
    meter: CpuMeter,
) -> tuple[float, int, float, dict[str, float]]:
    """(messages/s, messages, seconds, CPU by role) with ``window`` asks in flight.

    One worker per conversation, so no two asks ever wait on the same
    conversation (which would merge them into one turn).
    """

    def sender(persona: str) -> Callable[[str, str], Awaitable[ReplyEnvelope]]:
        async def via_router(cid: str, text: str) -> ReplyEnvelope:
            data = rt.envelope(persona, text, conversation_id=cid).model_dump_json()
            return ReplyEnvelope.model_validate_json(await rt.router.deliver.remote(data))

        async def via_runtime(cid: str, text: str) -> ReplyEnvelope:
            return await rt.ask_async(persona, text, conversation_id=cid)

        async def direct(cid: str, text: str) -> ReplyEnvelope:
            data = rt.envelope(persona, text, conversation_id=cid).model_dump_json()
            return ReplyEnvelope.model_validate_json(await handles[persona].handle.remote(data))

        return {"router": via_router, "runtime": via_runtime, "direct": direct}[path]

    per_worker = math.ceil(messages / window)
    failures: list[str] = []

    async def worker(w: int, count: int) -> None:
        persona = personas[w % len(personas)]
        send, cid = sender(persona), f"{persona}:tp-{path}:{w}"
        for i in range(count):
            reply = await send(cid, f"msg {i}")
            if reply.status != "ok":
                failures.append(f"{reply.status}: {reply.error}")

    await asyncio.gather(*(worker(w, 2) for w in range(window)))  # warm-up
    meter.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w, per_worker) for w in range(window)))
    elapsed = time.perf_counter() - t0
    spent = meter.stop()
    if failures:
        raise RuntimeError(f"{path}: {len(failures)} failed asks, e.g. {failures[0]}")
    total = per_worker * window
    return total / elapsed, total, elapsed, spent


# -- 3. concurrent turns against a slow model -----------------------------------


async def ask_all(
    rt: Runtime, asks: list[tuple[str, str]], timeout: float = 300.0
) -> tuple[float, float, list[ReplyEnvelope]]:
    """(seconds to submit every ask, seconds to the last reply, the replies)."""
    t0 = time.perf_counter()
    tasks = [
        asyncio.create_task(rt.ask_async(p, "hello there", conversation_id=cid, timeout=timeout))
        for p, cid in asks
    ]
    # One pass of the loop runs each task up to its first real wait: by then
    # (the handles being cached) every actor call has been submitted.
    await asyncio.sleep(0)
    submitted = time.perf_counter() - t0
    replies = await asyncio.gather(*tasks)
    return submitted, time.perf_counter() - t0, list(replies)


def burst(
    rt: Runtime, server: ServerProcess, names: list[str], turns: int, roles: dict[str, set[int]]
) -> dict[str, Any]:
    """``turns`` concurrent asks, ``turns / len(names)`` conversations per persona."""
    per_persona = math.ceil(turns / len(names))
    asks = [(p, f"{p}:burst-{k}") for k in range(per_persona) for p in names][:turns]
    server.stats()  # reset the server's records
    gc.collect()
    meter = CpuMeter(roles)
    meter.start()
    wall_t0 = time.time()
    submitted, wall, replies = asyncio.run(ask_all(rt, asks))
    spent = meter.stop()
    arrivals, departures, max_in_flight = server.stats()
    bad = [r for r in replies if r.status != "ok"]
    return {
        "wall": wall,
        "submitted": submitted,
        "cpu": spent,
        "n": len(replies),
        "ok": len(replies) - len(bad),
        "bad": bad,
        "first_arrival": min(arrivals) - wall_t0 if arrivals else float("nan"),
        "last_arrival": max(arrivals) - wall_t0 if arrivals else float("nan"),
        "last_departure": max(departures) - wall_t0 if departures else float("nan"),
        "requests": len(arrivals),
        "max_in_flight": max_in_flight,
    }


def report_burst(
    report: Report, notes: list[str], res: dict[str, Any], label: str, target: float | None
) -> None:
    value = f"{res['wall']:.2f} s"
    if target is None:
        report.add(label, value)
    else:
        report.check(label, value, f"<= {target:.2f} s", res["wall"] <= target)
    report.check(
        "  replies ok",
        f"{res['ok']} / {res['n']}",
        f"{res['n']} / {res['n']}",
        res["ok"] == res["n"],
    )
    report.add("  driver: all asks submitted after", f"{res['submitted']:.2f} s")
    report.add(
        "  model requests: first / last arrival after submit",
        f"{res['first_arrival']:.2f} / {res['last_arrival']:.2f} s",
    )
    report.add(
        "  last model reply sent / max in flight at the server",
        f"{res['last_departure']:.2f} s / {res['max_in_flight']}",
    )
    report.add("  CPU s during the burst, by process", cpu_text(res["cpu"], res["wall"]))
    if res["bad"]:
        notes.append(f"{label}: {len(res['bad'])} failed, e.g. {res['bad'][0].error}")


async def in_process_cpu(home: Path, persona: str, turns: int, concurrency: int) -> float:
    """CPU ms per turn of a bare PersonaRuntime in this process (no Ray, no audit)."""
    loaded = load_persona(home, persona)
    runtime = PersonaRuntime(
        loaded, model=build_model(loaded.config.model), registry=builtin_registry()
    )

    async def one_round(tag: str) -> None:
        replies = await asyncio.gather(
            *(
                runtime.handle(
                    MessageEnvelope(
                        recipient=persona,
                        conversation_id=f"{persona}:floor-{tag}-{k}",
                        text="hello there",
                    )
                )
                for k in range(concurrency)
            )
        )
        bad = [r for r in replies if r.status != "ok"]
        if bad:
            raise RuntimeError(f"in-process {persona}: {bad[0].error}")

    try:
        await one_round("warm")  # imports, client, connections
        rounds = max(1, turns // concurrency)
        c0 = time.process_time()
        for r in range(rounds):
            await one_round(str(r))
        return (time.process_time() - c0) * 1000 / (rounds * concurrency)
    finally:
        await runtime.aclose()


# -- the run --------------------------------------------------------------------


def warm_up(
    rt: Runtime, names: list[str], attempts: int = 3
) -> tuple[float, list[tuple[str, str]]]:
    """Activate every persona with one ask each, all at once; retry the failures.

    Returns the seconds it took and the (persona, error) of first-try failures.
    """
    t0 = time.perf_counter()
    pending, failed_first = list(names), []
    # Every persona process starts at once: on 2 busy cores 100 of them can
    # take longer than one ask's usual 300 s.
    timeout = max(300.0, 10.0 * len(names))
    for attempt in range(attempts):
        asks = [(p, f"{p}:warm") for p in pending]
        _, _, replies = asyncio.run(ask_all(rt, asks, timeout=timeout))
        bad = [
            (p, r.error or r.status)
            for p, r in zip(pending, replies, strict=True)
            if r.status != "ok"
        ]
        if attempt == 0:
            failed_first = bad
        pending = [p for p, _ in bad]
        if not pending:
            return time.perf_counter() - t0, failed_first
    raise RuntimeError(f"warm-up failed for {len(pending)} personas, e.g. {bad[0][1]}")


def run_main_home(
    args: argparse.Namespace, report: Report, notes: list[str], home: Path, srv: ServerProcess
) -> None:
    # The floor, before Ray starts: one persona's turn loop in this process.
    with console.status("in-process floor"):
        floor = {
            "scripted": asyncio.run(in_process_cpu(home, scripted_names(1)[0], 200, 10)),
            "openai": asyncio.run(in_process_cpu(home, model_names(1)[0], 100, 50)),
        }
    with console.status("starting Ray"):
        # Never passivated (a slow cold start must not lose the first ones).
        rt = Runtime.start(home=home, num_cpus=2, settings=RuntimeSettings(idle_timeout=None))
    try:
        ray.get([rt.router.ping.remote(), rt.audit.stats.remote()])
        roles = {
            "router": {actor_pid("RouterActor")},
            "audit": {actor_pid("AuditLogActor")},
            "model server": {srv.pid},
        }
        # 1. sequential
        bench = scripted_names(args.tp_personas)
        with console.status(f"sequential asks: {args.asks} per path"):
            seq = sequential(rt, bench[0], args.asks)
        d50 = statistics.median(seq["direct"])
        labels = {
            "router": "(a) router.deliver (driver -> router -> persona)",
            "runtime": "(b) Runtime.ask / ask_async (resolved once, then direct)",
            "direct": "(c) direct handle.handle.remote",
        }
        report.section(f"1. ask round trip, scripted instant persona, {args.asks} sequential")
        for path in ("router", "runtime", "direct"):
            p50, p99 = statistics.median(seq[path]), pct(seq[path], 0.99)
            extra = "" if path == "direct" else f"  (+{p50 - d50:.2f} p50 vs c)"
            report.add(f"{labels[path]} p50 / p99", f"{p50:.2f} / {p99:.2f} ms{extra}")

        # 2. throughput
        handles = {p: ray.get(rt.router.resolve.remote(p)) for p in bench}
        best: dict[str, float] = {}
        best_cpu: dict[str, tuple[float, dict[str, float]]] = {}
        total = 0
        order = ["router", "runtime", "direct"]
        meter = CpuMeter({**roles, "personas": persona_pids(rt, bench)})
        with console.status(f"throughput: {args.messages} messages, {args.window} in flight"):
            for _ in range(args.rounds):
                for path in order:
                    gc.collect()
                    rate, total, secs, spent = asyncio.run(
                        throughput(rt, path, bench, handles, args.messages, args.window, meter)
                    )
                    if rate > best.get(path, 0.0):
                        best[path], best_cpu[path] = rate, (secs, spent)
                order.reverse()
        report.section(
            f"2. throughput, {args.window} in flight, {total} messages over "
            f"{len(bench)} personas x {args.window // len(bench)} conversations "
            f"(best of {args.rounds})"
        )
        for path in ("router", "runtime", "direct"):
            report.add(labels[path], f"{best[path]:,.0f} msg/s")
        for path in ("router", "runtime", "direct"):
            secs, spent = best_cpu[path]
            report.add(
                f"  {labels[path][:3]} CPU core-ms per message, by process",
                cpu_text(spent, secs, per=total / 1000, unit="ms"),
            )
        for path in ("router", "runtime"):
            ratio = best[path] / best["direct"]
            report.check(
                f"ratio {labels[path][:3]}/(c) routed/direct",
                f"{ratio:.2f}",
                ">= 0.80",
                ratio >= 0.8,
            )

        # 3. concurrent turns over warm personas
        names = model_names(args.personas)
        report.section(
            f"3. {args.turns} concurrent turns over {args.personas} warm personas, "
            f"model latency {args.latency:g} s"
        )
        with console.status(f"warming up {len(names)} personas"):
            warm_s, warm_failed = warm_up(rt, names)
        report.add(f"warm-up: {len(names)} personas activated + one turn each", f"{warm_s:.1f} s")
        report.check(
            "  warm-up asks that failed (then retried, ok)",
            str(len(warm_failed)),
            "0",
            not warm_failed,
        )
        for persona, error in warm_failed[:3]:
            notes.append(f"warm-up ask to {persona} failed: {error}")
        report.add(
            "in-process floor, CPU per turn (PersonaRuntime, no Ray): scripted / openai SDK",
            f"{floor['scripted']:.2f} / {floor['openai']:.2f} ms",
        )
        report.add(
            f"  so {args.turns} openai turns need, in persona code alone",
            f"{args.turns * floor['openai'] / 1000:.2f} core-s",
        )
        roles["personas"] = persona_pids(rt, names)
        roles["scripted personas"] = persona_pids(rt, bench)
        time.sleep(1.0)  # let the warm-up's audit flushes settle
        meter = CpuMeter(roles)
        meter.start()
        time.sleep(5.0)
        idle = meter.stop()["personas"] / 5.0
        report.add(
            f"  idle CPU of the {len(names)} warm persona processes (no messages)",
            f"{idle:.2f} cores = {idle * 1000 / len(names):.1f} core-ms/s each",
        )
        # A new conversation's first turn asks the audit actor for its history.
        events = rt.query("select count(*) from events").rows[0][0]
        probe = []
        for i in range(20):
            t0 = time.perf_counter()
            ray.get(rt.audit.history.remote(names[0], f"{names[0]}:probe-{i}"))
            probe.append((time.perf_counter() - t0) * 1000)
        report.add(
            f"  audit.history() of an unseen conversation, {events:,} events in the log",
            f"{statistics.median(probe):.1f} ms p50 (one at a time, under a lock)",
        )
        target = args.latency + 0.5
        with console.status(f"{args.turns} concurrent turns"):
            first = burst(rt, srv, names, args.turns, roles)
        report_burst(
            report,
            notes,
            first,
            f"wall time, submit -> last reply ({args.turns} asks, new conversations)",
            target,
        )
        # The same conversations again: their (empty) history is loaded from
        # the audit store only on a conversation's first turn in this actor,
        # and each persona's HTTP connections are already open.
        with console.status(f"{args.turns} concurrent turns, again"):
            second = burst(rt, srv, names, args.turns, roles)
        report_burst(report, notes, second, "same conversations again (second turn each)", None)

        # 4a. memory of the active personas
        stats = ray.get([handles_for(rt, p).stats.remote() for p in names])
        uss = [uss_mib(s["pid"]) for s in stats]
        sdks = {sdk for s in stats for sdk in s["sdks_loaded"]}
        rss = [psutil.Process(s["pid"]).memory_info().rss / MiB for s in stats]
        r_uss, _ = router_uss(rt)
        report.section(f"4. memory, {len(names)} active personas (sdks: {', '.join(sorted(sdks))})")
        report.add(
            f"USS of the {len(names)} persona processes: sum / mean",
            f"{sum(uss) / 1024:.2f} GiB / {statistics.mean(uss):.1f} MiB",
        )
        report.add("  RSS mean (shared pages counted in each)", f"{statistics.mean(rss):.1f} MiB")
        report.add(
            f"router USS, {len(names) + len(bench)} active personas",
            f"{r_uss:.1f} MiB",
        )
    finally:
        rt.shutdown()


def handles_for(rt: Runtime, persona: str) -> Any:
    return ray.get_actor(persona_actor_name(rt.id, persona), namespace=rt.namespace)


def run_registered_home(args: argparse.Namespace, report: Report, home: Path) -> None:
    n = args.registered
    t0 = time.perf_counter()
    with console.status(f"writing {n:,} persona directories"):
        for i in range(n):
            write_persona(
                home, f"p-{i:05d}", {**SCRIPTED, "description": f"registered persona {i}"}
            )
    write_s = time.perf_counter() - t0
    report.section(f"4b. fresh home, {n:,} registered personas (written in {write_s:.1f} s)")
    with console.status("starting Ray"):
        t0 = time.perf_counter()
        rt = Runtime.start(home=home, num_cpus=2)
        start_s = time.perf_counter() - t0
    try:
        named = named_persona_actors(rt)
        active = ray.get(rt.router.active.remote())
        procs = our_ray_processes("PersonaActor")
        idle = len(named) + len(active) + len(procs) == 0
        report.check(
            "persona processes: named actors / router.active / ray::PersonaActor",
            f"{len(named)} / {len(active)} / {len(procs)}",
            "0",
            idle,
        )
        report.add(f"Runtime.start on this home (Ray + router listing {n:,})", f"{start_s:.2f} s")
        uss0, pid = router_uss(rt)
        report.add(f"router USS after start (pid {pid})", f"{uss0:.1f} MiB")
        with console.status("Runtime.personas()"):
            t0 = time.perf_counter()
            roster = rt.personas()
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            rt.personas()
            warm = time.perf_counter() - t0
        if len(roster) != n:
            raise RuntimeError(f"personas() listed {len(roster)} of {n}")
        report.add("Runtime.personas(): first / second call", f"{cold:.2f} / {warm:.2f} s")
        uss1, _ = router_uss(rt)
        report.add("router USS after personas() (descriptions cached)", f"{uss1:.1f} MiB")
        t0 = time.perf_counter()
        ray.get(rt.router.resolve.remote("p-04242" if n > 4242 else "p-00000"))
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.get(rt.router.resolve.remote("p-00000" if n > 4242 else f"p-{n - 1:05d}"))
        second = time.perf_counter() - t0
        report.add("first resolve (activates one persona process)", f"{first:.2f} s")
        report.add("  a second persona's resolve", f"{second:.2f} s")
        report.add(
            "persona processes after the two resolves",
            f"{len(named_persona_actors(rt))} / {len(our_ray_processes('PersonaActor'))}",
        )
    finally:
        rt.shutdown()


@contextmanager
def fake_server(latency: float) -> Iterator[ServerProcess]:
    with console.status("starting the fake model server"):
        srv = ServerProcess(latency)
    try:
        yield srv
    finally:
        srv.stop()


def revision() -> str:
    """The checkout's commit, "+dirty" when files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown revision"
    return f"{head or 'unknown'}{'+dirty' if dirty else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--asks", type=int, default=500, help="sequential asks per path")
    parser.add_argument("--messages", type=int, default=3000, help="throughput messages per path")
    parser.add_argument("--window", type=int, default=64, help="asks in flight for throughput")
    parser.add_argument("--rounds", type=int, default=3, help="throughput runs per path")
    parser.add_argument("--tp-personas", type=int, default=4, help="scripted personas")
    parser.add_argument("--personas", type=int, default=100, help="warm OpenAI personas")
    parser.add_argument("--turns", type=int, default=1000, help="concurrent turns")
    parser.add_argument("--latency", type=float, default=1.0, help="model latency (s)")
    parser.add_argument("--registered", type=int, default=10_000, help="personas in 4b")
    args = parser.parse_args()

    # Persona actors inherit this (Ray's workers get the driver's environment).
    os.environ[KEY_ENV] = "sk-bench-dummy"
    # Always a fresh local Ray: the numbers (and the process scan) assume it.
    os.environ.pop("RAY_ADDRESS", None)
    report = Report()
    notes: list[str] = []
    started = time.perf_counter()
    try:
        with fake_server(args.latency) as srv, tempfile.TemporaryDirectory() as tmp:
            main_home, big_home = Path(tmp) / "main", Path(tmp) / "registered"
            write_main_home(main_home, args, srv.base_url)
            run_main_home(args, report, notes, main_home, srv)
            run_registered_home(args, report, big_home)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        title = (
            f"coterie personas benchmark ({revision()}, {os.cpu_count()} cores, "
            f"{time.perf_counter() - started:.0f} s)"
        )
        if CpuMeter.wall_total:
            cores = os.cpu_count() or 2
            share = CpuMeter.other_total / (cores * CpuMeter.wall_total)
            report.section("machine")
            report.add(
                "other users' CPU during the measured intervals",
                f"{CpuMeter.other_total:.1f} core-s in {CpuMeter.wall_total:.0f} s "
                f"({share:.0%} of {cores} cores)",
            )
        console.print(report.table(title))
        for note in notes:
            console.print(f"note: {note}", markup=False, highlight=False)


if __name__ == "__main__":
    main()
