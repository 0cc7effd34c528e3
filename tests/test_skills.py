"""Skills without a persona: SKILL.md's format, the catalog a persona sees
(override, narrowing, problems, changes picked up by stamps) and the
prompt's listing under its budget."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from coterie.runtime.config import PersonaConfig, RuntimeSettings
from coterie.runtime.errors import ConfigError
from coterie.runtime.skills import (
    MAX_SKILL_FILE_BYTES,
    SkillCatalog,
    SkillFormatError,
    SkillPrompt,
    SkillSet,
    estimate_tokens,
    parse_skill,
    skill_listing,
)
from coterie.runtime.skills import catalog as catalog_module


def write_skill(
    root: Path,
    name: str,
    description: str = "",
    *,
    body: str = "Do the thing.",
    extra: str = "",
    front: str | None = None,
) -> Path:
    """``root/<name>/SKILL.md``; ``front`` replaces the whole front matter."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    head = (
        front
        if front is not None
        else (f"name: {name}\ndescription: {description or f'The {name} skill.'}\n{extra}")
    )
    path = folder / "SKILL.md"
    path.write_text(f"---\n{head}---\n{body}\n", encoding="utf-8")
    return path


def parse(path: Path) -> object:
    return parse_skill(path, path.read_bytes(), scope="global")


# --- the format ------------------------------------------------------------


def test_a_valid_skill_has_its_fields_and_its_body_without_front_matter(tmp_path: Path) -> None:
    path = write_skill(
        tmp_path,
        "pdf-forms",
        "Fill in PDF forms.",
        body="# Steps\n\n1. Read reference.md",
        extra=(
            "license: MIT\ncompatibility: needs python3\n"
            "metadata:\n  author: ops\n  version: '1.2'\nallowed-tools: file_read  grep\n"
        ),
    )
    skill = parse_skill(path, path.read_bytes(), scope="persona")
    assert (skill.name, skill.description, skill.scope) == (
        "pdf-forms",
        "Fill in PDF forms.",
        "persona",
    )
    assert skill.body == "# Steps\n\n1. Read reference.md"
    assert (skill.license, skill.compatibility) == ("MIT", "needs python3")
    assert dict(skill.metadata) == {"author": "ops", "version": "1.2"}
    assert skill.allowed_tools == ("file_read", "grep")
    assert skill.tool_limit() == ("file_read", "grep", "end_task", "load_skill")


def test_allowed_tools_may_be_a_yaml_list_and_no_field_means_no_narrowing(tmp_path: Path) -> None:
    listed = write_skill(tmp_path, "listed", extra="allowed-tools: [file_read, 'mcp_*']\n")
    assert parse_skill(listed, listed.read_bytes(), scope="global").allowed_tools == (
        "file_read",
        "mcp_*",
    )
    plain = write_skill(tmp_path, "plain")
    skill = parse_skill(plain, plain.read_bytes(), scope="global")
    assert skill.allowed_tools is None and skill.tool_limit() is None


BAD_FRONT_MATTER = [
    ("name: other\ndescription: d\n", "name: 'other' must equal the folder's name 'skill'"),
    ("description: d\n", "name: missing"),
    ("name: Skill\ndescription: d\n", "name: 'Skill': expected lowercase"),
    ("name: skill\n", "description: missing"),
    ("name: skill\ndescription: '  '\n", "description: expected a non-empty string"),
    ("name: skill\ndescription: [a]\n", "description: expected a non-empty string"),
    (f"name: skill\ndescription: {'x' * 1025}\n", "description: 1025 characters; at most 1024"),
    ("name: skill\ndescription: d\nlicense: 3\n", "license: expected a non-empty string"),
    (
        f"name: skill\ndescription: d\ncompatibility: {'c' * 501}\n",
        "compatibility: 501 characters; at most 500",
    ),
    ("name: skill\ndescription: d\nmetadata: [a]\n", "metadata: expected a mapping"),
    ("name: skill\ndescription: d\nmetadata: {version: 1.0}\n", "metadata.version: expected"),
    (
        "name: skill\ndescription: d\nallowed-tools: Bash(git:*) file_read\n",
        "allowed-tools: 'Bash(git:*)': argument patterns are not supported",
    ),
    ("name: skill\ndescription: d\nallowed-tools: {a: 1}\n", "allowed-tools: expected tool"),
    ("name: skill\ndescription: d\nallowed-tools: [3]\n", "allowed-tools: 3 is not a tool name"),
    ("name: skill\ndescription: d\nversion: 2\n", "version: unknown field"),
    ("name: skill\ndescription: d\nfoo: [\n", "(front matter): not valid YAML"),
    ("- a\n- b\n", "(front matter): expected a mapping"),
]


