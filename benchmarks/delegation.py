"""Delegation: subagent spawn latency, 100 concurrent subagents, ACP agent startup.

Measured in one run and printed as one table, each figure beside its floor or
peer measured in the same run:

1. spawn -> first model call: from the parent's ``tool_call`` event for
   ``spawn_subagent`` to the start of the subagent's first model call (its
   ``model_call`` event's time minus the call's latency), read back from the
   audit log. Through the Ray persona path (a spare Subagent actor is kept
   warm, so a spawn reuses a started process) and, as the peer, in-process
   (``LocalSubagents``, no Ray). The first spawn of a freshly activated
   persona has no spare yet and starts an actor: it is reported on its own
   beside a bare Ray actor's start -> first reply. The warm spawns are beside
   one call on an already-started bare actor.
2. 100 concurrent subagents, spawned by one assistant message
   (``subagents.max_running: 128``), each on a scripted model that answers
   after 1 s: wall time from the ask to the end of the parent's wake turn,
   beside 100 bare async actors (``num_cpus=0``) started together, each
   awaiting a 1 s sleep; and the peak summed USS of the live
   ``ray::SubagentActor`` processes (each exits once it has reported, so on a
   small box fewer than 100 are alive at once) beside as many bare actors.
3. one ACP agent's startup: ``AcpSession.start`` (spawn, ``initialize``,
   ``session/new``) of claude-agent-acp (installed by ``.ci/run`` under
   ``.acp-agents/``) beside ``node -e 0``. Skipped with a line in the table
   when node or the agent is missing.

    python benchmarks/delegation.py [--spawns 10] [--fanout 100] [--acp 3]

Processes are found by Ray proctitle among the descendants of this driver
only, so other Ray sessions on a shared machine stay out of the count.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
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
from coterie.runtime.config import RuntimeSettings, load_persona  # noqa: E402
from coterie.runtime.delegation import LocalSubagents  # noqa: E402
from coterie.runtime.delegation.acp import AcpSession, AgentSpec  # noqa: E402
from coterie.runtime.messages import MessageEnvelope, ModelCalled, ToolCalled  # noqa: E402
from coterie.runtime.models import build_model  # noqa: E402
from coterie.runtime.persona import Launchers, PersonaRuntime  # noqa: E402
from coterie.runtime.services import NullAudit, Services  # noqa: E402
from coterie.tools import builtin_registry  # noqa: E402
from tests.fakes.anthropic_stream import AnthropicStreamServer  # noqa: E402

MiB = 2**20
CLAUDE_ACP = Path(
    os.environ.get(
        "COTERIE_CLAUDE_AGENT_ACP",
        ROOT / ".acp-agents/node_modules/@zed-industries/claude-agent-acp/dist/index.js",
    )
)

console = Console(width=None if sys.stdout.isatty() else 150)


# -- the table -------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, label: str, value: str, floor: str = "", ratio: str = "") -> None:
        self.rows.append((label, value, floor, ratio))

    def section(self, title: str) -> None:
        self.rows.append((f"[bold]{title}[/]", "", "", ""))

    def table(self, title: str) -> Table:
        table = Table(title=title)
        table.add_column("measure")
        table.add_column("coterie", justify="right")
        table.add_column("floor / peer (same run)", justify="right")
        table.add_column("ratio", justify="right")
        for row in self.rows:
            table.add_row(*row)
        return table


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "-"


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5):.1f} / p90 {pct(values, 0.9):.1f} ms"


# -- the personas ----------------------------------------------------------------


def spawn(task: str, **extra: Any) -> dict[str, Any]:
    return {"name": "spawn_subagent", "arguments": {"task": task, **extra}}


def write_persona(home: Path, name: str, config: dict[str, Any]) -> None:
    path = home / "personas" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "persona.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (path / "SOUL.md").write_text(f"You are {name}.", encoding="utf-8")


def lead_config(fanout: int) -> dict[str, Any]:
    """Scripted: ``spawn one`` spawns one subagent; ``fan out`` spawns
    ``fanout`` subagents on a model that answers after 1 s."""
    rules = [
        {"when": {"context": "subagent"}, "text": "done: {input}"},
        # The wake; checked before the triggers (its text quotes the tasks).
        {"when": {"contains": "delegated"}, "text": "all back"},
        {"when": {"turn": 1, "contains": "spawn one"}, "tool_calls": [spawn("look")]},
        {
            "when": {"turn": 1, "contains": "fan out"},
            "tool_calls": [spawn(f"task {i}", model="slow") for i in range(fanout)],
        },
    ]
    slow = {"provider": "scripted", "name": "slow", "latency_ms": 1000, "default": "done"}
    return {
        "model": {"provider": "scripted", "rules": rules, "default": "ok"},
        "subagents": {"models": {"slow": slow}, "max_running": max(4, fanout + 28)},
    }


# -- 1. spawn -> first model call ------------------------------------------------


def first_call_start(calls: list[ModelCalled]) -> float:
    first = min(calls, key=lambda c: c.ts)
    return first.ts - first.latency_ms / 1000


async def in_process_spawns(home: Path, n: int) -> list[float]:
    """Spawn -> first model call (ms) through ``LocalSubagents`` in this process."""
    persona = load_persona(home, "lead")
    audit = NullAudit()
    registry = builtin_registry()
    launcher = LocalSubagents(registry=registry, model_factory=build_model, audit=audit)
    rt = PersonaRuntime(
        persona,
        model=build_model(persona.config.model),
        registry=registry,
        services=Services(audit=audit),
        launchers=Launchers(subagents=launcher),
    )
    out = []
    try:
        for i in range(n + 1):
            conv = f"lead:local-{i}"
            envelope = MessageEnvelope(recipient="lead", conversation_id=conv, text="spawn one")
            await rt.handle(envelope)
            async with asyncio.timeout(60):
                while not rt.settled(conv):
                    await asyncio.sleep(0.005)
            (spawned,) = [
                e
                for e in audit.events
                if isinstance(e, ToolCalled)
                and e.conversation_id == conv
                and e.tool == "spawn_subagent"
            ]
            child = [
                e
                for e in audit.events
                if isinstance(e, ModelCalled)
                and e.conversation_id.startswith("sub_")
                and e.ts >= spawned.ts
            ]
            if i:  # the first warms the imports
                out.append((first_call_start(child) - spawned.ts) * 1000)
            audit.events.clear()
    finally:
        await rt.aclose()
    return out


def ray_spawn(rt: Runtime, conv: str) -> float:
    """One spawn through the Ray persona; spawn -> first model call in ms."""
    reply = rt.ask("lead", "spawn one", conversation_id=conv)
    if reply.status != "ok":
        raise RuntimeError(f"spawn ask failed: {reply.status} {reply.text}")
    rt.wait_settled("lead", conv, timeout=120)
    sql = (
        "select (payload->>'ts')::double from events where kind = 'tool_call' "
        f"and tool = 'spawn_subagent' and conversation_id = '{conv}'"
    )
    deadline = time.monotonic() + 30
    while True:
        rt.flush()
        spawned = rt.query(sql).rows
        child = rt.query(
            "select (payload->>'ts')::double - latency_ms / 1000 from events "
            "where kind = 'model_call' and conversation_id in (select call_id from events "
            f"where kind = 'delegation' and conversation_id = '{conv}') order by 1 limit 1"
        ).rows
        if spawned and child:
            return float((child[0][0] - spawned[0][0]) * 1000)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no audit rows for the spawn in {conv}")
        time.sleep(0.2)


@ray.remote(num_cpus=0)
class Bare:
    async def ping(self) -> int:
        return os.getpid()

    async def sleep(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()


def bare_start_ms() -> float:
    started = time.perf_counter()
    actor = Bare.remote()  # type: ignore[attr-defined]
    ray.get(actor.ping.remote())
    elapsed = (time.perf_counter() - started) * 1000
    ray.kill(actor)
    return elapsed


def bare_call_ms(actor: Any) -> float:
    started = time.perf_counter()
    ray.get(actor.ping.remote())
    return (time.perf_counter() - started) * 1000


# -- 2. many at once -------------------------------------------------------------


def summed_uss(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / MiB


class PeakUss:
    """Samples the summed USS of ``ray::<title>`` processes in a thread."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.peak = 0.0
        self.peak_count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            procs = our_ray_processes(self.title)
            total = summed_uss(procs)
            if total > self.peak:
                self.peak, self.peak_count = total, len(procs)
            self._stop.wait(0.2)

    def __enter__(self) -> PeakUss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def ray_fanout(rt: Runtime, n: int) -> tuple[float, float, int, int]:
    """(wall s, peak summed USS MiB, processes at the peak, subagents that reported ok)."""
    conv = "lead:fanout"
    with PeakUss("SubagentActor") as peak:
        started = time.time()
        reply = rt.ask("lead", "fan out", conversation_id=conv, timeout=600)
        if reply.status != "ok":
            raise RuntimeError(f"fan-out ask failed: {reply.status} {reply.text}")
        rt.wait_settled("lead", conv, timeout=600)
    rt.flush()
    ended = rt.query(
        "select max((payload->>'ts')::double) from events where kind = 'turn_ended' "
        f"and conversation_id = '{conv}'"
    ).rows[0][0]
    ok = rt.query(
        "select count(*) from events where kind = 'delegation' and status = 'ok' "
        f"and conversation_id = '{conv}' and payload->>'phase' = 'finished'"
    ).rows[0][0]
    return float(ended) - started, peak.peak, peak.peak_count, int(ok)


