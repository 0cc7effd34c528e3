"""``<persona>/schedules.yaml`` and ``HEARTBEAT.md``: what a persona runs on its own.

The file (every field but the cron entries' ``name``, ``cron`` and
``prompt`` optional; an unknown field is an error)::

    heartbeat:                      # at most one
      every: 30m                    # 45s, 30m, 2h, 1d: multiples since the epoch, UTC
      prompt: "..."                 # else the persona's HEARTBEAT.md checklist
      model: {provider: ..., ...}   # a cheaper model for heartbeat turns only
      active_hours: {start: "08:00", end: "22:00", tz: Europe/Paris}
      light: false                  # true: a fresh conversation, SOUL + checklist only
      misfire_grace: 15m
    cron:
      - name: overnight-alerts      # lowercase letters, digits and '-'; unique
        cron: "0 8 * * 1-5"         # five fields, or @daily, @hourly ...
        tz: Europe/Paris            # else $COTERIE_TIMEZONE
        prompt: "Summarize the overnight alerts."
        conversation: persistent    # persistent | fresh
        deliver: {connector: telegram, destination: "12345"}
        misfire_grace: 1h

:func:`load_schedules` validates it into :class:`PersonaSchedules`, whose
:class:`Entry` objects carry the resolved spec, zone and grace; every error
is a :class:`~coterie.runtime.errors.ScheduleConfigError` naming the file,
the entry and the field. :func:`read_checklist` reads ``HEARTBEAT.md``.
:func:`write_schedules` writes the file back atomically (the ``remind``
tool's edits; comments are not kept).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from coterie.runtime.config import ModelConfig, runtime_timezone
from coterie.runtime.config._strict import Strict
from coterie.runtime.errors import ScheduleConfigError, ScheduleError
from coterie.runtime.messages import Origin
from coterie.runtime.schedule.cron import CronSpec, Every, parse_duration, zone
from coterie.runtime.yaml_load import load_yaml

SCHEDULES_FILE = "schedules.yaml"
CHECKLIST_FILE = "HEARTBEAT.md"
#: Names of cron entries and reminders: lowercase letters, digits and '-'.
ENTRY_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
#: The heartbeat's name in listings and in the ``remind`` tool (no cron entry takes it).
HEARTBEAT_NAME = "heartbeat"
#: A ``HEARTBEAT.md`` larger than this is an error (the checklist goes in a prompt).
MAX_CHECKLIST_BYTES = 64 * 1024
#: The cap on the default misfire grace (half the period).
MAX_DEFAULT_GRACE = timedelta(hours=1)
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class DeliverTarget(Strict):
    """Where a fired turn's ``reply_to_origin`` delivers: a connector and a
    destination on it (a chat id, a web session)."""

    connector: str = Field(min_length=1, description="connector id: web, cli, telegram …")
    destination: str | None = Field(default=None, description="chat or session id on it")

    @field_validator("destination", mode="before")
    @classmethod
    def _numbers_are_ids(cls, value: Any) -> Any:
        # A chat id written without quotes is read by YAML as a number.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    def origin(self) -> Origin:
        return Origin(connector=self.connector, destination=self.destination)


class ActiveHours(Strict):
    """The hours of the day a heartbeat may fire (``end`` before ``start``
    spans midnight); outside them it is skipped without a model call."""

    start: str = Field(description="HH:MM, 24-hour")
    end: str = Field(description="HH:MM, 24-hour; the first minute outside")
    tz: str | None = Field(default=None, description="IANA zone; else $COTERIE_TIMEZONE")

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        if not _HHMM.match(value):
            raise ValueError(f"{value!r} is not a time of day as HH:MM (e.g. 08:00)")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> ActiveHours:
        if self.start == self.end:
            raise ValueError(f"start and end are both {self.start}: an empty window")
        return self

    def contains(self, instant: datetime, default_tz: ZoneInfo) -> bool:
        """Whether ``instant`` falls inside the window (in its zone)."""
        tz = zone(self.tz) if self.tz else default_tz
        local = instant.astimezone(tz).time()
        start, end = _clock(self.start), _clock(self.end)
        if start < end:
            return start <= local < end
        return local >= start or local < end

    def describe(self, default_tz: ZoneInfo) -> str:
        return f"{self.start}–{self.end} {self.tz or default_tz.key}"


def _clock(text: str) -> time:
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


class HeartbeatConfig(Strict):
    """``heartbeat:``: a check-in every ``every``."""

    every: str | int = Field(description="45s, 30m, 2h, 1d (or seconds)")
    prompt: str | None = Field(default=None, description="else the HEARTBEAT.md checklist")
    model: ModelConfig | None = Field(default=None, description="a model for heartbeats only")
    active_hours: ActiveHours | None = None
    light: bool = Field(default=False, description="fresh conversation, SOUL + checklist")
    misfire_grace: str | int | None = Field(
        default=None, description="how late a fire may still run (default: half the period)"
    )


class CronConfig(Strict):
    """One named entry of ``cron:``."""

    name: str = Field(description="lowercase letters, digits and '-', unique in the file")
    cron: str = Field(description="five fields, or @hourly, @daily …")
    tz: str | None = Field(default=None, description="IANA zone; else $COTERIE_TIMEZONE")
    prompt: str = Field(min_length=1)
    conversation: Literal["persistent", "fresh"] = "persistent"
    deliver: DeliverTarget | None = None
    misfire_grace: str | int | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ENTRY_NAME_RE.match(value):
            raise ValueError(
                f"{value!r}: expected lowercase letters, digits and '-' (at most 64, "
                "starting with a letter or digit)"
            )
        if value == HEARTBEAT_NAME:
            raise ValueError(f"{value!r} is the heartbeat's name; pick another")
        return value


class ScheduleFile(Strict):
    """The whole of ``schedules.yaml``."""

    heartbeat: HeartbeatConfig | None = None
    cron: list[CronConfig] = Field(default_factory=list)


EntryKind = Literal["heartbeat", "cron", "reminder"]


@dataclass(frozen=True)
class Entry:
    """A heartbeat or cron entry, resolved: when it fires and what it runs."""

    persona: str
    kind: Literal["heartbeat", "cron"]
    name: str
    spec: CronSpec | Every
    tz: ZoneInfo
    grace: timedelta
    prompt: str | None
    conversation: Literal["persistent", "fresh"] = "persistent"
    deliver: DeliverTarget | None = None
    model: ModelConfig | None = None
    light: bool = False
    active_hours: ActiveHours | None = None

    @property
    def key(self) -> str:
        """``<persona>/<kind>/<name>``: what the store's cursors are keyed by."""
        return f"{self.persona}/{self.kind}/{self.name}"

    @property
    def fingerprint(self) -> str:
        """What the instants depend on: a cursor kept under another one is stale."""
        if isinstance(self.spec, Every):
            return f"every {self.spec.interval.total_seconds():g}s"
        return f"cron {self.spec.expr} {self.tz.key}"

    @property
    def uses_checklist(self) -> bool:
        """A heartbeat without a prompt runs the persona's HEARTBEAT.md."""
        return self.kind == "heartbeat" and self.prompt is None

    def describe(self) -> str:
        return self.spec.describe()


