"""The path rails under races: a folder or file swapped for a symlink between
the check and the I/O is refused (``path_denied``), never followed out of
the allowed roots.

Real files in ``tmp_path``. The deterministic tests swap at a chosen moment
(after :func:`tools._paths.locate`, or after a folder was listed); the race
tests let a thread swap ``workspace/sub`` back and forth with an atomic
``renameat2(RENAME_EXCHANGE)`` while the tools run.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from coterie.runtime.context import TurnContext, TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.testing import turn_context
from coterie.runtime.tool import ToolSpec
from coterie.tools import _fs
from coterie.tools import files as F
from coterie.tools._paths import locate

SECRET = "SECRET-7f3a9c"
RACE_CALLS = 200


class World:
    """A persona's workspace with ``sub/f.txt`` and an outside folder that
    holds a secret (in a file named like the one inside, and in a name)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.me = self.home / "personas" / "tester"
        self.ws = self.me / "workspace"
        self.outside = root / "outside"
        (self.ws / "sub").mkdir(parents=True)
        (self.ws / "sub" / "f.txt").write_text("mine\n")
        (self.ws / "f.txt").write_text("mine\n")
        self.outside.mkdir()
        (self.outside / "f.txt").write_text(f"{SECRET}\n")
        (self.outside / f"{SECRET}.txt").write_text(f"{SECRET}\n")

    def ctx(self) -> TurnContext:
        return turn_context(
            settings=TurnSettings(
                workspace=self.ws, persona_dir=self.me, home=self.home, access="workspace"
            )
        )

    def outside_tree(self) -> dict[str, bytes | None]:
        """Every path under the outside folder with its bytes (None: a folder)."""
        tree: dict[str, bytes | None] = {}
        for dirpath, dirnames, filenames in os.walk(self.outside):
            for name in dirnames:
                tree[os.path.join(dirpath, name)] = None
            for name in filenames:
                tree[os.path.join(dirpath, name)] = Path(dirpath, name).read_bytes()
        return tree

    def link_folder_out(self, rel: str = "sub") -> None:
        """Move the workspace folder ``rel`` aside and put a symlink to the
        outside folder in its place."""
        path = self.ws / rel
        path.rename(path.with_name(path.name + ".moved"))
        path.symlink_to(self.outside, target_is_directory=True)

    def link_file_out(self, rel: str) -> None:
        """Replace the workspace file ``rel`` by a symlink to the outside one."""
        path = self.ws / rel
        path.unlink()
        path.symlink_to(self.outside / "f.txt")


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "systmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def call(spec: ToolSpec, ctx: TurnContext, **args: Any) -> str:
    return str(await spec.fn(spec.args_model(**args), ctx))


def assert_swap_refused(exc: ToolError) -> None:
    assert exc.kind == "path_denied", exc
    assert "changed while the tool used it (a symlink appeared" in exc.detail
    assert SECRET not in exc.detail


# --- deterministic: the primitives given an earlier check ----------------


@pytest.mark.parametrize("rel", ["sub/f.txt", "sub/new/deeper/f.txt"])
def test_write_refuses_folder_swapped_after_check(world: World, rel: str) -> None:
    target = locate(world.ctx(), rel, write=True)
    before = world.outside_tree()
    world.link_folder_out("sub")
    with pytest.raises(ToolError) as info:
        _fs.atomic_write(target.root, target.parts, b"pwned\n")
    assert_swap_refused(info.value)
    # Neither the file, a temp file nor the missing folders landed outside.
    assert world.outside_tree() == before


def test_write_refuses_file_swapped_after_check(world: World) -> None:
    target = locate(world.ctx(), "sub/f.txt", write=True)
    before = world.outside_tree()
    world.link_file_out("sub/f.txt")
    with pytest.raises(ToolError) as info:
        _fs.atomic_write(target.root, target.parts, b"pwned\n")
    assert_swap_refused(info.value)
    assert world.outside_tree() == before
    # The link itself was left alone too, and no temp file stayed behind.
    assert (world.ws / "sub" / "f.txt").is_symlink()
    assert sorted(os.listdir(world.ws / "sub")) == ["f.txt"]