def bare_fanout(n: int) -> tuple[float, float]:
    """100 bare async actors started together, each awaiting a 1 s sleep:
    (wall s, summed USS MiB while they sleep)."""
    started = time.perf_counter()
    actors = [Bare.remote() for _ in range(n)]  # type: ignore[attr-defined]
    refs = [a.sleep.remote(1.0) for a in actors]
    ray.get(refs)
    wall = time.perf_counter() - started
    uss = summed_uss(our_ray_processes("Bare"))
    for actor in actors:
        ray.kill(actor)
    return wall, uss


# -- 3. ACP startup --------------------------------------------------------------


async def acp_startups(n: int, tmp: Path) -> list[float]:
    node = shutil.which("node")
    assert node is not None
    out = []
    async with AnthropicStreamServer() as server:
        env = {
            "ANTHROPIC_BASE_URL": server.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-bench",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "IS_SANDBOX": "1",
        }
        spec = AgentSpec(command=node, args=[str(CLAUDE_ACP)], env=env, startup_timeout=120)
        for i in range(n):
            workspace = tmp / f"ws{i}"
            workspace.mkdir(parents=True)
            session = AcpSession(
                spec,
                name="claude",
                workspace=workspace,
                log_path=tmp / "logs" / f"claude{i}.log",
                env=env,
                agent_home=tmp / f"home{i}",
            )
            started = time.perf_counter()
            try:
                await session.start()
                out.append(time.perf_counter() - started)
            finally:
                await session.close()
    return out


