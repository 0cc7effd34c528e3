"""Permission rules, approvals and the team roster, without Ray.

The rules read what a call *does* (its resolved effect): these tests try the
bypasses peers' users found (``bash -c``, ``env``, ``sudo``, ``find -exec``,
a wrapper script, ``..``, a symlink, an IP spelled another way) and the
approval flow end to end in a persona (approve, deny, always, expiry, three
refusals, turns nobody reads, a restart).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from coterie.runtime.config import PermissionSettings, load_persona
from coterie.runtime.errors import (
    ApprovalClosedError,
    PersonaConfigError,
    UnknownApprovalError,
)
from coterie.runtime.messages import (
    ApprovalEvent,
    AssistantMessage,
    MessageEnvelope,
    ModelRequest,
    ToolCall,
    ToolResultMessage,
    TurnEvent,
)
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.models.scripted import FunctionModel, latest_user_text
from coterie.runtime.permissions.effects import Effect, host_effect, path_effect
from coterie.runtime.permissions.rules import PermissionRules, Places
from coterie.runtime.permissions.shell import ShellParseError, commands
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import Services
from coterie.runtime.shell import LocalProcesses
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona

# -- the shell line: what it runs ---------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        'bash -c "rm -rf x"',
        "sh -lc 'rm -rf x'",
        "env X=1 rm -rf x",
        "sudo rm -rf x",
        "sudo -u root timeout 5 nice -n 3 rm -rf x",
        "find . -name a -exec rm -rf {} \\;",
        "echo $(rm -rf x)",
        'echo "`rm -rf x`"',
        "ls | xargs rm -rf",
        "true && rm -fr x",
        "X=1 rm -r -f x",
        "echo ok\nrm -rf x",
        'eval "rm -rf x"',
        "/bin/rm -rf x",
        "diff <(ls) <(rm -rf x)",
    ],
)
def test_wrapped_rm_is_seen(line: str) -> None:
    rules = PermissionRules(
        [("persona.yaml", _rules([{"tool": "shell_exec", "match": "rm -rf", "action": "deny"}]))],
        Places(),
    )
    decision = rules.decide("shell_exec", Effect("shell", tuple(commands(line)), line))
    assert decision.action == "deny", commands(line)
    assert decision.rule is not None and decision.rule.label == "persona.yaml rule 1"


def test_plain_words_are_not_commands() -> None:
    # Quoted text and comments are not run: nothing to see.
    assert commands("echo 'rm -rf x' # rm -rf y") == [("echo", "rm -rf x")]
    assert commands("ls 2>/dev/null > out.txt") == [("ls",)]


def test_unclosed_quote_is_unreadable() -> None:
    with pytest.raises(ShellParseError):
        commands("echo 'rm -rf x")


def test_wrapper_script_in_the_workspace_is_read(tmp_path: Path) -> None:
    script = tmp_path / "go.sh"
    script.write_text("#!/bin/sh\nset -e\nrm -rf /important\n")

    def read(path: str) -> str | None:
        return (tmp_path / path).read_text() if (tmp_path / path).exists() else None

    for line in ("sh go.sh", "bash ./go.sh", "./go.sh"):
        assert ("rm", "-rf", "/important") in commands(line, read_script=read), line


# -- rules and their precedence ------------------------------------------------


def _rules(raw: list[dict[str, Any]]) -> Any:
    return PermissionSettings.model_validate({"rules": raw}).rules


def _shell(rules: PermissionRules, line: str) -> str:
    return rules.decide("shell_exec", Effect("shell", tuple(commands(line)), line)).action


def test_precedence_deny_wins_then_first_match() -> None:
    persona = _rules(
        [
            {"tool": "shell_exec", "match": "git status", "action": "allow"},
            {"tool": "shell_exec", "match": "git push", "action": "ask"},
            {"tool": "shell_exec", "match": "git", "action": "allow"},
            {"tool": "shell_exec", "action": "ask"},
        ]
    )
    runtime = _rules([{"tool": "shell_exec", "match": "git push --force", "action": "deny"}])
    rules = PermissionRules([("persona.yaml", persona), ("runtime.yaml", runtime)], Places())
    assert _shell(rules, "git status") == "allow"
    assert _shell(rules, "git log") == "allow"  # the third rule, before the catch-all
    assert _shell(rules, "git push origin main") == "ask"
    assert _shell(rules, "git status && git push") == "ask"  # the strictest command
    assert _shell(rules, "git push --force origin") == "deny"  # a deny anywhere wins
    assert _shell(rules, "ls") == "ask"
    # A restricting rule finds its words anywhere; an allowing one only first.
    assert _shell(rules, "git -C repo push") == "ask"
    only_status = PermissionRules(
        [
            (
                "persona.yaml",
                _rules(
                    [
                        {"tool": "shell_exec", "match": "git status", "action": "allow"},
                        {"tool": "shell_exec", "action": "deny"},
                    ]
                ),
            )
        ],
        Places(),
    )
    assert _shell(only_status, "git push status") == "deny"
    # No rule for the tool: as without rules.
    assert rules.decide("file_read", path_effect("read", "/etc/hosts", verb="read")).action == (
        "allow"
    )


def test_exact_rules_match_only_the_whole_command() -> None:
    rules = PermissionRules(
        [
            (
                "approved.yaml",
                _rules(
                    [
                        {
                            "tool": "shell_exec",
                            "match": "git push origin main",
                            "action": "allow",
                            "exact": True,
                        },
                        {"tool": "shell_exec", "action": "ask"},
                    ]
                ),
            )
        ],
        Places(),
    )
    assert _shell(rules, "git push origin main") == "allow"
    assert _shell(rules, "git push origin main --force") == "ask"
    assert _shell(rules, "git push origin main extra") == "ask"


def test_paths_resolve_dots_and_symlinks(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    outside = tmp_path / "secret"
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    rules = PermissionRules(
        [
            (
                "persona.yaml",
                _rules(
                    [
                        {"tool": "file_write", "match": "!{workspace}", "action": "ask"},
                        {"tool": "file_read", "match": str(outside), "action": "deny"},
                    ]
                ),
            )
        ],
        Places(workspace=workspace),
    )

    def decide(tool: str, raw: str) -> str:
        return rules.decide(tool, path_effect(tool, workspace / raw, verb="x")).action

    assert decide("file_write", "notes/a.md") == "allow"
    assert decide("file_write", "../secret/a.md") == "ask"
    assert decide("file_write", "link/a.md") == "ask"
    assert decide("file_read", "link/passwords") == "deny"
    assert decide("file_read", "sub/../../secret/x") == "deny"
    assert decide("file_read", "fine.txt") == "allow"


@pytest.mark.parametrize(
    ("url_host", "addresses"),
    [
        ("127.0.0.1", []),
        ("2130706433", []),
        ("0x7f.0.0.1", []),
        ("127.1", []),
        ("[::ffff:127.0.0.1]", []),
        ("localhost", ["127.0.0.1"]),
        ("sneaky.test", ["127.0.0.5"]),
    ],
)
def test_hosts_given_as_ip_in_any_spelling(url_host: str, addresses: list[str]) -> None:
    rules = PermissionRules(
        [
            (
                "persona.yaml",
                _rules(
                    [
                        {"tool": "web_fetch", "match": "127.0.0.0/8", "action": "deny"},
                        {"tool": "web_fetch", "match": "*.example.org", "action": "allow"},
                        {"tool": "web_fetch", "action": "ask"},
                    ]
                ),
            )
        ],
        Places(),
    )
    effect = host_effect("fetch", f"http://{url_host}/", url_host, addresses)
    assert rules.decide("web_fetch", effect).action == "deny"
    fine = host_effect("fetch", "https://Docs.Example.org/", "Docs.Example.org", ["93.0.0.1"])
    assert rules.decide("web_fetch", fine).action == "allow"
    other = host_effect("fetch", "https://elsewhere.net/", "elsewhere.net", ["93.0.0.2"])
    assert rules.decide("web_fetch", other).action == "ask"


# -- a broken permissions block refuses to start ---------------------------------


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ([{"tool": "shell_exec", "action": "maybe"}], "permissions.rules.0.action"),
        ([{"tool": "shell_exec", "action": "deny", "mach": "rm"}], "permissions.rules.0.mach"),
        ([{"action": "deny"}], "permissions.rules.0.tool"),
        ([{"tool": "web_fetch", "match": "10.0.0.300/8", "action": "deny"}], "address range"),
        ([{"tool": "shell_exec", "match": "rm 'x", "action": "deny"}], "cannot be read"),
        ([{"tool": "shel_exec", "action": "deny"}], "did you mean shell_exec"),
    ],
)
def test_broken_rules_refuse_to_start(tmp_path: Path, rules: Any, expected: str) -> None:
    write_persona(tmp_path, "p", scripted(permissions={"rules": rules}))
    with pytest.raises(PersonaConfigError) as err:
        _runtime(tmp_path, "p")
    text = str(err.value)
    assert expected in text and "persona.yaml" in text


def test_broken_approved_file_refuses_to_start(tmp_path: Path) -> None:
    path = write_persona(tmp_path, "p", scripted())
    (path / "approved.yaml").write_text("rules:\n- {tool: shell_exec, action: alow}\n")
    with pytest.raises(PersonaConfigError, match=r"(?s)approved\.yaml.*rules\.0\.action"):
        _runtime(tmp_path, "p")


# -- in a persona -------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[TurnEvent] = []

    def record(self, event: TurnEvent) -> None:
        self.events.append(event)

    async def flush(self) -> None:
        pass

    def approvals(self) -> list[ApprovalEvent]:
        return [e for e in self.events if isinstance(e, ApprovalEvent)]


def shell_runner(request: ModelRequest) -> AssistantMessage | str:
    """Runs the person's message as a shell command, then reports its result."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return f"result: {last.content}"
    command = latest_user_text(request)
    call = ToolCall(
        id=f"call_{len(request.messages)}", name="shell_exec", arguments={"command": command}
    )
    return AssistantMessage(text="", tool_calls=[call])


