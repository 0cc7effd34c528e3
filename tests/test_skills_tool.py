"""load_skill, the file rails around skill folders, and allowed-tools narrowing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coterie.runtime.config import ToolFilter
from coterie.runtime.context import TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.messages import ToolCall
from coterie.runtime.runner import ToolRunner
from coterie.runtime.skills import SkillCatalog, SkillSet
from coterie.runtime.testing import turn_context
from coterie.tools import builtin_registry
from coterie.tools.files import FileReadArgs, FileWriteArgs, file_read, file_write
from coterie.tools.skills import MAX_LISTED_FILES, LoadSkillArgs, load_skill, skill_files
from tests.test_skills import write_skill

PERSONA = "ann"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "personas" / PERSONA / "workspace").mkdir(parents=True)
    (tmp_path / "personas" / "bob").mkdir(parents=True)
    return tmp_path


def settings(home: Path, only: list[str] | None = None, **kw: object) -> TurnSettings:
    persona_dir = home / "personas" / PERSONA
    skills = SkillCatalog(home=home, persona_dir=persona_dir, only=only).scan()
    return TurnSettings(
        workspace=persona_dir / "workspace",
        persona_dir=persona_dir,
        home=home,
        skills=skills,
        **kw,  # type: ignore[arg-type]
    )


def ctx_for(home: Path, only: list[str] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return turn_context(persona=PERSONA, settings=settings(home, only, **kw))


@pytest.fixture
def pdf(home: Path) -> Path:
    """A global skill with files of its own."""
    write_skill(
        home / "skills",
        "pdf-forms",
        "Fill in PDF forms.",
        body="# Steps\n\n1. Read reference.md.",
        extra="allowed-tools: file_read grep\n",
    )
    folder = home / "skills" / "pdf-forms"
    (folder / "reference.md").write_text("the reference\n")
    (folder / "scripts").mkdir()
    (folder / "scripts" / "fill.py").write_text("print('fill')\n")
    (folder / ".env").write_text("TOKEN=shh\n")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x").write_text("hidden")
    return folder


async def test_load_skill_returns_the_body_and_the_paths_of_its_files(
    home: Path, pdf: Path
) -> None:
    ctx = ctx_for(home)
    text = await load_skill.fn(LoadSkillArgs(name="pdf-forms"), ctx)
    real = pdf.resolve()
    assert text.startswith(f"# Skill pdf-forms (a shared skill, {real})")
    assert "# Steps\n\n1. Read reference.md." in text
    assert "---" not in text and "description:" not in text  # no front matter
    assert f"- {real / 'reference.md'}\n- {real / 'scripts' / 'fill.py'}" in text
    assert ".env" not in text and ".cache" not in text and "SKILL.md" not in text
    assert "may use only these tools" in text and "file_read, grep, end_task, load_skill" in text
    assert ctx.outputs.tool_limits == [("file_read", "grep", "end_task", "load_skill")]


async def test_a_skill_without_allowed_tools_does_not_narrow(home: Path) -> None:
    write_skill(home / "personas" / PERSONA / "skills", "mine", "Ann's own.", body="Be brief.")
    ctx = ctx_for(home)
    text = await load_skill.fn(LoadSkillArgs(name="mine"), ctx)
    assert "(your own skill," in text and "Be brief." in text
    assert "Files of this skill" not in text and "may use only" not in text
    assert ctx.outputs.tool_limits == []


async def test_an_unknown_name_is_an_error_listing_every_skill(home: Path, pdf: Path) -> None:
    write_skill(home / "skills", "long-one", "x" * 400)
    write_skill(home / "skills", "broken", front="name: broken\n")
    ctx = ctx_for(home)
    with pytest.raises(ToolError) as caught:
        await load_skill.fn(LoadSkillArgs(name="pdf"), ctx)
    assert caught.value.kind == "not_found"
    detail = caught.value.detail
    assert "no skill named 'pdf'" in detail
    assert "- pdf-forms: Fill in PDF forms." in detail
    assert "- long-one: " + "x" * 159 + "…" in detail  # descriptions are shortened
    assert "- broken: (cannot be loaded: description: missing)" in detail


async def test_a_broken_skill_answers_with_its_file_and_field(home: Path) -> None:
    path = write_skill(home / "skills", "broken", front="name: broken\ndescription: d\nfoo: 1\n")
    with pytest.raises(ToolError) as caught:
        await load_skill.fn(LoadSkillArgs(name="broken"), ctx_for(home))
    assert caught.value.kind == "invalid_skill"
    assert str(path) in caught.value.detail and "foo: unknown field" in caught.value.detail


async def test_a_narrowed_out_skill_cannot_be_loaded(home: Path, pdf: Path) -> None:
    write_skill(home / "skills", "other")
    ctx = ctx_for(home, only=["other"])
    with pytest.raises(ToolError, match="no skill named 'pdf-forms'"):
        await load_skill.fn(LoadSkillArgs(name="pdf-forms"), ctx)


def test_load_skill_is_hidden_without_skills(home: Path) -> None:
    registry = builtin_registry()
    assert "load_skill" not in registry.visible(ctx_for(home))
    write_skill(home / "skills", "broken", front="name: broken\n")
    assert "load_skill" in registry.visible(ctx_for(home))  # so it can say why
    # A subagent's settings carry no skills.
    assert "load_skill" not in registry.visible(turn_context(kind="subagent", depth=1))


def test_skill_files_are_bounded(tmp_path: Path) -> None:
    for i in range(MAX_LISTED_FILES + 5):
        (tmp_path / f"f{i:03}.md").write_text("x")
    files, total = skill_files(tmp_path)
    assert len(files) == MAX_LISTED_FILES and total == MAX_LISTED_FILES + 5


async def test_load_skill_through_the_runner_lists_more_files_past_the_bound(
    home: Path, pdf: Path
) -> None:
    for i in range(MAX_LISTED_FILES + 1):
        (pdf / f"extra{i:03}.txt").write_text("x")
    ctx = ctx_for(home)
    runner = ToolRunner()
    call = ToolCall(id="c1", name="load_skill", arguments={"name": "pdf-forms"})
    [outcome] = await runner.run_calls([call], ctx, builtin_registry().visible(ctx))
    assert outcome.error_kind is None
    assert f"… and 3 more (file_list {pdf.resolve()})" in outcome.content


# --- the rails ---------------------------------------------------------------


async def test_file_read_reads_a_global_skills_file(home: Path, pdf: Path) -> None:
    ctx = ctx_for(home)
    text = await file_read.fn(FileReadArgs(path=str(pdf / "reference.md")), ctx)
    assert text.startswith("1\tthe reference")
    text = await file_read.fn(FileReadArgs(path=str(pdf / "scripts" / "fill.py")), ctx)
    assert "print('fill')" in text


async def test_file_read_reads_the_personas_own_skill_files(home: Path) -> None:
    write_skill(home / "personas" / PERSONA / "skills", "mine", body="own body")
    path = home / "personas" / PERSONA / "skills" / "mine" / "SKILL.md"
    assert "own body" in await file_read.fn(FileReadArgs(path=str(path)), ctx_for(home))


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("skills/pdf-forms/.env", ".env files hold secrets"),
        ("skills/hidden-skill/SKILL.md", "outside the allowed roots"),
        ("skills", "outside the allowed roots"),
        ("runtime.yaml", "outside the allowed roots"),
        ("personas/bob/skills/bobs/SKILL.md", "belongs to another persona"),
    ],
)
async def test_paths_outside_the_visible_skills_are_refused(
    home: Path, pdf: Path, where: str, message: str
) -> None:
    write_skill(home / "skills", "hidden-skill")
    write_skill(home / "personas" / "bob" / "skills", "bobs")
    (home / "runtime.yaml").write_text("{}\n")
    ctx = ctx_for(home, only=["pdf-forms"])
    with pytest.raises(ToolError) as caught:
        await file_read.fn(FileReadArgs(path=str(home / where)), ctx)
    assert caught.value.kind == "path_denied" and message in caught.value.detail


async def test_a_link_out_of_a_skill_folder_is_refused(home: Path, pdf: Path) -> None:
    secret = home / "outside.txt"
    secret.write_text("private")
    (pdf / "link.txt").symlink_to(secret)
    with pytest.raises(ToolError) as caught:
        await file_read.fn(FileReadArgs(path=str(pdf / "link.txt")), ctx_for(home))
    assert caught.value.kind == "path_denied"


async def test_global_skill_folders_are_never_writable(home: Path, pdf: Path) -> None:
    ctx = ctx_for(home, access="full")
    with pytest.raises(ToolError) as caught:
        await file_write.fn(
            FileWriteArgs(path=str(pdf / "reference.md"), content="changed", overwrite=True), ctx
        )
    assert caught.value.kind == "path_denied" and "read-only" in caught.value.detail
    assert (pdf / "reference.md").read_text() == "the reference\n"


# --- allowed-tools -------------------------------------------------------------


def offered(ctx: object) -> set[str]:
    return set(builtin_registry().visible(ctx))  # type: ignore[arg-type]


async def test_allowed_tools_narrow_the_rest_of_the_turn(home: Path, pdf: Path) -> None:
    ctx = ctx_for(home)
    before = offered(ctx)
    assert {"file_read", "grep", "clock", "todo_write", "end_task", "load_skill"} <= before
    await load_skill.fn(LoadSkillArgs(name="pdf-forms"), ctx)
    assert offered(ctx) == {"file_read", "grep", "end_task", "load_skill"}
    # Outside the narrowed set, a call is an unknown tool.
    [outcome] = await ToolRunner().run_calls(
        [ToolCall(id="c1", name="clock", arguments={})], ctx, builtin_registry().visible(ctx)
    )
    assert outcome.error_kind == "unknown_tool"
    assert json.loads(outcome.content)["error"] == "unknown_tool"


async def test_allowed_tools_never_widen_what_the_persona_allows(home: Path) -> None:
    write_skill(
        home / "skills",
        "wide",
        extra="allowed-tools: [clock, file_read, shell_exec, '*']\n",
    )
    write_skill(home / "skills", "narrow", extra="allowed-tools: clock\n")
    ctx = ctx_for(home, tool_filter=ToolFilter(allow=["clock", "load_skill"], deny=[]))
    assert offered(ctx) == {"clock", "load_skill"}
    await load_skill.fn(LoadSkillArgs(name="wide"), ctx)
    assert offered(ctx) == {"clock", "load_skill"}  # end_task stays denied by the persona
    # A second skill narrows further; loading a wider one after never widens back.
    await load_skill.fn(LoadSkillArgs(name="narrow"), ctx)
    await load_skill.fn(LoadSkillArgs(name="wide"), ctx)
    assert offered(ctx) == {"clock", "load_skill"}
    narrowed = ctx_for(home)
    await load_skill.fn(LoadSkillArgs(name="narrow"), narrowed)
    await load_skill.fn(LoadSkillArgs(name="wide"), narrowed)
    assert offered(narrowed) == {"clock", "end_task", "load_skill"}


def test_an_empty_skill_set_is_falsy_and_has_no_roots() -> None:
    empty = SkillSet()
    assert not empty and empty.read_roots == () and empty.get("x") is None
