"""The file tools: happy paths, caps and the errors the model reads."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.tool import ToolRegistry, ToolSpec
from coterie.tools import files as F
from tests.helpers import make_ctx


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sys-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "sys-tmp"))


def ctx_for(tmp_path: Path, access: str = "workspace") -> TurnContext:
    ws = tmp_path / "home" / "personas" / "tester" / "workspace"
    ws.mkdir(parents=True, exist_ok=True)
    return make_ctx(
        settings=TurnSettings(
            workspace=ws, persona_dir=ws.parent, home=tmp_path / "home", access=access
        )
    )


def ws(ctx: TurnContext) -> Path:
    assert ctx.settings.workspace is not None
    return ctx.settings.workspace


async def call(spec: ToolSpec, ctx: TurnContext, **args: Any) -> str:
    return str(await spec.fn(spec.args_model(**args), ctx))


async def error(spec: ToolSpec, ctx: TurnContext, **args: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        await call(spec, ctx, **args)
    return info.value


# --- file_read -----------------------------------------------------------


async def test_read_numbered_with_offset_and_limit(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (ws(ctx) / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = await call(F.file_read, ctx, path="a.txt")
    assert out.splitlines()[0] == " 1\tline 1" and out.splitlines()[-1] == "10\tline 10"
    out = await call(F.file_read, ctx, path="a.txt", offset=3, limit=2)
    assert out.splitlines() == [
        "3\tline 3",
        "4\tline 4",
        "[showing lines 3–4 of 10; continue with offset=5]",
    ]


async def test_read_caps(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (ws(ctx) / "long.txt").write_text("x" * 5000 + "\nshort\n")
    out = await call(F.file_read, ctx, path="long.txt")
    assert out.splitlines() == [
        "1\t" + "x" * F.READ_MAX_LINE_CHARS + "… [line cut: 5000 chars]",
        "2\tshort",
        f"[1 line(s) longer than {F.READ_MAX_LINE_CHARS} chars were cut]",
    ]
    (ws(ctx) / "big.txt").write_text(("y" * 1000 + "\n") * 500)
    out = await call(F.file_read, ctx, path="big.txt")
    # Each numbered line is "NNN\t" + 1,000 chars + a newline = 1,005: 99 of
    # them fit in the output cap (99,495), a 100th would not (100,500).
    lines = out.splitlines()
    assert len(lines) == 100 and len(out) <= F.READ_MAX_OUTPUT_CHARS
    assert lines[0] == "  1\t" + "y" * 1000 and lines[98] == " 99\t" + "y" * 1000
    assert lines[-1] == "[showing lines 1–99 of 500; continue with offset=100]"
    limited = await call(F.file_read, ctx, path="big.txt", limit=5)
    assert limited.splitlines() == [
        *(f"{i}\t" + "y" * 1000 for i in range(1, 6)),
        "[showing lines 1–5 of 500; continue with offset=6]",
    ]


async def test_read_errors(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (ws(ctx) / "bin.dat").write_bytes(b"\x89PNG\x00\x01\x02")
    (ws(ctx) / "latin.txt").write_bytes("café".encode("latin-1"))
    (ws(ctx) / "sub").mkdir()
    (ws(ctx) / "one.txt").write_text("one\n")
    assert (await error(F.file_read, ctx, path="bin.dat")).kind == "binary_file"
    err = await error(F.file_read, ctx, path="latin.txt")
    assert err.kind == "not_utf8" and "offset 3" in err.detail
    assert (await error(F.file_read, ctx, path="sub")).kind == "is_directory"
    assert (await error(F.file_read, ctx, path="missing.txt")).kind == "not_found"
    assert (await error(F.file_read, ctx, path="one.txt", offset=5)).kind == "invalid_arguments"
    (ws(ctx) / "empty.txt").write_text("")
    assert await call(F.file_read, ctx, path="empty.txt") == "(empty file)"


async def test_read_persona_dir_and_temp_by_absolute_path(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, access="readonly")
    assert ctx.settings.persona_dir is not None
    (ctx.settings.persona_dir / "SOUL.md").write_text("You are tester.\n")
    out = await call(F.file_read, ctx, path=str(ctx.settings.persona_dir / "SOUL.md"))
    assert "You are tester." in out
    scratch = Path(tempfile.gettempdir()) / "coterie-tester"
    scratch.mkdir()
    (scratch / "n.txt").write_text("note\n")
    assert "note" in await call(F.file_read, ctx, path=str(scratch / "n.txt"))


# --- file_write ----------------------------------------------------------


async def test_write_creates_parents_and_refuses_overwrite(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    out = await call(F.file_write, ctx, path="a/b/c.txt", content="hi\nthere\n")
    assert out == "wrote a/b/c.txt (9 bytes, 2 lines)"
    err = await error(F.file_write, ctx, path="a/b/c.txt", content="new")
    assert err.kind == "already_exists" and "overwrite" in err.detail
    assert (ws(ctx) / "a/b/c.txt").read_text() == "hi\nthere\n"
    out = await call(F.file_write, ctx, path="a/b/c.txt", content="new", overwrite=True)
    assert out == "overwrote a/b/c.txt (3 bytes, 1 lines)"
    assert (ws(ctx) / "a/b/c.txt").read_text() == "new"
    # No temp files left behind.
    assert sorted(p.name for p in (ws(ctx) / "a/b").iterdir()) == ["c.txt"]


async def test_write_caps_and_errors(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    err = await error(F.file_write, ctx, path="huge.txt", content="x" * (F.WRITE_MAX_BYTES + 1))
    assert err.kind == "too_large"
    assert not (ws(ctx) / "huge.txt").exists()
    (ws(ctx) / "d").mkdir()
    assert (await error(F.file_write, ctx, path="d", content="x")).kind == "is_directory"
    (ws(ctx) / "f").write_text("file")
    assert (await error(F.file_write, ctx, path="f/x.txt", content="x")).kind == "invalid_path"


async def test_workspace_access_refuses_writes_outside_workspace(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, access="workspace")
    assert ctx.settings.persona_dir is not None
    target = ctx.settings.persona_dir / "persona.yaml"
    err = await error(F.file_write, ctx, path=str(target), content="x")
    assert err.kind == "path_denied" and not target.exists()
    err = await error(F.file_write, ctx, path="../notes.md", content="x")
    assert err.kind == "path_denied"


async def test_full_access_writes_persona_dir_and_temp(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, access="full")
    assert ctx.settings.persona_dir is not None
    await call(F.file_write, ctx, path=str(ctx.settings.persona_dir / "notes.md"), content="n")
    assert (ctx.settings.persona_dir / "notes.md").read_text() == "n"
    scratch = Path(tempfile.gettempdir()) / "coterie-tester" / "s.txt"
    await call(F.file_write, ctx, path=str(scratch), content="s")
    assert scratch.read_text() == "s"


async def test_readonly_hides_write_tools_and_refuses_writes(tmp_path: Path) -> None:
    registry = ToolRegistry(F.FILE_TOOLS)
    ro = ctx_for(tmp_path, access="readonly")
    assert sorted(registry.visible(ro)) == ["file_list", "file_read", "glob", "grep"]
    rw = ctx_for(tmp_path, access="workspace")
    assert "file_write" in registry.visible(rw) and "file_edit" in registry.visible(rw)
    assert (await error(F.file_write, ro, path="x.txt", content="x")).kind == "path_denied"
    assert not (ws(ro) / "x.txt").exists()


def test_read_only_tools_allow_repeat() -> None:
    assert F.file_read.allow_repeat and F.glob.allow_repeat and F.grep.allow_repeat
    assert F.file_list.allow_repeat and not F.file_write.allow_repeat


# --- file_list -----------------------------------------------------------


async def test_list_depth_sorted_dirs_marked(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    for rel in ["b.txt", "a/x.txt", "a/deep/y.txt", ".git/HEAD"]:
        (ws(ctx) / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws(ctx) / rel).write_text("x")
    out = await call(F.file_list, ctx)
    assert out.splitlines() == ["./", "a/", "b.txt"]
    out = await call(F.file_list, ctx, depth=5)
    assert out.splitlines() == ["./", "a/", "a/deep/", "a/deep/y.txt", "a/x.txt", "b.txt"]
    assert (await error(F.file_list, ctx, path="b.txt")).kind == "not_a_directory"
    assert (await error(F.file_list, ctx, path="nope")).kind == "not_found"


async def test_list_cap(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    for i in range(F.LIST_MAX_ENTRIES + 20):
        (ws(ctx) / f"f{i:04}").write_text("")
    out = await call(F.file_list, ctx)
    lines = out.splitlines()
    # The header, exactly the cap of entries (the first 500 by name), the note.
    assert len(lines) == 1 + F.LIST_MAX_ENTRIES + 1
    assert lines[0] == "./" and lines[1] == "f0000"
    assert lines[-2] == f"f{F.LIST_MAX_ENTRIES - 1:04}"
    assert lines[-1] == (
        f"[listing cut at {F.LIST_MAX_ENTRIES} entries; use glob or a lower depth]"
    )


# --- glob and grep -------------------------------------------------------


def tree(ctx: TurnContext) -> None:
    files = {
        ".gitignore": "build/\n*.log\n",
        "src/app.py": "import os\nprint('hello')\n",
        "src/util.py": "def hello():\n    return 1\n",
        "src/web/page.ts": "// hello from ts\n",
        "build/out.py": "print('hello')\n",
        "debug.log": "hello log\n",
        "README.md": "Hello readme\n",
        "src/sub/.gitignore": "secret_*.py\n",
        "src/sub/secret_a.py": "hello hidden\n",
        "src/sub/keep.py": "hello kept\n",
    }
    for rel, text in files.items():
        (ws(ctx) / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws(ctx) / rel).write_text(text)
    (ws(ctx) / "src/blob.bin").write_bytes(b"hello\x00\x01")
    (ws(ctx) / ".env").write_text("TOKEN=hello\n")


async def test_glob_respects_gitignore_sorted(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    tree(ctx)
    out = await call(F.glob, ctx, pattern="**/*.py")
    assert out.splitlines() == ["src/app.py", "src/sub/keep.py", "src/util.py"]
    out = await call(F.glob, ctx, pattern="src/*.{py,ts}")
    assert out.splitlines() == ["src/app.py", "src/util.py"]
    out = await call(F.glob, ctx, pattern="*.py", path="src")
    assert out.splitlines() == ["app.py", "util.py"]
    assert "No files match" in await call(F.glob, ctx, pattern="*.rs")


async def test_glob_cap(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    for i in range(F.GLOB_MAX_RESULTS + 5):
        (ws(ctx) / f"f{i:04}.txt").write_text("")
    out = await call(F.glob, ctx, pattern="*.txt")
    lines = out.splitlines()
    assert len(lines) == F.GLOB_MAX_RESULTS + 1
    assert lines[-2] == f"f{F.GLOB_MAX_RESULTS - 1:04}.txt"
    assert lines[-1] == f"[results cut at {F.GLOB_MAX_RESULTS}; narrow the pattern]"


async def test_grep_gitignore_binaries_and_secrets(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    tree(ctx)
    out = await call(F.grep, ctx, pattern="hello")
    assert out.splitlines() == [
        "src/app.py:2: print('hello')",
        "src/sub/keep.py:1: hello kept",
        "src/util.py:1: def hello():",
        "src/web/page.ts:1: // hello from ts",
    ]
    out = await call(F.grep, ctx, pattern="HELLO", ignore_case=True, include="*.md")
    assert out == "README.md:1: Hello readme"
    out = await call(F.grep, ctx, pattern="hello", path="src/app.py")
    assert out == "app.py:2: print('hello')"
    out = await call(F.grep, ctx, pattern="hello", max_results=2)
    assert out.splitlines() == [
        "src/app.py:2: print('hello')",
        "src/sub/keep.py:1: hello kept",
        "[results cut at 2; narrow the pattern, path or include]",
    ]
    assert (await error(F.grep, ctx, pattern="(")).kind == "invalid_arguments"


async def test_grep_skips_symlinks_out(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("hello secret\n")
    (ws(ctx) / "link.txt").symlink_to(outside)
    assert "No matches" in await call(F.grep, ctx, pattern="secret")