def _runtime(
    home: Path, name: str, audit: Recorder | None = None, *, model: Any = None, **host: Any
) -> PersonaRuntime:
    persona = load_persona(home, name)
    return PersonaRuntime(
        persona,
        model=model or build_model_or_unavailable(persona.config.model),
        registry=builtin_registry(),
        services=Services(audit=audit or Recorder(), processes=LocalProcesses(max_processes=4)),
        host=PersonaHost(**host),
    )


PUSH = "echo pushed >> pushes.txt  # git push origin main"
OPS_RULES = {
    "rules": [
        {"tool": "shell_exec", "match": "rm -rf", "action": "deny", "reason": "never"},
        {"tool": "shell_exec", "match": "tee", "action": "ask"},
        {"tool": "file_write", "match": "!{workspace}", "action": "ask"},
    ],
    "approval_timeout": 30,
}


def ops(home: Path, **permissions: Any) -> Path:
    """A persona that runs what it is told in shell (see :func:`shell_runner`)."""
    return write_persona(home, "ops", scripted(permissions={**OPS_RULES, **permissions}))


def ops_runtime(home: Path, audit: Recorder | None = None, **host: Any) -> PersonaRuntime:
    return _runtime(home, "ops", audit, model=FunctionModel(shell_runner), **host)


