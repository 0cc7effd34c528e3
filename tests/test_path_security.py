"""Generated path escapes and malformed paths: every one is refused with a
ToolError, and nothing outside the rails is created or changed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.tool import ToolSpec
from coterie.tools import files as F
from coterie.tools._paths import Target, resolve_path, workspace_path
from tests.helpers import make_ctx

# The real writer, taken before any test wraps it.
_REAL_WRITE = F._atomic_write


def snapshot(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every path under ``root`` with its bytes and mtime (None for folders)."""
    out: dict[str, tuple[bytes, int] | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.join(dirpath, name)] = None
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(p)] = (os.readlink(p).encode(), 0)
            else:
                out[str(p)] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


class World:
    """A home with two personas, secrets and an outside tree, plus links out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.me = self.home / "personas" / "tester"
        self.ws = self.me / "workspace"
        self.other = self.home / "personas" / "other"
        self.outside = root / "outside"
        self.systmp = root / "systmp"
        for d in (self.ws / "sub", self.other / "workspace", self.outside, self.systmp):
            d.mkdir(parents=True)
        (self.other / "workspace" / "notes.txt").write_text("other's notes\n")
        (self.other / "persona.yaml").write_text("model: {}\n")
        (self.outside / "passwd").write_text("root:x:0:0\n")
        (self.home / "config.yaml").write_text("secret: 1\n")
        (self.me / ".env").write_text("KEY=1\n")
        (self.ws / ".env").write_text("KEY=2\n")
        (self.ws / "sub" / ".env.local").write_text("KEY=3\n")
        (self.ws / "ok.txt").write_text("fine\n")
        (self.ws / "out_dir").symlink_to(self.outside, target_is_directory=True)
        (self.ws / "out_file").symlink_to(self.outside / "passwd")
        (self.ws / "other_link").symlink_to(self.other, target_is_directory=True)
        (self.ws / "env_link").symlink_to(self.ws / ".env")
        (self.ws / "loop").symlink_to(self.ws / "loop")

    def ctx(self, access: str) -> TurnContext:
        return make_ctx(
            settings=TurnSettings(
                workspace=self.ws, persona_dir=self.me, home=self.home, access=access
            )
        )


@contextlib.contextmanager
def writes_confined_to(root: Path) -> Iterator[None]:
    """A regression in the rails must fail the test, not write to /etc: while
    this is active every write goes through a guard that only lets paths
    under ``root``."""

    def guarded(ctx: TurnContext, target: Target, data: bytes, *rest: Any) -> Any:
        for path in (target.path, target.root.joinpath(*target.parts)):
            if not path.resolve().is_relative_to(root.resolve()):
                raise AssertionError(f"a write escaped the test world: {path}")
        return _REAL_WRITE(ctx, target, data, *rest)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "_atomic_write", guarded)
        yield


@contextlib.contextmanager
def system_tempdir(path: Path) -> Iterator[None]:
    """``tempfile.gettempdir()`` answers ``path`` (personas' temp roots live there)."""
    old = tempfile.tempdir
    tempfile.tempdir = str(path)
    try:
        yield
    finally:
        tempfile.tempdir = old


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("rails"))
    with writes_confined_to(w.root):
        yield w


NAMES = st.sampled_from(["etc", "passwd", "x.txt", "other", "home", "ünï", "日本", "a b", "..."])
WEIRD = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/\x00"),
    min_size=1,
    max_size=12,
)