@pytest.mark.parametrize(("front", "expected"), BAD_FRONT_MATTER)
def test_each_bad_field_is_an_error_naming_the_file_and_the_field(
    tmp_path: Path, front: str, expected: str
) -> None:
    path = write_skill(tmp_path, "skill", front=front)
    with pytest.raises(SkillFormatError) as caught:
        parse(path)
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)
    assert any(expected in p for p in caught.value.problems), caught.value.problems
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize(
    "name",
    ["-lead", "trail-", "two--hyphens", "under_score", "a" * 65, "dotted.name", "ünï"],
)
def test_names_outside_the_format_are_refused(tmp_path: Path, name: str) -> None:
    path = write_skill(tmp_path, "skill", front=f"name: '{name}'\ndescription: d\n")
    with pytest.raises(SkillFormatError, match=r"name: "):
        parse(path)


def test_a_64_character_name_is_the_longest_accepted(tmp_path: Path) -> None:
    name = "a" * 64
    path = write_skill(tmp_path, name)
    assert parse_skill(path, path.read_bytes(), scope="global").name == name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no front matter at all\n", "(front matter): the file must open with a '---' line"),
        ("---\nname: skill\ndescription: d\n", "(front matter): the file must open"),
        ("", "(front matter)"),
    ],
)
def test_a_file_without_front_matter_is_an_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "skill" / "SKILL.md"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(SkillFormatError) as caught:
        parse(path)
    assert caught.value.problems[0].startswith(expected)


def test_a_file_too_large_or_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = write_skill(tmp_path, "skill", body="x" * MAX_SKILL_FILE_BYTES)
    with pytest.raises(SkillFormatError, match=r"\(file\): larger than"):
        parse(path)
    path.write_bytes(b"---\nname: skill\ndescription: caf\xe9\n---\n")
    with pytest.raises(SkillFormatError, match=r"\(file\): not UTF-8"):
        parse(path)


def test_a_bom_and_crlf_line_ends_are_read(tmp_path: Path) -> None:
    path = tmp_path / "skill" / "SKILL.md"
    path.parent.mkdir()
    path.write_bytes("\ufeff---\r\nname: skill\r\ndescription: d\r\n---\r\nbody\r\n".encode())
    skill = parse_skill(path, path.read_bytes(), scope="global")
    assert (skill.name, skill.body) == ("skill", "body")


def test_the_error_survives_pickling() -> None:
    import pickle

    error = SkillFormatError("/x/SKILL.md", ["name: missing"])
    again = pickle.loads(pickle.dumps(error))
    assert (again.path, again.problems, str(again)) == (error.path, error.problems, str(error))


# --- persona.yaml's skills: --------------------------------------------------


def test_persona_yaml_skills_are_checked_names() -> None:
    model = {"provider": "scripted"}
    assert PersonaConfig.model_validate({"model": model}).skills is None
    assert PersonaConfig.model_validate({"model": model, "skills": ["a-b", "c"]}).skills == [
        "a-b",
        "c",
    ]
    with pytest.raises(ValueError, match=r"skills\n.*entry 1: 'Bad_Name'"):
        PersonaConfig.model_validate({"model": model, "skills": ["ok", "Bad_Name"]})
    with pytest.raises(ValueError, match="a listed more than once"):
        PersonaConfig.model_validate({"model": model, "skills": ["a", "a"]})