def msg(text: str, conv: str = "ops:c", **kw: Any) -> MessageEnvelope:
    return MessageEnvelope(recipient="ops", conversation_id=conv, text=text, **kw)


async def _pending(rt: PersonaRuntime) -> ApprovalEvent:
    for _ in range(500):
        pending = rt.approvals.pending()
        if pending:
            return pending[0]
        await asyncio.sleep(0.01)
    raise AssertionError("no approval was requested")


async def test_deny_names_the_rule(tmp_path: Path) -> None:
    ops(tmp_path)
    rt = ops_runtime(tmp_path)
    reply = await rt.handle(msg("bash -c 'rm -rf data'"))
    body = json.loads(reply.text.removeprefix("result: "))
    assert body["error"] == "permission_denied"
    assert "persona.yaml rule 1: deny shell_exec 'rm -rf' (never)" in body["detail"]
    await rt.aclose()


async def test_ask_approved_runs_the_call_once_while_other_conversations_go_on(
    tmp_path: Path,
) -> None:
    path = ops(tmp_path)
    audit = Recorder()
    rt = ops_runtime(tmp_path, audit)
    waiting = asyncio.create_task(rt.handle(msg("echo hello | tee out.txt")))
    pending = await _pending(rt)
    assert pending.tool == "shell_exec" and "tee out.txt" in pending.summary
    assert pending.rule == "persona.yaml rule 2: ask shell_exec 'tee'"
    assert rt.stats().waiting_approval == 1 and not waiting.done()
    # The persona goes on serving its other conversations meanwhile.
    other = await asyncio.wait_for(rt.handle(msg("echo elsewhere", conv="ops:d")), 30)
    assert "elsewhere" in other.text
    assert not (path / "workspace" / "out.txt").exists()
    decided = await rt.decide_approval(pending.approval_id, "approve", by="ana", via="test")
    assert decided.state == "approved" and decided.decided_by == "ana"
    reply = await asyncio.wait_for(waiting, 30)
    assert "hello" in reply.text
    assert (path / "workspace" / "out.txt").read_text() == "hello\n"
    with pytest.raises(ApprovalClosedError):
        await rt.decide_approval(pending.approval_id, "deny", by="ana", via="test")
    with pytest.raises(UnknownApprovalError):
        await rt.decide_approval("apr_0000", "deny", by="ana", via="test")
    phases = [(e.phase, e.state, e.decided_by, e.via) for e in audit.approvals()]
    assert phases == [("requested", "pending", None, None), ("decided", "approved", "ana", "test")]
    assert rt.stats().waiting_approval == 0
    await rt.aclose()