@pytest.mark.parametrize("swap", ["folder", "file"])
def test_read_refuses_swap_after_check(world: World, swap: str) -> None:
    ctx = world.ctx()
    target = locate(ctx, "sub/f.txt", write=False)
    if swap == "folder":
        world.link_folder_out("sub")
    else:
        world.link_file_out("sub/f.txt")
    with pytest.raises(ToolError) as info:
        _fs.read_file(target.root, target.parts, limit=1000)
    assert_swap_refused(info.value)
    with pytest.raises(ToolError) as info:
        F._load_text(ctx, target, F.READ_MAX_FILE_BYTES)
    assert_swap_refused(info.value)


def test_swapped_root_is_refused(world: World) -> None:
    """The allowed root itself is reached component by component from ``/``:
    a workspace replaced by a link after the check is refused as well."""
    ctx = world.ctx()
    read = locate(ctx, "f.txt", write=False)
    write = locate(ctx, "new.txt", write=True)
    assert read.root == world.ws.resolve() and read.parts == ("f.txt",)
    before = world.outside_tree()
    world.ws.rename(world.me / "workspace.moved")
    world.ws.symlink_to(world.outside, target_is_directory=True)
    with pytest.raises(ToolError) as info:
        _fs.read_file(read.root, read.parts, limit=1000)
    assert_swap_refused(info.value)
    with pytest.raises(ToolError) as info:
        _fs.atomic_write(write.root, write.parts, b"pwned\n")
    assert_swap_refused(info.value)
    assert world.outside_tree() == before


# --- deterministic: the tools, swapped right after their check -----------

TOOL_CALLS: dict[str, tuple[ToolSpec, dict[str, Any]]] = {
    "file_write": (F.file_write, {"path": "sub/f.txt", "content": "pwned\n", "overwrite": True}),
    "file_edit": (F.file_edit, {"path": "sub/f.txt", "old_text": "SECRET", "new_text": "x"}),
    "file_read": (F.file_read, {"path": "sub/f.txt"}),
    "file_list": (F.file_list, {"path": "sub"}),
    "glob": (F.glob, {"pattern": "*", "path": "sub"}),
    "grep": (F.grep, {"pattern": SECRET, "path": "sub"}),
}


