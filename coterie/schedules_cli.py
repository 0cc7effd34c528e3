"""``coterie schedules [persona]``: every heartbeat, cron entry and pending
reminder of the home, with its next fire in its own zone, its last outcome
and why, whether its queue is paused, and the schedule files that do not
load (the previous schedule stays in force; the file, entry and field are
named).

Through the running ``coterie serve`` of the home when there is one (its
scheduler answers); with ``--address``, through a runtime joined to that
cluster; else from the files and the schedule store opened read-only (no
Ray started).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from coterie.runtime.config import load_settings, persona_exists, persona_names, resolve_home
from coterie.runtime.errors import ScheduleStoreError, UnknownPersonaError
from coterie.runtime.schedule.records import EntryStatus, ScheduleListing
from coterie.runtime.serve.client import find_server, schedules_path

console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

#: How times are shown: in the entry's own zone, with its abbreviation.
TIME_FORMAT = "%Y-%m-%d %H:%M %Z"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "schedules",
        help="heartbeats, cron entries and reminders: next fires, last outcomes, errors",
        description="List the schedules of the home's personas (or of one): each entry's "
        "next fire in its own zone, its last outcome and reason, paused queues, and the "
        "schedules.yaml files that do not load. Through the running coterie serve if there "
        "is one, else read from the files and the schedule store.",
    )
    p.add_argument("persona", nargs="?", help="only this persona's")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")


def read(args: argparse.Namespace) -> tuple[ScheduleListing, str]:
    """The listing, and where it came from."""
    home = resolve_home(args.home)
    persona = args.persona
    if not args.address:
        server = find_server(home)
        if server is not None:
            data = server.get(schedules_path(persona))
            return ScheduleListing.model_validate(data), f"served at {server.state.url}"
    if persona is not None and not persona_exists(home, persona):
        raise UnknownPersonaError(persona, persona_names(home))
    if args.address:
        from coterie.api import Runtime  # imports Ray

        with console.status("Joining the cluster…"):
            rt = Runtime.start(home=args.home, address=args.address)
        try:
            return rt.schedules(persona), f"runtime on {rt.address}"
        finally:
            rt.shutdown()
    from coterie.runtime.schedule.service import read_listing

    try:
        listing = read_listing(home, persona, settings=load_settings(home).schedule)
    except ScheduleStoreError as exc:
        from coterie.holder import home_in_use, is_lock_conflict

        if is_lock_conflict(exc):  # a runtime holds the store: say which, and what to do
            raise home_in_use(home, exc) from None
        raise
    return listing, "no runtime running: read from the files and the store"


def _when(value: Any) -> str:
    return value.strftime(TIME_FORMAT) if value is not None else ""


def _last(row: EntryStatus) -> str:
    if row.last_outcome is None:
        return ""
    text: str = row.last_outcome
    if row.last_at is not None:
        text += f" {_when(row.last_at)}"
    if row.last_reason:
        text += f": {row.last_reason}"
    return text


def rows(listing: ScheduleListing) -> list[tuple[str, ...]]:
    """One row per entry: persona, entry, kind, schedule, tz, next fire (in
    its zone), last outcome, paused, error."""
    broken = {e.persona for e in listing.errors}
    return [
        (
            row.persona,
            row.name,
            row.kind,
            row.schedule,
            row.tz,
            _when(row.next_fire),
            _last(row),
            "paused" if row.paused else "",
            row.error or ("schedules.yaml: see below" if row.persona in broken else ""),
        )
        for row in listing.entries
    ]


def cmd_schedules(args: argparse.Namespace) -> int:
    listing, where = read(args)
    if args.json:
        print(json.dumps(listing.model_dump(mode="json"), indent=2))
        return 0
    home = resolve_home(args.home)
    title = f"schedules in {home} ({where}); times in each entry's zone"
    table = Table(title=title)
    for column in ("persona", "entry", "kind", "schedule", "tz", "next fire", "last", "paused"):
        table.add_column(column)
    table.add_column("error", style="red")
    for row in rows(listing):
        table.add_row(*row)
    if listing.entries:
        console.print(table)
    else:
        console.print(f"No heartbeats, cron entries or pending reminders ({where}).")
    console.print(f"The runtime's zone ($COTERIE_TIMEZONE): {listing.timezone}", highlight=False)
    for persona, queues in listing.paused.items():
        console.print(f"{persona}: paused {', '.join(queues)}", markup=False, highlight=False)
    for err in listing.errors:
        err_console.print(
            f"error: {err.path}: {err.entry}: {err.field}: {err.message} (since "
            f"{_when(err.since)}; the previous schedule stays in force)",
            style="red",
            markup=False,
            highlight=False,
            soft_wrap=True,  # a path is never broken across lines
        )
    return 0


__all__ = ["add_parser", "cmd_schedules", "read", "rows"]
