"""The README is the front page and docs/ is the guide: both are checked.

The guide builds with ``mkdocs build --strict`` (a broken link or anchor, or a
page missing from the nav, is a warning and so a failure); the README is short,
opens with the two commands, and its test command is the one CI runs; the
guide's Python examples run; its error tree is the one ``errors.py`` draws.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

DEMO_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && coterie demo"


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """Each fenced code block of ``text``: (language, body, line of its fence)."""
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((match.group(1), match.group(2), line))
    return blocks


def readme_test_command() -> str:
    """The README's second command: the one that runs the tests."""
    return fenced_blocks(README.read_text(encoding="utf-8"))[1][1].strip()


def test_mkdocs_builds_the_guide_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    command = [str(mkdocs)] if mkdocs.exists() else [sys.executable, "-m", "mkdocs"]
    proc = subprocess.run(
        [*command, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()


def nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            pages += nav_pages(value)
        else:
            pages.append(str(value))
    return pages


def test_every_docs_page_is_in_the_nav_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert Path(config["docs_dir"]) == Path("docs")
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), listed
    found = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert set(listed) == found
    # The validation that makes --strict catch what the default only logs.
    assert config["validation"]["nav"]["omitted_files"] == "warn"
    assert config["validation"]["links"]["anchors"] == "warn"


def test_the_readme_is_a_front_page_that_opens_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    blocks = fenced_blocks(text)
    first_section = text.index("\n## ")
    (_, demo, demo_line), (_, tests, tests_line) = blocks[:2]
    assert demo.strip() == DEMO_COMMAND
    assert tests.strip() == "tests/run.sh"
    assert max(demo_line, tests_line) < text.count("\n", 0, first_section) + 1
    assert demo_line < 20


def github_slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readmes_links_reach_files_and_headings() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {github_slug(h) for h in headings}, link
    # Every page of the guide is one link away from the front page.
    for page in DOCS.glob("*.md"):
        assert f"(docs/{page.name}" in text, page.name


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.strip() for line in script.splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert "export CI=1" in commands
    last = shlex.split(commands[-1])
    assert last[0] == "exec"
    assert last[1:] == shlex.split(readme_test_command())
    # The command is the script in the repository, and the script runs pytest.
    runner = ROOT / shlex.split(readme_test_command())[0]
    assert runner.is_file() and os.access(runner, os.X_OK)
    assert re.search(r'^pytest -q "\$@"', runner.read_text(encoding="utf-8"), re.MULTILINE)


#: Pages whose Python examples run as they are (from the given heading on):
#: those that need no Ray and no key. The python-api page's first example
#: starts a Ray runtime; its "Without Ray" section does not.
RUNNABLE = {"testing.md": "# Testing API", "python-api.md": "## Without Ray"}


def test_the_guides_python_examples_run() -> None:
    for page, heading in RUNNABLE.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        assert heading in text, (page, heading)
        for language, body, line in fenced_blocks(text.split(heading, 1)[1]):
            if language == "python":
                code = compile(body, f"docs/{page}:{line}", "exec")
                exec(code, {"__name__": "__main__"})


def error_tree_in_the_docstring() -> str:
    source = (ROOT / "runtime" / "errors.py").read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source)) or ""
    # The drawing is the indented block after "::", up to the next paragraph.
    drawn = []
    for line in doc.split("::\n\n", 1)[1].splitlines():
        if line and not line.startswith("    "):
            break
        drawn.append(line.removeprefix("    "))
    return "\n".join(drawn)


def test_the_reliability_page_draws_the_error_tree_of_errors_py() -> None:
    page = (DOCS / "reliability.md").read_text(encoding="utf-8")
    section = page.split("## The error tree", 1)[1]
    [tree] = [body for language, body, _ in fenced_blocks(section)[:1] if language == "text"]
    assert tree.rstrip() == error_tree_in_the_docstring().rstrip()


#: Every section of the README before it became the front page (issue 35), and
#: the page of the guide that holds it now under the same heading.
OLD_README_SECTIONS = {
    "What the demo shows": "index.md",
    "The command line": "index.md",
    "Homes and personas": "personas-and-models.md",
    "Scripted models": "personas-and-models.md",
    "Providers": "personas-and-models.md",
    "Serving": "serving.md",
    "Connectors and delivery tools": "serving.md",
    "The tool loop": "tools.md",
    "Built-in tools": "tools.md",
    "draft": "tools.md",
    "Writing a tool": "tools.md",
    "File tools": "tools.md",
    "Shell tools": "tools.md",
    "Web tools": "tools.md",
    "Personas talking to each other": "delegation.md",
    "Delegation: subagents and coding agents": "delegation.md",
    "Subagents": "delegation.md",
    "Coding agents over ACP": "delegation.md",
    "Evaluating agents": "evaluation.md",
    "A task": "evaluation.md",
    "How samples run": "evaluation.md",
    "Results": "evaluation.md",
    "Error kinds": "reliability.md",
    "Virtual personas, restarts and settings": "reliability.md",
    "The audit log": "reliability.md",
    "What survives what": "reliability.md",
    "MCP": "mcp.md",
    "MCP servers for personas": "mcp.md",
    "coterie as an MCP server": "mcp.md",
    "Long-term memory": "memory.md",
    "Embedders: which one memory uses": "memory.md",
    "Installing the local model": "memory.md",
    "Settings": "memory.md",
    "Python API": "python-api.md",
    "Running on a cluster": "cluster.md",
    "Placement": "cluster.md",
    "When a node dies": "cluster.md",
    "Benchmarks": "benchmarks.md",
    "Layout": "layout.md",
}


def test_every_section_of_the_old_readme_has_its_heading_in_the_guide() -> None:
    for title, page in OLD_README_SECTIONS.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        assert re.search(rf"^#+ {re.escape(title)}$", text, re.MULTILINE), (title, page)