def test_runtime_yaml_has_the_prompt_budget() -> None:
    assert RuntimeSettings().skills.prompt_budget == 2000
    assert (
        RuntimeSettings.model_validate({"skills": {"prompt_budget": 50}}).skills.prompt_budget == 50
    )
    with pytest.raises(ValueError, match="prompt_budget"):
        RuntimeSettings.model_validate({"skills": {"prompt_budget": -1}})
    with pytest.raises(ValueError, match=r"skills.budget"):
        RuntimeSettings.model_validate({"skills": {"budget": 5}})


# --- the catalog -------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "personas" / "ann").mkdir(parents=True)
    return tmp_path


def catalog(home: Path, only: list[str] | None = None) -> SkillCatalog:
    return SkillCatalog(home=home, persona_dir=home / "personas" / "ann", only=only)


def test_a_persona_skill_overrides_a_global_one_of_the_same_name(home: Path) -> None:
    write_skill(home / "skills", "report", "The shared report.")
    write_skill(home / "skills", "shared-only", "Only shared.")
    own = write_skill(home / "personas" / "ann" / "skills", "report", "Ann's own report.")
    skills = catalog(home).scan()
    assert skills.names() == ["report", "shared-only"]  # the persona's own first
    report = skills.get("report")
    assert report is not None
    assert (report.description, report.scope, report.path) == ("Ann's own report.", "persona", own)
    assert skills.problems == ()
    # Only the global skills' folders are read roots (the persona's are in its directory).
    assert skills.read_roots == ((home / "skills" / "shared-only").resolve(),)


def test_a_broken_persona_skill_still_takes_the_name(home: Path) -> None:
    write_skill(home / "skills", "report", "The shared report.")
    write_skill(home / "personas" / "ann" / "skills", "report", front="name: report\n")
    skills = catalog(home).scan()
    assert skills.get("report") is None
    problem = skills.problem("report")
    assert problem is not None and "description: missing" in problem.detail
    assert "personas/ann/skills/report/SKILL.md" in problem.path


def test_skills_in_persona_yaml_narrow_and_order_what_the_persona_sees(home: Path) -> None:
    for name in ("alpha", "beta", "gamma"):
        write_skill(home / "skills", name)
    skills = catalog(home, only=["gamma", "alpha"]).scan()
    assert skills.names() == ["gamma", "alpha"]
    assert skills.get("beta") is None and skills.problem("beta") is None
    assert [r.name for r in skills.read_roots] == ["gamma", "alpha"]


def test_a_name_in_skills_that_no_folder_holds_is_a_problem_naming_it(home: Path) -> None:
    write_skill(home / "skills", "alpha")
    skills = catalog(home, only=["alpha", "ghost"]).scan()
    assert skills.names() == ["alpha"]
    problem = skills.problem("ghost")
    assert problem is not None
    assert problem.path.endswith("personas/ann/persona.yaml")
    assert "skills: names 'ghost', which no folder holds" in problem.detail


def test_a_narrowed_out_broken_skill_is_not_the_personas_problem(home: Path) -> None:
    write_skill(home / "skills", "alpha")
    write_skill(home / "skills", "broken", front="name: nope\n")
    assert catalog(home, only=["alpha"]).scan().problems == ()
    assert catalog(home).scan().problem("broken") is not None


def test_bad_skills_are_reported_and_left_out_never_dropped(home: Path) -> None:
    write_skill(home / "skills", "good")
    write_skill(home / "skills", "bad-name", front="name: other\ndescription: d\n")
    (home / "skills" / "no-file").mkdir()
    (home / "skills" / "no-file" / "skill.md").write_text("---\nname: no-file\n---\n")
    (home / "skills" / ".hidden").mkdir()  # hidden folders are not skills
    (home / "skills" / "README.md").write_text("not a folder")
    skills = catalog(home).scan()
    assert skills.names() == ["good"]
    assert sorted(p.name for p in skills.problems) == ["bad-name", "no-file"]
    no_file = skills.problem("no-file")
    assert no_file is not None and "no SKILL.md in the folder" in no_file.detail


