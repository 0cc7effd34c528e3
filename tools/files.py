"""File tools: file_read, file_write, file_edit, file_list, glob, grep.

Every path goes through :func:`tools._paths.locate`: relative paths land
in the workspace, absolute ones must be inside the persona's allowed roots,
and the access level decides where writes may go. The write tools are hidden
from read-only personas. The I/O itself goes through :mod:`tools._fs`, which
walks the checked path without following symlinks, so a folder or file
swapped for a link after the check is refused instead of followed out of the
roots.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.tool import tool
from coterie.tools import _fs
from coterie.tools._edit import edit_text
from coterie.tools._effects import file_effect
from coterie.tools._paths import Target, display, is_secret, locate, within

if TYPE_CHECKING:
    import pathspec

READ_MAX_FILE_BYTES = 10 * 1024 * 1024
READ_DEFAULT_LINES = 2000
READ_MAX_LINE_CHARS = 2000
READ_MAX_OUTPUT_CHARS = 100_000
WRITE_MAX_BYTES = 1024 * 1024
LIST_MAX_ENTRIES = 500
GLOB_MAX_RESULTS = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 5 * 1024 * 1024
BINARY_SNIFF_BYTES = 8192
GITIGNORE_MAX_BYTES = 1024 * 1024
SKIP_DIRS = frozenset({".git", ".hg", ".svn"})


def _can_write(ctx: TurnContext) -> bool:
    return ctx.settings.access != "readonly"


def _show(ctx: TurnContext) -> _fs.Show:
    return lambda path: display(ctx, path)


# --- reading -------------------------------------------------------------


def _load_text(ctx: TurnContext, target: Target, max_bytes: int) -> str:
    """The file's text; ToolError for missing, directory, binary, non-UTF-8,
    huge, unreadable, or a symlink where the checked path had none."""
    shown = display(ctx, target.path)

    def check(st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("is_directory", f"{shown} is a directory; use file_list")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("invalid_path", f"{shown} is not a regular file")
        if st.st_size > max_bytes:
            raise ToolError(
                "too_large",
                f"{shown} is {st.st_size} bytes; the limit is {max_bytes} bytes for this tool",
            )

    try:
        data = _fs.read_file(
            target.root, target.parts, limit=max_bytes, check=check, show=_show(ctx)
        )
    except OSError as exc:
        raise ToolError("unreadable", f"could not read {shown}: {exc.strerror}") from exc
    if len(data) > max_bytes:
        raise ToolError(
            "too_large",
            f"{shown} grew past {max_bytes} bytes while it was read; the limit is "
            f"{max_bytes} bytes for this tool",
        )
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        raise ToolError("binary_file", f"{shown} looks binary (it contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            "not_utf8", f"{shown} is not valid UTF-8 (bad byte at offset {exc.start})"
        ) from exc


class FileReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="file path; relative paths are inside your workspace")
    offset: int = Field(default=1, ge=1, description="first line to show (1-based)")
    limit: int = Field(default=READ_DEFAULT_LINES, ge=1, le=10_000, description="lines to show")


def render_lines(text: str, offset: int, limit: int) -> str:
    """``text`` as numbered lines ``N\\t...`` from ``offset``, with truncation notes."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.splitlines()
    total = len(lines)
    if total == 0:
        return "(empty file)"
    if offset > total:
        raise ToolError("invalid_arguments", f"offset {offset} is past the end ({total} lines)")
    out: list[str] = []
    used = 0
    shown_last = offset - 1
    cut_lines = 0
    width = len(str(min(total, offset + limit - 1)))
    for number in range(offset, min(total, offset + limit - 1) + 1):
        line = lines[number - 1]
        if len(line) > READ_MAX_LINE_CHARS:
            line = f"{line[:READ_MAX_LINE_CHARS]}… [line cut: {len(line)} chars]"
            cut_lines += 1
        entry = f"{number:>{width}}\t{line}"
        if used + len(entry) + 1 > READ_MAX_OUTPUT_CHARS and out:
            break
        out.append(entry)
        used += len(entry) + 1
        shown_last = number
    notes: list[str] = []
    if shown_last < total:
        notes.append(
            f"[showing lines {offset}–{shown_last} of {total}; continue with "
            f"offset={shown_last + 1}]"
        )
    if cut_lines:
        notes.append(f"[{cut_lines} line(s) longer than {READ_MAX_LINE_CHARS} chars were cut]")
    return "\n".join(out + notes)


