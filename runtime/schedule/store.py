"""The scheduler's durable state: one DuckDB file, ``<home>/schedule.duckdb``.

One process writes it (the scheduler: the Scheduler actor, or a
``LocalScheduler``); ``ScheduleStore.read_only`` opens it for
``coterie schedules`` when no runtime runs. A second writer gets a
:class:`~coterie.runtime.errors.ScheduleStoreError` saying who holds it.
Tables (timestamps are naive UTC)::

    fires       the fire ledger: one row per fire (or per run of misses)
        fire_id PK, persona, kind, name, label, instant, state
        (claimed/accepted/done/skipped/failed/missed), reason, status (the
        turn's), manual, capped (counts against the daily cap), missed
        (how many instants a miss row stands for), first_instant,
        claimed_at, dispatched_at, accepted_at, finished_at, expires_at,
        payload (the Fire as JSON, to dispatch it again after a restart)
    cursors     per entry (heartbeat, cron entry, reminder): the last instant
                handled, the fingerprint of the spec it was computed with,
                and the last outcome (what listings show)
    reminders   the reminders; ``pending_key`` is persona/name while pending
                and NULL after: a UNIQUE column, so the database refuses a
                second pending reminder of the same name (race-safe)
    acks        per persona: the HEARTBEAT.md digest its last heartbeat on
                it ended ``skipped`` on (nothing to do)
    paused      (persona, queue) pairs on hold

Exactly once: :meth:`claim` writes the fire and moves the entry's cursor in
one transaction, before dispatch; :meth:`accept` moves it from claimed to
accepted only once (compare-and-set). ``duckdb`` is imported inside the
methods, so importing this module loads no database.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from coterie.runtime.errors import ScheduleStoreError
from coterie.runtime.messages import Origin, TurnStatus
from coterie.runtime.schedule.entries import DeliverTarget, EntryKind
from coterie.runtime.schedule.records import (
    Fire,
    FireState,
    Miss,
    Outcome,
    Queue,
    Reminder,
    ReminderState,
    Skip,
    utc,
)

if TYPE_CHECKING:
    import duckdb

STORE_FILE = "schedule.duckdb"

_DDL = """
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
_REMINDER_FIELDS = (
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
_REMINDER_SELECT = ", ".join("next_at" if f == "at" else f'"{f}"' for f in _REMINDER_FIELDS)
_FINISHED_BY_STATUS: dict[str, FireState] = {
    "ok": "done",
    "skipped": "skipped",
    "failed": "failed",
    "error": "failed",
}
_TURN_STATUSES = frozenset(get_args(TurnStatus))
# States of a fire that started (or may have started) a turn: what the daily cap counts.
_STARTED = ("claimed", "accepted", "done", "skipped", "failed")


def _naive(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value).replace(tzinfo=None)


def _aware(value: datetime | None) -> datetime | None:
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


def _held_message(path: str, exc: Exception) -> str:
    return (
        f"the schedule store {path} is held by another process ({exc}); a runtime is "
        "using this home: ask it (coterie schedules goes through coterie serve) or stop it"
    )


class ScheduleStore:
    """The schedule's DuckDB file (see the module's docstring for its tables).

    Methods are synchronous and thread-safe (writes take a lock); async
    callers run them in a thread (``asyncio.to_thread``).
    """

    def __init__(self, path: Path | str, *, _read_only: bool = False) -> None:
        import duckdb

        self.path = str(path)
        self.writable = not _read_only
        self._lock = threading.RLock()
        if self.writable and self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            # No file access from SQL: the store reads and writes this file only.
            con = duckdb.connect(
                self.path, read_only=_read_only, config={"enable_external_access": False}
            )
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise ScheduleStoreError(_held_message(self.path, exc)) from None
            raise ScheduleStoreError(f"cannot open the schedule store {self.path}: {exc}") from None
        except duckdb.Error as exc:
            raise ScheduleStoreError(f"cannot open the schedule store {self.path}: {exc}") from None
        if self.writable:
            try:
                con.execute(_DDL)
            except BaseException:
                con.close()
                raise
        self._con: duckdb.DuckDBPyConnection | None = con

    @classmethod
    def read_only(cls, path: Path | str) -> ScheduleStore:
        """Open for reading (``coterie schedules`` with no runtime): writes
        raise. A file that does not exist yet reads as an empty store (kept
        in memory; nothing is written)."""
        if not Path(path).is_file():
            empty = cls(":memory:")
            empty.writable = False
            return empty
        return cls(path, _read_only=True)

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    def __enter__(self) -> ScheduleStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise ScheduleStoreError(f"the schedule store {self.path} is closed")
        return self._con.cursor()

    def _rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        cur = self._cursor()
        try:
            return cur.execute(sql, list(params)).fetchall()
        finally:
            cur.close()

    @contextmanager
    def _write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction, under the store's lock."""
        if not self.writable:
            raise ScheduleStoreError(f"the schedule store {self.path} is open read-only")
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN TRANSACTION")
                try:
                    yield cur
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
            finally:
                cur.close()

    @staticmethod
    def _outcome(
        cur: duckdb.DuckDBPyConnection,
        *,
        persona: str,
        kind: EntryKind,
        name: str,
        outcome: Outcome,
        reason: str | None,
        at: datetime,
        fire_id: str | None,
        instant: datetime | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Record an entry's last outcome (and, with ``instant``, move its cursor)."""
        cur.execute(
            """
            INSERT INTO cursors (entry_key, persona, kind, name, instant, fingerprint,
                                 last_outcome, last_reason, last_at, last_fire_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (entry_key) DO UPDATE SET
                instant = coalesce(excluded.instant, cursors.instant),
                fingerprint = coalesce(excluded.fingerprint, cursors.fingerprint),
                last_outcome = excluded.last_outcome,
                last_reason = excluded.last_reason,
                last_at = excluded.last_at,
                last_fire_id = excluded.last_fire_id
            """,
            [
                entry_key(persona, kind, name),
                persona,
                kind,
                name,
                _naive(instant),
                fingerprint,
                outcome,
                reason,
                _naive(at),
                fire_id,
            ],
        )

    # -- cursors -------------------------------------------------------------

    def cursors(self) -> dict[str, CursorRow]:
        """Every entry's cursor and last outcome, by entry key."""
        rows = self._rows(
            "SELECT entry_key, instant, fingerprint, last_outcome, last_reason, last_at, "
            "last_fire_id FROM cursors"
        )
        return {r[0]: CursorRow(_aware(r[1]), r[2], r[3], r[4], _aware(r[5]), r[6]) for r in rows}

    def set_cursors(self, entries: Iterable[tuple[str, EntryKind, str, datetime, str]]) -> None:
        """Start entries (persona, kind, name, instant, fingerprint) at an
        instant: their first fire is the next one after it. A stale cursor
        (another fingerprint) is replaced."""
        items = list(entries)
        if not items:
            return
        with self._write() as cur:
            cur.executemany(
                """
                INSERT INTO cursors (entry_key, persona, kind, name, instant, fingerprint)
                VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT (entry_key) DO UPDATE SET
                    instant = excluded.instant, fingerprint = excluded.fingerprint
                """,
                [[entry_key(p, k, n), p, k, n, _naive(at), fp] for p, k, n, at, fp in items],
            )

    # -- the fire ledger -----------------------------------------------------

    def claim(
        self,
        fire: Fire,
        *,
        fingerprint: str | None = None,
        next_at: datetime | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Write ``fire`` as claimed (before it is dispatched) and move its
        entry: False if the ledger already holds that fire (then nothing
        changes). See :meth:`claim_all`."""
        return self.claim_all([Claim(fire, fingerprint, next_at)], at=at)[0]

    def claim_all(self, claims: Sequence[Claim], *, at: datetime | None = None) -> list[bool]:
        """Claim several fires in one transaction; one bool per claim.

        A scheduled heartbeat or cron fire moves its entry's cursor to its
        instant (with the spec's fingerprint); a reminder's fire moves the
        reminder to ``next_at`` (None: the reminder is done); a ``manual``
        fire (run_now) moves nothing.
        """
        now = at or datetime.now(UTC)
        out: list[bool] = []
        with self._write() as cur:
            for claim in claims:
                fire = claim.fire
                capped = fire.kind != "reminder" or _reminder_capped(cur, fire.key.name)
                inserted = cur.execute(
                    """
                    INSERT INTO fires (fire_id, persona, kind, name, label, instant, state,
                                       manual, capped, claimed_at, dispatched_at, expires_at,
                                       payload)
                    VALUES (?, ?, ?, ?, ?, ?, 'claimed', ?, ?, ?, ?, ?, ?)
                    ON CONFLICT DO NOTHING RETURNING fire_id
                    """,
                    [
                        fire.fire_id,
                        fire.persona,
                        fire.kind,
                        fire.key.name,
                        fire.label,
                        _naive(fire.instant),
                        fire.manual,
                        capped,
                        _naive(now),
                        # A claim is dispatched at once: it counts as the first dispatch.
                        _naive(now),
                        _naive(fire.expires_at),
                        fire.model_dump_json(),
                    ],
                ).fetchall()
                out.append(bool(inserted))
                if not inserted:
                    continue
                if fire.kind == "reminder" and not fire.manual:
                    _advance_reminder(cur, fire.key.name, claim.next_at, now)
                self._outcome(
                    cur,
                    persona=fire.persona,
                    kind=fire.kind,
                    name=fire.key.name,
                    outcome="late" if fire.late else "fired",
                    reason="run_now" if fire.manual else None,
                    at=now,
                    fire_id=fire.fire_id,
                    instant=None if fire.manual or fire.kind == "reminder" else fire.instant,
                    fingerprint=None if fire.manual else claim.fingerprint,
                )
        return out

    def mark_dispatched(self, fire_id: str, at: datetime) -> None:
        """Note when a claimed fire was (last) handed to its persona."""
        with self._write() as cur:
            cur.execute(
                "UPDATE fires SET dispatched_at = ? WHERE fire_id = ?", [_naive(at), fire_id]
            )

    def accept(self, fire_id: str, *, at: datetime | None = None) -> bool:
        """Compare-and-set claimed -> accepted: True once per fire, False for
        every later call (and for fires the ledger does not hold)."""
        now = at or datetime.now(UTC)
        with self._write() as cur:
            rows = cur.execute(
                "UPDATE fires SET state = 'accepted', accepted_at = ? "
                "WHERE fire_id = ? AND state = 'claimed' RETURNING persona, kind, name",
                [_naive(now), fire_id],
            ).fetchall()
            if not rows:
                return False
            persona, kind, name = rows[0]
            self._outcome(
                cur,
                persona=persona,
                kind=kind,
                name=name,
                outcome="accepted",
                reason=None,
                at=now,
                fire_id=fire_id,
            )
            return True

    def finish(
        self,
        fire_id: str,
        status: TurnStatus,
        *,
        reason: str | None = None,
        at: datetime | None = None,
    ) -> FireState | None:
        """End a claimed or accepted fire with its turn's ``status`` (ok ->
        done, skipped -> skipped, failed/error -> failed); returns the new
        state, or None if the fire is unknown or already ended. A heartbeat
        on the HEARTBEAT.md checklist that ends ``skipped`` acknowledges that
        checklist."""
        if status not in _TURN_STATUSES:
            raise ValueError(f"unknown turn status {status!r}")
        state = _FINISHED_BY_STATUS[status]
        now = at or datetime.now(UTC)
        with self._write() as cur:
            rows = cur.execute(
                "UPDATE fires SET state = ?, status = ?, reason = coalesce(?, reason), "
                "finished_at = ? WHERE fire_id = ? AND state IN ('claimed', 'accepted') "
                "RETURNING persona, kind, name, payload",
                [state, status, reason, _naive(now), fire_id],
            ).fetchall()
            if not rows:
                return None
            persona, kind, name, payload = rows[0]
            if kind == "heartbeat" and status == "skipped" and payload:
                digest = json.loads(payload).get("checklist_digest")
                if digest:
                    _ack(cur, persona, digest, now)
            self._outcome(
                cur,
                persona=persona,
                kind=kind,
                name=name,
                outcome="done" if state in ("done", "skipped") else "failed",
                reason=reason if reason is not None else (None if status == "ok" else status),
                at=now,
                fire_id=fire_id,
            )
            return state

    def skip_all(
        self, skips: Sequence[tuple[Skip, str | None, datetime | None]], *, at: datetime
    ) -> None:
        """Record gate skips, each with its entry's fingerprint (a reminder's:
        its next instant, None: it is over): the cursor moves past the
        instant and the reason is the entry's last outcome. The ledger holds
        no row for them (the audit log has each one)."""
        if not skips:
            return
        with self._write() as cur:
            for skip, fingerprint, next_at in skips:
                if skip.kind == "reminder":
                    _advance_reminder(cur, skip.name, next_at, at, final="skipped")
                self._outcome(
                    cur,
                    persona=skip.persona,
                    kind=skip.kind,
                    name=skip.name,
                    outcome="skipped",
                    reason=skip.reason,
                    at=at,
                    fire_id=skip.fire_id,
                    instant=None if skip.kind == "reminder" else skip.instant,
                    fingerprint=fingerprint,
                )

    def miss(
        self,
        miss: Miss,
        *,
        fingerprint: str | None = None,
        next_at: datetime | None = None,
        at: datetime,
    ) -> None:
        """Record instants missed while the runtime was down: one ledger row
        for the run (its count, first and last instant); the entry's cursor
        moves to the last (a reminder to ``next_at``, None: it is over)."""
        with self._write() as cur:
            cur.execute(
                """
                INSERT INTO fires (fire_id, persona, kind, name, label, instant, state, reason,
                                   missed, first_instant, finished_at)
                VALUES (?, ?, ?, ?, ?, ?, 'missed', ?, ?, ?, ?)
                ON CONFLICT DO NOTHING
                """,
                [
                    miss.fire_id,
                    miss.persona,
                    miss.kind,
                    miss.name,
                    miss.label or miss.name,
                    _naive(miss.last),
                    miss.reason,
                    miss.count,
                    _naive(miss.first),
                    _naive(at),
                ],
            )
            if miss.kind == "reminder":
                _advance_reminder(cur, miss.name, next_at, at, final="missed")
            self._outcome(
                cur,
                persona=miss.persona,
                kind=miss.kind,
                name=miss.name,
                outcome="missed",
                reason=miss.reason,
                at=at,
                fire_id=miss.fire_id,
                instant=None if miss.kind == "reminder" else miss.last,
                fingerprint=fingerprint,
            )

    def claimed(self) -> list[tuple[Fire, datetime | None]]:
        """Fires claimed but not accepted, oldest first, with when each was
        last dispatched (None: never): to dispatch again."""
        rows = self._rows(
            "SELECT payload, dispatched_at FROM fires WHERE state = 'claimed' "
            "ORDER BY instant, fire_id"
        )
        return [(Fire.model_validate_json(p), _aware(d)) for p, d in rows]

    def state(self, fire_id: str) -> FireState | None:
        rows = self._rows("SELECT state FROM fires WHERE fire_id = ?", [fire_id])
        return rows[0][0] if rows else None

    def ledger(self, persona: str | None = None, *, limit: int = 1000) -> list[LedgerRow]:
        """The latest ledger rows (of one persona), newest first."""
        where, params = ("WHERE persona = ?", [persona]) if persona else ("", [])
        rows = self._rows(
            "SELECT fire_id, persona, kind, name, label, instant, state, reason, status, manual, "
            f"missed, first_instant, claimed_at, accepted_at, finished_at FROM fires {where} "
            "ORDER BY instant DESC, fire_id LIMIT ?",
            [*params, limit],
        )
        return [
            LedgerRow(
                fire_id=r[0],
                persona=r[1],
                kind=r[2],
                name=r[3],
                label=r[4],
                instant=r[5].replace(tzinfo=UTC),
                state=r[6],
                reason=r[7],
                status=r[8],
                manual=r[9],
                missed=r[10],
                first_instant=_aware(r[11]),
                claimed_at=_aware(r[12]),
                accepted_at=_aware(r[13]),
                finished_at=_aware(r[14]),
            )
            for r in rows
        ]

    def background_turns(self, start: datetime, end: datetime) -> dict[str, int]:
        """Per persona: the fires counted by the daily cap claimed in [start, end)."""
        marks = ", ".join("?" for _ in _STARTED)
        rows = self._rows(
            f"SELECT persona, count(*) FROM fires WHERE capped AND state IN ({marks}) "
            "AND claimed_at >= ? AND claimed_at < ? GROUP BY persona",
            [*_STARTED, _naive(start), _naive(end)],
        )
        return {persona: int(n) for persona, n in rows}

    def background_turns_today(self, persona: str, start: datetime, end: datetime) -> int:
        """One persona's count of :meth:`background_turns`."""
        return self.background_turns(start, end).get(persona, 0)

    # -- checklist acknowledgements ------------------------------------------

    def acks(self) -> dict[str, str]:
        """Per persona: the HEARTBEAT.md digest it acknowledged."""
        return dict(self._rows("SELECT persona, digest FROM acks"))  # type: ignore[arg-type]

    def ack(self, persona: str, digest: str, *, at: datetime) -> None:
        with self._write() as cur:
            _ack(cur, persona, digest, at)

    # -- paused queues -------------------------------------------------------

    def paused(self) -> dict[str, set[Queue]]:
        out: dict[str, set[Queue]] = {}
        for persona, queue in self._rows("SELECT persona, queue FROM paused"):
            out.setdefault(persona, set()).add(queue)
        return out

    def pause(self, persona: str, queue: Queue, *, at: datetime) -> bool:
        """Hold a queue; False if it was already held."""
        with self._write() as cur:
            rows = cur.execute(
                "INSERT INTO paused VALUES (?, ?, ?) ON CONFLICT DO NOTHING RETURNING persona",
                [persona, queue, _naive(at)],
            ).fetchall()
            return bool(rows)

    def resume(self, persona: str, queue: Queue) -> bool:
        """Release a queue; False if it was not held."""
        with self._write() as cur:
            rows = cur.execute(
                "DELETE FROM paused WHERE persona = ? AND queue = ? RETURNING persona",
                [persona, queue],
            ).fetchall()
            return bool(rows)

    # -- reminders -----------------------------------------------------------

    def add_reminder(self, reminder: Reminder) -> bool:
        """Keep a new pending reminder; False if one of that name is pending
        for the persona (the database's UNIQUE constraint decides, so two
        racing adds cannot both win)."""
        import duckdb

        row = _reminder_row(reminder)
        marks = ", ".join("?" for _ in _REMINDER_FIELDS)
        try:
            with self._write() as cur:
                cur.execute(
                    f"INSERT INTO reminders ({_REMINDER_SELECT}, pending_key) VALUES ({marks}, ?)",
                    [*row, f"{reminder.persona}/{reminder.name}"],
                )
        except (duckdb.ConstraintException, duckdb.TransactionException):
            # A pending reminder of that name exists, or another connection
            # is writing one right now (a write-write conflict): either way
            # this one does not get the name.
            return False
        return True

    def reminders(self, persona: str | None = None, *, pending: bool = True) -> list[Reminder]:
        """Reminders (pending ones by default), by next instant."""
        clauses, params = [], []
        if persona is not None:
            clauses.append("persona = ?")
            params.append(persona)
        if pending:
            clauses.append("state = 'pending'")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._rows(
            f"SELECT {_REMINDER_SELECT} FROM reminders {where} ORDER BY next_at, id",
            params,
        )
        return [_reminder_of(r) for r in rows]

    def reminder(self, persona: str, name: str) -> Reminder | None:
        """The pending reminder of that name."""
        rows = self._rows(
            f"SELECT {_REMINDER_SELECT} FROM reminders WHERE pending_key = ?",
            [f"{persona}/{name}"],
        )
        return _reminder_of(rows[0]) if rows else None

    def cancel_reminder(self, persona: str, name: str, *, at: datetime) -> Reminder | None:
        """Cancel the pending reminder of that name (its future occurrences
        too); returns it, or None if none is pending."""
        with self._write() as cur:
            rows = cur.execute(
                "UPDATE reminders SET state = 'cancelled', pending_key = NULL, finished_at = ? "
                f"WHERE pending_key = ? RETURNING {_REMINDER_SELECT}",
                [_naive(at), f"{persona}/{name}"],
            ).fetchall()
            return _reminder_of(rows[0]) if rows else None

    def reminders_created_by(self, turn_id: str) -> int:
        """How many reminders a turn created."""
        return int(
            self._rows("SELECT count(*) FROM reminders WHERE created_by_turn = ?", [turn_id])[0][0]
        )

    def pending_count(self, persona: str) -> int:
        return int(
            self._rows(
                "SELECT count(*) FROM reminders WHERE persona = ? AND state = 'pending'", [persona]
            )[0][0]
        )

    # -- bounds --------------------------------------------------------------

    def prune(self, before: datetime) -> int:
        """Delete ledger rows and finished reminders older than ``before``
        (``history_days``); returns how many rows went."""
        cut = _naive(before)
        with self._write() as cur:
            fires = cur.execute(
                "DELETE FROM fires WHERE coalesce(finished_at, claimed_at, instant) < ? "
                "AND (state NOT IN ('claimed', 'accepted') OR expires_at < ?) RETURNING fire_id",
                [cut, cut],
            ).fetchall()
            gone = cur.execute(
                "DELETE FROM reminders WHERE state <> 'pending' AND finished_at < ? RETURNING id",
                [cut],
            ).fetchall()
            if gone:
                cur.executemany(
                    "DELETE FROM cursors WHERE kind = 'reminder' AND name = ?",
                    [[rid] for (rid,) in gone],
                )
        return len(fires) + len(gone)


def _ack(cur: duckdb.DuckDBPyConnection, persona: str, digest: str, at: datetime) -> None:
    cur.execute(
        "INSERT INTO acks VALUES (?, ?, ?) ON CONFLICT (persona) DO UPDATE SET "
        "digest = excluded.digest, acked_at = excluded.acked_at",
        [persona, digest, _naive(at)],
    )


def _reminder_capped(cur: duckdb.DuckDBPyConnection, reminder_id: str) -> bool:
    rows = cur.execute("SELECT background FROM reminders WHERE id = ?", [reminder_id]).fetchall()
    return bool(rows and rows[0][0])


def _advance_reminder(
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
            [_naive(next_at), fired, reminder_id],
        )
        return
    cur.execute(
        "UPDATE reminders SET state = ?, pending_key = NULL, finished_at = ?, "
        "fired = fired + ? WHERE id = ?",
        [final, _naive(now), fired, reminder_id],
    )


def _reminder_row(r: Reminder) -> list[Any]:
    return [
        r.id,
        r.persona,
        r.name,
        r.prompt,
        _naive(r.at),
        r.every_seconds,
        _naive(r.until),
        r.origin.model_dump_json() if r.origin else None,
        r.deliver.model_dump_json() if r.deliver else None,
        r.created_by_turn,
        r.background,
        _naive(r.created_at),
        r.fired,
        r.state,
    ]


def _reminder_of(row: tuple[Any, ...]) -> Reminder:
    data = dict(zip(_REMINDER_FIELDS, row, strict=True))
    for name in ("at", "until", "created_at"):
        data[name] = _aware(data[name])
    data["origin"] = Origin.model_validate_json(data["origin"]) if data["origin"] else None
    data["deliver"] = (
        DeliverTarget.model_validate_json(data["deliver"]) if data["deliver"] else None
    )
    return Reminder.model_validate(data)


__all__ = ["STORE_FILE", "Claim", "CursorRow", "LedgerRow", "ScheduleStore", "entry_key"]
