"""The evaluator next to Inspect AI: the same one-tool task, same box, same run.

Each sample asks for a sum; the answering model is scripted so that each
sample costs two model calls and one tool call (call the tool, then answer
with its result) and is scored with ``includes``. Measured:

1. 500 samples, 100 in flight, an instant model: samples/s and peak memory.
   coterie: the ``coterie eval`` path (a run planned from a task file, the
   samples on eval worker actors, results in DuckDB), timed around the run
   (Ray and the runtime actors already up), with ``--workers`` actors;
   memory = the driver's peak RSS + the workers' peak RSS. Inspect AI
   (``benchmarks/_inspect_peer.py``, its ``mockllm`` model, run in its own
   process): timed around ``eval()``, its process's peak RSS.
2. 200 samples, 100 in flight, each model call taking 1 s: wall time beside
   the ideal, 2 calls × 1 s × 200 / 100 = 4 s, for both.

    python benchmarks/eval.py [--samples 500] [--latency-samples 200] [--workers 2]

Inspect AI is not a dependency of coterie: ``pip install inspect-ai`` first
(without it its rows say so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._procs import our_ray_processes, peer_json  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.actors.eval import RayExecutor  # noqa: E402
from coterie.runtime.config import RuntimeSettings  # noqa: E402
from coterie.runtime.eval import EvalRunner, RunOptions, open_store, plan_run  # noqa: E402

MiB = 2**20
console = Console(width=None if sys.stdout.isatty() else 150)


def write_task(folder: Path, samples: int, latency_ms: int, max_samples: int) -> Path:
    rng = random.Random(1234)
    data = f"sums-{samples}-{latency_ms}.jsonl"
    with (folder / data).open("w") as f:
        for i in range(samples):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            f.write(json.dumps({"id": str(i), "input": f"{a} + {b}", "target": str(a + b)}) + "\n")
    model: dict[str, Any] = {
        "provider": "scripted",
        "rules": [
            {
                "when": {"turn": 1},
                "tool_calls": [{"name": "calculate", "arguments": {"expression": "{input}"}}],
            },
            {"when": {"turn": 2}, "text": "The answer is {last_tool_result}."},
        ],
    }
    if latency_ms:
        model["latency_ms"] = latency_ms
    task = {
        "name": f"sums-{samples}-{latency_ms}",
        "dataset": {"path": data},
        "solver": {"inline": {"model": model, "tools": {"allow": ["calculate"]}}},
        "scorers": [{"type": "includes"}],
        "max_samples": max_samples,
        "max_connections": max_samples,
    }
    path = folder / f"sums-{samples}-{latency_ms}.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


class PeakRss:
    """Peak RSS of this process plus the eval worker actors, sampled."""

    def __init__(self) -> None:
        self.workers = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for proc in our_ray_processes("EvalWorkerActor"):
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    continue
            self.workers = max(self.workers, total / MiB)
            self._stop.wait(0.1)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def coterie_run(rt: Runtime, task: Path, workers: int) -> dict[str, float]:
    store = open_store(rt.home)
    try:
        plan = plan_run(task, rt.home, store, RunOptions())
        executor = RayExecutor.for_runtime(plan, rt, workers=workers)
        asyncio.run(executor.nodes())  # the workers are up before the clock starts

        async def go() -> tuple[Any, float]:
            runner = EvalRunner(
                plan.task,
                plan.samples,
                run=plan.run,
                store=store,
                executor=executor,
                scorers=plan.scorers,
            )
            try:
                started = time.perf_counter()
                # The run: every result written and the run marked finished.
                progress = await runner.run()
                return progress, time.perf_counter() - started
            finally:
                await executor.aclose()  # teardown, not timed

        with PeakRss() as peak:
            progress, wall = asyncio.run(go())
        report = store.report(plan.run.run_id)
        accuracy = next(s.mean for s in report.summaries if s.group is None)
        n = len(plan.samples)
        driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {
            "wall_s": wall,
            "samples_per_s": n / wall,
            "accuracy": accuracy,
            "errors": progress.errors,
            "rss_mib": driver + peak.workers,
        }
    finally:
        store.close()


def inspect_run(samples: int, latency: float, max_samples: int) -> dict[str, Any] | str:
    try:
        import inspect_ai  # noqa: F401
    except ImportError:
        return "inspect-ai is not installed (pip install inspect-ai)"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "_inspect_peer.py"),
        "--samples",
        str(samples),
        "--latency",
        str(latency),
        "--max-samples",
        str(max_samples),
        "--json",
    ]
    return peer_json(cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--max-samples", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="eval worker actors")
    args = parser.parse_args()
    load = os.getloadavg()

    table = Table(title=f"Evaluator · {os.cpu_count()} cores · load {load[0]:.1f} {load[1]:.1f}")
    for column in ("measure", "coterie eval", "Inspect AI (same run)", "ratio"):
        table.add_column(column, justify="left" if column == "measure" else "right")

    with tempfile.TemporaryDirectory(prefix="coterie-bench-eval-") as tmp_s:
        tmp = Path(tmp_s)
        home = tmp / "home"
        (home / "personas").mkdir(parents=True)
        fast = write_task(tmp, args.samples, 0, args.max_samples)
        slow = write_task(tmp, args.latency_samples, 1000, args.max_samples)

        rt = Runtime.start(home=home, num_cpus=2, settings=RuntimeSettings(idle_timeout=None))
        try:
            ours_fast = coterie_run(rt, fast, args.workers)
            ours_slow = coterie_run(rt, slow, args.workers)
        finally:
            rt.shutdown()
        theirs_fast = inspect_run(args.samples, 0.0, args.max_samples)
        theirs_slow = inspect_run(args.latency_samples, 1.0, args.max_samples)

    def row(label: str, ours: float, theirs: dict[str, Any] | str, key: str, fmt: str) -> None:
        if isinstance(theirs, str):
            table.add_row(label, fmt.format(ours), theirs, "")
            return
        other = float(theirs[key])
        table.add_row(label, fmt.format(ours), fmt.format(other), f"{ours / other:.2f}x")

    table.add_row(f"[bold]{args.samples} samples, {args.max_samples} in flight, instant model[/]")
    row("samples/s", ours_fast["samples_per_s"], theirs_fast, "samples_per_s", "{:.1f}")
    row("wall s", ours_fast["wall_s"], theirs_fast, "wall_s", "{:.2f}")
    row(
        "peak RSS MiB (coterie: driver + workers)",
        ours_fast["rss_mib"],
        theirs_fast,
        "peak_rss_mib",
        "{:.0f}",
    )
    row("accuracy", ours_fast["accuracy"], theirs_fast, "accuracy", "{:.3f}")
    ideal = 2 * 1.0 * args.latency_samples / args.max_samples
    table.add_row(
        f"[bold]{args.latency_samples} samples, {args.max_samples} in flight, 1 s model "
        f"(ideal {ideal:.1f} s)[/]"
    )
    row("wall s", ours_slow["wall_s"], theirs_slow, "wall_s", "{:.2f}")
    table.add_row(
        "wall / ideal",
        f"{ours_slow['wall_s'] / ideal:.2f}x",
        "" if isinstance(theirs_slow, str) else f"{theirs_slow['wall_s'] / ideal:.2f}x",
        "",
    )
    row("accuracy", ours_slow["accuracy"], theirs_slow, "accuracy", "{:.3f}")
    console.print(table)


if __name__ == "__main__":
    main()
