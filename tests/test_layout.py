"""The shape of the tree: layering, import cost, packaging, one error vocabulary."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from runtime.errors import ERROR_KINDS, ToolError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "tools", "actors", "coterie")


def modules() -> dict[str, Path]:
    """Every module of the import packages, by dotted name."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, name: str) -> set[str]:
    """Dotted names a module imports, anywhere in it (function-level included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def test_layering_has_no_back_edges_or_cycles() -> None:
    mods = modules()
    below = {"runtime": {"tools", "actors", "coterie"}, "tools": {"actors", "coterie"}}
    below["actors"] = {"coterie"}
    graph: dict[str, set[str]] = {}
    broken: list[str] = []
    for name, path in mods.items():
        targets = set()
        for imported in imports_of(path, name):
            top = imported.split(".")[0]
            if top in below.get(name.split(".")[0], set()):
                broken.append(f"{name} imports {imported}")
            while imported and imported not in mods:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    assert broken == []
    # No import circles between modules (a package's __init__ re-exporting its
    # own modules is not one).
    inits = {n for n, p in mods.items() if p.name == "__init__.py"}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node] - inits:
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_benchmarks_do_not_import_the_tests() -> None:
    for path in (ROOT / "benchmarks").glob("*.py"):
        tops = {name.split(".")[0] for name in imports_of(path, f"benchmarks.{path.stem}")}
        assert "tests" not in tops, path


def loaded_by(imports: str, libraries: tuple[str, ...]) -> list[str]:
    """Which of ``libraries`` a fresh interpreter has loaded after ``import {imports}``."""
    code = f"import sys, {imports}\nprint(','.join(m for m in {libraries!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_importing_the_core_loads_no_heavy_library() -> None:
    core = "runtime, runtime.audit, runtime.memory, runtime.shell, runtime.routing, runtime.models"
    heavy = ("ray", "duckdb", "pyarrow", "lancedb", "torch", "sentence_transformers")
    assert (
        loaded_by(f"{core}, tools, coterie", (*heavy, "openai", "anthropic", "aiohttp", "bs4"))
        == []
    )


def test_a_persona_process_loads_no_library_before_it_needs_it() -> None:
    """What a starting persona's process imports costs every one of a hundred
    starts: the SDKs wait for the first turn, DuckDB and LanceDB stay in their
    actors, and pathspec waits for the first .gitignore a file tool walks."""
    later = ("openai", "anthropic", "mcp", "duckdb", "pyarrow", "lancedb", "torch", "pathspec")
    assert loaded_by("actors.persona", (*later, "bs4")) == []


def test_the_lean_serialization_module_loads_nothing_of_coteries() -> None:
    """actors._lean runs first in every actor's process (and the benchmarks
    build floors with it): it must not load coterie's modules before it."""
    ours = ("runtime", "tools", "coterie", "actors._ray", "actors.persona")
    assert loaded_by("actors._lean", ours) == []


def test_holding_a_memory_store_handle_loads_no_store() -> None:
    """A persona holds a handle to the MemoryStore actor, and Ray loads the
    actor's class to make one: that must not bring the store, the embedders
    or their choice into every persona's process."""
    store_side = (
        "runtime.memory.store",
        "runtime.memory._lance",
        "runtime.memory.choice",
        "runtime.memory.embedders",
        "runtime.memory.chunking",
    )
    assert loaded_by("actors.persona, actors.memory", store_side) == []


def test_every_package_is_listed_for_packaging() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert listed == found | {"coterie.configs"}


def test_error_kinds_are_one_vocabulary_listed_in_the_readme() -> None:
    # Every kind a tool or the runner can report is in ErrorKind…
    spelled: set[str] = set()
    for path in [*(ROOT / "runtime").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        spelled |= set(re.findall(r'(?:ToolError|error_result)\(\s*"([a-z0-9_]+)"', text))
    assert spelled and spelled <= ERROR_KINDS, spelled - ERROR_KINDS
    # …and the README's reliability section lists each of them.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Error kinds", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.MULTILINE))
    assert listed == ERROR_KINDS


def test_tool_error_refuses_a_kind_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="invalid_input"):
        ToolError("invalid_input", "x")  # type: ignore[arg-type]
    assert ToolError("invalid_arguments", "x").kind == "invalid_arguments"
