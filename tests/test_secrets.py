"""Secrets stay hidden: every value of a persona's .env and the runtime's
provider keys are redacted from shell output and from every tool result, and
without bubblewrap only ``full`` personas (or an explicit
``unsandboxed_shell: allow``) run commands unconfined.

Driven through a real PersonaRuntime and real processes (no Ray): the
runtime decides what is hidden, the tools and the runner hide it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.config import RuntimeSettings, load_persona
from coterie.runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    ToolFinished,
    ToolResultMessage,
)
from coterie.runtime.models.scripted import ScriptedModel, tool_call
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.runtime.shell import LocalProcesses, secrets_to_hide
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona

TOKEN = "hunter2-token-value"
KEY = "sk-provider-key-4242"


@pytest.fixture
async def unconfined() -> AsyncIterator[LocalProcesses]:
    svc = LocalProcesses(bwrap=None)
    yield svc
    await svc.close()


def persona(
    home: Path,
    calls: list[Any],
    *,
    access: str = "workspace",
    processes: LocalProcesses | None = None,
    settings: RuntimeSettings | None = None,
) -> tuple[PersonaRuntime, ScriptedModel, NullAudit]:
    path = write_persona(home, "ana", scripted(access=access))
    (path / ".env").write_text(f"TOKEN={TOKEN}\nSHORT=abc\n", encoding="utf-8")
    model = ScriptedModel([AssistantMessage(tool_calls=calls), "done"])
    audit = NullAudit()
    runtime = PersonaRuntime(
        load_persona(home, "ana"),
        model=model,
        registry=builtin_registry(),
        services=Services(audit=audit, processes=processes),
        host=PersonaHost(settings=settings or RuntimeSettings()),
    )
    return runtime, model, audit


def results(model: ScriptedModel) -> list[ToolResultMessage]:
    return [m for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]


def go() -> MessageEnvelope:
    return MessageEnvelope(recipient="ana", conversation_id="ana:s", text="go")


async def test_without_bubblewrap_a_workspace_persona_is_refused_with_the_way_out(
    tmp_path: Path, unconfined: LocalProcesses
) -> None:
    rt, model, _ = persona(
        tmp_path, [tool_call("shell_exec", {"command": "echo hi"})], processes=unconfined
    )
    await rt.handle(go())
    [result] = results(model)
    body = json.loads(result.content)
    assert body["error"] == "unavailable"
    assert "apt-get install bubblewrap" in body["detail"]
    assert "unsandboxed_shell: allow" in body["detail"]
    assert await unconfined.list() == []  # nothing ran


async def test_unsandboxed_shell_allow_and_full_access_run_commands(
    tmp_path: Path, unconfined: LocalProcesses
) -> None:
    allow = RuntimeSettings(unsandboxed_shell="allow")
    for home, kw in ((tmp_path / "a", {"settings": allow}), (tmp_path / "f", {"access": "full"})):
        rt, model, _ = persona(
            home, [tool_call("shell_exec", {"command": "echo hi"})], processes=unconfined, **kw
        )
        await rt.handle(go())
        assert [r.content for r in results(model)] == ["exit=0\nhi\n"]


async def test_readonly_gets_no_shell_without_bubblewrap_even_when_allowed(
    tmp_path: Path, unconfined: LocalProcesses
) -> None:
    rt, model, _ = persona(
        tmp_path,
        [tool_call("shell_exec", {"command": "echo hi"})],
        access="readonly",
        processes=unconfined,
        settings=RuntimeSettings(unsandboxed_shell="allow"),
    )
    await rt.handle(go())
    [result] = results(model)
    assert json.loads(result.content)["error"] == "unknown_tool"  # never offered
    assert "shell_exec" not in {t.name for t in model.requests[0].tools}


async def test_an_unconfined_command_cannot_show_the_dotenv(
    tmp_path: Path, unconfined: LocalProcesses
) -> None:
    rt, model, audit = persona(
        tmp_path,
        [tool_call("shell_exec", {"command": "cat ../.env"})],
        processes=unconfined,
        settings=RuntimeSettings(unsandboxed_shell="allow"),
    )
    await rt.handle(go())
    [result] = results(model)
    # Every .env value is hidden, requested or not (one too short to matter is not).
    assert result.content == "exit=0\nTOKEN=[redacted:TOKEN]\nSHORT=abc\n"
    [finished] = [e for e in audit.events if isinstance(e, ToolFinished)]
    assert TOKEN not in finished.result  # nor in the audit log


RUNTIME_WITH_A_KEY = r"""
import asyncio, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.messages import MessageEnvelope
from coterie.runtime.shell import LocalProcesses
from tests.test_secrets import go, persona, results
from coterie.runtime.models.scripted import tool_call