@dataclass(frozen=True)
class PersonaSchedules:
    """One persona's file, validated (no file: no entries)."""

    persona: str
    path: Path
    file: ScheduleFile
    entries: tuple[Entry, ...]

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.name == name), None)


def default_grace(period: timedelta) -> timedelta:
    """Half the period, at most an hour."""
    return min(period / 2, MAX_DEFAULT_GRACE)


def _problem(path: Path, raw: Any, err: dict[str, Any]) -> ScheduleConfigError:
    loc = list(err["loc"])
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "missing":
        message = "required"
    if loc and loc[0] == "heartbeat":
        return ScheduleConfigError(
            str(path), HEARTBEAT_NAME, ".".join(map(str, loc[1:])) or "heartbeat", message
        )
    if len(loc) >= 2 and loc[0] == "cron" and isinstance(loc[1], int):
        entry = f"cron #{loc[1] + 1}"
        try:
            name = raw["cron"][loc[1]]["name"]
            if isinstance(name, str) and name:
                entry = f"cron {name!r}"
        except (KeyError, IndexError, TypeError):
            pass
        field = ".".join(map(str, loc[2:])) or "(entry)"
        return ScheduleConfigError(str(path), entry, field, message)
    field = ".".join(map(str, loc)) or "(top level)"
    return ScheduleConfigError(str(path), "(file)", field, message)