@tool(name="file_read", timeout=30, allow_repeat=True, effect=file_effect("read"))
async def file_read(args: FileReadArgs, ctx: TurnContext) -> str:
    """Read a UTF-8 text file as numbered lines (`N<tab>text`). offset is the
    first line (1-based), limit the number of lines (default 2000); long lines
    and long outputs are cut with a note saying how to continue."""
    target = await asyncio.to_thread(locate, ctx, args.path, write=False)
    text = await asyncio.to_thread(_load_text, ctx, target, READ_MAX_FILE_BYTES)
    return render_lines(text, args.offset, args.limit)


# --- writing -------------------------------------------------------------


def _atomic_write(
    ctx: TurnContext, target: Target, data: bytes, check: _fs.WriteCheck | None = None
) -> os.stat_result | None:
    """Write via a temp file in the same folder renamed over the target (see
    :func:`tools._fs.atomic_write`); the status of the file replaced, if any."""
    return _fs.atomic_write(target.root, target.parts, data, check=check, show=_show(ctx))


class FileWriteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="file path; relative paths are inside your workspace")
    content: str = Field(description="the whole new content (UTF-8 text)")
    overwrite: bool = Field(default=False, description="replace the file if it already exists")


@tool(name="file_write", timeout=30, available=_can_write, effect=file_effect("write"))
async def file_write(args: FileWriteArgs, ctx: TurnContext) -> str:
    """Write a whole UTF-8 text file (at most 1 MB), creating missing parent
    folders. An existing file is only replaced with overwrite: true; to change
    part of a file use file_edit. The write is atomic."""
    target = await asyncio.to_thread(locate, ctx, args.path, write=True)
    shown = display(ctx, target.path)
    try:
        data = args.content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError("invalid_arguments", "content is not valid unicode text") from exc
    if len(data) > WRITE_MAX_BYTES:
        raise ToolError(
            "too_large", f"content is {len(data)} bytes; the limit is {WRITE_MAX_BYTES} bytes"
        )

    def check(st: os.stat_result | None) -> None:
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("is_directory", f"{shown} is a directory")
        if not args.overwrite:
            raise ToolError(
                "already_exists",
                f"{shown} already exists; pass overwrite: true to replace it, or use "
                "file_edit to change part of it",
            )

    async with ctx.services.file_locks(target.path):
        try:
            replaced = await asyncio.to_thread(_atomic_write, ctx, target, data, check)
        except OSError as exc:
            raise ToolError("write_failed", f"could not write {shown}: {exc.strerror}") from exc
    existed = replaced is not None
    lines = args.content.count("\n") + (0 if args.content.endswith("\n") or not data else 1)
    verb = "overwrote" if existed else "wrote"
    return f"{verb} {shown} ({len(data)} bytes, {lines} lines)"


class FileEditArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="an existing file; relative paths are inside your workspace")
    old_text: str = Field(description="the text to replace, copied exactly from the file")
    new_text: str = Field(description="the replacement text")
    replace_all: bool = Field(
        default=False, description="replace every exact occurrence instead of exactly one"
    )