def escapes(world: World) -> st.SearchStrategy[str]:
    """Paths that must never be allowed, for reads or writes."""
    up = st.integers(min_value=3, max_value=12).map(lambda n: "../" * n)
    tail = st.lists(st.one_of(NAMES, WEIRD), min_size=0, max_size=3).map("/".join)
    other = str(world.other)
    return st.one_of(
        # `..` chains out of the persona directory (3+ levels from workspace).
        st.builds(lambda u, t: u + t, up, tail),
        st.builds(lambda t: f"sub/../../../{t}", tail),
        st.builds(lambda t: f"../../other/{t}", tail),
        # Absolute paths to system files, other personas and outside trees.
        st.builds(lambda t: f"/etc/{t}", tail),
        st.sampled_from(["/etc/passwd", "/", "/root", "/proc/self/environ", str(world.home)]),
        st.builds(lambda t: f"{other}/{t}", tail),
        st.builds(lambda t: f"{world.outside}/{t}", tail),
        st.builds(lambda t: f"{world.systmp}/{t}", tail),
        st.builds(lambda t: f"{world.systmp}/coterie-other/{t}", tail),
        st.builds(lambda t: f"~/{t}", tail),
        # Symlinks that point out of the rails.
        st.builds(lambda link, t: f"{link}/{t}", st.sampled_from(["out_dir", "other_link"]), tail),
        st.sampled_from(["out_file", "out_dir", "other_link", "env_link", "loop", "loop/x"]),
        # .env files in any directory, ours included.
        st.builds(
            lambda d, n: f"{d}/{n}".lstrip("/"),
            st.sampled_from(["", "sub", "sub/deeper", str(world.me), str(world.ws), ".."]),
            st.sampled_from([".env", ".env.local", ".env.production"]),
        ),
        # Malformed: NUL bytes, control characters, huge names, empty.
        st.builds(lambda a, b: f"{a}\x00{b}", tail, tail),
        st.builds(lambda a, c: f"{a}{c}x", tail, st.sampled_from(["\n", "\r", "\x1b", "\x7f"])),
        st.integers(min_value=256, max_value=600).map(lambda n: "a" * n),
        st.integers(min_value=4097, max_value=5000).map(lambda n: "ab/" * (n // 3 + 1)),
        st.sampled_from(["", "   ", "\t"]),
    )


def run_tool(name: str, ctx: TurnContext, path: str) -> Any:
    table: dict[str, tuple[ToolSpec, dict[str, Any]]] = {
        "file_read": (F.file_read, {"path": path}),
        "file_write": (F.file_write, {"path": path, "content": "pwned\n", "overwrite": True}),
        "file_edit": (F.file_edit, {"path": path, "old_text": "root", "new_text": "pwned"}),
        "file_list": (F.file_list, {"path": path, "depth": 3}),
        "glob": (F.glob, {"pattern": "**/*", "path": path}),
        "grep": (F.grep, {"pattern": ".", "path": path}),
    }
    spec, args = table[name]

    async def go() -> Any:
        return await spec.fn(spec.args_model(**args), ctx)

    return asyncio.run(go())


TOOLS = st.sampled_from(["file_read", "file_write", "file_edit", "file_list", "glob", "grep"])
ACCESS = st.sampled_from(["full", "workspace", "readonly"])


def test_generated_escapes_are_refused(world: World) -> None:
    with system_tempdir(world.systmp):
        before = snapshot(world.root)
        seen: list[str] = []

        @settings(
            max_examples=300,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(path=escapes(world), tool=TOOLS, access=ACCESS)
        def check(path: str, tool: str, access: str) -> None:
            seen.append(path)
            ctx = world.ctx(access)
            with pytest.raises(ToolError) as info:
                run_tool(tool, ctx, path)
            assert info.value.kind in {"path_denied", "invalid_path"}, (path, info.value)
            with pytest.raises(ToolError):
                resolve_path(ctx, path, write=False)

        check()
        assert len(seen) >= 100
        assert snapshot(world.root) == before


def test_writes_outside_workspace_refused_unless_full(world: World, tmp_path: Path) -> None:
    def targets(w: World) -> list[str]:
        """Outside the workspace, inside the allowed roots: the persona's own
        directory (relative and absolute) and its temp directory."""
        return ["../notes.md", str(w.me / "persona.yaml"), str(w.systmp / "coterie-tester" / "x")]

    with system_tempdir(world.systmp):
        before = snapshot(world.root)
        # Every combination, not a sample of them.
        for target, access, tool in itertools.product(
            targets(world), ["workspace", "readonly"], ["file_write", "file_edit"]
        ):
            with pytest.raises(ToolError) as info:
                run_tool(tool, world.ctx(access), target)
            assert info.value.kind == "path_denied", (target, access, tool)
        assert snapshot(world.root) == before

    # Full access writes there. A world of its own, so the shared world stays
    # exactly as every other test's snapshot expects it.
    full = World(tmp_path / "full")
    soul = full.me / "SOUL.md"
    soul.write_text("root of me\n")
    with writes_confined_to(full.root), system_tempdir(full.systmp):
        before = snapshot(full.root)
        ctx = full.ctx("full")
        notes, persona_yaml, scratch = targets(full)
        written = [
            (notes, full.me / "notes.md"),
            (persona_yaml, full.me / "persona.yaml"),
            (scratch, full.systmp / "coterie-tester" / "x"),
        ]
        for raw, path in written:
            out = run_tool("file_write", ctx, raw)
            assert out == f"wrote {path.resolve()} (6 bytes, 1 lines)"
            assert path.read_text() == "pwned\n"
        out = run_tool("file_edit", ctx, str(soul))
        assert out == f"edited {soul.resolve()} (exact match, line 1)"
        assert soul.read_text() == "pwned of me\n"
        after = snapshot(full.root)
    # Those files, the temp folder and the edit; nothing else changed.
    new = {str(path) for _, path in written} | {str(full.systmp / "coterie-tester")}
    assert set(after) - set(before) == new
    assert set(before) - set(after) == set()
    assert {k for k in before if before[k] != after[k]} == {str(soul)}


def test_inside_paths_still_work(world: World) -> None:
    ctx = world.ctx("readonly")
    assert resolve_path(ctx, "ok.txt", write=False) == (world.ws / "ok.txt").resolve()
    assert resolve_path(ctx, "../SOUL.md", write=False) == (world.me / "SOUL.md").resolve()
    assert workspace_path(ctx, "sub/../ok.txt") == (world.ws / "ok.txt").resolve()
    with pytest.raises(ToolError):
        workspace_path(ctx, "../SOUL.md")
