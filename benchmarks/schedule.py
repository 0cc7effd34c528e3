"""The scheduler with 1,000 personas whose heartbeats fall due in the same minute.

950 of them have an empty ``HEARTBEAT.md`` (nothing to do: each heartbeat
must be skipped before anything starts), 50 have work (a scripted model that
does it in one call and ends the turn with ``end_task``). One runtime on
Ray, the real Scheduler actor; the schedules are written once the runtime is
up, at least 20 s before a minute's start, so that every heartbeat falls due
at that minute (heartbeat instants are aligned on the epoch). Printed:

* the Scheduler actor's CPU (its process, psutil), less what it spends idle
  for as long (measured over the seconds before: it looks at 2,000 files
  every ``reload_interval``): from half a second before the minute until
  every skip is recorded, per due heartbeat, beside the floor — croniter
  alone computing the same 1,000 next fires, in this process; and from then
  until the last fire was dispatched (each through the router to a persona
  started for it, whose accept and finish come back), per fire;
* its idle CPU per second with the 1,000 entries loaded;
* how late after the minute each heartbeat was decided (a skip's audit
  event), claimed in the ledger and accepted by its persona (whose process
  started for it meanwhile), p50 and p99;
* persona processes started and model calls made: both must be 50.

    python benchmarks/schedule.py [--personas 1000] [--busy 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import ray
import yaml
from croniter import croniter
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._procs import compile_coterie, cpu_of  # noqa: E402
from coterie import Runtime  # noqa: E402
from coterie.actors._ray import persona_actor_name  # noqa: E402
from coterie.runtime.schedule import STORE_FILE, ScheduleStore  # noqa: E402

#: A persona with work: the heartbeat's one model call ends the turn.
BUSY = {
    "description": "has work on every heartbeat",
    "model": {
        "provider": "scripted",
        "rules": [
            {
                "when": {"contains": "Heartbeat"},
                "tool_calls": [{"name": "end_task", "arguments": {"status": "ok"}}],
            }
        ],
        "default": "ok",
    },
}
IDLE = {"description": "nothing to do", "model": {"provider": "scripted", "default": "ok"}}
#: Seconds the benchmark waits for the minute's fires to be done.
WAIT = 600.0


def names(n: int) -> list[str]:
    return [f"hb-{i:04d}" for i in range(n)]


def write_personas(home: Path, n: int, busy: int) -> list[str]:
    """The personas (no schedules yet); the busy ones' names."""
    workers = []
    for i, name in enumerate(names(n)):
        folder = home / "personas" / name
        folder.mkdir(parents=True)
        is_busy = i % (n // busy) == 0 and len(workers) < busy
        (folder / "persona.yaml").write_text(yaml.safe_dump(BUSY if is_busy else IDLE))
        (folder / "SOUL.md").write_text(f"You are {name}.")
        checklist = "- look at the queue\n" if is_busy else "# Heartbeat\n\n<!-- nothing -->\n"
        (folder / "HEARTBEAT.md").write_text(checklist)
        if is_busy:
            workers.append(name)
    return workers


def write_schedules(home: Path, n: int) -> None:
    for name in names(n):
        (home / "personas" / name / "schedules.yaml").write_text("heartbeat: {every: 1m}\n")


def until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.25)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def croniter_floor(n: int, start: datetime) -> float:
    """CPU seconds croniter takes to compute ``n`` next fires, one a persona."""
    began = time.process_time()
    for i in range(n):
        croniter("* * * * *", start + timedelta(microseconds=i)).get_next(datetime)
    return time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--personas", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=50)
    args = parser.parse_args()
    console = Console(width=120)
    console.print(compile_coterie())
    home = Path(tempfile.mkdtemp(prefix="coterie-bench-schedule-"))
    workers = write_personas(home, args.personas, args.busy)
    rt = Runtime.start(home=home, num_cpus=2)
    try:
        proc = psutil.Process(ray.get(rt.scheduler.pid.remote()))
        # Write the schedules early in a minute: all of them load before the next.
        until(lambda: datetime.now(UTC).second < 30, "the start of a minute", 70)
        write_schedules(home, args.personas)
        stats = lambda: ray.get(rt.scheduler.stats.remote())  # noqa: E731
        until(lambda: stats().entries == args.personas, "the scheduler to load every entry", 60)
        instant: datetime = stats().next_wake
        console.print(f"{args.personas} heartbeats fall due at {instant:%H:%M:%S} UTC")
        # Idle: from now to 2 s before the minute.
        idle_from, idle_cpu = time.monotonic(), cpu_of(proc)
        until(lambda: datetime.now(UTC) >= instant - timedelta(seconds=2), "the minute", 90)
        idle_rate = (cpu_of(proc) - idle_cpu) / (time.monotonic() - idle_from)
        until(lambda: datetime.now(UTC) >= instant - timedelta(seconds=0.5), "the minute", 5)
        start_cpu, start = cpu_of(proc), time.monotonic()

        def count(outcome: str) -> int:
            # The audit log itself, not Runtime.query: that would also call
            # the scheduler (to flush it) and add to what is measured.
            result = ray.get(
                rt.audit.query.remote(
                    f"select count(*) from events where kind = 'schedule' and status = '{outcome}'"
                )
            )
            return int(result.rows[0][0])

        until(lambda: count("skipped") >= args.personas - args.busy, "the skips")
        decided_cpu, decided = cpu_of(proc), time.monotonic()
        until(lambda: count("fired") >= args.busy, "the fires to be dispatched")
        dispatched_cpu, dispatched = cpu_of(proc), time.monotonic()
        decide = decided_cpu - start_cpu - idle_rate * (decided - start)
        dispatch = dispatched_cpu - decided_cpu - idle_rate * (dispatched - decided)
        until(lambda: count("done") >= args.busy, "the fired turns to end")
        skips = rt.query(
            "select epoch_ms(ts) from events where kind = 'schedule' and status = 'skipped'"
        ).rows
        model_calls = rt.query("select count(*) from events where kind = 'model_call'").rows[0][0]
        prefix = persona_actor_name(rt.id, "")
        started = sum(
            a["name"].startswith(prefix) for a in ray.util.list_named_actors(all_namespaces=True)
        )
    finally:
        rt.shutdown()
    with ScheduleStore.read_only(home / STORE_FILE) as store:
        ledger = [r for r in store.ledger(limit=10_000) if r.kind == "heartbeat"]
    at = instant.timestamp()
    skip_late = [ms / 1000 - at for (ms,) in skips]
    claim_late = [r.claimed_at.timestamp() - at for r in ledger if r.claimed_at]
    accept_late = [r.accepted_at.timestamp() - at for r in ledger if r.accepted_at]
    floor = croniter_floor(args.personas, instant)
    due = args.personas

    table = Table(
        title=f"{due} heartbeats due in one minute: {due - args.busy} empty checklists, "
        f"{args.busy} with work (2 cores)"
    )
    for column in ("measure", "value", "floor (croniter alone)", "ratio"):
        table.add_column(column)
    per_due, per_floor = decide / due, floor / due
    table.add_row(
        "scheduler CPU per due heartbeat (decided, claimed or skipped, recorded)",
        f"{per_due * 1e3:.3f} ms",
        f"{per_floor * 1e3:.3f} ms",
        f"{per_due / per_floor:.1f}×",
    )
    table.add_row(
        f"scheduler CPU per fire dispatched ({args.busy}: router, post, accept, finish)",
        f"{dispatch / args.busy * 1e3:.2f} ms",
        "",
        "",
    )
    table.add_row(
        f"scheduler idle CPU per second ({due} entries, files looked at every 2 s)",
        f"{idle_rate * 1e3:.1f} ms/s",
        "",
        "",
    )
    for label, values in (
        (f"lateness of a skip ({len(skip_late)})", skip_late),
        (f"lateness of a claim ({len(claim_late)})", claim_late),
        (f"lateness of an acceptance ({len(accept_late)}, persona started)", accept_late),
    ):
        if values:
            text = f"p50 {percentile(values, 0.5):.2f} s, p99 {percentile(values, 0.99):.2f} s"
            table.add_row(label, text, "", "")
    table.add_row("persona processes started", str(started), f"must be {args.busy}", "")
    table.add_row("model calls", str(model_calls), f"must be {args.busy}", "")
    console.print(table)
    console.print(
        f"busy personas: {', '.join(workers[:3])}…; median skip lateness "
        f"{statistics.median(skip_late) if skip_late else float('nan'):.3f} s"
    )
    if started != args.busy or model_calls != args.busy:
        raise SystemExit("the skipped heartbeats started personas or called a model")


if __name__ == "__main__":
    main()