def test_a_global_skill_that_resolves_to_the_home_is_refused(home: Path) -> None:
    (home / "skills").mkdir()
    (home / "skills" / "sneaky").symlink_to(home)
    (home / "SKILL.md").write_text("---\nname: sneaky\ndescription: d\n---\n")
    skills = catalog(home).scan()
    assert skills.get("sneaky") is None and skills.read_roots == ()
    problem = skills.problem("sneaky")
    assert problem is not None and "which holds the home" in problem.detail


def test_too_many_skill_folders_are_one_problem(home: Path) -> None:
    for i in range(4):
        write_skill(home / "skills", f"s{i}")
    skills = SkillCatalog(home=home, persona_dir=home / "personas" / "ann", max_per_folder=3).scan()
    assert skills.names() == ["s0", "s1", "s2"]
    assert len(skills.problems) == 1 and "left out: s3" in skills.problems[0].detail


def test_changes_are_noticed_by_stamps_and_only_changed_files_are_read_again(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_skill(home / "skills", "alpha", "First words.")
    write_skill(home / "skills", "beta")
    cat = catalog(home)
    assert cat.changed()  # never scanned
    reads: list[str] = []
    parse_real = catalog_module.parse_skill

    def counting(p: Path, data: bytes, *, scope: str) -> object:
        reads.append(p.parent.name)
        return parse_real(p, data, scope=scope)  # type: ignore[arg-type]

    monkeypatch.setattr(catalog_module, "parse_skill", counting)
    first = cat.scan()
    assert sorted(reads) == ["alpha", "beta"] and not cat.changed()
    # Nothing changed: the same snapshot object (the prompt's cache key).
    assert cat.scan() is first
    path.write_text(path.read_text().replace("First words.", "Second, longer words."))
    assert cat.changed()
    reads.clear()
    second = cat.scan()
    assert reads == ["alpha"]  # beta's stamp did not move
    skill = second.get("alpha")
    assert (
        second is not first and skill is not None and skill.description == "Second, longer words."
    )
    # A new skill folder moves the folder's own stamp.
    write_skill(home / "skills", "gamma")
    assert cat.changed() and cat.scan().names() == ["alpha", "beta", "gamma"]
    # A SKILL.md written into a folder that had none.
    (home / "skills" / "delta").mkdir()
    assert cat.changed() and cat.scan().problem("delta") is not None
    write_skill(home / "skills", "delta")
    assert cat.changed() and cat.scan().get("delta") is not None
    # The persona's own skills folder appearing later.
    write_skill(home / "personas" / "ann" / "skills", "alpha", "Ann's alpha.")
    assert cat.changed()
    mine = cat.scan().get("alpha")
    assert mine is not None and mine.scope == "persona"


def test_an_unchanged_catalog_costs_stats_not_listings(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_skill(home / "skills", "alpha")
    cat = catalog(home)
    cat.scan()
    listed: list[object] = []
    real = os.scandir

    def counting(path: object) -> object:
        listed.append(path)
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(catalog_module.os, "scandir", counting)
    for _ in range(5):
        assert not cat.changed()
    assert listed == []


async def test_refresh_scans_only_when_something_changed(home: Path) -> None:
    path = write_skill(home / "skills", "alpha", "One.")
    cat = catalog(home)
    first = await cat.refresh()
    assert first.names() == ["alpha"] and await cat.refresh() is first
    path.write_text(path.read_text().replace("One.", "Two, edited."))
    second = await cat.refresh()
    skill = second.get("alpha")
    assert skill is not None and skill.description == "Two, edited."


# --- the listing ---------------------------------------------------------------


def skill_set(home: Path, *descriptions: str) -> SkillSet:
    for i, description in enumerate(descriptions):
        write_skill(home / "skills", f"s{i}", description)
    return catalog(home).scan()


def test_tokens_are_characters_over_four_rounded_up() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 400)] == [0, 1, 1, 2, 100]


