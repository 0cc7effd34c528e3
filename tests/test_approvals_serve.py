"""Approvals through ``coterie serve`` on Ray: the HTTP routes, and an
approval answered after the whole runtime restarted resumes its turn."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.serve.discovery import ServerState
from tests.helpers import outside_writer, scripted, write_persona
from tests.serving import running_server

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

#: Writes the message to a file outside its workspace (asks first), then reports.
GUARD = outside_writer(
    "../outside.md",
    "{input}",
    "wrote: {last_tool_result}",
    description="writes outside its workspace when allowed",
)


def call(state: ServerState, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(state.url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {state.token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def pending(state: ServerState) -> list[dict[str, Any]]:
    status, body = call(state, "GET", "/v1/approvals?persona=guard")
    assert status == 200
    return list(body["approvals"])


def history(state: ServerState, conversation: str) -> list[dict[str, Any]]:
    status, body = call(state, "GET", f"/v1/personas/guard/conversations/{conversation}")
    return list(body["messages"]) if status == 200 else []


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write_persona(tmp_path, "guard", GUARD)
    return tmp_path


def _send(state: ServerState, text: str, conversation: str) -> None:
    status, body = call(
        state,
        "POST",
        "/v1/personas/guard/messages",
        {"text": text, "conversation_id": conversation, "wait": False},
    )
    assert status == 202, body


def test_routes_list_and_answer_approvals(home: Path) -> None:
    outside = home / "personas" / "guard" / "outside.md"
    typo = {"rules": [{"tool": "shel_exec", "match": "rm", "action": "deny"}]}
    write_persona(home, "typo", scripted(permissions=typo))
    with running_server(home) as state:
        # A deny rule voided by a typo: the persona does not start at all.
        status, body = call(state, "POST", "/v1/personas/typo/messages", {"text": "hi"})
        assert status == 500 and body["error"]["type"] == "persona_config", body
        message = body["error"]["message"]
        assert "typo/persona.yaml" in message and "persona.yaml rule 1" in message
        assert "did you mean shell_exec?" in message
        status, described = call(state, "GET", "/v1/personas/guard")
        assert status == 200 and described["team"] is None
        assert described["permissions"]["rules"][0]["match"] == "!{workspace}"
        _send(state, "first note", "c1")
        (found,) = wait_for(lambda: pending(state), "an approval")
        assert found["tool"] == "file_write" and found["state"] == "pending"
        assert found["summary"] == f"write {outside}"
        assert found["rule"] == "persona.yaml rule 1: ask file_write '!{workspace}'"
        assert found["conversation_id"] == "c1" and found["expires"] > found["requested"]
        assert not outside.exists()
        # The persona shows it waits.
        status, body = call(state, "GET", "/v1/status")
        active = body["personas"]["active"]
        assert [p["waiting_approval"] for p in active if p["name"] == "guard"] == [1]
        # Bad answers name what is wrong; nothing is decided by them.
        status, body = call(state, "POST", f"/v1/approvals/{found['id']}", {"decision": "yes"})
        assert status == 400 and body["error"]["field"] == "decision"
        status, body = call(state, "POST", "/v1/approvals/apr_123", {"decision": "approve"})
        assert status == 404 and body["error"]["type"] == "unknown_approval"
        status, body = call(state, "GET", "/v1/approvals?state=maybe")
        assert status == 400 and body["error"]["field"] == "state"
        status, body = call(
            state, "POST", f"/v1/approvals/{found['id']}", {"decision": "approve", "by": "ana"}
        )
        assert status == 200 and body["approval"]["state"] == "approved"
        assert body["approval"]["decided_by"] == "ana" and body["approval"]["via"] == "http"
        wait_for(lambda: outside.exists(), "the write")
        assert outside.read_text() == "first note"
        last = wait_for(
            lambda: [m for m in history(state, "c1") if m["kind"] == "assistant"][1:], "the reply"
        )
        assert last[-1]["text"].startswith("wrote: ")
        status, body = call(state, "POST", f"/v1/approvals/{found['id']}", {"decision": "deny"})
        assert status == 409 and body["error"]["type"] == "approval_closed"
        # Every decision is in the audit log: who, how, when.
        status, body = call(
            state,
            "POST",
            "/v1/audit/query",
            {"sql": "SELECT state, decided_by, via FROM approvals WHERE decided IS NOT NULL"},
        )
        assert body["rows"] == [["approved", "ana", "http"]]
        # A denial: the model reads permission_denied, nothing is written.
        _send(state, "second note", "c2")
        (second,) = wait_for(lambda: pending(state), "a second approval")
        call(state, "POST", f"/v1/approvals/{second['id']}", {"decision": "deny", "by": "bo"})
        reply = wait_for(
            lambda: [m for m in history(state, "c2") if m["kind"] == "assistant"][1:], "the reply"
        )
        assert "permission_denied" in reply[-1]["text"]
        assert outside.read_text() == "first note"


def test_an_approval_answered_after_a_restart_resumes_its_turn(home: Path) -> None:
    outside = home / "personas" / "guard" / "outside.md"
    with running_server(home) as state:
        _send(state, "kept across a restart", "c-restart")
        (found,) = wait_for(lambda: pending(state), "an approval")
    # The whole runtime is down; the approval waits in the audit log.
    assert not outside.exists()
    with running_server(home) as state:
        (again,) = pending(state)
        assert again["id"] == found["id"] and again["state"] == "pending"
        status, body = call(
            state, "POST", f"/v1/approvals/{found['id']}", {"decision": "approve", "by": "ana"}
        )
        assert status == 200, body
        wait_for(lambda: outside.exists(), "the write after the restart")
        assert outside.read_text() == "kept across a restart"
        messages = wait_for(
            lambda: [
                m for m in history(state, "c-restart") if m.get("text", "").startswith("wrote")
            ],
            "the turn's end",
        )
        assert len(messages) == 1
        results = [m for m in history(state, "c-restart") if m["kind"] == "tool_result"]
        assert len(results) == 1  # the call ran once, after the approval
        assert pending(state) == []
