"""The schedule store's tables: their DDL, the rows read from them, and the
SQL helpers several of the store's transactions share (private to
:mod:`~coterie.runtime.schedule.store`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, get_args

from coterie.runtime.messages import Origin, TurnStatus
from coterie.runtime.schedule.entries import DeliverTarget, EntryKind
from coterie.runtime.schedule.records import (
    Fire,
    FireState,
    Outcome,
    Reminder,
    ReminderState,
    utc,
)

if TYPE_CHECKING:
    import duckdb

STORE_FILE = "schedule.duckdb"

DDL = """
CREATE TABLE IF NOT EXISTS fires (
    fire_id VARCHAR PRIMARY KEY,
    persona VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    label VARCHAR NOT NULL,
    instant TIMESTAMP NOT NULL,
    state VARCHAR NOT NULL,
    reason VARCHAR,
    status VARCHAR,
    manual BOOLEAN NOT NULL DEFAULT false,
    capped BOOLEAN NOT NULL DEFAULT false,
    missed INTEGER,
    first_instant TIMESTAMP,
    claimed_at TIMESTAMP,
    dispatched_at TIMESTAMP,
    accepted_at TIMESTAMP,
    finished_at TIMESTAMP,
    expires_at TIMESTAMP,
    payload JSON
);
CREATE TABLE IF NOT EXISTS cursors (
    entry_key VARCHAR PRIMARY KEY,
    persona VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    instant TIMESTAMP,
    fingerprint VARCHAR,
    last_outcome VARCHAR,
    last_reason VARCHAR,
    last_at TIMESTAMP,
    last_fire_id VARCHAR
);
CREATE TABLE IF NOT EXISTS reminders (
    id VARCHAR PRIMARY KEY,
    persona VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    pending_key VARCHAR UNIQUE,
    prompt VARCHAR NOT NULL,
    next_at TIMESTAMP NOT NULL,
    every_seconds INTEGER,
    "until" TIMESTAMP,
    origin JSON,
    deliver JSON,
    created_by_turn VARCHAR,
    background BOOLEAN NOT NULL,
    created_at TIMESTAMP NOT NULL,
    fired INTEGER NOT NULL,
    state VARCHAR NOT NULL,
    finished_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS acks (
    persona VARCHAR PRIMARY KEY,
    digest VARCHAR NOT NULL,
    acked_at TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS paused (
    persona VARCHAR NOT NULL,
    queue VARCHAR NOT NULL,
    since TIMESTAMP NOT NULL,
    PRIMARY KEY (persona, queue)
);
"""

#: The Reminder's fields, in the order of the table's columns (``at`` is
#: the column ``next_at``: AT is an SQL keyword).
REMINDER_FIELDS = (
    "id",
    "persona",
    "name",
    "prompt",
    "at",
    "every_seconds",
    "until",
    "origin",
    "deliver",
    "created_by_turn",
    "background",
    "created_at",
    "fired",
    "state",
)
REMINDER_SELECT = ", ".join("next_at" if f == "at" else f'"{f}"' for f in REMINDER_FIELDS)
FINISHED_BY_STATUS: dict[str, FireState] = {
    "ok": "done",
    "skipped": "skipped",
    "failed": "failed",
    "error": "failed",
}
TURN_STATUSES = frozenset(get_args(TurnStatus))
# States of a fire that started (or may have started) a turn: what the daily cap counts.
STARTED = ("claimed", "accepted", "done", "skipped", "failed")


def naive(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value).replace(tzinfo=None)


def aware(value: datetime | None) -> datetime | None:
    return None if value is None else value.replace(tzinfo=UTC)


def entry_key(persona: str, kind: EntryKind, name: str) -> str:
    """The cursor key of an entry: ``<persona>/<kind>/<name>`` (a reminder's
    name here is its id)."""
    return f"{persona}/{kind}/{name}"


@dataclass(frozen=True)
class CursorRow:
    """Where an entry is: its last handled instant and its last outcome."""

    instant: datetime | None
    fingerprint: str | None
    last_outcome: Outcome | None
    last_reason: str | None
    last_at: datetime | None
    last_fire_id: str | None


@dataclass(frozen=True)
class LedgerRow:
    """One row of the fire ledger, as tests and surfaces read it."""

    fire_id: str
    persona: str
    kind: EntryKind
    name: str
    label: str
    instant: datetime
    state: FireState
    reason: str | None
    status: str | None
    manual: bool
    missed: int | None
    first_instant: datetime | None
    claimed_at: datetime | None
    accepted_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class Claim:
    """A fire to claim and what claiming it moves: the entry's cursor (and the
    fingerprint of its spec), or the reminder's next instant (None: done)."""

    fire: Fire
    fingerprint: str | None = None
    next_at: datetime | None = None


def held_message(path: str, exc: Exception) -> str:
    return (
        f"the schedule store {path} is held by another process ({exc}); a runtime is "
        "using this home: ask it (coterie schedules goes through coterie serve) or stop it"
    )


_CURSOR_COLUMNS = (
    "entry_key",
    "persona",
    "kind",
    "name",
    "instant",
    "fingerprint",
    "last_outcome",
    "last_reason",
    "last_at",
    "last_fire_id",
)
_CURSOR_TIMES = frozenset({"instant", "last_at"})
_SET_OUTCOME = """
    instant = coalesce(excluded.instant, cursors.instant),
    fingerprint = coalesce(excluded.fingerprint, cursors.fingerprint),
    last_outcome = excluded.last_outcome,
    last_reason = excluded.last_reason,
    last_at = excluded.last_at,
    last_fire_id = excluded.last_fire_id"""
_SET_START = "instant = excluded.instant, fingerprint = excluded.fingerprint"
# Fewer rows than this are upserted one statement each; more, as one Arrow batch
# (a statement costs about a millisecond: 950 skipped heartbeats took 1.7 s).
_BATCH_FROM = 8


def cursor_row(
    *,
    persona: str,
    kind: EntryKind,
    name: str,
    outcome: Outcome | None = None,
    reason: str | None = None,
    at: datetime | None = None,
    fire_id: str | None = None,
    instant: datetime | None = None,
    fingerprint: str | None = None,
) -> list[Any]:
    """One row of ``cursors`` for :func:`upsert_cursors`."""
    return [
        entry_key(persona, kind, name),
        persona,
        kind,
        name,
        naive(instant),
        fingerprint,
        outcome,
        reason,
        naive(at),
        fire_id,
    ]


def upsert_cursors(
    cur: duckdb.DuckDBPyConnection, rows: list[list[Any]], *, start: bool = False
) -> None:
    """Write cursor rows: an entry's last outcome (and, where a row has an
    instant, its cursor); ``start``: only the instant and fingerprint (an
    entry starting from now keeps its last outcome)."""
    if not rows:
        return
    columns = ", ".join(_CURSOR_COLUMNS)
    update = _SET_START if start else _SET_OUTCOME
    if len(rows) < _BATCH_FROM:
        marks = ", ".join("?" for _ in _CURSOR_COLUMNS)
        sql = (
            f"INSERT INTO cursors ({columns}) VALUES ({marks}) "
            f"ON CONFLICT (entry_key) DO UPDATE SET {update}"
        )
        for row in rows:
            cur.execute(sql, row)
        return
    import pyarrow as pa

    table = pa.table(
        {
            c: pa.array(
                [row[i] for row in rows],
                type=pa.timestamp("us") if c in _CURSOR_TIMES else pa.string(),
            )
            for i, c in enumerate(_CURSOR_COLUMNS)
        }
    )
    cur.register("cursor_batch", table)
    try:
        cur.execute(
            f"INSERT INTO cursors ({columns}) SELECT {columns} FROM cursor_batch "
            f"ON CONFLICT (entry_key) DO UPDATE SET {update}"
        )
    finally:
        cur.unregister("cursor_batch")


_FIRE_COLUMNS = (
    "fire_id",
    "persona",
    "kind",
    "name",
    "label",
    "instant",
    "state",
    "manual",
    "capped",
    "claimed_at",
    "dispatched_at",
    "expires_at",
    "payload",
)


def insert_fires(cur: duckdb.DuckDBPyConnection, rows: list[list[Any]]) -> set[str]:
    """Insert claimed fires (rows in the order of ``_FIRE_COLUMNS``); a fire
    the ledger already holds is left as it is. Returns the ids inserted."""
    columns = ", ".join(_FIRE_COLUMNS)
    if len(rows) < _BATCH_FROM:
        marks = ", ".join("?" for _ in _FIRE_COLUMNS)
        sql = (
            f"INSERT INTO fires ({columns}) VALUES ({marks}) "
            "ON CONFLICT DO NOTHING RETURNING fire_id"
        )
        return {fid for row in rows for (fid,) in cur.execute(sql, row).fetchall()}
    import pyarrow as pa

    types = {"manual": pa.bool_(), "capped": pa.bool_()}
    for name in ("instant", "claimed_at", "dispatched_at", "expires_at"):
        types[name] = pa.timestamp("us")
    table = pa.table(
        {
            c: pa.array([row[i] for row in rows], type=types.get(c, pa.string()))
            for i, c in enumerate(_FIRE_COLUMNS)
        }
    )
    cur.register("fire_batch", table)
    try:
        # One batch holds each fire once (the engine decides an instant once).
        found = cur.execute(
            f"INSERT INTO fires ({columns}) SELECT {columns} FROM fire_batch "
            "ON CONFLICT DO NOTHING RETURNING fire_id"
        ).fetchall()
    finally:
        cur.unregister("fire_batch")
    return {fid for (fid,) in found}


def record_outcome(cur: duckdb.DuckDBPyConnection, **fields: Any) -> None:
    """Record an entry's last outcome (and, with ``instant``, move its cursor);
    the fields of :func:`cursor_row`."""
    upsert_cursors(cur, [cursor_row(**fields)])


def ack_digest(cur: duckdb.DuckDBPyConnection, persona: str, digest: str, at: datetime) -> None:
    cur.execute(
        "INSERT INTO acks VALUES (?, ?, ?) ON CONFLICT (persona) DO UPDATE SET "
        "digest = excluded.digest, acked_at = excluded.acked_at",
        [persona, digest, naive(at)],
    )


def reminder_capped(cur: duckdb.DuckDBPyConnection, reminder_id: str) -> bool:
    rows = cur.execute("SELECT background FROM reminders WHERE id = ?", [reminder_id]).fetchall()
    return bool(rows and rows[0][0])


def advance_reminder(
    cur: duckdb.DuckDBPyConnection,
    reminder_id: str,
    next_at: datetime | None,
    now: datetime,
    *,
    final: ReminderState = "done",
) -> None:
    """Move a reminder to ``next_at``, or end it (``final``) when None."""
    fired = 1 if final == "done" else 0
    if next_at is not None:
        cur.execute(
            "UPDATE reminders SET next_at = ?, fired = fired + ? WHERE id = ?",
            [naive(next_at), fired, reminder_id],
        )
        return
    cur.execute(
        "UPDATE reminders SET state = ?, pending_key = NULL, finished_at = ?, "
        "fired = fired + ? WHERE id = ?",
        [final, naive(now), fired, reminder_id],
    )


def reminder_row(r: Reminder) -> list[Any]:
    return [
        r.id,
        r.persona,
        r.name,
        r.prompt,
        naive(r.at),
        r.every_seconds,
        naive(r.until),
        r.origin.model_dump_json() if r.origin else None,
        r.deliver.model_dump_json() if r.deliver else None,
        r.created_by_turn,
        r.background,
        naive(r.created_at),
        r.fired,
        r.state,
    ]


def reminder_of(row: tuple[Any, ...]) -> Reminder:
    data = dict(zip(REMINDER_FIELDS, row, strict=True))
    for name in ("at", "until", "created_at"):
        data[name] = aware(data[name])
    data["origin"] = Origin.model_validate_json(data["origin"]) if data["origin"] else None
    data["deliver"] = (
        DeliverTarget.model_validate_json(data["deliver"]) if data["deliver"] else None
    )
    return Reminder.model_validate(data)


__all__ = [
    "DDL",
    "FINISHED_BY_STATUS",
    "REMINDER_FIELDS",
    "REMINDER_SELECT",
    "STARTED",
    "STORE_FILE",
    "TURN_STATUSES",
    "Claim",
    "CursorRow",
    "LedgerRow",
    "ack_digest",
    "advance_reminder",
    "aware",
    "cursor_row",
    "entry_key",
    "held_message",
    "insert_fires",
    "naive",
    "record_outcome",
    "reminder_capped",
    "reminder_of",
    "reminder_row",
    "upsert_cursors",
]