def test_every_skill_is_listed_within_the_budget(home: Path) -> None:
    skills = skill_set(home, "Fill in\n  PDF forms.", "Write a report.")
    listing = skill_listing(skills, budget=2000)
    assert listing.listed == ("s0", "s1") and listing.left_out == ()
    assert "- s0: Fill in PDF forms.\n- s1: Write a report." in listing.text
    assert listing.text.startswith("## Skills\n") and "load_skill" in listing.text
    assert "not listed here" not in listing.text
    assert listing.tokens == estimate_tokens("- s0: Fill in PDF forms.\n") + estimate_tokens(
        "- s1: Write a report.\n"
    )


def test_the_budget_cuts_the_listing_and_says_how_to_see_the_rest(home: Path) -> None:
    skills = skill_set(home, "a" * 40, "b" * 40, "c" * 4)
    line = estimate_tokens(f"- s0: {'a' * 40}\n")
    listing = skill_listing(skills, budget=line + 5)
    assert listing.listed == ("s0",)
    # The first that does not fit ends the listing (s2 is short but comes later).
    assert listing.left_out == ("s1", "s2")
    assert listing.tokens <= listing.budget
    assert "- s1" not in listing.text and "- s2" not in listing.text
    assert "2 more skills are not listed here" in listing.text
    assert "load_skill with a name that is not a skill" in listing.text
    nothing = skill_listing(skills, budget=0)
    assert nothing.listed == () and "3 skills are not listed here" in nothing.text


def test_no_skills_no_section(home: Path) -> None:
    assert skill_listing(SkillSet(), budget=100).text == ""


def test_the_listing_is_the_same_bytes_while_the_skills_do_not_change(home: Path) -> None:
    write_skill(home / "skills", "zeta", "Last by name.")
    write_skill(home / "skills", "alpha", "First by name.")
    write_skill(home / "skills", "broken", front="name: broken\n")
    prompt = SkillPrompt("ann", budget=500)
    cat = catalog(home)
    first = prompt.listing(cat.scan()).text
    # Another catalog over the same files (a restarted persona) lists the same bytes.
    again = SkillPrompt("ann", budget=500).listing(catalog(home).scan()).text
    assert first == again and prompt.listing(cat.scan()).text is first
    assert first.index("- alpha") < first.index("- zeta")
    assert "cannot be loaded now: broken" in first


def test_a_new_listing_is_reported_once_with_a_warning_naming_what_was_left_out(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_skill(home / "skills", "big", "b" * 400)
    write_skill(home / "skills", "small", "s")
    write_skill(home / "skills", "broken", front="name: broken\n")
    cat = catalog(home)
    prompt = SkillPrompt("ann", budget=10)
    with caplog.at_level(logging.WARNING, logger="coterie.skills"):
        event = prompt.report(cat.scan(), conversation_id="c", turn_id="t1")
    assert event is not None
    assert (event.listed, event.left_out, event.budget) == ([], ["big", "small"], 10)
    assert len(event.problems) == 1 and event.problems[0].startswith("broken: ")
    assert "description: missing" in event.problems[0]
    messages = [r.getMessage() for r in caplog.records]
    assert any("left out 2 skills: big, small" in m for m in messages), messages
    assert any("skill 'broken' cannot be used" in m and "SKILL.md" in m for m in messages)
    # The same snapshot is not reported twice.
    caplog.clear()
    assert prompt.report(cat.scan(), conversation_id="c", turn_id="t2") is None
    assert caplog.records == []
    # A persona without skills has nothing to report.
    assert (
        SkillPrompt("bob", budget=10).report(SkillSet(), conversation_id="c", turn_id="t") is None
    )
