"""What an idle process costs: CPU per second and main-thread wake-ups.

``python benchmarks/idle_cpu.py [--actors 8] [--seconds 10]``

Measured on the same Ray, one row at a time (nothing else of the benchmark
runs meanwhile):

- the floor: bare async actors (``num_cpus=0``) that did nothing since start;
- the same bare actors, each row under one of Ray's documented settings
  (given to their workers as ``runtime_env`` variables) that a periodic
  task of the core worker reads;
- coterie's persona actors after one turn, idle (``idle_timeout: null``, so
  that no passivation watcher runs either).

Each row shows CPU milliseconds per second per process beside the floor's,
with the ratio, and how often the process's main thread woke up (voluntary
context switches per second, from ``/proc``). A bare actor's main thread
wakes about 100 times a second: Ray's core worker runs its signal check
every 10 ms in the task execution loop (``CoreWorker::RunTaskExecutionLoop``,
``"CoreWorker.CheckSignal"``, a period no setting changes), and each check
takes the GIL to run Python's signal handlers.
"""

from __future__ import annotations

import argparse
import os
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

from benchmarks._procs import compile_coterie  # noqa: E402
from benchmarks.personas import persona_pids, write_persona  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.runtime.config import RuntimeSettings  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 140)

#: Ray settings with a periodic task in every worker, each tried alone.
SETTINGS: list[tuple[str, dict[str, str]]] = [
    ("event loop stats off", {"RAY_event_stats": "false"}),
    ("task events off", {"RAY_enable_task_events": "false"}),
    ("metrics reported every 60 s", {"RAY_metrics_report_interval_ms": "60000"}),
]


class Bare:
    async def pid(self) -> int:
        return os.getpid()


BareRemote = ray.remote(num_cpus=0)(Bare)


def wakeups(pid: int) -> int:
    """The main thread's voluntary context switches so far."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    raise RuntimeError(f"no context switches for {pid}")


def idle(pids: list[int], seconds: float) -> tuple[float, float]:
    """CPU ms per second per process, and main-thread wake-ups per second."""
    procs = [psutil.Process(p) for p in pids]

    def cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    cpu0, wake0 = cpu(), sum(wakeups(p) for p in pids)
    time.sleep(seconds)
    cpu1, wake1 = cpu(), sum(wakeups(p) for p in pids)
    n = len(pids)
    return (cpu1 - cpu0) * 1000 / seconds / n, (wake1 - wake0) / seconds / n


def bare_row(n: int, env: dict[str, str], seconds: float, settle: float) -> tuple[float, float]:
    options: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
    actors = [BareRemote.options(**options).remote() for _ in range(n)]
    pids = ray.get([a.pid.remote() for a in actors])
    time.sleep(settle)  # past the start's own work
    try:
        return idle(pids, seconds)
    finally:
        for actor in actors:
            ray.kill(actor)


def persona_row(n: int, seconds: float, settle: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        names = [f"idle-{i}" for i in range(n)]
        for name in names:
            write_persona(home, name, {"model": {"provider": "scripted", "default": "ok"}})
        rt = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None))
        try:
            for name in names:
                assert rt.ask(name, "hello").status == "ok"
            rt.flush()
            pids = sorted(persona_pids(rt, names))
            time.sleep(settle)  # the audit buffer's last flush and the turn's tail
            return idle(pids, seconds)
        finally:
            rt.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=8, help="processes per row")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per row")
    parser.add_argument("--settle", type=float, default=5.0, help="wait before measuring")
    args = parser.parse_args()
    console.print(compile_coterie())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="idle-bench")
    rows: list[tuple[str, float, float]] = []
    floor = bare_row(args.actors, {}, args.seconds, args.settle)
    rows.append(("bare async actor (the floor)", *floor))
    for label, env in SETTINGS:
        rows.append((f"bare, {label}", *bare_row(args.actors, env, args.seconds, args.settle)))
    rows.append(
        ("coterie persona, idle after a turn", *persona_row(args.actors, args.seconds, args.settle))
    )
    ray.shutdown()
    table = Table(title=f"idle processes, {args.actors} per row, {args.seconds:g} s each")
    for column in ("process", "CPU ms/s", "floor ms/s", "ratio", "main-thread wake-ups/s"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for label, cpu, wake in rows:
        table.add_row(
            label, f"{cpu:.2f}", f"{floor[0]:.2f}", f"{cpu / floor[0]:.2f}x", f"{wake:.1f}"
        )
    console.print(table)
    console.print(
        "target (issue 41): an idle persona process <= 2 ms/s. A bare actor's main thread "
        "wakes ~100 times a second for Ray's 10 ms signal check, whatever the settings."
    )


if __name__ == "__main__":
    main()
