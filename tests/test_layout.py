"""The shape of the tree: layering, import cost, packaging, one error vocabulary."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from coterie.runtime.errors import ERROR_KINDS, ToolError

ROOT = Path(__file__).resolve().parent.parent
#: The folders of the repository that install as one package each, under the
#: one import root: runtime/ is coterie.runtime, and so on.
PACKAGES = ("runtime", "tools", "actors", "coterie")


def installed_name(top: str) -> str:
    return top if top == "coterie" else f"coterie.{top}"


def modules() -> dict[str, Path]:
    """Every module of the import packages, by its installed dotted name."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT / top).with_suffix("").parts
            name = ".".join((installed_name(top), *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def folder_of(path: Path) -> str:
    """The repository folder a module's file sits in (runtime, tools, actors, coterie)."""
    return path.relative_to(ROOT).parts[0]


def room(path: Path) -> str:
    """A module's room: its folder below a top folder (runtime/audit), or the
    file itself when it sits in a top folder (runtime/errors.py)."""
    rel = path.relative_to(ROOT)
    if len(rel.parts) > 2:
        return "/".join(rel.parts[:2])
    return rel.parts[0] if rel.name == "__init__.py" else str(rel.with_suffix(""))


def imported_names(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for each import in a module, anywhere in
    it (function-level included); a plain ``import x`` takes no names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.append((module, [alias.name for alias in node.names]))
    return out


def imports_of(path: Path, name: str) -> set[str]:
    """Dotted names a module imports, anywhere in it (function-level included)."""
    out: set[str] = set()
    for module, names in imported_names(path, name):
        out.add(module)
        out.update(f"{module}.{n}" for n in names)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (anywhere in it).

    ``from package import submodule`` is an edge to the submodule, not to
    the package's __init__; ``from package import name`` is one to the
    __init__ (or to the module the name is defined in, when the package is
    a module)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for module, names in imported_names(path, name):
            wanted = [f"{module}.{n}" for n in names if f"{module}.{n}" in mods]
            if len(wanted) < len(names) or not names:
                wanted.append(module)
            for imported in wanted:
                while imported and imported not in mods:
                    imported = imported.rpartition(".")[0]
                if imported and imported != name:
                    targets.add(imported)
        graph[name] = targets
    return graph


def test_every_import_goes_through_the_one_root() -> None:
    """`import runtime` would load a second copy of a module (or another
    distribution's `runtime`): every import of ours is spelled coterie.…"""
    bare = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        for imported in imports_of(path, name)
        if imported.split(".")[0] in ("runtime", "tools", "actors")
    ]
    assert bare == []
    for folder in ("tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            tops = {n.split(".")[0] for n in imports_of(path, f"{folder}.{path.stem}")}
            assert not tops & {"runtime", "tools", "actors"}, path


def test_layering_has_no_back_edges_or_cycles() -> None:
    mods = modules()
    below = {"runtime": {"tools", "actors", "coterie"}, "tools": {"actors", "coterie"}}
    below["actors"] = {"coterie"}
    graph = import_graph()
    broken = [
        f"{name} imports {target}"
        for name, targets in graph.items()
        for target in targets
        if folder_of(mods[target]) in below.get(folder_of(mods[name]), set())
    ]
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


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_strongly_connected_finds_a_knot_and_leaves_a_chain() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    knot = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert strongly_connected(knot) == [{"a", "b", "c"}]


def test_no_import_cycles_between_folders() -> None:
    """A folder (or a file at the top of runtime/, tools/, actors/, coterie/)
    is a concept: when two import each other, even through others, one is in
    the wrong place. A package's __init__ is its folder's room."""
    mods = modules()
    rooms: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        mine = room(mods[name])
        theirs = {room(mods[t]) for t in targets} - {mine}
        rooms.setdefault(mine, set()).update(theirs)
    assert strongly_connected(rooms) == []


#: What of tests/ the benchmarks may import: the test equipment (fake protocol
#: servers, recall datasets), which is not product and so lives outside the wheel.
TEST_EQUIPMENT = ("tests.fakes", "tests.recall")


def is_equipment(module: str) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in TEST_EQUIPMENT)


def test_benchmarks_import_only_the_test_equipment() -> None:
    """The benchmarks measure against the very fake servers and datasets the
    tests check, so the two cannot drift apart; those live in tests/fakes and
    tests/recall. Nothing else of tests/: a test module, conftest or helpers
    would bring pytest and fixtures into a benchmark, and a change to a test
    could break a benchmark."""
    for path in (ROOT / "benchmarks").glob("*.py"):
        ours = [
            name
            for name in imports_of(path, f"benchmarks.{path.stem}")
            if name.split(".")[0] == "tests"
        ]
        assert all(is_equipment(name) for name in ours), (path, ours)


def test_the_test_equipment_stands_alone() -> None:
    """What the benchmarks may import imports nothing else of tests/ and no
    pytest, so importing it never loads a test."""
    for package in TEST_EQUIPMENT:
        for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            imported = imports_of(path, name.removesuffix(".__init__"))
            tops = {n.split(".")[0] for n in imported}
            assert not tops & {"pytest", "_pytest"}, path
            strays = [n for n in imported if n.split(".")[0] == "tests" and not is_equipment(n)]
            assert strays == [], (path, strays)


def loaded_by(imports: str, libraries: tuple[str, ...]) -> list[str]:
    """Which of ``libraries`` a fresh interpreter has loaded after ``import {imports}``."""
    code = f"import sys, {imports}\nprint(','.join(m for m in {libraries!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_importing_the_core_loads_no_heavy_library() -> None:
    core = ", ".join(
        f"coterie.runtime{sub}"
        for sub in ("", ".audit", ".memory", ".shell", ".routing", ".models")
    )
    heavy = ("ray", "duckdb", "pyarrow", "lancedb", "torch", "sentence_transformers")
    assert (
        loaded_by(
            f"{core}, coterie.tools, coterie", (*heavy, "openai", "anthropic", "aiohttp", "bs4")
        )
        == []
    )


def test_a_persona_process_loads_no_library_before_it_needs_it() -> None:
    """What a starting persona's process imports costs every one of a hundred
    starts and stays in its memory: the SDKs wait for the first turn, DuckDB
    and LanceDB stay in their actors, pathspec waits for the first .gitignore
    a file tool walks, croniter (and dateutil) for the first cron expression
    read, difflib for the edit tool's first fuzzy match."""
    later = ("openai", "anthropic", "mcp", "duckdb", "pyarrow", "lancedb", "torch", "pathspec")
    # The ACP SDK waits for a coding agent's session (runtime.delegation.acp loads it lazily).
    rare = ("acp", "bs4", "croniter", "dateutil", "difflib")
    # Ray imports an actor's class wherever a handle to it is made: a persona
    # holds the router's, the audit log's and the memory store's; the
    # scheduler's it makes at its first fire or reminder (test_named_actor_proxy).
    handles = ", ".join(f"coterie.actors.{a}" for a in ("router", "audit", "memory"))
    scheduler = (
        "coterie.actors.scheduler",
        "coterie.runtime.fires",
        *(f"coterie.runtime.schedule.{m}" for m in ("engine", "store", "service", "clock")),
    )
    assert loaded_by(f"coterie.actors.persona, {handles}", (*later, *rare, *scheduler)) == []


def test_the_schedule_package_offers_every_name_it_lists() -> None:
    """Its names load with their modules on first use: each one it lists resolves."""
    import importlib

    import coterie.runtime.schedule as schedule

    assert sorted(schedule.__all__) == sorted(schedule._LAZY)
    for name in schedule.__all__:
        module = importlib.import_module(f"coterie.runtime.schedule.{schedule._LAZY[name]}")
        assert getattr(schedule, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        schedule.Nope  # noqa: B018


def test_the_lean_serialization_module_loads_nothing_of_coteries() -> None:
    """coterie.actors._lean runs first in every actor's process (and the
    benchmarks build floors with it): it must not load coterie's modules
    before it (the coterie and coterie.actors packages' own __init__ aside)."""
    ours = ("coterie.runtime", "coterie.tools", "coterie.actors._ray", "coterie.actors.persona")
    assert loaded_by("coterie.actors._lean", ours) == []


def test_holding_a_memory_store_handle_loads_no_store() -> None:
    """A persona holds a handle to the MemoryStore actor, and Ray loads the
    actor's class to make one: that must not bring the store, the embedders
    or their choice into every persona's process."""
    store_side = (
        "coterie.runtime.memory.store",
        "coterie.runtime.memory._lance",
        "coterie.runtime.memory.choice",
        "coterie.runtime.memory.embedders",
        "coterie.runtime.memory.chunking",
    )
    assert loaded_by("coterie.actors.persona, coterie.actors.memory", store_side) == []


def test_every_package_is_listed_for_packaging() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join((installed_name(top), *init.parent.relative_to(ROOT / top).parts))
        for top in PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert listed == found | {"coterie.configs"}
    assert {name.split(".")[0] for name in listed} == {"coterie"}


def test_error_kinds_are_one_vocabulary_listed_in_the_guide() -> None:
    # Every kind a tool or the runner can report is in ErrorKind…
    spelled: set[str] = set()
    for path in [*(ROOT / "runtime").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        spelled |= set(re.findall(r'(?:ToolError|error_result)\(\s*"([a-z0-9_]+)"', text))
    assert spelled and spelled <= ERROR_KINDS, spelled - ERROR_KINDS
    # …and the guide's reliability page lists each of them.
    page = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = page.split("\n## Error kinds\n", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.MULTILINE))
    assert listed == ERROR_KINDS


def test_tool_error_refuses_a_kind_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="invalid_input"):
        ToolError("invalid_input", "x")  # type: ignore[arg-type]
    assert ToolError("invalid_arguments", "x").kind == "invalid_arguments"
