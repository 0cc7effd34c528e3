"""The scheduler's records: fires and their ledger states, the engine's
decisions, reminders, listings, and the ``remind`` tool's request and result.

A fire is one scheduled instant of one entry: :class:`FireKey` names it and
:func:`fire_id` derives its id from the key alone, so the same instant gets
the same id in every process and after every restart (the ledger's primary
key, and what a persona's ``accept`` compares).

Times are aware datetimes in UTC unless a field says it is in an entry's zone.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config import ModelConfig
from coterie.runtime.messages import Origin
from coterie.runtime.schedule.entries import DeliverTarget, EntryKind

#: Where a fire is in the ledger: ``claimed`` (written before dispatch),
#: ``accepted`` (the persona took it: its turn runs), then ``done`` (the turn
#: ended ok), ``skipped`` (the turn ended skipped: nothing to do), ``failed``
#: (the turn failed, or the fire could not be delivered), or ``missed`` (due
#: while the runtime was down, past its misfire grace, never run).
FireState = Literal["claimed", "accepted", "done", "skipped", "missed", "failed"]

#: What the audit log and the listings say happened to an entry's instant.
#: fired/late: dispatched (late: after a delay, e.g. the runtime was down);
#: skipped: a gate stopped it before any model call (the reason says which);
#: missed: not run (past its grace); accepted: the persona started it;
#: dropped: a second delivery of a fire already accepted; done/failed: its
#: turn ended.
Outcome = Literal["fired", "late", "skipped", "missed", "accepted", "dropped", "done", "failed"]

#: A queue ``pause``/``resume`` act on: heartbeats, or cron entries and reminders.
Queue = Literal["heartbeat", "cron"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (naive ones are taken as UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class FireKey(_Record):
    """One scheduled instant of one entry: the ledger's identity of a fire.

    ``name`` is the entry's name for heartbeats (``heartbeat``) and cron
    entries, and the reminder's id (``rem_…``) for reminders, since a
    reminder's name may be used again once it is done.
    """

    persona: str
    kind: EntryKind
    name: str
    instant: datetime

    def canonical(self) -> str:
        at = utc(self.instant).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return "\x1f".join((self.persona, self.kind, self.name, at))


def fire_id(key: FireKey) -> str:
    """``fire_<hex>``: a hash of the key, the same in every process."""
    return "fire_" + hashlib.sha256(key.canonical().encode("utf-8")).hexdigest()[:24]


class Fire(_Record):
    """A fire to dispatch: everything the persona's turn needs.

    ``conversation_id``: ``<persona>:heartbeat`` (light:
    ``<persona>:heartbeat:<fire_id>``), ``<persona>:cron:<name>`` (fresh:
    ``<persona>:cron:<name>:<fire_id>``), ``<persona>:job:<reminder_id>``.
    """

    decision: Literal["fire"] = "fire"
    key: FireKey
    fire_id: str
    label: str = Field(description="the entry's name as people know it (a reminder's name)")
    conversation_id: str
    prompt: str = Field(description="the cron or reminder prompt, or the heartbeat checklist")
    late: bool = False
    light: bool = False
    model: ModelConfig | None = None
    deliver: DeliverTarget | None = Field(
        default=None, description="a cron entry's target or a reminder's override"
    )
    origin: Origin | None = Field(
        default=None, description="where a reminder was asked for (reply_to_origin goes there)"
    )
    manual: bool = Field(default=False, description="run_now, not a scheduled instant")
    checklist_digest: str | None = Field(
        default=None, description="the HEARTBEAT.md this heartbeat ran on (acknowledged if skipped)"
    )
    expires_at: datetime = Field(description="past this, a fire not yet accepted is missed")

    @property
    def persona(self) -> str:
        return self.key.persona

    @property
    def kind(self) -> EntryKind:
        return self.key.kind

    @property
    def instant(self) -> datetime:
        return self.key.instant

    @property
    def reply_origin(self) -> Origin | None:
        """The origin the fired turn replies to: the delivery target if set,
        else where the reminder was asked for."""
        return self.deliver.origin() if self.deliver is not None else self.origin


class Skip(_Record):
    """An instant a gate stopped before any model call."""

    decision: Literal["skip"] = "skip"
    persona: str
    kind: EntryKind
    name: str
    instant: datetime
    fire_id: str
    reason: str
    label: str | None = Field(default=None, description="a reminder's name (name is its id)")


class Miss(_Record):
    """Instants of one entry that fell due while the runtime was down and are
    past their grace: one record for all of them, never a backlog."""

    decision: Literal["miss"] = "miss"
    persona: str
    kind: EntryKind
    name: str
    count: int
    first: datetime
    last: datetime
    fire_id: str = Field(description="the id of the last missed instant")
    reason: str
    label: str | None = Field(default=None, description="a reminder's name (name is its id)")


Decision = Annotated[Fire | Skip | Miss, Field(discriminator="decision")]


class FireReport(_Record):
    """One thing that happened to a fire, for the audit log (the actor turns
    it into a ``schedule`` event) and the log."""

    persona: str
    kind: EntryKind
    name: str
    instant: datetime
    fire_id: str
    outcome: Outcome
    reason: str | None = None


#: pending: still to fire; done: fired its last time; cancelled: cancel_reminder;
#: missed: due while the runtime was down past its grace; skipped: stopped by
#: the daily cap (only reminders set by a background turn count against it).
ReminderState = Literal["pending", "done", "cancelled", "missed", "skipped"]


class Reminder(_Record):
    """A reminder a persona set with ``remind``: one-shot, or every
    ``every_seconds`` until ``until``. ``at`` is its next instant."""

    id: str
    persona: str
    name: str
    prompt: str
    at: datetime
    every_seconds: int | None = None
    until: datetime | None = None
    origin: Origin | None = None
    deliver: DeliverTarget | None = None
    created_by_turn: str | None = None
    background: bool = Field(
        default=False,
        description="set in a heartbeat/cron/reminder turn: its fires count against the "
        "daily cap of background turns",
    )
    created_at: datetime
    fired: int = 0
    state: ReminderState = "pending"


class ScheduleFileError(_Record):
    """A persona's schedules.yaml (or HEARTBEAT.md) that does not load: the
    previous schedule stays in force."""

    persona: str
    path: str
    entry: str
    field: str
    message: str
    since: datetime


class EntryStatus(_Record):
    """One line of a listing: an entry or a pending reminder."""

    persona: str
    kind: EntryKind
    name: str
    schedule: str = Field(description="every 30m / cron 0 8 * * 1-5 (Europe/Paris) / at …")
    tz: str = Field(description="the zone its times are shown in")
    next_fire: datetime | None = Field(default=None, description="in the entry's zone")
    next_fire_utc: datetime | None = None
    last_outcome: Outcome | None = None
    last_reason: str | None = None
    last_at: datetime | None = Field(default=None, description="in the entry's zone")
    paused: bool = False
    prompt: str = ""
    error: str | None = None


class ScheduleListing(_Record):
    """What ``coterie schedules``, ``GET /v1/schedules``, the chat page and
    ``remind list`` show."""

    now: datetime
    timezone: str = Field(description="the runtime's zone ($COTERIE_TIMEZONE)")
    entries: list[EntryStatus] = Field(default_factory=list)
    paused: dict[str, list[Queue]] = Field(default_factory=dict)
    errors: list[ScheduleFileError] = Field(default_factory=list)


RemindAction = Literal[
    "list", "add", "update", "remove", "run_now", "remind", "cancel_reminder", "pause", "resume"
]


class RemindRequest(BaseModel):
    """The ``remind`` tool's arguments (its JSON schema is this model's).

    Recurring entries live in the persona's schedules.yaml (``list``, ``add``,
    ``update``, ``remove``, ``run_now``); reminders are kept by the scheduler
    (``remind``, ``cancel_reminder``); ``pause``/``resume`` hold a queue.
    """

    model_config = ConfigDict(extra="forbid")

    action: RemindAction = Field(
        description="list: every entry and pending reminder; add/update/remove: a recurring "
        "entry of schedules.yaml; run_now: fire an entry once now; remind: set a reminder; "
        "cancel_reminder: cancel one by name; pause/resume: hold or release a queue"
    )
    name: str | None = Field(
        default=None,
        max_length=64,
        description="the entry or reminder (lowercase letters, digits, '-'); required for "
        "add (cron), update, remove, run_now, cancel_reminder; optional for remind (else made "
        "from the prompt); the heartbeat is 'heartbeat'",
    )
    type: Literal["heartbeat", "cron"] | None = Field(
        default=None, description="add: which kind of entry"
    )
    cron: str | None = Field(
        default=None, max_length=200, description="add/update (cron): 5 fields, e.g. '0 8 * * 1-5'"
    )
    every: str | None = Field(
        default=None, max_length=20, description="add/update (heartbeat): 45s, 30m, 2h, 1d"
    )
    prompt: str | None = Field(
        default=None,
        max_length=8000,
        description="add (cron) and remind: what the fired turn is asked; update: a new one",
    )
    tz: str | None = Field(
        default=None, max_length=64, description="add/update (cron): IANA zone, e.g. Europe/Paris"
    )
    fresh: bool | None = Field(
        default=None,
        description="add/update (cron): each fire in a new conversation without history",
    )
    light: bool | None = Field(
        default=None, description="add/update (heartbeat): a fresh conversation, SOUL + checklist"
    )
    at: str | None = Field(
        default=None,
        max_length=64,
        description="remind: ISO 8601 time, with an offset; without one it is the runtime's zone",
    )
    in_seconds: int | None = Field(
        default=None,
        ge=1,
        le=10 * 366 * 86400,
        description="remind: fire this many seconds from now",
    )
    every_seconds: int | None = Field(
        default=None, ge=1, le=366 * 86400, description="remind: fire again every N seconds"
    )
    until: str | None = Field(
        default=None, max_length=64, description="remind with every_seconds: ISO 8601 end"
    )
    deliver_connector: str | None = Field(
        default=None,
        max_length=64,
        description="add/update (cron) and remind: deliver the final message through this "
        "connector (web, cli, telegram) instead of where the request came from",
    )
    deliver_to: str | None = Field(
        default=None, max_length=256, description="the destination on deliver_connector"
    )
    queue: Queue | None = Field(default=None, description="pause/resume: heartbeat or cron")


class RemindResult(_Record):
    """What a ``remind`` action did; ``message`` is what the model reads."""

    action: RemindAction
    message: str
    name: str | None = None
    at: datetime | None = Field(default=None, description="the reminder's first instant (UTC)")
    fire_id: str | None = None
    listing: ScheduleListing | None = None

    def __str__(self) -> str:
        return self.message


__all__ = [
    "Decision",
    "EntryStatus",
    "Fire",
    "FireKey",
    "FireReport",
    "FireState",
    "Miss",
    "Outcome",
    "Queue",
    "RemindAction",
    "RemindRequest",
    "RemindResult",
    "Reminder",
    "ReminderState",
    "ScheduleFileError",
    "ScheduleListing",
    "Skip",
    "fire_id",
    "utc",
]