def parse_schedule_file(path: Path, text: str) -> ScheduleFile:
    """Validate the text of one ``schedules.yaml`` (the models only)."""
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ScheduleConfigError(str(path), "(file)", "(yaml)", f"not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScheduleConfigError(str(path), "(file)", "(top level)", "expected a mapping")
    try:
        return ScheduleFile.model_validate(raw)
    except ValidationError as exc:
        raise _problem(path, raw, exc.errors()[0]) from None  # type: ignore[arg-type]


def _grace(path: Path, entry: str, value: str | int | None, period: timedelta) -> timedelta:
    if value is None:
        return default_grace(period)
    try:
        return parse_duration(value)
    except ScheduleError as exc:
        raise ScheduleConfigError(str(path), entry, "misfire_grace", str(exc)) from None


def resolve_schedules(
    persona: str,
    path: Path,
    file: ScheduleFile,
    *,
    min_interval: timedelta = timedelta(seconds=60),
    default_tz: ZoneInfo | None = None,
) -> PersonaSchedules:
    """Turn a validated file into entries: parse the cron expressions, zones,
    intervals and graces; raises :class:`ScheduleConfigError`."""
    tz_default = default_tz or runtime_timezone()
    entries: list[Entry] = []
    hb = file.heartbeat
    if hb is not None:
        try:
            every = Every.parse(hb.every)
        except ScheduleError as exc:
            raise ScheduleConfigError(str(path), HEARTBEAT_NAME, "every", str(exc)) from None
        if every.interval < min_interval:
            raise ScheduleConfigError(
                str(path),
                HEARTBEAT_NAME,
                "every",
                f"{hb.every} is shorter than the runtime's min_interval "
                f"({min_interval.total_seconds():g}s, runtime.yaml schedule.min_interval)",
            )
        hb_tz = tz_default
        if hb.active_hours is not None and hb.active_hours.tz:
            try:
                hb_tz = zone(hb.active_hours.tz)
            except ScheduleError as exc:
                raise ScheduleConfigError(
                    str(path), HEARTBEAT_NAME, "active_hours.tz", str(exc)
                ) from None
        entries.append(
            Entry(
                persona=persona,
                kind="heartbeat",
                name=HEARTBEAT_NAME,
                spec=every,
                tz=hb_tz,
                grace=_grace(path, HEARTBEAT_NAME, hb.misfire_grace, every.interval),
                prompt=hb.prompt,
                model=hb.model,
                light=hb.light,
                active_hours=hb.active_hours,
            )
        )
    seen: set[str] = set()
    for cron in file.cron:
        label = f"cron {cron.name!r}"
        if cron.name in seen:
            raise ScheduleConfigError(str(path), label, "name", "a second entry of that name")
        seen.add(cron.name)
        try:
            tz = zone(cron.tz) if cron.tz else tz_default
        except ScheduleError as exc:
            raise ScheduleConfigError(str(path), label, "tz", str(exc)) from None
        try:
            spec = CronSpec.parse(cron.cron, tz)
        except ScheduleError as exc:
            raise ScheduleConfigError(str(path), label, "cron", str(exc)) from None
        if spec.period() < min_interval:
            raise ScheduleConfigError(
                str(path),
                label,
                "cron",
                f"{cron.cron!r} fires every {spec.period().total_seconds():g}s, more often than "
                f"the runtime's min_interval ({min_interval.total_seconds():g}s)",
            )
        entries.append(
            Entry(
                persona=persona,
                kind="cron",
                name=cron.name,
                spec=spec,
                tz=tz,
                grace=_grace(path, label, cron.misfire_grace, spec.period()),
                prompt=cron.prompt,
                conversation=cron.conversation,
                deliver=cron.deliver,
            )
        )
    return PersonaSchedules(persona=persona, path=path, file=file, entries=tuple(entries))


def load_schedules(
    persona_dir: Path,
    *,
    persona: str | None = None,
    min_interval: timedelta = timedelta(seconds=60),
    default_tz: ZoneInfo | None = None,
) -> PersonaSchedules:
    """``<persona_dir>/schedules.yaml``, validated and resolved (none: no
    entries); raises :class:`ScheduleConfigError` naming file, entry and field."""
    name = persona or persona_dir.name
    path = persona_dir / SCHEDULES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return PersonaSchedules(name, path, ScheduleFile(), ())
    except (OSError, UnicodeDecodeError) as exc:
        raise ScheduleConfigError(str(path), "(file)", "(file)", f"cannot read: {exc}") from None
    file = parse_schedule_file(path, text)
    return resolve_schedules(name, path, file, min_interval=min_interval, default_tz=default_tz)


def dump_schedules(file: ScheduleFile) -> str:
    """The YAML text of ``file`` (fields left at their defaults are omitted)."""
    data = file.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    header = "# Schedules of this persona (the guide's page: Schedules and reminders).\n"
    return header + (yaml.safe_dump(data, sort_keys=False, allow_unicode=True) if data else "")


def write_schedules(path: Path, file: ScheduleFile) -> None:
    """Write ``file`` to ``path`` atomically (a reader sees the old file or
    the new one, never half of one)."""
    text = dump_schedules(file)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass(frozen=True)
class Checklist:
    """A persona's ``HEARTBEAT.md``: its text, a hash of it, and whether it
    holds anything to do (headings, comments and blank lines are nothing)."""

    text: str
    digest: str
    empty: bool


_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_NOTHING_LINE = re.compile(r"^\s*(#.*|[-*_]{3,}|[-*+]\s*(\[\s?\])?\s*)?$")


def checklist_of(text: str) -> Checklist:
    """A checklist from the file's text."""
    normal = "\n".join(line.rstrip() for line in text.strip().splitlines())
    digest = hashlib.sha256(normal.encode("utf-8")).hexdigest()[:32]
    body = _COMMENT.sub("", normal)
    empty = all(_NOTHING_LINE.match(line) for line in body.splitlines())
    return Checklist(text=normal, digest=digest, empty=empty)


def read_checklist(persona_dir: Path) -> Checklist:
    """``<persona_dir>/HEARTBEAT.md`` (none: an empty checklist); a file over
    :data:`MAX_CHECKLIST_BYTES` or not UTF-8 raises :class:`ScheduleConfigError`."""
    path = persona_dir / CHECKLIST_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return checklist_of("")
    except OSError as exc:
        raise ScheduleConfigError(
            str(path), HEARTBEAT_NAME, "checklist", f"cannot read: {exc}"
        ) from None
    if len(data) > MAX_CHECKLIST_BYTES:
        raise ScheduleConfigError(
            str(path),
            HEARTBEAT_NAME,
            "checklist",
            f"{len(data)} bytes, over the {MAX_CHECKLIST_BYTES} a checklist may hold",
        )
    try:
        return checklist_of(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ScheduleConfigError(
            str(path), HEARTBEAT_NAME, "checklist", "not UTF-8 text"
        ) from None


__all__ = [
    "CHECKLIST_FILE",
    "ENTRY_NAME_RE",
    "HEARTBEAT_NAME",
    "MAX_CHECKLIST_BYTES",
    "SCHEDULES_FILE",
    "ActiveHours",
    "Checklist",
    "CronConfig",
    "DeliverTarget",
    "Entry",
    "EntryKind",
    "HeartbeatConfig",
    "PersonaSchedules",
    "ScheduleFile",
    "checklist_of",
    "default_grace",
    "dump_schedules",
    "load_schedules",
    "parse_schedule_file",
    "read_checklist",
    "resolve_schedules",
    "write_schedules",
]