async def test_ask_denied_tells_the_model(tmp_path: Path) -> None:
    path = ops(tmp_path)
    rt = ops_runtime(tmp_path)
    waiting = asyncio.create_task(rt.handle(msg("echo x | tee denied.txt")))
    pending = await _pending(rt)
    await rt.decide_approval(pending.approval_id, "deny", by="ana", via="test")
    body = json.loads((await waiting).text.removeprefix("result: "))
    assert body["error"] == "permission_denied" and "a person denied it" in body["detail"]
    assert body["approval"] == pending.approval_id
    assert not (path / "workspace" / "denied.txt").exists()
    await rt.aclose()


async def test_expired_approval_is_denied(tmp_path: Path) -> None:
    ops(tmp_path, approval_timeout=0.3)
    audit = Recorder()
    rt = ops_runtime(tmp_path, audit)
    reply = await asyncio.wait_for(rt.handle(msg("echo x | tee late.txt")), 30)
    body = json.loads(reply.text.removeprefix("result: "))
    assert body["error"] == "permission_denied" and "approval_timeout" in body["detail"]
    assert [(e.phase, e.state, e.via) for e in audit.approvals()][-1] == (
        "decided",
        "expired",
        "timeout",
    )
    await rt.aclose()


async def test_always_writes_a_rule_used_next_time(tmp_path: Path) -> None:
    path = ops(tmp_path)
    rt = ops_runtime(tmp_path)
    waiting = asyncio.create_task(rt.handle(msg("echo a | tee always.txt")))
    pending = await _pending(rt)
    await rt.decide_approval(pending.approval_id, "always", by="ana", via="test")
    assert "a" in (await waiting).text
    saved = yaml.safe_load((path / "approved.yaml").read_text())
    assert saved["rules"][0]["tool"] == "shell_exec"
    assert saved["rules"][0]["action"] == "allow" and saved["rules"][0]["exact"] is True
    # The same command runs without asking; another still asks.
    again = await asyncio.wait_for(rt.handle(msg("echo a | tee always.txt")), 30)
    assert "a" in again.text and not rt.approvals.pending()
    await rt.aclose()
    # A new process of the persona reads the file.
    rt2 = ops_runtime(tmp_path)
    third = await asyncio.wait_for(rt2.handle(msg("echo a | tee always.txt", conv="x")), 30)
    assert "a" in third.text
    other = asyncio.create_task(rt2.handle(msg("echo b | tee other.txt", conv="y")))
    await _pending(rt2)
    other.cancel()
    await rt2.aclose()


async def test_three_refusals_end_the_turn(tmp_path: Path) -> None:
    write_persona(
        tmp_path,
        "ops",
        scripted(
            default="gave up",
            rules=[
                {
                    "when": {},
                    "tool_calls": [{"name": "shell_exec", "arguments": {"command": "rm -rf x"}}],
                }
            ],
            permissions={"rules": [{"tool": "shell_exec", "match": "rm", "action": "deny"}]},
            max_steps=10,
        ),
    )
    audit = Recorder()
    rt = _runtime(tmp_path, "ops", audit)
    reply = await asyncio.wait_for(rt.handle(msg("clean up")), 30)
    assert reply.status == "failed"
    refused = [
        e
        for e in audit.events
        if getattr(e, "message", None) is not None and isinstance(e.message, ToolResultMessage)  # type: ignore[attr-defined]
    ]
    assert len(refused) == 3  # the repeat guard did not get to block it: the rules did
    await rt.aclose()


