"""``coterie serve`` as a user runs it (its own process and Ray), and the other
commands going through it; SIGTERM stops it cleanly with the audit log flushed."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coterie.runtime.audit import read_only_query
from coterie.runtime.serve.client import ServerClient, find_server
from coterie.runtime.serve.discovery import read_state
from tests.helpers import asker, outside_writer, scripted, write_persona
from tests.test_cli import ROOT, coterie

CALC = scripted(
    [
        {
            "when": {"turn": 1},
            "tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}],
        },
        {"when": {"turn": 2}, "text": "The answer is {last_tool_result}."},
    ],
    description="does sums",
)


#: Writes a note outside its workspace, which a rule says to ask about.
GUARD = outside_writer(
    "../{input}.md",
    "hi",
    "Wrote it: {last_tool_result}",
    description="asks before writing outside its workspace",
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A command on a pseudo-terminal, read and typed into as a person would."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env, close_fds=True
        )
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 120, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while self.seen.count(text) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} did not show; the terminal shows:\n{self.seen}")
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 4096).decode("utf-8", "replace")
                except OSError:  # the command exited
                    chunk = ""
                self.seen += ANSI.sub("", chunk.replace("\r", ""))
        return self.seen

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        self.type("\x04")  # Ctrl-D
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"the command did not end; it showed:\n{self.seen}") from None
        finally:
            os.close(self.master)


class Served:
    def __init__(self, home: Path, proc: subprocess.Popen[str]) -> None:
        self.home = home
        self.proc = proc

    def client(self) -> ServerClient:
        client = find_server(self.home)
        assert client is not None, "coterie serve is not answering"
        return client


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("served-home")
    write_persona(home, "calc", CALC)
    write_persona(home, "asker", asker())
    write_persona(home, "guard", GUARD)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coterie", "--home", str(home), "serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while find_server(home) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"coterie serve did not start: {proc.communicate()[0]}")
        time.sleep(0.5)
    try:
        yield Served(home, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def turns_run(served: Served, persona: str) -> int:
    active = served.client().get("/v1/status")["personas"]["active"]
    return next((p["turns_run"] for p in active if p["name"] == persona), 0)


def test_the_state_file_is_private_and_names_the_server(served: Served) -> None:
    path = served.home / "serve.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    state = read_state(served.home)
    assert state is not None and state.pid == served.proc.pid
    assert state.url.startswith("http://127.0.0.1:") and len(state.token) >= 32


def test_ask_goes_through_the_server(served: Served) -> None:
    before = turns_run(served, "calc")
    proc = coterie(served.home, "ask", "calc", "what is 6*7?")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "The answer is 42."
    # The turn ran in the server's persona actor (a runtime of its own would
    # have stopped its actors on exit).
    assert turns_run(served, "calc") == before + 1


def test_ask_an_unknown_persona_through_the_server(served: Served) -> None:
    proc = coterie(served.home, "ask", "nobody", "hi")
    assert proc.returncode == 1
    assert "404" in proc.stderr and "unknown persona 'nobody'" in proc.stderr


def test_chat_streams_through_the_server(served: Served) -> None:
    proc = coterie(served.home, "chat", "calc", stdin="what is 6*7?\n")
    assert proc.returncode == 0, proc.stderr
    assert "through http://127.0.0.1:" in proc.stdout
    assert "⚙ calculate" in proc.stdout and "The answer is 42." in proc.stdout


def test_chat_asks_for_an_approval_inline_on_a_terminal(served: Served) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["COLUMNS"] = "200"
    term = Terminal(
        [sys.executable, "-m", "coterie", "--home", str(served.home), "chat", "guard"], env
    )
    note = served.home / "personas" / "guard" / "plan.md"
    try:
        term.expect("you>")
        term.type("plan\n")
        shown = term.expect("approve? [y]es / [n]o / [a]lways:")
        assert "file_write needs your approval" in shown and f"write {note}" in shown
        assert "persona.yaml rule 1: ask file_write" in shown
        assert not note.exists()
        term.type("maybe\n")  # not an answer: asked again
        term.expect("type y, n or a")
        term.type("y\n")
        term.expect("Wrote it:")
        assert note.read_text() == "hi"
        term.expect("you>")
        term.type("other\n")
        term.expect("approve?", timeout=60)
        term.type("n\n")
        term.expect("permission_denied")
        term.expect("you>", timeout=60, count=3)  # the prompt after the denied turn
        assert not (served.home / "personas" / "guard" / "other.md").exists()
    finally:
        code = term.close()
    assert code == 0, term.seen
    rows = served.client().post(
        "/v1/audit/query",
        {"sql": "SELECT state, via FROM approvals WHERE persona = 'guard' ORDER BY requested"},
    )["rows"]
    assert rows == [["approved", "cli"], ["denied", "cli"]]


def test_chat_numbers_a_questions_choices_and_takes_a_number(served: Served) -> None:
    proc = coterie(served.home, "chat", "asker", stdin="plan a trip\n2\n")
    assert proc.returncode == 0, proc.stderr
    assert "Which city?" in proc.stdout
    assert "1. Paris" in proc.stdout and "2. Oslo" in proc.stdout
    assert 'you said: [answer to your question "Which city?"] Oslo' in proc.stdout


def test_personas_status_and_audit_through_the_server(served: Served) -> None:
    proc = coterie(served.home, "personas")
    flat = " ".join(proc.stdout.split())  # the table's title wraps to its width
    assert proc.returncode == 0 and "served at" in flat and "does sums" in flat
    proc = coterie(served.home, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["personas"]["registered"] == 3
    assert {c["id"] for c in status["connectors"]} == {"cli", "web"}
    proc = coterie(served.home, "status")
    assert proc.returncode == 0 and "3 registered" in proc.stdout and "audit:" in proc.stdout
    proc = coterie(served.home, "status", "--page-url")
    state = read_state(served.home)
    assert state is not None and proc.stdout.strip() == f"{state.url}/#token={state.token}"
    proc = coterie(
        served.home,
        "audit",
        "--json",
        "select count(*) as n from events where kind = 'turn_ended' and persona = 'calc'",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["n"] >= 1


def test_usage_through_the_server(served: Served) -> None:
    """While the server holds the audit log, coterie usage asks it (GET /v1/usage)."""
    assert coterie(served.home, "ask", "calc", "what is 6*7?").returncode == 0
    proc = coterie(served.home, "usage", "--since", "1h", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    calc = next(r for r in report["rows"] if r["key"] == "calc")
    assert calc["calls"] >= 2 and calc["unpriced_calls"] == 0 and report["by"] == "persona"
    proc = coterie(served.home, "usage", "--by", "model")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "usage by model: provider/model; all time;" in out and "served at http://" in out
    assert "scripted/" in out and "total │" in out and "$0.0000" in out
    proc = coterie(served.home, "usage", "--since", "whenever")
    assert proc.returncode == 2 and "--since 'whenever'" in proc.stderr


def test_eval_joins_the_servers_cluster(served: Served) -> None:
    task = ROOT / "configs" / "evals" / "arithmetic.yaml"
    proc = coterie(served.home, "eval", str(task), "--limit", "2", "--epochs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = read_state(served.home)
    assert state is not None and f"through coterie serve at {state.url}" in proc.stdout
    assert "2 run now" in proc.stdout
    # The server is unharmed by the eval's driver coming and going.
    assert served.client().get("/v1/health")["status"] == "ok"


def test_a_second_serve_for_the_same_home_is_refused(served: Served) -> None:
    proc = coterie(served.home, "serve", "--port", "0", timeout=60)
    assert proc.returncode == 1 and "already runs" in proc.stderr


def test_stop_leaves_a_served_home_to_its_server(served: Served) -> None:
    proc = coterie(served.home, "stop", timeout=60)
    assert proc.returncode == 1 and f"coterie serve runs for {served.home}" in proc.stderr
    assert served.client().get("/v1/health")["status"] == "ok"


def test_sigterm_stops_cleanly_with_everything_flushed(served: Served) -> None:
    answered = served.client().post(
        "/v1/personas/calc/messages", {"text": "last one", "conversation_id": "c-last"}
    )
    assert answered["reply"]["text"] == "The answer is 42."
    served.proc.send_signal(signal.SIGTERM)
    out, _ = served.proc.communicate(timeout=120)
    assert served.proc.returncode == 0, out
    assert "stopping" in out
    assert not (served.home / "serve.json").exists()
    # The last turn reached DuckDB: the shutdown flushed the audit buffers.
    result = read_only_query(
        str(served.home / "audit.duckdb"),
        "select count(*) from events where conversation_id = 'c-last' and kind = 'turn_ended'",
    )
    assert result.rows[0][0] == 1
    proc = coterie(served.home, "status")
    assert proc.returncode == 1 and "No coterie serve runs" in proc.stdout
