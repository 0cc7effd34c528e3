"""shell_exec end to end: a persona's model calls it through its actor."""

from __future__ import annotations

from pathlib import Path

import pytest

from coterie import Runtime
from coterie.runtime.config import RuntimeSettings
from tests.helpers import scripted, write_persona

pytestmark = pytest.mark.usefixtures("ray_session")


def test_persona_runs_a_command_in_its_workspace(tmp_path: Path, ray_session: None) -> None:
    home = tmp_path / "home"
    rules = [
        {
            "when": {"turn": 1},
            "tool_calls": [
                {
                    "name": "shell_exec",
                    "arguments": {"command": "echo made-by-shell > out.txt && cat out.txt && pwd"},
                }
            ],
        },
        {"when": {"turn": 2}, "text": "{last_tool_result}"},
    ]
    path = write_persona(home, "runner", scripted(rules))
    (path / "workspace").mkdir()
    rt = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None))
    try:
        reply = rt.ask("runner", "run it")
    finally:
        rt.shutdown()
    assert reply.status == "ok", reply.error
    assert reply.text.startswith("exit=0")
    assert "made-by-shell" in reply.text
    assert (path / "workspace" / "out.txt").read_text() == "made-by-shell\n"
