"""Shell tools: latency next to a bare subprocess, background start, memory.

In the same run: ``shell_exec`` of ``true`` and ``echo hi`` through the Ray
service (one ShellProcessActor per command) and through the in-process
service, next to a bare ``/bin/sh -c`` subprocess; the start latency of a
``background: true`` command; the memory (USS, summed over every process
involved) of 50 background ``sleep 60``. Everything is removed at the end.

    python benchmarks/shell.py [--n 20] [--background 50]
"""

from __future__ import annotations

import argparse
import asyncio
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

from coterie.actors.shell import ShellProcesses  # noqa: E402
from coterie.runtime.context import TurnContext, TurnSettings  # noqa: E402
from coterie.runtime.services import Services  # noqa: E402
from coterie.runtime.shell import LocalProcesses, scrubbed_env  # noqa: E402
from coterie.runtime.testing import turn_context as make_ctx  # noqa: E402
from coterie.tools.shell import ShellExecArgs, shell_exec  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 150)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(n: int, fn: Callable[[], Awaitable[Any]], gap: float = 0.0) -> list[float]:
    await fn()  # warm-up
    out = []
    for _ in range(n):
        await asyncio.sleep(gap)
        started = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def bare(command: str, cwd: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=scrubbed_env(home=cwd),
    )
    await proc.communicate()


def uss(pids: list[int]) -> float:
    total = 0
    for pid in set(pids):
        try:
            total += psutil.Process(pid).memory_full_info().uss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree(pid: int | None) -> list[int]:
    if pid is None:
        return []
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


async def run(args: argparse.Namespace) -> Table:
    tmp = Path(tempfile.mkdtemp(prefix="coterie-shell-bench-"))
    ws = tmp / "home" / "personas" / "bench" / "workspace"
    ws.mkdir(parents=True)
    ray_svc = ShellProcesses(bwrap="auto", spares=args.spares)
    local_svc = LocalProcesses(bwrap="auto")

    def ctx(svc: Any) -> TurnContext:
        return make_ctx(
            persona="bench",
            services=Services(processes=svc),
            settings=TurnSettings(workspace=ws, persona_dir=ws.parent, home=tmp / "home"),
        )

    def exec_(svc: Any, command: str, **kw: Any) -> Callable[[], Awaitable[Any]]:
        c = ctx(svc)
        return lambda: shell_exec.fn(ShellExecArgs(command=command, **kw), c)

    table = Table(title=f"shell tools (bwrap: {'on' if ray_svc.sandboxed else 'off'})")
    for col in ("measure", "p50 ms", "p99 ms", "vs bare p50", "note"):
        table.add_column(col, justify="left" if col in ("measure", "note") else "right")

    for command in ("true", "echo hi"):
        floor = await timed(args.n, lambda command=command: bare(command, ws))  # type: ignore[misc]
        base = statistics.median(floor)
        table.add_row(
            f"bare subprocess `{command}`",
            f"{base:.2f}",
            f"{pct(floor, 0.99):.2f}",
            "1.0x",
            "asyncio, /bin/sh -c, no sandbox",
        )
        rows: list[tuple[str, Any, float, str]] = [
            ("in-process service", local_svc, 0.0, ""),
            ("Ray actor, back to back", ray_svc, 0.0, "no time to warm a spare: actor start"),
            ("Ray actor, warm spare", ray_svc, args.gap, f"{args.gap}s between calls"),
        ]
        for label, svc, gap, note in rows:
            with console.status(f"{label}: {command}"):
                lat = await timed(args.n, exec_(svc, command), gap)
            table.add_row(
                f"shell_exec `{command}` ({label})",
                f"{statistics.median(lat):.2f}",
                f"{pct(lat, 0.99):.2f}",
                f"{statistics.median(lat) / base:.1f}x",
                note,
            )

    for label, svc in (("in-process service", local_svc), ("Ray actor service", ray_svc)):
        starts: list[float] = []
        ids: list[str] = []
        with console.status(f"{label}: {args.background} background sleeps"):
            for _ in range(args.background):
                started = time.perf_counter()
                res = await exec_(svc, "sleep 60", background=True)()
                starts.append((time.perf_counter() - started) * 1000)
                ids.append(res["id"])
            statuses = await svc.list()
            pids: list[int] = []
            for st in statuses:
                assert st.pid is not None
                pids += tree(st.pid)
                if isinstance(svc, ShellProcesses):
                    # The shell's parent: the ShellProcess actor's worker process.
                    pids.append(psutil.Process(st.pid).ppid())
            mem = uss(pids)
        table.add_row(
            f"background start ({label})",
            f"{statistics.median(starts):.2f}",
            f"{pct(starts, 0.99):.2f}",
            "",
            "",
        )
        table.add_row(
            f"{args.background} x `sleep 60` in background ({label})",
            "",
            "",
            "",
            f"USS sum {mem:.1f} MiB = {mem / args.background:.2f} MiB/process"
            f" over {len(set(pids))} OS processes",
        )
        with console.status(f"{label}: cleaning up"):
            await asyncio.gather(*(svc.remove(i) for i in ids))
        await asyncio.sleep(2.0)
        left = [p for p in pids if alive(p)]
        if left:
            names = sorted({psutil.Process(p).name() for p in left if alive(p)})
            table.add_row(
                f"alive 2 s after remove ({label})", "", "", "", f"{len(left)}: {', '.join(names)}"
            )
    await local_svc.close()
    await ray_svc.close()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20, help="sequential runs per latency row")
    parser.add_argument("--background", type=int, default=50)
    parser.add_argument("--gap", type=float, default=1.5, help="seconds between warm calls")
    parser.add_argument("--spares", type=int, default=1, help="warm ShellProcessActors")
    args = parser.parse_args()
    with console.status("starting Ray"):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        table = asyncio.run(run(args))
    finally:
        ray.shutdown()
    console.print(table)


if __name__ == "__main__":
    main()
