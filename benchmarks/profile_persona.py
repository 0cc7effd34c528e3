"""Where a busy persona process spends its time: a py-spy profile, summed.

One warm OpenAI-provider persona (the fake OpenAI server in its own process,
an instant model) takes ``--in-flight`` turns at a time for ``--seconds``,
each in a new conversation, as in ``scale.py``'s burst. py-spy samples the
persona's process meanwhile (``pip install py-spy``; it reads the process's
memory, so it needs ptrace rights over it, as a child of this driver has).

It prints each sample's owner, found from the innermost frame that belongs
to one: the SDK and its HTTP client (openai, httpx2, aiohttp …), coterie's
code (``runtime/``, ``tools/``, ``actors/``), Ray's Python, or the rest
(asyncio's loop, threading); then coterie's share by file and its largest
functions. Samples of threads waiting (Ray's main loop, the event loop's
``select``, condition waits) are left out: what is left is where the busy
process is, not a CPU figure (``turn_cpu.py`` gives those, beside their
floors).

    python benchmarks/profile_persona.py [--seconds 20] [--in-flight 10] [--rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
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
from coterie import Runtime  # noqa: E402
from coterie.runtime.config import RuntimeSettings  # noqa: E402

NAME = "profiled"
#: Innermost frames that mean "this thread is waiting", not working.
WAITING = {"Worker.main_loop", "Condition.wait", "EpollSelector.select", ""}
OWNERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "SDK and HTTP client",
        re.compile(r"^(openai|httpx2?|httpcore2?|aiohttp|anyio|yarl|multidict)/"),
    ),
    ("coterie", re.compile(r"^(runtime|tools|actors|coterie)/")),
    ("Ray (Python)", re.compile(r"^ray/")),
)
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^:()]+)(?::\d+)?\)$")


def frames(stack: str) -> list[tuple[str, str]]:
    """(function, file) of each frame of a py-spy raw stack, outermost first."""
    out = []
    for frame in stack.split(";"):
        match = _FRAME.match(frame)
        out.append((match["function"], match["file"]) if match else (frame, ""))
    return out


def summarize(
    raw: str,
) -> tuple[int, collections.Counter[str], collections.Counter[str], collections.Counter[str]]:
    """Busy samples, and their counts by owner, and coterie's own samples
    (those whose innermost owned frame is coterie's) by file and function."""
    busy = 0
    owners: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        stack_frames = frames(stack)
        if stack_frames[-1][0] in WAITING:
            continue
        busy += n
        # The innermost frame that belongs to an owner decides the sample's.
        owner, frame = "asyncio, threading and the rest", ("", "")
        for candidate in reversed(stack_frames):
            found = next((name for name, pattern in OWNERS if pattern.match(candidate[1])), None)
            if found is not None:
                owner, frame = found, candidate
                break
        owners[owner] += n
        if owner == "coterie":
            function, file = frame
            files[file] += n
            functions[f"{function} ({file})"] += n
    return busy, owners, files, functions


async def load(rt: Runtime, seconds: float, in_flight: int) -> int:
    """Turns in new conversations, ``in_flight`` at a time, for ``seconds``."""
    deadline = time.monotonic() + seconds
    done = 0

    async def worker(k: int) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < deadline:
            reply = await rt.ask_async(NAME, "hi", conversation_id=f"w{k}-{i}")
            if reply.status != "ok":
                raise RuntimeError(f"turn failed: {reply.status}: {reply.error or reply.text}")
            done += 1
            i += 1

    await asyncio.gather(*(worker(k) for k in range(in_flight)))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20, help="how long to profile")
    parser.add_argument("--in-flight", type=int, default=10, help="turns at a time")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15, help="coterie files and functions shown")
    args = parser.parse_args()
    if args.seconds <= 0 or args.in_flight < 1 or args.rate < 1:
        parser.error("--seconds, --in-flight and --rate must be positive")
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        sys.exit("profile_persona.py needs py-spy: pip install py-spy")
    os.environ[KEY_ENV] = "sk-bench-dummy"  # the persona actor inherits it
    os.environ.pop("RAY_ADDRESS", None)
    load0 = os.getloadavg()[0]
    srv = ServerProcess(0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / "home"
            write_persona(home, NAME, openai_persona(srv.base_url))
            rt = Runtime.start(home=home, num_cpus=2, settings=RuntimeSettings(idle_timeout=None))
            try:
                asyncio.run(load(rt, 3.0, args.in_flight))  # warm: imports, connections
                proc = psutil.Process(next(iter(persona_pids(rt, [NAME]))))
                out = Path(tmp) / "profile.txt"
                recorder = subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(proc.pid),
                        "--duration",
                        str(args.seconds),
                        "--rate",
                        str(args.rate),
                        "--format",
                        "raw",
                        "--output",
                        str(out),
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                before = cpu_of(proc)
                turns = asyncio.run(load(rt, args.seconds, args.in_flight))
                spent = cpu_of(proc) - before
                _, err = recorder.communicate(timeout=args.seconds + 60)
                if recorder.returncode != 0 or not out.exists():
                    sys.exit(f"py-spy failed ({recorder.returncode}): {err.strip()[-500:]}")
                raw = out.read_text()
            finally:
                rt.shutdown()
    finally:
        srv.stop()
    busy, owners, files, functions = summarize(raw)
    if busy == 0:
        sys.exit("py-spy recorded no busy samples of the persona's process")
    console = Console(width=None if sys.stdout.isatty() else 140)
    title = (
        f"one persona, {turns} turns in {args.seconds} s, {args.in_flight} in flight, "
        f"{1000 * spent / turns:.2f} ms of its CPU per turn ({os.cpu_count()} cores, "
        f"load {load0:.2f} at start; {busy} busy samples)"
    )
    for heading, counts, limit in (
        ("owner", owners, None),
        ("coterie, by file", files, args.top),
        ("coterie, by function", functions, args.top),
    ):
        table = Table(title=title if heading == "owner" else None)
        table.add_column(heading)
        table.add_column("samples", justify="right")
        table.add_column("share of busy samples", justify="right")
        for key, n in counts.most_common(limit):
            table.add_row(key, str(n), f"{100 * n / busy:.1f}%")
        console.print(table)


if __name__ == "__main__":
    main()