@pytest.mark.parametrize(("unattended", "runs"), [("deny", False), ("allow", True)])
async def test_turns_nobody_reads_follow_unattended(
    tmp_path: Path, unattended: str, runs: bool
) -> None:
    path = ops(tmp_path, unattended=unattended)
    audit = Recorder()
    rt = ops_runtime(tmp_path, audit)
    reply = await asyncio.wait_for(rt.handle(msg("echo h | tee cron.txt", context="cron")), 30)
    assert (path / "workspace" / "cron.txt").exists() is runs
    assert not rt.approvals.pending()
    if not runs:
        assert "permissions.unattended: deny" in reply.text
    decided = audit.approvals()[-1]
    assert decided.decided_by == "permissions.unattended" and decided.via == "cron"
    await rt.aclose()


async def test_write_outside_the_workspace_asks(tmp_path: Path) -> None:
    write_persona(
        tmp_path,
        "ops",
        scripted(
            [
                {
                    "when": {"turn": 1},
                    "tool_calls": [
                        {
                            "name": "file_write",
                            "arguments": {"path": "{input}", "content": "x"},
                        }
                    ],
                },
                {"when": {"turn": 2}, "text": "result: {last_tool_result}"},
            ],
            access="full",
            permissions=OPS_RULES,
        ),
    )
    rt = _runtime(tmp_path, "ops")
    inside = await asyncio.wait_for(rt.handle(msg("notes.md")), 30)
    assert "permission_denied" not in inside.text and not rt.approvals.pending()
    waiting = asyncio.create_task(rt.handle(msg("../escape.md", conv="ops:e")))
    pending = await _pending(rt)
    assert pending.summary.endswith(str(tmp_path / "personas" / "ops" / "escape.md"))
    await rt.decide_approval(pending.approval_id, "deny", by="ana", via="test")
    assert "permission_denied" in (await waiting).text
    await rt.aclose()


async def test_parked_approval_answered_after_a_restart_resumes_the_turn(
    tmp_path: Path,
) -> None:
    """The process that asked is gone; a new one parks the approval, and the
    answer runs the call and lets the turn go on from there."""
    path = ops(tmp_path)
    audit = Recorder()
    first = ops_runtime(tmp_path, audit)
    waiting = asyncio.create_task(first.handle(msg("echo resumed | tee after.txt")))
    pending = await _pending(first)
    waiting.cancel()  # the process dies with the call waiting
    await asyncio.gather(waiting, return_exceptions=True)
    history = list(first.conversation("ops:c").history)

    async def load(conversation_id: str) -> Any:
        from coterie.runtime.messages import ConversationRecord

        return ConversationRecord(messages=history if conversation_id == "ops:c" else [])

    second_audit = Recorder()
    second = ops_runtime(tmp_path, second_audit, history=load)
    second.approvals.expect_parked()
    assert second.park_approvals([pending]) == 1
    assert second.stats().waiting_approval == 1
    await second.decide_approval(pending.approval_id, "approve", by="ana", via="http")
    for _ in range(500):
        if second.settled("ops:c") and second.turns_run:
            break
        await asyncio.sleep(0.01)
    assert (path / "workspace" / "after.txt").read_text() == "resumed\n"
    conversation = second.conversation("ops:c").history
    results = [m for m in conversation if isinstance(m, ToolResultMessage)]
    assert len(results) == 1 and "resumed" in results[0].content  # the call ran once
    assert conversation[-1].text.startswith("result: ")  # type: ignore[union-attr]
    await second.aclose()
    await first.aclose()


# -- the team ------------------------------------------------------------------


