"""schedules.yaml and HEARTBEAT.md: the models, the errors naming file,
entry and field, the defaults, and writing the file back."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from coterie.runtime.errors import PersonaConfigError, ScheduleConfigError
from coterie.runtime.schedule.cron import CronSpec, Every
from coterie.runtime.schedule.entries import (
    MAX_CHECKLIST_BYTES,
    ActiveHours,
    checklist_of,
    load_schedules,
    parse_schedule_file,
    read_checklist,
    write_schedules,
)
from tests.helpers import no_plugin_providers

FULL = """
heartbeat:
  every: 30m
  model: {provider: scripted, default: "ok"}
  active_hours: {start: "08:00", end: "22:00", tz: Europe/Paris}
  light: true
cron:
  - name: overnight-alerts
    cron: "0 8 * * 1-5"
    tz: America/New_York
    prompt: Summarize the overnight alerts.
    conversation: fresh
    deliver: {connector: telegram, destination: 12345}
    misfire_grace: 2h
  - name: weekly
    cron: "@weekly"
    prompt: Weekly review.
"""


def persona(tmp_path: Path, text: str | None, name: str = "ada") -> Path:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    if text is not None:
        (path / "schedules.yaml").write_text(text)
    return path


def test_a_full_file_resolves(tmp_path: Path) -> None:
    loaded = load_schedules(persona(tmp_path, FULL), default_tz=ZoneInfo("Asia/Tokyo"))
    hb, alerts, weekly = loaded.entries
    assert (hb.kind, hb.name, hb.light, hb.uses_checklist) == ("heartbeat", "heartbeat", True, True)
    assert isinstance(hb.spec, Every) and hb.spec.interval == timedelta(minutes=30)
    assert hb.tz.key == "Europe/Paris"  # the active hours' zone
    assert hb.grace == timedelta(minutes=15)  # half the period
    assert hb.model is not None and hb.model.provider == "scripted"
    assert isinstance(alerts.spec, CronSpec) and alerts.tz.key == "America/New_York"
    assert alerts.grace == timedelta(hours=2)
    assert alerts.conversation == "fresh"
    assert alerts.deliver is not None and alerts.deliver.destination == "12345"
    assert alerts.key == "ada/cron/overnight-alerts"
    # No tz: the runtime's zone; default grace: half a week capped at an hour.
    assert weekly.tz.key == "Asia/Tokyo" and weekly.grace == timedelta(hours=1)


def test_no_file_means_no_entries(tmp_path: Path) -> None:
    assert load_schedules(persona(tmp_path, None)).entries == ()
    assert load_schedules(persona(tmp_path, "", "bob")).entries == ()


def test_the_runtime_zone_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COTERIE_TIMEZONE", "America/New_York")
    text = "cron:\n  - {name: a, cron: '0 8 * * *', prompt: x}\n"
    [entry] = load_schedules(persona(tmp_path, text)).entries
    assert entry.tz.key == "America/New_York"


@pytest.mark.parametrize(
    ("text", "entry", "field", "needle"),
    [
        ("cron:\n  - {name: a, cron: '61 * * * *', prompt: x}\n", "cron 'a'", "cron", "61"),
        (
            "cron:\n  - {name: a, cron: '0 8 * * *', prompt: x, tz: Mars/Base}\n",
            "cron 'a'",
            "tz",
            "Mars/Base",
        ),
        ("cron:\n  - {name: a, cron: '0 8 * * *'}\n", "cron 'a'", "prompt", "required"),
        (
            "cron:\n  - {name: Bad_Name, cron: '0 8 * * *', prompt: x}\n",
            "cron 'Bad_Name'",
            "name",
            "lowercase",
        ),
        (
            "cron:\n  - {name: a, cron: '0 8 * * *', prompt: x, colour: red}\n",
            "cron 'a'",
            "colour",
            "unknown field",
        ),
        (
            "cron:\n  - {name: a, cron: '0 8 * * *', prompt: x}\n  - {name: a, cron: '0 9 * * *', "
            "prompt: y}\n",
            "cron 'a'",
            "name",
            "second entry",
        ),
        (
            "cron:\n  - {name: heartbeat, cron: '0 8 * * *', prompt: x}\n",
            "cron 'heartbeat'",
            "name",
            "heartbeat's name",
        ),
        ("heartbeat: {every: 10s}\n", "heartbeat", "every", "min_interval"),
        ("heartbeat: {every: soon}\n", "heartbeat", "every", "not a duration"),
        (
            "heartbeat: {every: 30m, active_hours: {start: '8am', end: '22:00'}}\n",
            "heartbeat",
            "active_hours.start",
            "HH:MM",
        ),
        (
            "heartbeat: {every: 30m, active_hours: {start: '08:00', end: '08:00'}}\n",
            "heartbeat",
            "active_hours",
            "empty window",
        ),
        (
            "heartbeat: {every: 30m, misfire_grace: later}\n",
            "heartbeat",
            "misfire_grace",
            "not a duration",
        ),
        (
            "heartbeat: {every: 30m, model: {provider: nope}}\n",
            "heartbeat",
            "model.plugin.provider",
            "a loaded plugin registers (loaded: none)",
        ),
        ("crons: []\n", "(file)", "crons", "unknown field"),
        ("- a\n- b\n", "(file)", "(top level)", "mapping"),
        ("cron: [\n", "(file)", "(yaml)", "not valid YAML"),
    ],
)
def test_errors_name_the_file_the_entry_and_the_field(
    tmp_path: Path, text: str, entry: str, field: str, needle: str
) -> None:
    path = persona(tmp_path, text)
    with pytest.raises(ScheduleConfigError) as info:
        load_schedules(path)
    err = info.value
    assert (err.entry, err.field) == (entry, field)
    assert err.path == str(path / "schedules.yaml")
    assert needle in err.message
    assert str(path / "schedules.yaml") in str(err) and field in str(err)
    # A PersonaConfigError like the other persona files' errors, and it
    # crosses actor boundaries whole.
    assert isinstance(err, PersonaConfigError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.entry, again.field, again.message) == (
        err.path,
        err.entry,
        err.field,
        err.message,
    )


def test_a_cron_period_below_min_interval_is_an_error(tmp_path: Path) -> None:
    text = "cron:\n  - {name: a, cron: '*/5 * * * *', prompt: x}\n"
    with pytest.raises(ScheduleConfigError, match="min_interval") as info:
        load_schedules(persona(tmp_path, text), min_interval=timedelta(minutes=10))
    assert (info.value.entry, info.value.field) == ("cron 'a'", "cron")
    # A lower floor (tests set one) lets it through.
    assert load_schedules(persona(tmp_path, text), min_interval=timedelta(seconds=1)).entries


def test_active_hours_window_and_wrap_over_midnight() -> None:
    paris = ZoneInfo("Europe/Paris")
    day = ActiveHours(start="08:00", end="22:00", tz="Europe/Paris")
    assert day.contains(datetime(2025, 1, 6, 7, 0, tzinfo=UTC), paris)  # 08:00 Paris
    assert not day.contains(datetime(2025, 1, 6, 6, 59, tzinfo=UTC), paris)
    assert not day.contains(datetime(2025, 1, 6, 21, 0, tzinfo=UTC), paris)  # 22:00: outside
    night = ActiveHours(start="22:00", end="06:00")
    assert night.contains(datetime(2025, 1, 6, 23, 0, tzinfo=UTC), ZoneInfo("UTC"))
    assert night.contains(datetime(2025, 1, 6, 5, 59, tzinfo=UTC), ZoneInfo("UTC"))
    assert not night.contains(datetime(2025, 1, 6, 12, 0, tzinfo=UTC), ZoneInfo("UTC"))


def test_write_schedules_round_trips_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = persona(tmp_path, FULL)
    loaded = load_schedules(path)
    target = path / "schedules.yaml"
    write_schedules(target, loaded.file)
    again = load_schedules(path)
    assert again.file == loaded.file
    assert [p.name for p in path.iterdir()] == ["schedules.yaml"]
    # The file omits what is left at its default.
    assert "conversation: persistent" not in target.read_text()
    assert parse_schedule_file(target, target.read_text()) == loaded.file


def test_checklists() -> None:
    assert checklist_of("").empty
    assert checklist_of("# Heartbeat\n\n<!-- add items -->\n- [ ]\n---\n").empty
    full = checklist_of("# Heartbeat\n- [ ] check the deploy\n")
    assert not full.empty
    # Trailing spaces do not change the hash; a word does.
    assert checklist_of("# Heartbeat  \n- [ ] check the deploy\n\n").digest == full.digest
    assert checklist_of("# Heartbeat\n- [ ] check the deploys\n").digest != full.digest


def test_read_checklist(tmp_path: Path) -> None:
    assert read_checklist(tmp_path).empty  # no file
    (tmp_path / "HEARTBEAT.md").write_text("- water the plants\n")
    assert not read_checklist(tmp_path).empty
    (tmp_path / "HEARTBEAT.md").write_bytes(b"x" * (MAX_CHECKLIST_BYTES + 1))
    with pytest.raises(ScheduleConfigError, match="over the"):
        read_checklist(tmp_path)
    (tmp_path / "HEARTBEAT.md").write_bytes(b"\xff\xfe")
    with pytest.raises(ScheduleConfigError, match="not UTF-8"):
        read_checklist(tmp_path)


def test_the_guides_example_file_loads(tmp_path: Path) -> None:
    """The schedules.yaml and runtime.yaml examples of docs/schedules.md are valid."""
    import re

    from coterie.runtime.config import RuntimeSettings

    page = (Path(__file__).resolve().parent.parent / "docs" / "schedules.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
    [file] = [b for b in blocks if b.startswith("heartbeat:")]
    [runtime_yaml] = [b for b in blocks if b.startswith("schedule:")]
    loaded = load_schedules(persona(tmp_path, file))
    assert [e.name for e in loaded.entries] == ["heartbeat", "overnight-alerts"]
    import yaml

    settings = RuntimeSettings.model_validate(yaml.safe_load(runtime_yaml))
    assert settings.schedule.max_background_turns_per_day == 24
    # Every field of the schedule: section is on the page.
    for field in settings.schedule.model_fields:
        assert f"{field}:" in runtime_yaml, field


@pytest.fixture(autouse=True)
def _no_plugin_providers() -> Iterator[None]:
    """Messages here name the plugin providers loaded: none, whatever ran before."""
    with no_plugin_providers():
        yield