@tool(name="file_edit", timeout=30, available=_can_write, effect=file_effect("write"))
async def file_edit(args: FileEditArgs, ctx: TurnContext) -> str:
    """Replace old_text with new_text in an existing file. old_text must occur
    exactly once (add surrounding lines to make it unique) unless replace_all.
    If it is not found exactly, tolerant matching (indentation, whitespace,
    escapes) is tried and the result says which matcher was used. Line endings
    and a UTF-8 BOM are kept. Create new files with file_write."""
    target = await asyncio.to_thread(locate, ctx, args.path, write=True)
    shown = display(ctx, target.path)
    async with ctx.services.file_locks(target.path):
        raw = await asyncio.to_thread(_load_text, ctx, target, WRITE_MAX_BYTES)
        result = await asyncio.to_thread(
            edit_text, raw, args.old_text, args.new_text, replace_all=args.replace_all
        )
        try:
            data = result.text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolError("invalid_arguments", "new_text is not valid unicode text") from exc
        if len(data) > WRITE_MAX_BYTES:
            raise ToolError("too_large", f"the edited file would exceed {WRITE_MAX_BYTES} bytes")
        try:
            await asyncio.to_thread(_atomic_write, ctx, target, data)
        except OSError as exc:
            raise ToolError("write_failed", f"could not write {shown}: {exc.strerror}") from exc
    where = (
        f"line {result.start_line}"
        if result.start_line == result.end_line
        else f"lines {result.start_line}–{result.end_line}"
    )
    if result.count > 1:
        return f"edited {shown} ({result.count} exact replacements, first at {where})"
    return f"edited {shown} ({result.matcher} match, {where})"


# --- walking -------------------------------------------------------------


class _Ignore:
    """The .gitignore rules that apply under a directory (nested files included)."""

    def __init__(self, specs: list[tuple[Path, pathspec.PathSpec]]) -> None:
        self.specs = specs

    @classmethod
    def above(cls, ctx: TurnContext, start: Path) -> _Ignore:
        """Rules from .gitignore files between the workspace root and ``start``."""
        dirs: list[Path] = []
        root = ctx.settings.workspace.resolve() if ctx.settings.workspace is not None else start
        if within(start, root):
            current = start.parent
            while within(current, root):
                dirs.append(current)
                if current == root:
                    break
                current = current.parent
        ignore = cls([])
        for directory in reversed(dirs):
            dir_fd = _fs.open_dir(root, directory.relative_to(root).parts, show=_show(ctx))
            try:
                ignore = ignore.entered(dir_fd, directory)
            finally:
                os.close(dir_fd)
        return ignore

    def entered(self, dir_fd: int, directory: Path) -> _Ignore:
        """These rules plus those of the .gitignore in ``directory`` (open as
        ``dir_fd``); a symlinked .gitignore is not followed."""
        data = _fs.read_at(dir_fd, ".gitignore", GITIGNORE_MAX_BYTES)
        if data is None:
            return self
        lines = data.decode("utf-8", errors="replace").splitlines()
        # Imported here: a persona's process pays for pathspec (and its tries
        # at optional regex backends) only once it walks a .gitignore.
        import pathspec

        return _Ignore([*self.specs, (directory, pathspec.GitIgnoreSpec.from_lines(lines))])

    def ignored(self, path: Path, is_dir: bool) -> bool:
        for base, spec in self.specs:
            if not path.is_relative_to(base):
                continue
            rel = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            if spec.match_file(rel):
                return True
        return False