async def test_team_limits_whom_a_persona_messages(tmp_path: Path) -> None:
    roster = [("lead", "leads"), ("dev", "writes code"), ("ops", "runs things")]
    write_persona(
        tmp_path,
        "lead",
        scripted(
            [
                {"when": {"turn": 1, "contains": "who"}, "tool_calls": [{"name": "list_personas"}]},
                {
                    "when": {"turn": 1, "contains": "tell"},
                    "tool_calls": [
                        {"name": "send_to_persona", "arguments": {"persona": "ops", "text": "hi"}}
                    ],
                },
                {"when": {"turn": 2}, "text": "{last_tool_result}"},
            ],
            team=["d*"],
        ),
    )
    persona = load_persona(tmp_path, "lead")

    class Messenger:
        sent: list[MessageEnvelope] = []

        async def post(self, envelope: MessageEnvelope) -> None:
            self.sent.append(envelope)

        async def ask(self, envelope: MessageEnvelope, *, timeout: float) -> Any:
            raise AssertionError("not asked")

    model = build_model_or_unavailable(persona.config.model)
    rt = PersonaRuntime(
        persona,
        model=model,
        registry=builtin_registry(),
        services=Services(messenger=Messenger()),
        host=PersonaHost(roster=roster),
    )
    listed = await rt.handle(MessageEnvelope(recipient="lead", conversation_id="l", text="who?"))
    assert "dev" in listed.text and "ops" not in listed.text
    refused = await rt.handle(MessageEnvelope(recipient="lead", conversation_id="m", text="tell"))
    body = json.loads(refused.text)
    assert body["error"] == "not_in_team" and "d*" in body["detail"]
    assert Messenger.sent == []
    system = await rt.turns.system_prompt()
    assert "- dev: writes code" in system and "ops" not in system.split("You are lead.")[-1]
    await rt.aclose()


def test_no_rules_means_no_gate(tmp_path: Path) -> None:
    write_persona(tmp_path, "p", scripted())
    rt = _runtime(tmp_path, "p")
    assert rt.services.permissions is None
    assert os.path.exists(tmp_path / "personas" / "p")


# -- delegation inherits ---------------------------------------------------------


async def test_a_subagent_runs_under_its_parents_rules(tmp_path: Path) -> None:
    from coterie.runtime.delegation import LocalSubagents
    from coterie.runtime.models import build_model
    from coterie.runtime.persona import Launchers

    read = "file_read"
    config = scripted(
        [
            {
                "when": {"context": "subagent", "tool_result": False},
                "tool_calls": [
                    {"name": read, "arguments": {"path": "secret.txt"}},
                    {"name": read, "arguments": {"path": "plan.txt"}},
                    {"name": read, "arguments": {"path": "open.txt"}},
                ],
            },
            {"when": {"context": "subagent"}, "text": "{tool_results}"},
            {
                "when": {"turn": 1, "contains": "go"},
                "tool_calls": [{"name": "spawn_subagent", "arguments": {"task": "read them"}}],
            },
            {"when": {"contains": "has finished"}, "text": "report: {input}"},
        ],
        permissions={
            "rules": [
                {"tool": read, "match": "{workspace}/secret.txt", "action": "deny"},
                {"tool": read, "match": "{workspace}/plan.txt", "action": "ask"},
            ]
        },
    )
    path = write_persona(tmp_path, "boss", config)
    for name in ("secret.txt", "plan.txt", "open.txt"):
        (path / "workspace").mkdir(exist_ok=True)
        (path / "workspace" / name).write_text(f"contents of {name}")
    persona = load_persona(tmp_path, "boss")
    registry = builtin_registry()
    rt = PersonaRuntime(
        persona,
        model=build_model(persona.config.model),
        registry=registry,
        services=Services(audit=Recorder()),
        launchers=Launchers(subagents=LocalSubagents(registry=registry, model_factory=build_model)),
    )
    await rt.handle(MessageEnvelope(recipient="boss", conversation_id="b", text="go"))
    async with asyncio.timeout(30):
        while not rt.settled("b"):
            await asyncio.sleep(0.01)
    history = rt.conversation("b").history
    report = history[-1].text  # type: ignore[union-attr]
    assert report.startswith("report: ")
    assert "refused by persona.yaml rule 1: deny file_read" in report
    assert "permissions.unattended: deny" in report  # nobody to ask inside a subagent
    assert "contents of open.txt" in report
    assert "contents of secret.txt" not in report and "contents of plan.txt" not in report
    assert not rt.approvals.pending()
    await rt.aclose()


