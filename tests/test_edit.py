"""The file_edit engine: exact matching, the tolerant matcher chain, line
endings, and serialized edits of one file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.tools._edit import edit_text, replace
from coterie.tools.files import FileEditArgs, file_edit
from tests.helpers import make_ctx


def kind_of(fn: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(ToolError) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    return info.value.kind


# --- exact ---------------------------------------------------------------


def test_exact_unique() -> None:
    r = replace("a = 1\nb = 2\n", "b = 2", "b = 3")
    assert (r.text, r.matcher, r.start_line, r.end_line) == ("a = 1\nb = 3\n", "exact", 2, 2)


def test_exact_ambiguous_says_how_many() -> None:
    with pytest.raises(ToolError) as info:
        replace("x\nx\nx\n", "x", "y")
    assert info.value.kind == "ambiguous_match"
    assert "3 times" in info.value.detail and "replace_all" in info.value.detail


def test_replace_all_lifts_uniqueness() -> None:
    r = replace("x\nx\nx\n", "x", "y", replace_all=True)
    assert r.text == "y\ny\ny\n" and r.count == 3


def test_empty_and_identical_refused() -> None:
    assert kind_of(replace, "abc", "", "x") == "invalid_arguments"
    assert kind_of(replace, "abc", "b", "b") == "invalid_arguments"


def test_not_found() -> None:
    assert kind_of(replace, "alpha\nbeta\n", "gamma", "delta") == "not_found"


# --- tolerant matchers ---------------------------------------------------


def test_line_trimmed() -> None:
    content = "def f():\n    x = 1   \n    return x\n"
    r = replace(content, "x = 1\n    return x", "x = 2\n    return x")
    assert r.matcher == "line-trimmed"
    assert r.text == "def f():\n    x = 2\n    return x\n"
    assert (r.start_line, r.end_line) == (2, 3)


def test_indentation_flexible_reindents_replacement() -> None:
    content = "class A:\n    def f(self):\n        if x:\n            return 1\n"
    old = "if x:\n    return 1"
    new = "if x:\n    return 2\nreturn 3"
    r = replace(content, old, new)
    assert r.matcher == "indentation-flexible"
    assert r.text == (
        "class A:\n    def f(self):\n        if x:\n            return 2\n        return 3\n"
    )


def test_block_anchor() -> None:
    content = "start()\nalpha = compute(1, 2)\nbeta = other(3)\nfinish()\ntail\n"
    old = "start()\nalpha = compute(1,2)\nbeta = othr(3)\nfinish()"
    r = replace(content, old, "replaced()")
    assert r.matcher == "block-anchor"
    assert r.text == "replaced()\ntail\n"
    assert (r.start_line, r.end_line) == (1, 4)


def test_block_anchor_needs_similar_middle() -> None:
    content = "start()\ncompletely different stuff here\nfinish()\n"
    old = "start()\nxyz = 42 # nothing alike\nfinish()"
    assert kind_of(replace, content, old, "z") == "not_found"


def test_block_anchor_only_for_three_lines_or_more() -> None:
    # Two lines with a different second line: no anchors to hold on to.
    assert kind_of(replace, "a()\nb()\n", "a()\nc()", "z") == "not_found"


def test_whitespace_normalized() -> None:
    content = "call(a,   b,\tc)\n"
    r = replace(content, "call(a, b, c)", "call(a, b)")
    assert r.matcher == "whitespace-normalized"
    assert r.text == "call(a, b)\n"


def test_escape_normalized() -> None:
    content = 'print("hi")\nsay("there")\n'
    r = replace(content, 'print(\\"hi\\")\\nsay(\\"there\\")', 'print(\\"bye\\")')
    assert r.matcher == "escape-normalized"
    assert r.text == 'print("bye")\n'


def test_trimmed_boundary() -> None:
    content = "f(two)\n"
    r = replace(content, "\n  two\n", "\n  2\n")
    assert r.matcher == "trimmed-boundary"
    assert r.text == "f(2)\n"


def test_tolerant_ambiguity_names_matcher_and_count() -> None:
    content = "if a:\n    go()\nif b:\n    go()\n"
    with pytest.raises(ToolError) as info:
        replace(content, "  go()  ", "stop()")
    assert info.value.kind == "ambiguous_match"
    assert "line-trimmed" in info.value.detail and "2 candidates" in info.value.detail


def test_block_anchor_ambiguity() -> None:
    block = "begin\nvalue = 1\nend\n"
    content = block + "middle\n" + block.replace("1", "2")
    with pytest.raises(ToolError) as info:
        replace(content, "begin\nvalue = 3\nend", "x")
    assert info.value.kind == "ambiguous_match" and "block-anchor" in info.value.detail


def test_disproportionate_block_refused() -> None:
    middle = "\n".join(f"line {i}" for i in range(10))
    content = f"begin\n{middle}\nend\n"
    # Three lines of old_text whose anchors enclose twelve lines.
    old = "begin\nline 0 line 1 line 2 line 3 line 4 line 5 line 6 line 7 line 8 line 9\nend"
    with pytest.raises(ToolError) as info:
        replace(content, old, "x")
    # Block-anchor finds begin…end (the middles are similar once stripped),
    # but twelve lines for three is more than 2×: refused, not replaced.
    assert info.value.kind == "disproportionate_match"
    assert info.value.detail.startswith("the block-anchor match spans lines 1–12 (12 lines)")
    assert "old_text of 3 line(s)" in info.value.detail
    # Whitespace-normalized finds "a b" across nine lines: more than 2× of 1.
    content2 = "a\n\n\n\n\n\n\n\nb\n"
    with pytest.raises(ToolError) as info2:
        replace(content2, "a b", "c")
    assert info2.value.kind == "disproportionate_match"
    assert info2.value.detail.startswith(
        "the whitespace-normalized match spans lines 1–9 (9 lines)"
    )
    assert "old_text of 1 line(s)" in info2.value.detail


# --- line endings and BOM ------------------------------------------------


def test_crlf_preserved() -> None:
    raw = "one\r\ntwo\r\nthree\r\n"
    r = edit_text(raw, "two\nthree", "2\n3")
    assert r.text == "one\r\n2\r\n3\r\n"


def test_crlf_old_text_matches_too() -> None:
    r = edit_text("a\r\nb\r\n", "a\r\nb", "c")
    assert r.text == "c\r\n"


def test_bom_preserved() -> None:
    raw = "\ufefffirst\nsecond\n"
    r = edit_text(raw, "first", "1st")
    assert r.text == "\ufeff1st\nsecond\n"


def test_lf_file_stays_lf() -> None:
    assert edit_text("a\nb\n", "a", "x\ny").text == "x\ny\nb\n"


# --- through the tool ----------------------------------------------------


def ctx_for(tmp_path: Path) -> TurnContext:
    ws = tmp_path / "personas" / "tester" / "workspace"
    ws.mkdir(parents=True, exist_ok=True)
    return make_ctx(
        settings=TurnSettings(
            workspace=ws, persona_dir=ws.parent, home=tmp_path, access="workspace"
        )
    )


async def test_tool_reports_matcher_and_lines(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    assert ctx.settings.workspace is not None
    (ctx.settings.workspace / "x.py").write_text("a\n    b  \nc\n")
    out = await file_edit.fn(FileEditArgs(path="x.py", old_text="b", new_text="B"), ctx)
    assert out == "edited x.py (exact match, line 2)"
    out = await file_edit.fn(FileEditArgs(path="x.py", old_text="B\nc", new_text="q\nr"), ctx)
    assert out == "edited x.py (line-trimmed match, lines 2–3)"
    assert (ctx.settings.workspace / "x.py").read_text() == "a\n    q\nr\n"


async def test_tool_keeps_crlf_and_bom_on_disk(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    assert ctx.settings.workspace is not None
    path = ctx.settings.workspace / "w.txt"
    path.write_bytes(b"\xef\xbb\xbfhello\r\nworld\r\n")
    await file_edit.fn(FileEditArgs(path="w.txt", old_text="world", new_text="there"), ctx)
    assert path.read_bytes() == b"\xef\xbb\xbfhello\r\nthere\r\n"


async def test_tool_missing_file(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    with pytest.raises(ToolError) as info:
        await file_edit.fn(FileEditArgs(path="nope.txt", old_text="a", new_text="b"), ctx)
    assert info.value.kind == "not_found"


async def test_failed_edit_leaves_file_alone(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    assert ctx.settings.workspace is not None
    path = ctx.settings.workspace / "d.txt"
    path.write_text("x\nx\n")
    with pytest.raises(ToolError):
        await file_edit.fn(FileEditArgs(path="d.txt", old_text="x", new_text="y"), ctx)
    assert path.read_text() == "x\nx\n"
    assert sorted(p.name for p in ctx.settings.workspace.iterdir()) == ["d.txt"]


async def test_concurrent_edits_to_one_file_are_serialized(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    assert ctx.settings.workspace is not None
    path = ctx.settings.workspace / "many.txt"
    n = 30
    path.write_text("".join(f"item{i}\n" for i in range(n)))
    calls = [
        file_edit.fn(
            FileEditArgs(path="many.txt", old_text=f"item{i}\n", new_text=f"done{i}\n"), ctx
        )
        for i in range(n)
    ]
    results = await asyncio.gather(*calls)
    # Every edit replaced its own line exactly; none saw a stale file.
    assert results == [f"edited many.txt (exact match, line {i + 1})" for i in range(n)]
    assert path.read_text() == "".join(f"done{i}\n" for i in range(n))