@pytest.mark.parametrize("tool", sorted(TOOL_CALLS))
async def test_tools_refuse_a_swap_between_check_and_use(
    world: World, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    checked = F.locate

    def check_then_swap(*args: Any, **kwargs: Any) -> Any:
        result = checked(*args, **kwargs)
        world.link_folder_out("sub")
        return result

    monkeypatch.setattr(F, "locate", check_then_swap)
    spec, args = TOOL_CALLS[tool]
    before = world.outside_tree()
    with pytest.raises(ToolError) as info:
        await call(spec, world.ctx(), **args)
    assert_swap_refused(info.value)
    assert world.outside_tree() == before


class _Listed(list[Any]):
    """Entries already read, usable like the iterator ``os.scandir`` returns."""

    def __enter__(self) -> _Listed:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


@pytest.mark.parametrize("tool", ["file_list", "glob", "grep"])
async def test_walk_does_not_enter_a_folder_swapped_mid_walk(
    world: World, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """The workspace is listed while ``sub`` is a real folder; ``sub`` is
    then swapped for a link before the walk goes into it."""
    listing = os.scandir
    calls = 0

    def list_then_swap(path: Any) -> _Listed:
        nonlocal calls
        calls += 1
        with listing(path) as entries:
            found = _Listed(entries)
        if calls == 1:
            world.link_folder_out("sub")
        return found

    monkeypatch.setattr(os, "scandir", list_then_swap)
    args: dict[str, Any] = {
        "file_list": {"depth": 5},
        "glob": {"pattern": "**/*"},
        "grep": {"pattern": "SECRET|mine"},
    }[tool]
    spec = {"file_list": F.file_list, "glob": F.glob, "grep": F.grep}[tool]
    out = await call(spec, world.ctx(), **args)
    assert calls >= 1
    assert SECRET not in out
    # The rest of the walk went on: the workspace's own file is there.
    assert "f.txt" in out and "sub/f.txt" not in out


# --- races: a thread keeps swapping workspace/sub -------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchanger() -> Callable[[Path, Path], None] | None:
    """``renameat2(a, b, RENAME_EXCHANGE)``: swaps two names atomically, so
    ``sub`` always exists, as a folder or as a link. None where missing."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return None

    def exchange(a: Path, b: Path) -> None:
        if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(a))

    return exchange


class Swapper:
    """A thread exchanging ``workspace/sub`` (a real folder) with a symlink
    to the outside folder, as fast as it can, until the block ends."""

    def __init__(self, world: World) -> None:
        exchange = _exchanger()
        if exchange is None:
            pytest.skip("needs renameat2(RENAME_EXCHANGE) (Linux)")
        self.exchange = exchange
        self.sub = world.ws / "sub"
        self.link = world.ws / "sub.link"
        self.link.symlink_to(world.outside, target_is_directory=True)
        try:
            self.exchange(self.sub, self.link)
            self.exchange(self.sub, self.link)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                pytest.skip(f"this filesystem cannot exchange names: {exc}")
            raise
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.exchange(self.sub, self.link)
            self.swaps += 1

    def __enter__(self) -> Swapper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.swaps % 2:
            self.exchange(self.sub, self.link)
        assert self.sub.is_dir() and not self.sub.is_symlink()


async def test_write_race_never_lands_outside(world: World) -> None:
    ctx = world.ctx()
    before = world.outside_tree()
    outcomes: Counter[str] = Counter()
    with Swapper(world) as swapper:
        for i in range(RACE_CALLS):
            content = f"write {i}\n"
            try:
                out = await call(
                    F.file_write, ctx, path="sub/f.txt", content=content, overwrite=True
                )
            except ToolError as exc:
                assert exc.kind == "path_denied", (i, exc)
                outcomes["denied"] += 1
            else:
                assert out == f"overwrote sub/f.txt ({len(content)} bytes, 1 lines)", (i, out)
                outcomes["wrote"] += 1
    assert world.outside_tree() == before
    # The race really ran both ways, and every write landed in the real folder.
    assert swapper.swaps > RACE_CALLS
    assert outcomes["wrote"] and outcomes["denied"], outcomes
    assert (world.ws / "sub" / "f.txt").read_text().startswith("write ")
    assert sorted(os.listdir(world.ws / "sub")) == ["f.txt"]


async def test_read_race_never_shows_outside(world: World) -> None:
    ctx = world.ctx()
    outcomes: Counter[str] = Counter()
    with Swapper(world) as swapper:
        for i in range(RACE_CALLS):
            try:
                out = await call(F.file_read, ctx, path="sub/f.txt")
            except ToolError as exc:
                assert SECRET not in str(exc), (i, exc)
                assert exc.kind == "path_denied", (i, exc)
                outcomes["denied"] += 1
            else:
                assert SECRET not in out, i
                assert out == "1\tmine", (i, out)
                outcomes["read"] += 1
    assert swapper.swaps > RACE_CALLS
    assert outcomes["read"] and outcomes["denied"], outcomes


@pytest.mark.parametrize("tool", ["file_list", "glob", "grep"])
async def test_walk_race_never_shows_outside(world: World, tool: str) -> None:
    """Listing, globbing and searching the whole workspace while ``sub`` flips:
    nothing behind the link (a name or a line) ever shows up."""
    ctx = world.ctx()
    spec, args = {
        "file_list": (F.file_list, {"depth": 5}),
        "glob": (F.glob, {"pattern": "**/*"}),
        "grep": (F.grep, {"pattern": "SECRET|mine"}),
    }[tool]
    with Swapper(world):
        for i in range(RACE_CALLS // 2):
            out = await call(spec, ctx, **args)
            assert SECRET not in out, (i, out)