async def test_a_redirect_to_a_host_the_rules_refuse_is_not_followed() -> None:
    from aiohttp import web

    from coterie.runtime.config import NetworkSettings
    from coterie.runtime.context import TurnSettings
    from coterie.runtime.permissions.gate import PermissionGate
    from coterie.runtime.runner import ToolRunner
    from coterie.runtime.testing import turn_context
    from coterie.tools.web import web_fetch

    async def start(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://localhost:{request.url.port}/inside")

    async def inside(request: web.Request) -> web.Response:
        return web.Response(text="the inside page")

    app = web.Application()
    app.router.add_get("/start", start)
    app.router.add_get("/inside", inside)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        rules = _rules(
            [
                {"tool": "web_fetch", "match": "localhost", "action": "deny"},
                {"tool": "web_fetch", "match": "127.0.0.1", "action": "allow"},
            ]
        )
        gate = PermissionGate(
            "p", settings=PermissionSettings(), layers=[("persona.yaml", rules)], places=Places()
        )
        ctx = turn_context(
            settings=TurnSettings(network=NetworkSettings(allow=["127.0.0.0/8", "localhost"])),
            services=Services(permissions=gate),
        )
        call = ToolCall(
            id="c1", name="web_fetch", arguments={"url": f"http://127.0.0.1:{port}/inside"}
        )
        (direct,) = await ToolRunner().run_calls([call], ctx, {"web_fetch": web_fetch})
        assert "the inside page" in direct.content
        call = ToolCall(
            id="c2", name="web_fetch", arguments={"url": f"http://127.0.0.1:{port}/start"}
        )
        (redirected,) = await ToolRunner().run_calls([call], ctx, {"web_fetch": web_fetch})
        assert redirected.error_kind == "permission_denied"
        assert "redirected to http://localhost" in redirected.content
        assert "persona.yaml rule 1: deny web_fetch 'localhost'" in redirected.content
        assert "the inside page" not in redirected.content
    finally:
        await runner.cleanup()


def test_the_guides_worked_example_decides_as_its_table_says(tmp_path: Path) -> None:
    """docs/permissions.md: the example persona.yaml, loaded as a persona,
    decides each call of the page's table the way the table says."""
    import re

    from coterie.runtime.permissions.gate import PermissionGate

    page = (Path(__file__).parent.parent / "docs" / "permissions.md").read_text()
    example = re.search(r"```yaml\n(# personas/ops/persona.yaml\n.*?)```", page, re.S)
    assert example is not None
    home = tmp_path
    path = home / "personas" / "ops"
    path.mkdir(parents=True)
    (path / "persona.yaml").write_text(example.group(1))
    (path / "workspace").mkdir()
    rt = _runtime(home, "ops")
    gate = rt.services.permissions
    assert isinstance(gate, PermissionGate)
    workspace = path / "workspace"

    def shell(line: str) -> str:
        return gate.rules.decide("shell_exec", Effect("shell", tuple(commands(line)), line)).action

    def files(tool: str, raw: str) -> str:
        return gate.rules.decide(tool, path_effect(tool, workspace / raw, verb="x")).action

    assert shell("git status && git log") == "allow"
    assert shell("git -C repo push origin main") == "ask"
    assert shell('bash -c "cd build && rm -fr ."') == "deny"
    assert files("file_write", "notes/today.md") == "allow"
    assert files("file_write", "../../other/escape.md") == "ask"
    assert files("file_read", "/etc/hostname") == "allow"
    assert (
        "permissions.rules" in page
        and "`permission_denied: … refused by persona.yaml rule 1" in page
    )


def test_always_on_a_command_with_quoted_words_matches_it_again() -> None:
    from coterie.runtime.permissions.approvals import Verdict
    from coterie.runtime.permissions.gate import PermissionGate

    gate = PermissionGate(
        "p",
        settings=PermissionSettings(),
        layers=[("persona.yaml", _rules([{"tool": "shell_exec", "action": "ask"}]))],
        places=Places(),
    )
    line = 'git commit -m "fix the [build] *now*"'
    effect = Effect("shell", tuple(commands(line)), line)
    decision = gate.rules.decide("shell_exec", effect)
    assert decision.action == "ask"
    gate.always("shell_exec", effect, decision, Verdict("approved", always=True, by="a", via="t"))
    assert gate.rules.decide("shell_exec", effect).action == "allow"
    other = 'git commit -m "fix the build now"'
    assert gate.rules.decide(
        "shell_exec", Effect("shell", tuple(commands(other)), other)
    ).action == ("ask")
