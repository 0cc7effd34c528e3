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
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coterie.runtime.errors import ScheduleStoreError
from coterie.runtime.messages import TurnStatus
from coterie.runtime.schedule._tables import (
    DDL,
    FINISHED_BY_STATUS,
    REMINDER_FIELDS,
    REMINDER_SELECT,
    STARTED,
    STORE_FILE,
    TURN_STATUSES,
    Claim,
    CursorRow,
    LedgerRow,
    ack_digest,
    advance_reminder,
    aware,
    cursor_row,
    entry_key,
    held_message,
    insert_fires,
    naive,
    record_outcome,
    reminder_capped,
    reminder_of,
    reminder_row,
    upsert_cursors,
)
from coterie.runtime.schedule.entries import EntryKind
from coterie.runtime.schedule.records import (
    Fire,
    FireState,
    Miss,
    Queue,
    Reminder,
    Skip,
)

if TYPE_CHECKING:
    import duckdb


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
                raise ScheduleStoreError(held_message(self.path, exc)) from None
            raise ScheduleStoreError(f"cannot open the schedule store {self.path}: {exc}") from None
        except duckdb.Error as exc:
            raise ScheduleStoreError(f"cannot open the schedule store {self.path}: {exc}") from None
        if self.writable:
            try:
                con.execute(DDL)
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

    # -- cursors -------------------------------------------------------------

    def cursors(self) -> dict[str, CursorRow]:
        """Every entry's cursor and last outcome, by entry key."""
        rows = self._rows(
            "SELECT entry_key, instant, fingerprint, last_outcome, last_reason, last_at, "
            "last_fire_id FROM cursors"
        )
        return {r[0]: CursorRow(aware(r[1]), r[2], r[3], r[4], aware(r[5]), r[6]) for r in rows}

    def set_cursors(self, entries: Iterable[tuple[str, EntryKind, str, datetime, str]]) -> None:
        """Start entries (persona, kind, name, instant, fingerprint) at an
        instant: their first fire is the next one after it. A stale cursor
        (another fingerprint) is replaced."""
        items = list(entries)
        if not items:
            return
        rows = [
            cursor_row(persona=p, kind=k, name=n, instant=at, fingerprint=fp)
            for p, k, n, at, fp in items
        ]
        with self._write() as cur:
            upsert_cursors(cur, rows, start=True)

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
        if not claims:
            return []
        with self._write() as cur:
            rows = [
                [
                    c.fire.fire_id,
                    c.fire.persona,
                    c.fire.kind,
                    c.fire.key.name,
                    c.fire.label,
                    naive(c.fire.instant),
                    "claimed",
                    c.fire.manual,
                    c.fire.kind != "reminder" or reminder_capped(cur, c.fire.key.name),
                    naive(now),
                    # A claim is dispatched at once: it counts as the first dispatch.
                    naive(now),
                    naive(c.fire.expires_at),
                    c.fire.model_dump_json(),
                ]
                for c in claims
            ]
            inserted = insert_fires(cur, rows)
            cursors = []
            for claim in claims:
                fire = claim.fire
                if fire.fire_id not in inserted:
                    continue
                if fire.kind == "reminder" and not fire.manual:
                    advance_reminder(cur, fire.key.name, claim.next_at, now)
                cursors.append(
                    cursor_row(
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
                )
            upsert_cursors(cur, cursors)
        return [c.fire.fire_id in inserted for c in claims]

    def mark_dispatched(self, fire_id: str, at: datetime) -> None:
        """Note when a claimed fire was (last) handed to its persona."""
        with self._write() as cur:
            cur.execute(
                "UPDATE fires SET dispatched_at = ? WHERE fire_id = ?", [naive(at), fire_id]
            )

    def accept(self, fire_id: str, *, at: datetime | None = None) -> bool:
        """Compare-and-set claimed -> accepted: True once per fire, False for
        every later call (and for fires the ledger does not hold)."""
        now = at or datetime.now(UTC)
        with self._write() as cur:
            rows = cur.execute(
                "UPDATE fires SET state = 'accepted', accepted_at = ? "
                "WHERE fire_id = ? AND state = 'claimed' RETURNING persona, kind, name",
                [naive(now), fire_id],
            ).fetchall()
            if not rows:
                return False
            persona, kind, name = rows[0]
            record_outcome(
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
        if status not in TURN_STATUSES:
            raise ValueError(f"unknown turn status {status!r}")
        state = FINISHED_BY_STATUS[status]
        now = at or datetime.now(UTC)
        with self._write() as cur:
            rows = cur.execute(
                "UPDATE fires SET state = ?, status = ?, reason = coalesce(?, reason), "
                "finished_at = ? WHERE fire_id = ? AND state IN ('claimed', 'accepted') "
                "RETURNING persona, kind, name, payload",
                [state, status, reason, naive(now), fire_id],
            ).fetchall()
            if not rows:
                return None
            persona, kind, name, payload = rows[0]
            if kind == "heartbeat" and status == "skipped" and payload:
                digest = json.loads(payload).get("checklist_digest")
                if digest:
                    ack_digest(cur, persona, digest, now)
            record_outcome(
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
        rows = [
            cursor_row(
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
            for skip, fingerprint, _ in skips
        ]
        with self._write() as cur:
            for skip, _, next_at in skips:
                if skip.kind == "reminder":
                    advance_reminder(cur, skip.name, next_at, at, final="skipped")
            upsert_cursors(cur, rows)

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
                    naive(miss.last),
                    miss.reason,
                    miss.count,
                    naive(miss.first),
                    naive(at),
                ],
            )
            if miss.kind == "reminder":
                advance_reminder(cur, miss.name, next_at, at, final="missed")
            record_outcome(
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
        return [(Fire.model_validate_json(p), aware(d)) for p, d in rows]

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
                first_instant=aware(r[11]),
                claimed_at=aware(r[12]),
                accepted_at=aware(r[13]),
                finished_at=aware(r[14]),
            )
            for r in rows
        ]

    def background_turns(self, start: datetime, end: datetime) -> dict[str, int]:
        """Per persona: the fires counted by the daily cap claimed in [start, end)."""
        marks = ", ".join("?" for _ in STARTED)
        rows = self._rows(
            f"SELECT persona, count(*) FROM fires WHERE capped AND state IN ({marks}) "
            "AND claimed_at >= ? AND claimed_at < ? GROUP BY persona",
            [*STARTED, naive(start), naive(end)],
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
            ack_digest(cur, persona, digest, at)

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
                [persona, queue, naive(at)],
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

        row = reminder_row(reminder)
        marks = ", ".join("?" for _ in REMINDER_FIELDS)
        try:
            with self._write() as cur:
                cur.execute(
                    f"INSERT INTO reminders ({REMINDER_SELECT}, pending_key) VALUES ({marks}, ?)",
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
            f"SELECT {REMINDER_SELECT} FROM reminders {where} ORDER BY next_at, id",
            params,
        )
        return [reminder_of(r) for r in rows]

    def reminder(self, persona: str, name: str) -> Reminder | None:
        """The pending reminder of that name."""
        rows = self._rows(
            f"SELECT {REMINDER_SELECT} FROM reminders WHERE pending_key = ?",
            [f"{persona}/{name}"],
        )
        return reminder_of(rows[0]) if rows else None

    def cancel_reminder(self, persona: str, name: str, *, at: datetime) -> Reminder | None:
        """Cancel the pending reminder of that name (its future occurrences
        too); returns it, or None if none is pending."""
        with self._write() as cur:
            rows = cur.execute(
                "UPDATE reminders SET state = 'cancelled', pending_key = NULL, finished_at = ? "
                f"WHERE pending_key = ? RETURNING {REMINDER_SELECT}",
                [naive(at), f"{persona}/{name}"],
            ).fetchall()
            return reminder_of(rows[0]) if rows else None

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
        cut = naive(before)
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


__all__ = ["STORE_FILE", "Claim", "CursorRow", "LedgerRow", "ScheduleStore", "entry_key"]