def node_floor(n: int) -> list[float]:
    node = shutil.which("node")
    assert node is not None
    out = []
    for _ in range(n):
        started = time.perf_counter()
        subprocess.run([node, "-e", "0"], check=True)
        out.append(time.perf_counter() - started)
    return out


# -- main ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=10, help="sequential spawns per path")
    parser.add_argument("--fanout", type=int, default=100, help="subagents in one message")
    parser.add_argument("--acp", type=int, default=3, help="ACP agent startups")
    args = parser.parse_args()

    report = Report()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="coterie-bench-delegation-") as tmp_s:
        tmp = Path(tmp_s)
        home = tmp / "home"
        write_persona(home, "lead", lead_config(args.fanout))

        # In-process first: no Ray running yet.
        local = asyncio.run(in_process_spawns(home, args.spawns))

        rt = Runtime.start(home=home, num_cpus=2, settings=RuntimeSettings(idle_timeout=None))
        try:
            cold = ray_spawn(rt, "lead:cold")
            time.sleep(3)  # let the spare start
            warm = []
            for i in range(args.spawns):
                warm.append(ray_spawn(rt, f"lead:warm-{i}"))
                time.sleep(2)
            bare_starts = [bare_start_ms() for _ in range(max(3, args.spawns // 2))]
            probe = Bare.remote()  # type: ignore[attr-defined]
            bare_call_ms(probe)
            bare_calls = [bare_call_ms(probe) for _ in range(args.spawns)]
            ray.kill(probe)

            report.section(f"1. spawn_subagent -> first model call ({args.spawns} spawns)")
            report.add(
                "Ray persona, spare actor warm",
                ms(warm),
                f"in-process LocalSubagents {ms(local)}",
                ratio(pct(warm, 0.5), pct(local, 0.5)),
            )
            report.add(
                "",
                "",
                f"call on a started bare actor p50 {pct(bare_calls, 0.5):.1f} ms",
                ratio(pct(warm, 0.5), pct(bare_calls, 0.5)),
            )
            report.add(
                "Ray persona, first spawn (cold: starts an actor)",
                f"{cold:.0f} ms",
                f"bare actor start -> first reply p50 {pct(bare_starts, 0.5):.0f} ms",
                ratio(cold, pct(bare_starts, 0.5)),
            )

            wall, peak, procs, ok = ray_fanout(rt, args.fanout)
            bare_wall, bare_uss = bare_fanout(args.fanout)
            report.section(f"2. {args.fanout} concurrent subagents, 1 s scripted model")
            report.add(
                "wall: ask -> end of the grouped wake turn",
                f"{wall:.1f} s ({ok} ok)",
                f"{args.fanout} bare actors start + 1 s call: {bare_wall:.1f} s",
                ratio(wall, bare_wall),
            )
            # Subagent actors exit once they report, and on 2 cores they start
            # a few per second: fewer than ``fanout`` are alive at the peak.
            # Their floor is the same number of bare actors.
            bare_per = bare_uss / args.fanout
            report.add(
                "peak summed USS of live Subagent actors",
                f"{peak:.0f} MiB ({procs} alive)",
                f"{procs} bare actors: {bare_per * procs:.0f} MiB",
                ratio(peak, bare_per * procs),
            )
            if procs:
                report.add(
                    "USS per Subagent actor at the peak",
                    f"{peak / procs:.0f} MiB",
                    f"bare actor {bare_per:.0f} MiB",
                    ratio(peak / procs, bare_per),
                )
        finally:
            rt.shutdown()

        report.section(f"3. ACP agent startup ({args.acp} runs)")
        if shutil.which("node") is None or not CLAUDE_ACP.is_file():
            report.add("claude-agent-acp", "skipped: node or the agent is not installed")
        else:
            starts = asyncio.run(acp_startups(args.acp, tmp / "acp"))
            floor = node_floor(args.acp)
            report.add(
                "claude-agent-acp: spawn + initialize + session/new",
                f"p50 {statistics.median(starts):.2f} / max {max(starts):.2f} s",
                f"node -e 0 p50 {statistics.median(floor):.2f} s",
                ratio(statistics.median(starts), statistics.median(floor)),
            )

    console.print(
        report.table(
            f"Delegation · {os.cpu_count()} cores · load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
        )
    )


if __name__ == "__main__":
    main()
