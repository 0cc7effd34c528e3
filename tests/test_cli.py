"""The ``coterie`` command, run as a user would (each run starts its own Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import scripted, write_persona

ROOT = Path(__file__).resolve().parent.parent


def coterie(
    home: Path, *args: str, stdin: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "coterie", "--home", str(home), *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("cli-home")
    proc = coterie(home, "demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for persona in ("concierge", "researcher", "planner"):
        assert persona in out
    assert "concurrent tool calls" in out
    assert "invalid_arguments" in out
    assert "status ok" in out
    assert "audit summary" in out
    # Act 4: heartbeats skipped before any model call, a reminder that fired.
    flat = " ".join(out.split())
    assert "empty checklist (HEARTBEAT.md has nothing to do)" in flat
    assert "model calls for the concierge's" in flat and "heartbeats: 0" in flat
    assert "Time to stand up and stretch!" in flat
    assert "Removed 'heartbeat'" in flat
    return home


def test_demo_then_audit(demo_home: Path) -> None:
    proc = coterie(
        demo_home, "audit", "select kind, count(*) as n from events group by 1 order by 1"
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "model_call" in proc.stdout and "tool_call" in proc.stdout and "tool_result" in proc.stdout
    )


def test_audit_is_read_only(demo_home: Path) -> None:
    proc = coterie(demo_home, "audit", "delete from events")
    assert proc.returncode == 1
    assert "audit queries are read-only (SELECT, EXPLAIN); refused DELETE statement" in (
        " ".join(proc.stderr.split())
    )
    proc = coterie(demo_home, "audit", "select count(*) from events", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    assert list(row) == ["count_star()"] and row["count_star()"] > 0  # the delete deleted nothing


def test_personas_table(demo_home: Path) -> None:
    proc = coterie(demo_home, "personas")
    assert proc.returncode == 0, proc.stderr
    # Body rows of the table: "│ persona │ provider │ model │ description │"
    # (a wrapped description continues on rows with an empty first cell).
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in proc.stdout.splitlines()
        if line.startswith("│")
    ]
    providers = {row[0]: row[1] for row in rows if row[0]}
    assert providers == {
        "concierge": "scripted",
        "coordinator": "scripted",
        "planner": "scripted",
        "researcher": "scripted",
    }


def test_personas_shows_plugin_tools_missing_tools_and_plugin_problems(tmp_path: Path) -> None:
    weather = ROOT / "configs" / "plugins" / "weather.py"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "broken_forecast.py").write_text("raise RuntimeError('no network')\n")
    (tmp_path / "plugins" / "parrot.py").write_text(
        "class Parrot:\n    async def request(self, r): ...\n    async def aclose(self): ...\n"
        "MODELS = {'parrot': Parrot}\n"
    )
    plugins = [str(weather), "./plugins/broken_forecast.py", "./plugins/parrot.py"]
    (tmp_path / "runtime.yaml").write_text(json.dumps({"plugins": plugins}))
    write_persona(tmp_path, "fc", scripted(tools={"allow": ["weather", "forecast", "clock"]}))
    write_persona(tmp_path, "parroting", {"model": {"provider": "parrot"}})
    proc = coterie(tmp_path, "personas")
    assert proc.returncode == 0, proc.stderr
    rows = {
        cells[0]: cells
        for line in proc.stdout.splitlines()
        if line.startswith("│")
        for cells in [[cell.strip() for cell in line.split("│")[1:-1]]]
        if cells[0]
    }
    assert rows["fc"][4].startswith(f"weather ({weather}), missing: forecast"), rows["fc"]
    # A provider a plugin registers is known to the listing (it loaded the plugins).
    assert rows["parroting"][1:3] == ["parrot", "parrot"]
    assert "plugin problem: plugin ./plugins/broken_forecast.py: failed to import: " in proc.stderr


def test_ask_and_chat(demo_home: Path) -> None:
    proc = coterie(demo_home, "ask", "ghost", "hello")
    assert proc.returncode == 1
    assert "unknown persona 'ghost'" in proc.stderr
    proc = coterie(demo_home, "chat", "concierge", stdin="what time is it?\nthanks\n")
    assert proc.returncode == 0, proc.stderr
    assert "It is " in proc.stdout
    assert "Ask me what time it is." in proc.stdout


def test_ask_prints_reply(demo_home: Path) -> None:
    proc = coterie(demo_home, "ask", "planner", "plan my week")
    assert proc.returncode == 0, proc.stderr
    assert "Here is the plan:" in proc.stdout and "Book the venue" in proc.stdout
