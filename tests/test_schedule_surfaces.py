"""``coterie schedules`` with no runtime (the files and the read-only store):
the table with each entry's zone, the errors of a file that does not load,
an unknown persona, JSON; a store another process holds is the held-home
message, naming the schedule store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coterie.cli import main
from coterie.holder import SCHEDULE_FILE, home_in_use, is_lock_conflict
from coterie.runtime.schedule import STORE_FILE, ScheduleListing
from coterie.schedules_cli import rows
from tests.schedule_helpers import make_persona

PARIS = (
    "cron:\n"
    "  - name: standup\n"
    "    cron: '0 9 * * 1-5'\n"
    "    tz: Europe/Paris\n"
    "    prompt: the standup\n"
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    make_persona(tmp_path, "ada", schedules=PARIS)
    make_persona(
        tmp_path, "bob", schedules="cron:\n  - {name: nightly, cron: '61 * * * *', prompt: x}\n"
    )
    make_persona(tmp_path, "cid")
    return tmp_path


def run(home: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["--home", str(home), "schedules", *args])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), " ".join(err.split())


def test_the_table_shows_each_entry_in_its_zone_and_the_files_that_do_not_load(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(home, capsys=capsys)
    assert code == 0
    assert "ada" in out and "standup" in out and "Europe/Paris" in out
    assert "09:00 CE" in out  # 09:00 on Paris's wall clock (CET or CEST)
    assert "read from the files and the store" in out
    assert "bob" not in out  # its file never loaded: no entry of it is in force
    assert "bob" in err and "schedules.yaml" in err and "nightly" in err and "cron" in err
    assert "the previous schedule stays in force" in err


def test_one_persona_json_and_an_unknown_one(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(home, "ada", "--json", capsys=capsys)
    assert code == 0
    listing = ScheduleListing.model_validate(json.loads(out))
    assert [(e.persona, e.name, e.tz) for e in listing.entries] == [
        ("ada", "standup", "Europe/Paris")
    ]
    assert listing.errors == []  # bob's error is bob's
    code, _, err = run(home, "nobody", capsys=capsys)
    assert code == 1 and "nobody" in err and "ada" in err


def test_rows_say_the_last_outcome_with_its_reason(home: Path) -> None:
    from coterie.runtime.schedule import read_listing

    listing = read_listing(home)
    entry = listing.entries[0].model_copy(
        update={
            "last_outcome": "failed",
            "last_reason": "deliver_unavailable: connector 'telegram' is not running",
            "paused": True,
        }
    )
    [row] = rows(listing.model_copy(update={"entries": [entry], "errors": []}))
    assert row[6].startswith("failed") and "deliver_unavailable" in row[6]
    assert row[7] == "paused" and row[8] == ""


HOLD = """
import sys, time
from coterie.runtime.schedule import ScheduleStore
store = ScheduleStore(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def test_a_store_another_process_holds_is_the_held_home_message(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert SCHEDULE_FILE == STORE_FILE  # holder spells it without importing the scheduler
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home / STORE_FILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, _, err = run(home, capsys=capsys)
        assert code == 1
        assert f"{home} is in use by another coterie runtime" in err
        assert "holds its schedule store" in err and "coterie --home" in err
    finally:
        holder.kill()
        holder.wait(10)
    deadline = time.monotonic() + 10
    while run(home, capsys=capsys)[0] != 0:  # the lock goes with its process
        assert time.monotonic() < deadline


def test_the_held_home_message_names_the_file_that_was_locked(tmp_path: Path) -> None:
    audit = RuntimeError('IO Error: Could not set lock on file "/h/audit.duckdb" (PID 42)')
    schedule = RuntimeError('IO Error: Could not set lock on file "/h/schedule.duckdb" (PID 42)')
    assert is_lock_conflict(audit) and is_lock_conflict(schedule)
    assert "holds its audit log" in str(home_in_use(tmp_path, audit))
    assert "holds its schedule store" in str(home_in_use(tmp_path, schedule))
