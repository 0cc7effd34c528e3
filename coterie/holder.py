"""Which runtime holds a home, so that another one that cannot open it says so.

A home has one runtime at a time: its audit log and its schedule store are
DuckDB files that one process each holds open (the AuditLog and Scheduler
actors'). A runtime joined to a cluster (``--address``) leaves its actors
running there, detached, when the command ends; a later command without
``--address`` would then start a second runtime on the same home, whose
audit log (or scheduler) cannot take its file's lock.

So a runtime that starts on a home records where it runs in
``<home>/runtime-holder.json`` — the Ray cluster's address, whether its
actors are detached, the process that started it — and the runtime that
finds the file locked turns DuckDB's lock error into :func:`home_in_use`'s
message: what holds the home and what to do (join it with ``--address``, or
stop it with ``coterie stop``). The record is removed when that runtime is
stopped; one left by a runtime whose cluster went away is only a name in a
message, and the next runtime to start on the home replaces it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coterie.runtime.errors import HomeInUseError
from coterie.runtime.serve.auth import write_private

HOLDER_FILE = "runtime-holder.json"
#: How DuckDB says another process holds the file's lock.
LOCK_CONFLICT = "Could not set lock on file"
#: The scheduler's file in a home (runtime.schedule.STORE_FILE; not imported:
#: this module stays light for every command).
SCHEDULE_FILE = "schedule.duckdb"
_HOLDER_PID = re.compile(r"\(PID (\d+)\)")


@dataclass(frozen=True)
class Holder:
    """The runtime that last started on a home."""

    #: The Ray cluster its actors run on (its GCS address).
    address: str
    #: Its actors outlive the command that started them (a joined cluster).
    detached: bool
    #: The process that started it, and on which machine.
    pid: int
    host: str
    #: When (seconds since the epoch).
    started: float


def holder_path(home: Path) -> Path:
    return home / HOLDER_FILE


def record_holder(home: Path, *, address: str, detached: bool) -> None:
    """Note that a runtime of this process, on the cluster at ``address``, holds ``home``."""
    holder = Holder(address, detached, os.getpid(), socket.gethostname(), time.time())
    write_private(holder_path(home), json.dumps(asdict(holder)))


def read_holder(home: Path) -> Holder | None:
    try:
        return Holder(**json.loads(holder_path(home).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def clear_holder(home: Path, *, address: str) -> None:
    """Forget the holder of ``home`` if it is the runtime on ``address`` (it was stopped)."""
    holder = read_holder(home)
    if holder is not None and holder.address == address:
        holder_path(home).unlink(missing_ok=True)


def is_lock_conflict(error: BaseException) -> bool:
    """Whether ``error`` (an audit log or a scheduler that could not start)
    is DuckDB's lock conflict."""
    return LOCK_CONFLICT in str(error)


def _held_file(error: BaseException) -> str:
    """Which of the home's files the lock conflict was on, as a message says it."""
    return "schedule store" if SCHEDULE_FILE in str(error) else "audit log"


def _may_run(holder: Holder) -> bool:
    """Whether the process that started ``holder`` may still run (another
    machine's cannot be checked from here)."""
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def home_in_use(home: Path, error: BaseException) -> HomeInUseError:
    """The error for a runtime whose audit log (or scheduler) found
    ``home``'s file locked: what holds the home, as far as its record says,
    and what to do."""
    found = _HOLDER_PID.search(str(error))
    locker = f" (process {found.group(1)} holds its {_held_file(error)})" if found else ""
    holder = read_holder(home)
    if holder is not None and holder.detached:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(holder.started))
        return HomeInUseError(
            f"{home} is held by a coterie runtime left running (detached) on the Ray "
            f"cluster at {holder.address}, started {when}{locker}. Use it: --address "
            f"{holder.address} (or RAY_ADDRESS={holder.address}); or stop it: "
            f"coterie --home {home} stop --address {holder.address}"
        )
    if holder is not None and holder.pid != os.getpid() and _may_run(holder):
        return HomeInUseError(
            f"{home} is in use by another coterie command (pid {holder.pid} on "
            f"{holder.host}, on its own Ray at {holder.address}){locker}: wait for it to "
            "end, or give this one another --home"
        )
    return HomeInUseError(
        f"{home} is in use by another coterie runtime{locker}. If one was left running "
        "on a Ray cluster, use it with --address ADDRESS, or stop it: "
        f"coterie --home {home} stop --address ADDRESS"
    )


__all__ = [
    "HOLDER_FILE",
    "Holder",
    "clear_holder",
    "holder_path",
    "home_in_use",
    "is_lock_conflict",
    "read_holder",
    "record_holder",
]
