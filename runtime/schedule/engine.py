"""The scheduler's decisions, with an injected clock and no Ray.

:class:`Scheduler` reads the personas' ``schedules.yaml`` and
``HEARTBEAT.md`` (:meth:`~Scheduler.reload`, by file stamps: an edit applies
at the next look, a bad edit keeps the previous schedule and records the
error), decides what is due (:meth:`~Scheduler.due`), claims fires in the
ledger before anyone dispatches them (:meth:`~Scheduler.claim`), finds the
fires a restart left claimed (:meth:`~Scheduler.recover`), says when to look
next (:meth:`~Scheduler.next_wake`) and lists everything
(:meth:`~Scheduler.listing`).

Due instants of an entry (after its cursor, up to now):

- the latest fires once, marked late when it is 30 s or more behind, if it is
  within the entry's ``misfire_grace``; every earlier one is a miss, all of
  them in ONE :class:`~coterie.runtime.schedule.records.Miss` (count, first,
  last): never a backlog of fires;
- an entry with no cursor (new, or its spec changed) starts from now.

Gates, before anything starts a persona (a skip has a reason and costs no
model call): a paused queue; for heartbeats, outside ``active_hours``, an
empty checklist, or a checklist unchanged since the persona acknowledged it
(its last heartbeat on it ended ``skipped``); for heartbeat and cron fires,
the daily cap ``max_background_turns_per_day`` (per persona, per day in the
runtime's zone; reminders count only if a background turn set them).
Reminders in a paused ``cron`` queue are held, not skipped: they fire (late,
within 24 h) on resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from coterie.runtime.config import ScheduleSettings, persona_names, runtime_timezone
from coterie.runtime.schedule._build import (
    REMINDER_GRACE,
    before,
    count_instants,
    day_bounds,
    describe_entry,
    describe_reminder,
    entry_fire,
    reminder_fire,
    reminder_instants,
)
from coterie.runtime.schedule._files import PersonaFiles
from coterie.runtime.schedule.clock import Clock
from coterie.runtime.schedule.cron import format_duration
from coterie.runtime.schedule.entries import (
    CHECKLIST_FILE,
    Checklist,
    Entry,
    PersonaSchedules,
)
from coterie.runtime.schedule.records import (
    Decision,
    EntryStatus,
    Fire,
    FireKey,
    FireReport,
    Miss,
    Queue,
    Reminder,
    ScheduleFileError,
    ScheduleListing,
    Skip,
    fire_id,
)
from coterie.runtime.schedule.store import Claim, ScheduleStore, entry_key


class _Cap:
    """The daily cap within one :meth:`Scheduler.due`: the store's counts of
    today (read once, when first needed) plus the fires decided since."""

    def __init__(self, store: ScheduleStore, now: datetime, tz: ZoneInfo, cap: int) -> None:
        self._store, self._now, self._tz, self.cap = store, now, tz, cap
        self._counts: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._counts is None:
            self._counts = self._store.background_turns(*day_bounds(self._now, self._tz))
        return self._counts

    def reached(self, persona: str) -> bool:
        return self._load().get(persona, 0) >= self.cap

    def spend(self, persona: str) -> None:
        counts = self._load()
        counts[persona] = counts.get(persona, 0) + 1


@dataclass
class _Slot:
    """An entry and where it is: its cursor and its next instant."""

    entry: Entry
    cursor: datetime | None = None
    fingerprint: str | None = None
    next: datetime | None = None
    started: bool = field(default=False)


class Scheduler:
    """The scheduler's whole decision logic over a :class:`ScheduleStore`.

    ``personas`` lists the persona names (default: the home's); a persona's
    files are ``<home>/personas/<name>/schedules.yaml`` and ``HEARTBEAT.md``.
    Not thread-safe: one caller (the tick loop) drives it.
    """

    def __init__(
        self,
        store: ScheduleStore,
        clock: Clock,
        *,
        home: Path,
        settings: ScheduleSettings | None = None,
        personas: Callable[[], Iterable[str]] | None = None,
        tz: ZoneInfo | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.home = home
        self.settings = settings or ScheduleSettings()
        self.tz = tz or runtime_timezone()
        self.files = PersonaFiles(
            home,
            personas or (lambda: persona_names(home)),
            min_interval=self.min_interval,
            tz=self.tz,
        )
        self._slots: dict[str, _Slot] = {}
        self._loaded = False  # cursors read from the store
        self._first_reload_done = False
        self._reminders: list[Reminder] | None = None
        self._paused: dict[str, set[Queue]] | None = None
        self._acks: dict[str, str] | None = None
        self._claims: dict[str, Claim] = {}
        self._reports: list[FireReport] = []

    # -- files ---------------------------------------------------------------

    @property
    def min_interval(self) -> timedelta:
        return timedelta(seconds=self.settings.min_interval)

    def persona_dir(self, persona: str) -> Path:
        return self.files.folder(persona)

    def reload(self, now: datetime | None = None) -> list[ScheduleFileError]:
        """Look at every persona's files; re-read the changed ones. A file
        that no longer loads keeps the previous schedule (none at start) and
        its error is recorded for the listings. Returns the new errors."""
        changes = self.files.look(now or self.clock.now())
        for persona in changes.gone:
            self._set_entries(persona, ())
        for persona, entries in changes.entries.items():
            self._set_entries(persona, entries)
        self._first_reload_done = True
        return changes.errors

    def _set_entries(self, persona: str, entries: Iterable[Entry]) -> None:
        prefix = f"{persona}/"
        wanted = {e.key: e for e in entries}
        for key in [k for k in self._slots if k.startswith(prefix) and k not in wanted]:
            del self._slots[key]
        for key, entry in wanted.items():
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot(entry)
                # Added while the scheduler runs: it starts from now, even
                # if an older entry of that name left a cursor behind.
                slot.started = self._first_reload_done
            elif slot.entry.fingerprint != entry.fingerprint:
                slot.next = None
            slot.entry = entry

    def entries(self, persona: str | None = None) -> list[Entry]:
        """The entries in force (of one persona)."""
        return [
            s.entry for s in self._slots.values() if persona is None or s.entry.persona == persona
        ]

    def schedules(self, persona: str) -> PersonaSchedules | None:
        """The persona's schedule in force (the last one that loaded)."""
        return self.files.schedules(persona)

    # -- state read from the store -------------------------------------------

    def invalidate(self) -> None:
        """Read reminders, paused queues and acknowledgements from the store
        again (after the service changed them)."""
        self._reminders = self._paused = self._acks = None

    def _load(self) -> None:
        if not self._first_reload_done:
            self.reload()
        if not self._loaded:
            cursors = self.store.cursors()
            for key, slot in self._slots.items():
                row = cursors.get(key)
                if row is not None and not slot.started:
                    slot.cursor, slot.fingerprint = row.instant, row.fingerprint
            self._loaded = True
        if self._reminders is None:
            self._reminders = self.store.reminders()
        if self._paused is None:
            self._paused = self.store.paused()
        if self._acks is None:
            self._acks = self.store.acks()

    def paused(self, persona: str, queue: Queue) -> bool:
        self._load()
        assert self._paused is not None
        return queue in self._paused.get(persona, set())

    # -- deciding ------------------------------------------------------------

    def due(self, now: datetime | None = None) -> list[Decision]:
        """Everything due at ``now``: fires to claim and dispatch, and the
        skips and misses (already recorded in the store; for the audit log)."""
        now = now or self.clock.now()
        self._load()
        decisions: list[Decision] = []
        starts: list[tuple[str, str, str, datetime, str]] = []
        skips: list[tuple[Skip, str | None, datetime | None]] = []
        cap = _Cap(self.store, now, self.tz, self.settings.max_background_turns_per_day)
        for slot in self._slots.values():
            entry = slot.entry
            if slot.cursor is None or slot.started or slot.fingerprint != entry.fingerprint:
                starts.append((entry.persona, entry.kind, entry.name, now, entry.fingerprint))
                slot.cursor, slot.fingerprint, slot.started = now, entry.fingerprint, False
                slot.next = entry.spec.next_after(now)
                continue
            if slot.next is None:
                slot.next = entry.spec.next_after(slot.cursor)
            if slot.next > now:
                continue
            latest = entry.spec.latest_at_or_before(now)
            assert latest is not None and latest >= slot.next
            count, capped = count_instants(entry.spec, slot.next, latest)
            fires = now - latest <= entry.grace
            missed = count - 1 if fires else count
            if missed > 0:
                last = latest if not fires else before(entry.spec, latest)
                assert last is not None
                miss = self._miss(entry, missed, capped, slot.next, last)
                self.store.miss(miss, fingerprint=entry.fingerprint, at=now)
                decisions.append(miss)
                slot.cursor = last
            if fires:
                reason = self._gate(entry, latest, cap)
                fire = entry_fire(entry, latest, now=now, checklist=self._checklist(entry))
                if reason is not None:
                    skip = Skip(
                        persona=entry.persona,
                        kind=entry.kind,
                        name=entry.name,
                        instant=latest,
                        fire_id=fire.fire_id,
                        reason=reason,
                    )
                    skips.append((skip, entry.fingerprint, None))
                    decisions.append(skip)
                else:
                    self._claims[fire.fire_id] = Claim(fire, fingerprint=entry.fingerprint)
                    decisions.append(fire)
                    cap.spend(entry.persona)
                slot.cursor = latest
            slot.next = entry.spec.next_after(slot.cursor)
        self.store.set_cursors(starts)  # type: ignore[arg-type]
        decisions.extend(self._due_reminders(now, skips, cap))
        self.store.skip_all(skips, at=now)
        return decisions

    def _checklist(self, entry: Entry) -> Checklist | None:
        return self.files.checklist(entry.persona) if entry.uses_checklist else None

    def _gate(self, entry: Entry, instant: datetime, cap: _Cap) -> str | None:
        """Why this fire must not start a turn, or None."""
        queue: Queue = "heartbeat" if entry.kind == "heartbeat" else "cron"
        if self.paused(entry.persona, queue):
            return f"the {queue} queue is paused"
        if entry.kind == "heartbeat":
            hours = entry.active_hours
            if hours is not None and not hours.contains(instant, self.tz):
                return f"outside active_hours ({hours.describe(self.tz)})"
            if entry.uses_checklist:
                checklist = self._checklist(entry)
                if checklist is None or checklist.empty:
                    return f"empty checklist ({CHECKLIST_FILE} has nothing to do)"
                assert self._acks is not None
                if self._acks.get(entry.persona) == checklist.digest:
                    return f"{CHECKLIST_FILE} unchanged since the persona found nothing to do on it"
        if cap.reached(entry.persona):
            return (
                f"daily cap reached ({self.settings.max_background_turns_per_day} background "
                "turns today: max_background_turns_per_day)"
            )
        return None

    def _miss(
        self, entry: Entry, count: int, capped: bool, first: datetime, last: datetime
    ) -> Miss:
        many = f"at least {count}" if capped else str(count)
        return Miss(
            persona=entry.persona,
            kind=entry.kind,
            name=entry.name,
            count=count,
            first=first,
            last=last,
            fire_id=fire_id(
                FireKey(persona=entry.persona, kind=entry.kind, name=entry.name, instant=last)
            ),
            reason=f"{many} fire(s) fell due while the scheduler was down, past misfire_grace "
            f"({format_duration(entry.grace)})",
        )

    def _due_reminders(
        self,
        now: datetime,
        skips: list[tuple[Skip, str | None, datetime | None]],
        cap: _Cap,
    ) -> list[Decision]:
        assert self._reminders is not None
        out: list[Decision] = []
        changed = False
        for reminder in self._reminders:
            if reminder.at > now or self.paused(reminder.persona, "cron"):
                continue  # a paused queue holds its reminders
            due = reminder_instants(reminder, now)
            if due is None:
                continue
            latest, count, following = due
            changed = True
            fires = now - latest <= REMINDER_GRACE
            missed = count - 1 if fires else count
            if missed > 0:
                last = (
                    latest if not fires else latest - timedelta(seconds=reminder.every_seconds or 0)
                )
                miss = Miss(
                    persona=reminder.persona,
                    kind="reminder",
                    name=reminder.id,
                    count=missed,
                    first=reminder.at,
                    last=last,
                    fire_id=fire_id(
                        FireKey(
                            persona=reminder.persona,
                            kind="reminder",
                            name=reminder.id,
                            instant=last,
                        )
                    ),
                    reason=f"reminder {reminder.name!r}: {missed} fire(s) fell due while the "
                    f"scheduler was down, more than {format_duration(REMINDER_GRACE)} ago",
                    label=reminder.name,
                )
                self.store.miss(miss, next_at=latest if fires else following, at=now)
                out.append(miss)
            if not fires:
                continue
            fire = reminder_fire(reminder, latest, now=now)
            if reminder.background and cap.reached(reminder.persona):
                skip = Skip(
                    persona=reminder.persona,
                    kind="reminder",
                    name=reminder.id,
                    instant=latest,
                    fire_id=fire.fire_id,
                    reason=f"reminder {reminder.name!r} (set by a background turn): daily cap "
                    f"reached ({self.settings.max_background_turns_per_day} background turns)",
                    label=reminder.name,
                )
                skips.append((skip, None, following))
                out.append(skip)
                continue
            self._claims[fire.fire_id] = Claim(fire, next_at=following)
            out.append(fire)
            if reminder.background:
                cap.spend(reminder.persona)
        if changed:
            self._reminders = None  # read again after the claims move them
        return out

    def claim(self, fires: list[Fire], now: datetime | None = None) -> list[bool]:
        """Claim fires :meth:`due` (or :meth:`manual_fire`) returned, before
        dispatching them: one transaction writes each and moves its entry.
        False: the ledger already held it (do not dispatch)."""
        claims = [self._claims.pop(f.fire_id, Claim(f)) for f in fires]
        result = self.store.claim_all(claims, at=now or self.clock.now())
        if any(f.kind == "reminder" for f in fires):
            self._reminders = None
        return result

    def manual_fire(self, persona: str, name: str, now: datetime | None = None) -> Fire:
        """A fire of the entry ``name`` at ``now``, outside its schedule
        (``run_now``): no gate but the caller's; it moves no cursor. Raises
        ``KeyError`` for an unknown entry."""
        now = now or self.clock.now()
        self._load()
        slot = self._slots.get(
            entry_key(persona, "heartbeat" if name == "heartbeat" else "cron", name)
        )
        if slot is None:
            raise KeyError(name)
        fire = entry_fire(
            slot.entry, now, now=now, checklist=self._checklist(slot.entry), manual=True
        )
        return fire

    def cap_reached(self, persona: str, now: datetime | None = None) -> bool:
        """Whether the persona has used its daily cap of background turns."""
        now = now or self.clock.now()
        counts = self.store.background_turns(*day_bounds(now, self.tz))
        return counts.get(persona, 0) >= self.settings.max_background_turns_per_day

    def recover(
        self, now: datetime | None = None, *, dispatched_before: datetime | None = None
    ) -> list[Fire]:
        """Claimed fires no persona accepted, to dispatch again: all of them
        at start (a restart may have come before, during or after their
        dispatch; a persona drops one it already accepted), or those last
        dispatched before ``dispatched_before``. One past its grace is
        failed instead (see :meth:`take_reports`)."""
        now = now or self.clock.now()
        again: list[Fire] = []
        for fire, dispatched in self.store.claimed():
            if now > fire.expires_at:
                reason = "never accepted before its misfire grace ran out"
                if self.store.finish(fire.fire_id, "failed", reason=reason, at=now):
                    self._reports.append(
                        FireReport(
                            persona=fire.persona,
                            kind=fire.kind,
                            name=fire.label,
                            instant=fire.instant,
                            fire_id=fire.fire_id,
                            outcome="failed",
                            reason=reason,
                        )
                    )
                continue
            if dispatched_before is None or dispatched is None or dispatched < dispatched_before:
                # (A claim notes its dispatch time: one never dispatched was
                # claimed just before a crash.)
                again.append(fire)
        return again

    def take_reports(self) -> list[FireReport]:
        """What happened outside :meth:`due`'s decisions since the last call."""
        out, self._reports = self._reports, []
        return out

    def next_wake(self, now: datetime | None = None) -> datetime | None:
        """The next instant something falls due (None: nothing scheduled)."""
        now = now or self.clock.now()
        self._load()
        times = []
        for slot in self._slots.values():
            if slot.next is None:
                base = slot.cursor if slot.cursor is not None and not slot.started else now
                slot.next = slot.entry.spec.next_after(base)
            times.append(slot.next)
        assert self._reminders is not None
        times.extend(r.at for r in self._reminders if not self.paused(r.persona, "cron"))
        return min(times) if times else None

    # -- listing -------------------------------------------------------------

    def listing(self, persona: str | None = None, now: datetime | None = None) -> ScheduleListing:
        """Every entry and pending reminder (of one persona), with the next
        fire in its zone, the last outcome, paused queues and file errors."""
        now = now or self.clock.now()
        self._load()
        assert self._paused is not None
        cursors = self.store.cursors()
        rows: list[EntryStatus] = []
        order = sorted(
            self._slots.values(),
            key=lambda s: (s.entry.persona, s.entry.kind != "heartbeat", s.entry.name),
        )
        for slot in order:
            entry = slot.entry
            if persona is not None and entry.persona != persona:
                continue
            nxt = slot.next or entry.spec.next_after(now)
            last = cursors.get(entry.key)
            queue: Queue = "heartbeat" if entry.kind == "heartbeat" else "cron"
            rows.append(
                EntryStatus(
                    persona=entry.persona,
                    kind=entry.kind,
                    name=entry.name,
                    schedule=describe_entry(entry),
                    tz=entry.tz.key,
                    next_fire=nxt.astimezone(entry.tz),
                    next_fire_utc=nxt,
                    last_outcome=last.last_outcome if last else None,
                    last_reason=last.last_reason if last else None,
                    last_at=last.last_at.astimezone(entry.tz) if last and last.last_at else None,
                    paused=queue in self._paused.get(entry.persona, set()),
                    prompt=entry.prompt or f"({CHECKLIST_FILE})",
                )
            )
        for reminder in self.store.reminders(persona):
            last = cursors.get(entry_key(reminder.persona, "reminder", reminder.id))
            rows.append(
                EntryStatus(
                    persona=reminder.persona,
                    kind="reminder",
                    name=reminder.name,
                    schedule=describe_reminder(reminder, self.tz),
                    tz=self.tz.key,
                    next_fire=reminder.at.astimezone(self.tz),
                    next_fire_utc=reminder.at,
                    last_outcome=last.last_outcome if last else None,
                    last_reason=last.last_reason if last else None,
                    last_at=last.last_at.astimezone(self.tz) if last and last.last_at else None,
                    paused="cron" in self._paused.get(reminder.persona, set()),
                    prompt=reminder.prompt,
                )
            )
        errors = self.files.errors(persona)
        paused = {
            name: sorted(queues)
            for name, queues in sorted(self._paused.items())
            if queues and (persona is None or name == persona)
        }
        return ScheduleListing(
            now=now,
            timezone=self.tz.key,
            entries=rows,
            paused=paused,
            errors=errors,  # type: ignore[arg-type]
        )


__all__ = ["Scheduler"]
