"""Skills in a persona's turns, without Ray: the prompt's listing, its budget,
picking up edits, and allowed-tools across the model calls of a turn."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from coterie.runtime.audit.rows import event_to_row
from coterie.runtime.config import RuntimeSettings, SkillSettings, load_persona
from coterie.runtime.messages import (
    AssistantMessage,
    MessageEnvelope,
    ModelRequest,
    SkillsListed,
    ToolResultMessage,
)
from coterie.runtime.models.scripted import FunctionModel, latest_user_text
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.runtime.skills import SkillCatalog
from coterie.runtime.testing import tool_call
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona
from tests.test_skills import write_skill


def runtime(
    home: Path, model: FunctionModel, *, budget: int = 2000, skills: list[str] | None = None
) -> tuple[PersonaRuntime, NullAudit]:
    extra = {} if skills is None else {"skills": skills}
    write_persona(home, "ann", scripted(**extra))
    audit = NullAudit()
    rt = PersonaRuntime(
        load_persona(home, "ann"),
        model=model,
        registry=builtin_registry(),
        services=Services(audit=audit),
        host=PersonaHost(settings=RuntimeSettings(skills=SkillSettings(prompt_budget=budget))),
    )
    return rt, audit


def ask(text: str, conversation: str = "ann:c") -> MessageEnvelope:
    return MessageEnvelope(recipient="ann", conversation_id=conversation, text=text)


def listed_events(audit: NullAudit) -> list[SkillsListed]:
    return [e for e in audit.events if isinstance(e, SkillsListed)]


async def test_the_prompt_lists_the_skills_and_stays_the_same_bytes(tmp_path: Path) -> None:
    write_skill(tmp_path / "skills", "weekly-report", "Write the weekly report.")
    write_skill(tmp_path / "personas" / "ann" / "skills", "triage", "Triage an alert.")
    model = FunctionModel(lambda r: "ok")
    rt, audit = runtime(tmp_path, model)
    for i in range(3):
        await rt.handle(ask(f"hello {i}", conversation=f"ann:c{i % 2}"))
    systems = [r.system for r in model.requests]
    assert "## Skills\n" in systems[0]
    assert "- triage: Triage an alert.\n- weekly-report: Write the weekly report." in systems[0]
    assert systems[1] == systems[0] and systems[2] == systems[0]
    assert "load_skill" in [t.name for t in model.requests[0].tools]
    # One report of the listing, by the first turn that used it.
    [event] = listed_events(audit)
    assert event.listed == ["triage", "weekly-report"] and event.left_out == []


async def test_a_persona_without_skills_has_no_section_no_tool_no_event(tmp_path: Path) -> None:
    model = FunctionModel(lambda r: "ok")
    rt, audit = runtime(tmp_path, model)
    await rt.handle(ask("hi"))
    assert "## Skills" not in model.requests[0].system
    assert "load_skill" not in [t.name for t in model.requests[0].tools]
    assert listed_events(audit) == []


async def test_the_budget_cut_is_named_in_a_warning_and_an_audit_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_skill(tmp_path / "skills", "alpha", "a" * 30)
    write_skill(tmp_path / "skills", "beta", "b" * 30)
    write_skill(tmp_path / "skills", "gamma", "c" * 30)
    model = FunctionModel(lambda r: "ok")
    rt, audit = runtime(tmp_path, model, budget=12)
    with caplog.at_level(logging.WARNING, logger="coterie.skills"):
        await rt.handle(ask("hi"))
    system = model.requests[0].system
    assert "- alpha: " in system and "- beta" not in system and "- gamma" not in system
    assert "2 more skills are not listed here" in system
    [event] = listed_events(audit)
    assert (event.listed, event.left_out, event.budget) == (["alpha"], ["beta", "gamma"], 12)
    assert event.tokens <= 12
    assert any(
        "budget (12 tokens) left out 2 skills: beta, gamma" in r.getMessage()
        for r in caplog.records
    )


async def test_a_bad_skill_reaches_the_prompt_the_log_and_the_audit_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_skill(tmp_path / "skills", "broken", front="name: broken\ndescription: ''\n")
    model = FunctionModel(lambda r: "ok")
    rt, audit = runtime(tmp_path, model, skills=["broken", "missing"])
    with caplog.at_level(logging.WARNING, logger="coterie.skills"):
        reply = await rt.handle(ask("hi"))
    assert reply.status == "ok"  # a bad skill never stops the persona
    assert "These skills cannot be loaded now: broken, missing" in model.requests[0].system
    [event] = listed_events(audit)
    assert event.listed == []
    assert any(
        str(path) in p and "description: expected a non-empty string" in p for p in event.problems
    )
    assert any("skills: names 'missing', which no folder holds" in p for p in event.problems)
    assert event_to_row(event)["error_kind"] == "invalid_skill"
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "skill 'broken' cannot be used" in logged and "skill 'missing' cannot be used" in logged


async def test_an_edited_skill_is_picked_up_by_the_next_turn(tmp_path: Path) -> None:
    path = write_skill(tmp_path / "skills", "report", "Old description.", body="Old body.")

    def step(request: ModelRequest) -> AssistantMessage | str:
        if "load" in latest_user_text(request) and request.step == 1:
            return AssistantMessage(
                text="", tool_calls=[tool_call("load_skill", {"name": "report"})]
            )
        return "done"

    model = FunctionModel(step)
    rt, audit = runtime(tmp_path, model)
    await rt.handle(ask("hi"))
    path.write_text(path.read_text().replace("Old description.", "New, edited description."))
    path.write_text(path.read_text().replace("Old body.", "New body."))
    await rt.handle(ask("load it"))
    assert "- report: Old description." in model.requests[0].system
    assert "- report: New, edited description." in model.requests[1].system
    results = [m for m in rt.conversation("ann:c").history if isinstance(m, ToolResultMessage)]
    assert "New body." in results[-1].content
    assert [e.listed for e in listed_events(audit)] == [["report"], ["report"]]
    # A new skill folder appears too, and a deleted one goes.
    write_skill(tmp_path / "skills", "added", "Added later.")
    await rt.handle(ask("hi again"))
    assert "- added: Added later." in model.requests[-1].system


async def test_unchanged_skills_are_not_scanned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_skill(tmp_path / "skills", "report")
    scans: list[int] = []
    real = SkillCatalog.scan

    def counting(self: SkillCatalog) -> object:
        scans.append(1)
        return real(self)

    monkeypatch.setattr(SkillCatalog, "scan", counting)
    rt, _ = runtime(tmp_path, FunctionModel(lambda r: "ok"))
    for i in range(5):
        await rt.handle(ask(f"turn {i}"))
    assert len(scans) == 1


async def test_allowed_tools_narrow_the_turns_later_calls_and_only_that_turn(
    tmp_path: Path,
) -> None:
    write_skill(tmp_path / "skills", "careful", "Be careful.", extra="allowed-tools: clock\n")

    def step(request: ModelRequest) -> AssistantMessage | str:
        if "careful" in latest_user_text(request) and request.step == 1:
            return AssistantMessage(
                text="", tool_calls=[tool_call("load_skill", {"name": "careful"})]
            )
        if "careful" in latest_user_text(request) and request.step == 2:
            # Not offered any more: the call is refused as an unknown tool.
            return AssistantMessage(text="", tool_calls=[tool_call("todo_read", {})])
        return "done"

    model = FunctionModel(step)
    rt, _ = runtime(tmp_path, model)
    await rt.handle(ask("be careful"))
    tools = [sorted(t.name for t in r.tools) for r in model.requests]
    assert "todo_read" in tools[0]
    assert tools[1] == ["clock", "end_task", "load_skill"]
    assert tools[2] == ["clock", "end_task", "load_skill"]
    results = [m for m in rt.conversation("ann:c").history if isinstance(m, ToolResultMessage)]
    assert results[-1].name == "todo_read" and results[-1].error_kind == "unknown_tool"
    await rt.handle(ask("next turn"))
    assert "todo_read" in [t.name for t in model.requests[-1].tools]


async def test_the_bundled_planner_loads_its_skill(tmp_path: Path) -> None:
    from coterie.demo import BUNDLED_PERSONAS
    from coterie.runtime.config import install_personas
    from coterie.runtime.models import build_model

    install_personas(tmp_path, BUNDLED_PERSONAS)
    persona = load_persona(tmp_path, "planner")
    model = build_model(persona.config.model)
    requests: list[ModelRequest] = []
    inner = model.request

    async def recording(request: ModelRequest) -> object:
        requests.append(request)
        return await inner(request)

    model.request = recording  # type: ignore[method-assign]
    rt = PersonaRuntime(persona, model=model, registry=builtin_registry())
    reply = await rt.handle(
        MessageEnvelope(recipient="planner", conversation_id="p:1", text="the launch checklist?")
    )
    assert reply.text.startswith("I loaded my launch-checklist skill:\n# Skill launch-checklist")
    assert "1. Draft the announcement" in reply.text and "venue.md" in reply.text
    assert "- launch-checklist: The checklist for a product launch" in requests[0].system
    tools = sorted(t.name for t in requests[1].tools)
    assert tools == ["end_task", "load_skill", "todo_read", "todo_write"]
