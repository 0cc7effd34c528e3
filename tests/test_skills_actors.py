"""A persona actor on a local Ray loads a skill (scripted model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coterie import Runtime
from tests.helpers import scripted, write_persona
from tests.test_skills import write_skill

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    write_persona(
        home,
        "writer",
        scripted(
            [
                {
                    "when": {"turn": 1, "contains": "report"},
                    "tool_calls": [{"name": "load_skill", "arguments": {"name": "weekly-report"}}],
                },
                {
                    "when": {"turn": 2},
                    "tool_calls": [
                        {
                            "name": "file_read",
                            "arguments": {
                                "path": str(home / "skills" / "weekly-report" / "template.md")
                            },
                        }
                    ],
                },
                {"when": {"turn": 3}, "text": "template: {last_tool_result}"},
            ]
        ),
    )
    write_skill(
        home / "skills",
        "weekly-report",
        "Write the weekly report from the team's notes.",
        body="Start from template.md.",
        extra="allowed-tools: file_read\n",
    )
    (home / "skills" / "weekly-report" / "template.md").write_text("# Week N\n")
    return home


@pytest.fixture(scope="module")
def rt(home: Path, ray_session: None) -> Iterator[Runtime]:
    runtime = Runtime.start(home=home)
    yield runtime
    runtime.shutdown()


def test_a_persona_actor_loads_a_skill_and_reads_its_file(rt: Runtime, home: Path) -> None:
    reply = rt.ask("writer", "write the weekly report", conversation_id="writer:r1")
    assert reply.status == "ok"
    assert reply.text == "template: 1\t# Week N"
    rt.flush()
    results = rt.query(
        "select tool, error_kind, json_extract_string(payload, '$.result') from events "
        "where kind = 'tool_result' and conversation_id = 'writer:r1' order by ts"
    )
    [(tool, error, body), (tool2, error2, _)] = results.rows
    assert (tool, error, tool2, error2) == ("load_skill", None, "file_read", None)
    assert "Start from template.md." in body and "template.md" in body
    listed = rt.query(
        "select json_extract_string(payload, '$.listed') from events "
        "where kind = 'skills' and persona = 'writer'"
    )
    assert listed.rows == [('["weekly-report"]',)]
