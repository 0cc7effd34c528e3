"""The ``remind`` tool's actions, as plain synchronous logic over the engine
and the store (the service runs them in a thread, one at a time).

Recurring entries are edits of the persona's ``schedules.yaml``: validated
as a whole before anything is written, written atomically, then applied at
once (the hot reload would pick them up too). Reminders live in the store.
Every bad input raises :class:`~coterie.runtime.errors.ToolError` whose
detail starts with the field.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from coterie.runtime.config import ScheduleSettings
from coterie.runtime.errors import ScheduleConfigError, ScheduleError, ToolError
from coterie.runtime.messages import Origin, new_id
from coterie.runtime.schedule.cron import CronSpec, format_duration, parse_duration, zone
from coterie.runtime.schedule.engine import Scheduler
from coterie.runtime.schedule.entries import (
    ENTRY_NAME_RE,
    HEARTBEAT_NAME,
    SCHEDULES_FILE,
    CronConfig,
    DeliverTarget,
    HeartbeatConfig,
    ScheduleFile,
    parse_schedule_file,
    resolve_schedules,
    write_schedules,
)
from coterie.runtime.schedule.records import (
    EntryStatus,
    Fire,
    Reminder,
    RemindRequest,
    RemindResult,
    ScheduleListing,
)

#: A reminder time this far in the past is taken as now (clock skew), not refused.
PAST_GRACE = timedelta(seconds=5)
#: Turns whose creations are counted in memory (entries: reminders are counted by the store).
_TURNS_REMEMBERED = 4096
_SLUG = re.compile(r"[^a-z0-9]+")
# Fields only reminders (and queues) take: add and update refuse them.
_REMINDER_ONLY = ("at", "in_seconds", "every_seconds", "until", "queue")


def local_time(instant: datetime, tz: ZoneInfo) -> str:
    """``2025-01-10 16:00:00 CET (Europe/Paris)``."""
    return f"{instant.astimezone(tz).strftime('%Y-%m-%d %H:%M:%S %Z')} ({tz.key})"


def slug(prompt: str, now: datetime) -> str:
    """A reminder name from its prompt: ``check-on-the-deploy-1714128480``."""
    words = _SLUG.sub("-", prompt.lower()).strip("-")[:40].strip("-") or "reminder"
    return f"{words}-{int(now.timestamp())}"


def _line(row: EntryStatus) -> str:
    text = f"- {row.kind} {row.name!r}: {row.schedule}"
    if row.next_fire is not None:
        text += f"; next {row.next_fire.strftime('%Y-%m-%d %H:%M %Z')} ({row.tz})"
    if row.last_outcome:
        text += f"; last {row.last_outcome}"
        if row.last_reason:
            text += f" ({row.last_reason})"
    if row.paused:
        text += "; PAUSED"
    return text


def listing_text(listing: ScheduleListing) -> str:
    """A listing as the model reads it."""
    lines = [f"Times are shown in each entry's zone; the runtime's zone is {listing.timezone}."]
    if not listing.entries:
        lines.append("No recurring entries and no pending reminders.")
    lines.extend(_line(row) for row in listing.entries)
    for persona, queues in listing.paused.items():
        lines.append(f"Paused queues of {persona}: {', '.join(queues)}")
    for err in listing.errors:
        lines.append(
            f"ERROR in {err.path}: {err.entry}: {err.field}: {err.message} "
            "(the previous schedule stays in force)"
        )
    return "\n".join(lines)


def _need(value: object, action: str, field: str, what: str) -> None:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ToolError("invalid_arguments", f"{field}: {action} needs {what}")


def _refuse(request: RemindRequest, action: str, fields: tuple[str, ...]) -> None:
    for name in fields:
        if getattr(request, name) is not None:
            raise ToolError("invalid_arguments", f"{name}: not used by {action}")


def _deliver(request: RemindRequest) -> DeliverTarget | None:
    if request.deliver_connector is None:
        if request.deliver_to is not None:
            raise ToolError("invalid_arguments", "deliver_to: needs deliver_connector")
        return None
    return DeliverTarget(connector=request.deliver_connector, destination=request.deliver_to)


class RemindActions:
    """Every action of ``remind`` for one runtime's scheduler."""

    def __init__(self, engine: Scheduler) -> None:
        self.engine = engine
        self._created: OrderedDict[str, int] = OrderedDict()

    @property
    def settings(self) -> ScheduleSettings:
        return self.engine.settings

    # -- the per-turn bound --------------------------------------------------

    def _bound(self, background: bool, turn_id: str | None) -> None:
        if not background:
            return
        if turn_id is None:
            raise ValueError("remind from a background turn needs its turn_id")
        made = self.engine.store.reminders_created_by(turn_id) + self._created.get(turn_id, 0)
        limit = self.settings.max_reminders_per_background_turn
        if made >= limit:
            raise ToolError(
                "limit_reached",
                f"action: a heartbeat, cron or reminder turn may create at most {limit} "
                "reminders or entries (max_reminders_per_background_turn)",
            )

    def _count_entry(self, background: bool, turn_id: str | None) -> None:
        if background and turn_id is not None:
            self._created[turn_id] = self._created.get(turn_id, 0) + 1
            self._created.move_to_end(turn_id)
            while len(self._created) > _TURNS_REMEMBERED:
                self._created.popitem(last=False)

    # -- schedules.yaml ------------------------------------------------------

    def _file(self, persona: str) -> ScheduleFile:
        path = self.engine.persona_dir(persona) / SCHEDULES_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ScheduleFile()
        except OSError as exc:
            raise ToolError("unavailable", f"{SCHEDULES_FILE}: cannot read it: {exc}") from None
        try:
            return parse_schedule_file(path, text)
        except ScheduleConfigError as exc:
            raise ToolError(
                "unavailable",
                f"{SCHEDULES_FILE}: the file does not load ({exc.entry}: {exc.field}: "
                f"{exc.message}); fix it first",
            ) from None

    def _save(self, persona: str, file: ScheduleFile, now: datetime) -> None:
        """Validate the whole file, then write it atomically and apply it."""
        path = self.engine.persona_dir(persona) / SCHEDULES_FILE
        try:
            resolve_schedules(
                persona,
                path,
                file,
                min_interval=self.engine.min_interval,
                default_tz=self.engine.tz,
            )
        except ScheduleConfigError as exc:
            raise ToolError("invalid_arguments", f"{exc.field}: {exc.message}") from None
        try:
            write_schedules(path, file)
        except OSError as exc:
            raise ToolError("write_failed", f"{SCHEDULES_FILE}: {exc}") from None
        self.engine.reload(now)

    def _check_cron_fields(self, request: RemindRequest) -> None:
        if request.tz is not None:
            try:
                zone(request.tz)
            except ScheduleError as exc:
                raise ToolError("invalid_arguments", f"tz: {exc}") from None
        if request.cron is not None:
            try:
                CronSpec.parse(request.cron, request.tz or self.engine.tz)
            except ScheduleError as exc:
                raise ToolError("invalid_arguments", f"cron: {exc}") from None

    def _check_every(self, request: RemindRequest) -> None:
        if request.every is not None:
            try:
                parse_duration(request.every)
            except ScheduleError as exc:
                raise ToolError("invalid_arguments", f"every: {exc}") from None

    def add(
        self,
        persona: str,
        request: RemindRequest,
        now: datetime,
        background: bool,
        turn_id: str | None,
    ) -> RemindResult:
        _need(request.type, "add", "type", "the entry's type (heartbeat or cron)")
        _refuse(request, "add", _REMINDER_ONLY)
        self._bound(background, turn_id)
        file = self._file(persona)
        if request.type == "heartbeat":
            _refuse(
                request, "a heartbeat", ("cron", "tz", "fresh", "deliver_connector", "deliver_to")
            )
            if request.name not in (None, HEARTBEAT_NAME):
                raise ToolError("invalid_arguments", "name: the heartbeat's name is 'heartbeat'")
            _need(request.every, "add (heartbeat)", "every", "an interval such as 30m")
            self._check_every(request)
            if file.heartbeat is not None:
                raise ToolError("already_exists", "type: this persona has a heartbeat; use update")
            assert request.every is not None
            file = file.model_copy(
                update={
                    "heartbeat": HeartbeatConfig(
                        every=request.every, prompt=request.prompt, light=bool(request.light)
                    )
                }
            )
            name = HEARTBEAT_NAME
        else:
            _refuse(request, "a cron entry", ("every", "light"))
            _need(request.name, "add (cron)", "name", "a name (lowercase letters, digits, '-')")
            _need(request.cron, "add (cron)", "cron", "a 5-field cron expression")
            _need(request.prompt, "add (cron)", "prompt", "the prompt each fire runs")
            assert request.name is not None and request.cron and request.prompt
            self._check_name(request.name)
            self._check_cron_fields(request)
            if any(c.name == request.name for c in file.cron):
                raise ToolError(
                    "already_exists", f"name: a cron entry {request.name!r} exists; use update"
                )
            entry = CronConfig(
                name=request.name,
                cron=request.cron,
                tz=request.tz,
                prompt=request.prompt,
                conversation="fresh" if request.fresh else "persistent",
                deliver=_deliver(request),
            )
            file = file.model_copy(update={"cron": [*file.cron, entry]})
            name = request.name
        self._save(persona, file, now)
        self._count_entry(background, turn_id)
        return self._entry_result("add", persona, name, f"Added {name!r}", now)

    def _check_name(self, name: str) -> None:
        if not ENTRY_NAME_RE.match(name):
            raise ToolError(
                "invalid_arguments",
                f"name: {name!r}: expected lowercase letters, digits and '-' (at most 64)",
            )
        if name == HEARTBEAT_NAME:
            raise ToolError("invalid_arguments", "name: 'heartbeat' is the heartbeat's name")

    def _entry_result(
        self, action: str, persona: str, name: str, said: str, now: datetime
    ) -> RemindResult:
        row = next(
            (
                r
                for r in self.engine.listing(persona, now).entries
                if r.kind != "reminder" and r.name == name
            ),
            None,
        )
        text = said
        if row is not None and row.next_fire is not None:
            text += f": {row.schedule}; next fire {local_time(row.next_fire, ZoneInfo(row.tz))}"
        return RemindResult(action=action, message=text + ".", name=name)  # type: ignore[arg-type]

    def update(self, persona: str, request: RemindRequest, now: datetime) -> RemindResult:
        _need(request.name, "update", "name", "the entry's name")
        _refuse(request, "update", _REMINDER_ONLY)
        assert request.name is not None
        file = self._file(persona)
        changes: dict[str, object]
        if request.name == HEARTBEAT_NAME:
            if file.heartbeat is None:
                raise ToolError("not_found", "name: this persona has no heartbeat")
            if request.type not in (None, "heartbeat"):
                raise ToolError("invalid_arguments", "type: 'heartbeat' is a heartbeat")
            _refuse(
                request, "a heartbeat", ("cron", "tz", "fresh", "deliver_connector", "deliver_to")
            )
            self._check_every(request)
            changes = {
                k: v
                for k, v in (
                    ("every", request.every),
                    ("prompt", request.prompt),
                    ("light", request.light),
                )
                if v is not None
            }
            if not changes:
                raise ToolError("invalid_arguments", "every: update needs every, prompt or light")
            file = file.model_copy(update={"heartbeat": file.heartbeat.model_copy(update=changes)})
        else:
            index = next((i for i, c in enumerate(file.cron) if c.name == request.name), None)
            if index is None:
                raise ToolError("not_found", f"name: no cron entry {request.name!r}")
            if request.type not in (None, "cron"):
                raise ToolError("invalid_arguments", f"type: {request.name!r} is a cron entry")
            _refuse(request, "a cron entry", ("every", "light"))
            self._check_cron_fields(request)
            changes = {
                k: v
                for k, v in (("cron", request.cron), ("prompt", request.prompt), ("tz", request.tz))
                if v is not None
            }
            if request.fresh is not None:
                changes["conversation"] = "fresh" if request.fresh else "persistent"
            deliver = _deliver(request)
            if deliver is not None:
                changes["deliver"] = deliver
            if not changes:
                raise ToolError(
                    "invalid_arguments",
                    "cron: update needs cron, prompt, tz, fresh or deliver_connector",
                )
            crons = list(file.cron)
            crons[index] = crons[index].model_copy(update=changes)
            file = file.model_copy(update={"cron": crons})
        self._save(persona, file, now)
        return self._entry_result("update", persona, request.name, f"Updated {request.name!r}", now)

    def remove(self, persona: str, request: RemindRequest, now: datetime) -> RemindResult:
        _need(request.name, "remove", "name", "the entry's name")
        file = self._file(persona)
        if request.name == HEARTBEAT_NAME:
            if file.heartbeat is None:
                raise ToolError("not_found", "name: this persona has no heartbeat")
            file = file.model_copy(update={"heartbeat": None})
        else:
            if not any(c.name == request.name for c in file.cron):
                raise ToolError("not_found", f"name: no cron entry {request.name!r}")
            file = file.model_copy(
                update={"cron": [c for c in file.cron if c.name != request.name]}
            )
        self._save(persona, file, now)
        return RemindResult(
            action="remove", message=f"Removed {request.name!r}.", name=request.name
        )

    def run_now(
        self, persona: str, request: RemindRequest, now: datetime
    ) -> tuple[RemindResult, Fire]:
        _need(request.name, "run_now", "name", "the entry's name")
        assert request.name is not None
        queue = "heartbeat" if request.name == HEARTBEAT_NAME else "cron"
        try:
            fire = self.engine.manual_fire(persona, request.name, now)
        except KeyError:
            raise ToolError("not_found", f"name: no entry {request.name!r}") from None
        if self.engine.paused(persona, queue):  # type: ignore[arg-type]
            raise ToolError("unavailable", f"queue: the {queue} queue is paused; resume it first")
        if self.engine.cap_reached(persona, now):
            raise ToolError(
                "limit_reached",
                f"name: the daily cap of background turns is reached "
                f"({self.settings.max_background_turns_per_day}: max_background_turns_per_day)",
            )
        if not self.engine.claim([fire], now)[0]:
            raise ToolError(
                "already_exists", f"name: {request.name!r} already fired at this instant"
            )
        message = (
            f"Fired {request.name!r} now (fire {fire.fire_id}, "
            f"conversation {fire.conversation_id})."
        )
        return RemindResult(
            action="run_now", message=message, name=request.name, fire_id=fire.fire_id
        ), fire

    def remind(
        self,
        persona: str,
        request: RemindRequest,
        now: datetime,
        *,
        origin: Origin | None,
        deliver: DeliverTarget | None,
        background: bool,
        turn_id: str | None,
    ) -> RemindResult:
        _need(request.prompt, "remind", "prompt", "the prompt the reminder fires")
        _refuse(request, "remind", ("type", "cron", "every", "tz", "fresh", "light", "queue"))
        assert request.prompt is not None
        if request.at is not None and request.in_seconds is not None:
            raise ToolError("invalid_arguments", "at: give at or in_seconds, not both")
        if request.at is None and request.in_seconds is None:
            raise ToolError("invalid_arguments", "at: remind needs at (ISO 8601) or in_seconds")
        tz = self.engine.tz
        note = ""
        if request.at is not None:
            at, naive = self._parse_time("at", request.at, tz)
            if naive:
                note = f" (at had no offset: read in the runtime's zone, {tz.key})"
            if at < now - PAST_GRACE:
                raise ToolError(
                    "invalid_arguments",
                    f"at: {local_time(at, tz)} is in the past (now is {local_time(now, tz)}); "
                    "use in_seconds for a time relative to now",
                )
            at = max(at, now)
        else:
            assert request.in_seconds is not None
            at = now + timedelta(seconds=request.in_seconds)
        until = None
        if request.until is not None:
            if request.every_seconds is None:
                raise ToolError("invalid_arguments", "until: only with every_seconds")
            until, _ = self._parse_time("until", request.until, tz)
            if until <= at:
                raise ToolError(
                    "invalid_arguments",
                    f"until: {local_time(until, tz)} is not after the first time "
                    f"{local_time(at, tz)}",
                )
        if request.every_seconds is not None and request.every_seconds < self.settings.min_interval:
            raise ToolError(
                "invalid_arguments",
                f"every_seconds: {request.every_seconds} is shorter than the runtime's "
                f"min_interval ({self.settings.min_interval:g}s)",
            )
        name = request.name or slug(request.prompt, now)
        if not ENTRY_NAME_RE.match(name):
            raise ToolError(
                "invalid_arguments",
                f"name: {name!r}: expected lowercase letters, digits and '-' (at most 64)",
            )
        self._bound(background, turn_id)
        store = self.engine.store
        if store.pending_count(persona) >= self.settings.max_pending_reminders:
            raise ToolError(
                "limit_reached",
                f"name: {persona} has {self.settings.max_pending_reminders} pending reminders "
                "(max_pending_reminders); cancel some first",
            )
        reminder = Reminder(
            id=new_id("rem_"),
            persona=persona,
            name=name,
            prompt=request.prompt,
            at=at,
            every_seconds=request.every_seconds,
            until=until,
            origin=origin,
            deliver=_deliver(request) or deliver,
            created_by_turn=turn_id,
            background=background,
            created_at=now,
        )
        if not store.add_reminder(reminder):
            raise ToolError(
                "already_exists",
                f"name: a pending reminder {name!r} exists; pick another name or cancel it",
            )
        self.engine.invalidate()
        utc_text = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        text = f"Reminder {name!r} set for {local_time(at, tz)} = {utc_text}"
        if request.every_seconds:
            text += f", then every {format_duration(timedelta(seconds=request.every_seconds))}"
            if until is not None:
                text += f" until {local_time(until, tz)}"
        text += f"{note}. Cancel it with cancel_reminder name={name!r}."
        return RemindResult(action="remind", message=text, name=name, at=at)

    @staticmethod
    def _parse_time(field: str, text: str, tz: ZoneInfo) -> tuple[datetime, bool]:
        try:
            value = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ToolError(
                "invalid_arguments",
                f"{field}: {text!r} is not an ISO 8601 time (e.g. 2025-03-07T16:00:00+01:00)",
            ) from None
        if value.tzinfo is None:
            return value.replace(tzinfo=tz).astimezone(UTC), True
        return value.astimezone(UTC), False

    def cancel(self, persona: str, request: RemindRequest, now: datetime) -> RemindResult:
        _need(request.name, "cancel_reminder", "name", "the reminder's name (see list)")
        assert request.name is not None
        cancelled = self.engine.store.cancel_reminder(persona, request.name, at=now)
        if cancelled is None:
            raise ToolError("not_found", f"name: no pending reminder {request.name!r} (see list)")
        self.engine.invalidate()
        return RemindResult(
            action="cancel_reminder",
            message=f"Cancelled reminder {request.name!r} (and its later occurrences).",
            name=request.name,
        )

    def pause(
        self, persona: str, request: RemindRequest, now: datetime, *, resume: bool
    ) -> RemindResult:
        action = "resume" if resume else "pause"
        _need(request.queue, action, "queue", "the queue: heartbeat or cron")
        assert request.queue is not None
        store = self.engine.store
        if resume:
            changed = store.resume(persona, request.queue)
            said = "Resumed" if changed else "Nothing to resume:"
            tail = "" if changed else " was not paused"
        else:
            changed = store.pause(persona, request.queue, at=now)
            said = "Paused" if changed else "Already paused:"
            tail = (
                " (held until resume; cron also holds reminders, which then fire late)"
                if changed
                else ""
            )
        self.engine.invalidate()
        return RemindResult(action=action, message=f"{said} the {request.queue} queue{tail}.")  # type: ignore[arg-type]

    def list(self, persona: str, now: datetime) -> RemindResult:
        listing = self.engine.listing(persona, now)
        return RemindResult(action="list", message=listing_text(listing), listing=listing)


__all__ = ["PAST_GRACE", "RemindActions", "listing_text", "local_time", "slug"]