async def main():
    peek = (
        "tr '\\0' '\\n' < /proc/$PPID/environ | grep OPENAI_API_KEY; "
        "env | grep -c OPENAI_API_KEY"
    )
    svc = LocalProcesses(bwrap=None)
    rt, model, _ = persona(
        Path(sys.argv[1]), [tool_call("shell_exec", {"command": peek})], processes=svc,
        settings=RuntimeSettings(unsandboxed_shell="allow"),
    )
    await rt.handle(go())
    print(results(model)[0].content)
    await svc.close()

asyncio.run(main())
"""


def test_the_runtime_keys_are_hidden_from_an_unconfined_command(tmp_path: Path) -> None:
    # A runtime started with a provider key in its environment (as in real
    # use): a command reads it through /proc, and never sees it.
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run(
        [sys.executable, "-c", RUNTIME_WITH_A_KEY, str(tmp_path), root],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert KEY not in out
    assert "OPENAI_API_KEY=[redacted:OPENAI_API_KEY]" in out  # it was there to find…
    assert out.rstrip().endswith("\n0")  # …and never in the command's own environment


async def test_no_tool_result_shows_a_secret(tmp_path: Path) -> None:
    rt, model, audit = persona(
        tmp_path,
        [
            tool_call("file_read", {"path": "notes.txt"}),
            tool_call("grep", {"pattern": "token"}),
        ],
    )
    (rt.persona.workspace / "notes.txt").write_text(f"the token is {TOKEN}\n", encoding="utf-8")
    await rt.handle(go())
    contents = [r.content for r in results(model)]
    assert contents[0] == "1\tthe token is [redacted:TOKEN]"
    assert contents[1] == "notes.txt:1: the token is [redacted:TOKEN]"
    logged = [e.result for e in audit.events if isinstance(e, ToolFinished)]
    assert all(TOKEN not in text for text in logged) and len(logged) == 2


def test_secrets_to_hide_reads_the_dotenv_and_the_named_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text("A=long-enough\nB=no\n", encoding="utf-8")
    monkeypatch.setenv("MY_PROVIDER_KEY", "sk-elsewhere-123")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-456")
    hidden = secrets_to_hide(tmp_path, key_vars=["MY_PROVIDER_KEY"])
    assert hidden["A"] == "long-enough" and "B" not in hidden
    assert hidden["MY_PROVIDER_KEY"] == "sk-elsewhere-123"
    assert hidden["ANTHROPIC_API_KEY"] == "sk-ant-456"
    assert secrets_to_hide(None, environ={}) == {}


@pytest.mark.needs("bubblewrap")
async def test_inside_bubblewrap_output_is_redacted_too(tmp_path: Path) -> None:
    confined = LocalProcesses(bwrap="auto")
    try:
        rt, model, _ = persona(
            tmp_path,
            [tool_call("shell_exec", {"command": f"echo {TOKEN}; cat ../.env || echo hidden"})],
            processes=confined,
        )
        await rt.handle(go())
        [result] = results(model)
        assert result.content.startswith("exit=0\n[redacted:TOKEN]\n")
        assert TOKEN not in result.content
    finally:
        await confined.close()