def _walk(
    ctx: TurnContext, top: Target, *, gitignore: bool, max_depth: int | None = None
) -> Generator[tuple[Path, bool, int, int], None, None]:
    """``(path, is_dir, depth, dir_fd)`` under ``top`` in sorted order, skipping
    VCS folders and (optionally) ignored paths. ``dir_fd`` is the open folder
    holding the entry, valid until the next item: read the entry relative to
    it. Each folder is opened relative to its parent without following
    symlinks, so a symlinked folder, even one swapped in during the walk, is
    listed but never entered."""
    base = _Ignore.above(ctx, top.path) if gitignore else _Ignore([])

    def visit(
        dir_fd: int, directory: Path, ignore: _Ignore, depth: int
    ) -> Generator[tuple[Path, bool, int, int], None, None]:
        if gitignore:
            ignore = ignore.entered(dir_fd, directory)
        try:
            entries = _fs.scan(dir_fd)
        except OSError:
            return
        for name, is_dir in entries:
            if is_dir and name in SKIP_DIRS:
                continue
            path = directory / name
            if gitignore and ignore.ignored(path, is_dir):
                continue
            yield path, is_dir, depth, dir_fd
            if is_dir and (max_depth is None or depth < max_depth):
                sub_fd = _fs.open_subdir(dir_fd, name)
                if sub_fd is None:
                    continue
                try:
                    yield from visit(sub_fd, path, ignore, depth + 1)
                finally:
                    os.close(sub_fd)

    top_fd = _fs.open_dir(top.root, top.parts, listable=True, show=_show(ctx))
    try:
        yield from visit(top_fd, top.path, base, 1)
    finally:
        os.close(top_fd)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A shell glob (``**``, ``*``, ``?``, ``[...]``, ``{a,b}``) as a regex on
    ``/``-separated relative paths."""
    out: list[str] = []
    i, n = 0, len(pattern)
    brace = 0
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                    out.append("(?:.*/)?")
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "{":
            brace += 1
            out.append("(?:")
        elif c == "}" and brace:
            brace -= 1
            out.append(")")
        elif c == "," and brace:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if brace:
        raise ToolError("invalid_arguments", f"unbalanced braces in {pattern!r}")
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error as exc:
        raise ToolError("invalid_arguments", f"bad glob {pattern!r}: {exc}") from exc


def _existing(ctx: TurnContext, raw: str) -> tuple[Target, os.stat_result]:
    """``raw`` through the rails, with its status; ``not_found`` when missing."""
    target = locate(ctx, raw, write=False)
    st = _fs.stat_target(target.root, target.parts, show=_show(ctx))
    if st is None:
        raise ToolError("not_found", f"{display(ctx, target.path)} does not exist")
    return target, st


class FileListArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(default=".", description="folder; default: your workspace")
    depth: int = Field(
        default=1, ge=1, le=20, description="1: the folder's entries; more: walk sub-folders"
    )


@tool(name="file_list", timeout=30, allow_repeat=True, effect=file_effect("read"))
async def file_list(args: FileListArgs, ctx: TurnContext) -> str:
    """List a folder's entries (sorted; folders end with /). depth > 1 walks
    sub-folders; at most 500 entries. Use glob to find files by pattern."""
    target, st = await asyncio.to_thread(_existing, ctx, args.path)
    top = target.path
    if not stat.S_ISDIR(st.st_mode):
        raise ToolError("not_a_directory", f"{display(ctx, top)} is a file; use file_read")

    def run() -> list[str]:
        found: list[str] = []
        walk = _walk(ctx, target, gitignore=False, max_depth=args.depth)
        with contextlib.closing(walk):
            for path, is_dir, _depth, _dir_fd in walk:
                if len(found) >= LIST_MAX_ENTRIES:
                    found.append(
                        f"[listing cut at {LIST_MAX_ENTRIES} entries; use glob or a lower depth]"
                    )
                    break
                found.append(path.relative_to(top).as_posix() + ("/" if is_dir else ""))
        return found

    entries = await asyncio.to_thread(run)
    header = f"{display(ctx, top)}/" if display(ctx, top) != "." else "./"
    if not entries:
        return f"{header} (empty)"
    return "\n".join([header, *entries])


class GlobArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(
        min_length=1, max_length=500, description="e.g. **/*.py, src/*.{ts,tsx}, *.md"
    )
    path: str = Field(default=".", description="folder to search from; default: your workspace")


@tool(name="glob", timeout=30, allow_repeat=True, effect=file_effect("read"))
async def glob(args: GlobArgs, ctx: TurnContext) -> str:
    """Find files whose path (relative to `path`) matches a glob pattern; `**`
    spans folders. .gitignore'd files are skipped. Sorted, at most 200."""
    target, st = await asyncio.to_thread(_existing, ctx, args.path)
    top = target.path
    if not stat.S_ISDIR(st.st_mode):
        raise ToolError("not_a_directory", f"{display(ctx, top)} is a file")
    regex = _glob_regex(args.pattern.lstrip("/").removeprefix("./"))

    def run() -> tuple[list[str], bool]:
        found: list[str] = []
        walk = _walk(ctx, target, gitignore=True)
        with contextlib.closing(walk):
            for path, is_dir, _depth, _dir_fd in walk:
                rel = path.relative_to(top).as_posix()
                if not is_dir and regex.match(rel):
                    if len(found) >= GLOB_MAX_RESULTS:
                        return found, True
                    found.append(rel)
        return found, False

    found, capped = await asyncio.to_thread(run)
    if not found:
        return f"No files match {args.pattern!r} under {display(ctx, top)}."
    if capped:
        found.append(f"[results cut at {GLOB_MAX_RESULTS}; narrow the pattern]")
    return "\n".join(found)


class GrepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1, max_length=1000, description="a Python regular expression")
    path: str = Field(default=".", description="folder or file; default: your workspace")
    include: str | None = Field(
        default=None, max_length=500, description="only files matching this glob, e.g. *.py"
    )
    ignore_case: bool = False
    max_results: int = Field(default=100, ge=1, le=1000)


@tool(name="grep", timeout=60, allow_repeat=True, effect=file_effect("read"))
async def grep(args: GrepArgs, ctx: TurnContext) -> str:
    """Search file contents with a regular expression. Prints `path:line: text`
    sorted by path and line; binary and .gitignore'd files are skipped.
    include filters files by glob (matched against the name and the relative
    path)."""
    target, st = await asyncio.to_thread(_existing, ctx, args.path)
    top = target.path
    try:
        regex = re.compile(args.pattern, re.IGNORECASE if args.ignore_case else 0)
    except re.error as exc:
        raise ToolError("invalid_arguments", f"bad regular expression: {exc}") from exc
    include = _glob_regex(args.include) if args.include else None
    single = not stat.S_ISDIR(st.st_mode)
    base = top.parent if single else top

    def wanted(path: Path) -> bool:
        rel = path.relative_to(base).as_posix()
        if include and not (include.match(path.name) or include.match(rel)):
            return False
        return not is_secret(path)

    def contents() -> Generator[tuple[Path, bytes], None, None]:
        """Each file to search with its bytes, opened without following a
        symlink relative to the folder it was found in; symlinks, special
        files and huge files are skipped."""
        if single:
            if not wanted(top):
                return
            dir_fd, name = _fs.open_parent(target.root, target.parts, show=_show(ctx))
            try:
                data = _fs.read_at(dir_fd, name, GREP_MAX_FILE_BYTES)
            finally:
                os.close(dir_fd)
            if data is not None:
                yield top, data
            return
        walk = _walk(ctx, target, gitignore=True)
        with contextlib.closing(walk):
            for path, is_dir, _depth, dir_fd in walk:
                if is_dir or not wanted(path):
                    continue
                data = _fs.read_at(dir_fd, path.name, GREP_MAX_FILE_BYTES)
                if data is not None:
                    yield path, data

    def run() -> tuple[list[str], bool]:
        hits: list[str] = []
        items = contents()
        with contextlib.closing(items):
            for path, data in items:
                rel = path.relative_to(base).as_posix()
                if b"\x00" in data[:BINARY_SNIFF_BYTES]:
                    continue
                text = data.decode("utf-8", errors="replace")
                for number, line in enumerate(text.splitlines(), 1):
                    if regex.search(line):
                        if len(hits) >= args.max_results:
                            return hits, True
                        snippet = line.strip()
                        if len(snippet) > GREP_MAX_LINE_CHARS:
                            snippet = snippet[:GREP_MAX_LINE_CHARS] + "…"
                        hits.append(f"{rel}:{number}: {snippet}")
        return hits, False

    hits, capped = await asyncio.to_thread(run)
    if not hits:
        return f"No matches for {args.pattern!r} under {display(ctx, top)}."
    if capped:
        hits.append(f"[results cut at {args.max_results}; narrow the pattern, path or include]")
    return "\n".join(hits)


FILE_TOOLS = [file_read, file_write, file_edit, file_list, glob, grep]

__all__ = [
    "FILE_TOOLS",
    "file_edit",
    "file_list",
    "file_read",
    "file_write",
    "glob",
    "grep",
]
