"""Symlink-proof file primitives for the file tools.

A path checked by :mod:`tools._paths` can change before it is used: a
process of the persona (``shell_exec``, say) may swap a folder on the way or
the file itself for a symlink pointing out of the allowed roots, and a
read or write through the path string would follow it. So nothing here
hands a path string to the kernel. A walk starts at ``/`` and opens one
component at a time relative to the folder opened before it (``openat``
with ``O_NOFOLLOW | O_DIRECTORY``), through the allowed root down to the
target; the file is then opened, created, renamed or stat'ed relative to
the last folder's descriptor, again without following a symlink. The
checked path is fully resolved, so it had no symlink on it: a symlink met
now appeared after the check and is refused with ``path_denied``. Folder
descriptors stay bound to the folders that were walked, whatever happens to
their names afterwards.

Everything here blocks; the tools call it through ``asyncio.to_thread``.
Errors the model should read are :class:`~runtime.errors.ToolError`; other
I/O failures (permissions, a full disk) stay ``OSError`` for the caller to
word.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from coterie.runtime.errors import ToolError

#: How a path is named in an error message (the tools show workspace paths
#: relative to the workspace).
Show = Callable[[Path], str]
#: Sees the target's status before it is read and may refuse it (ToolError).
ReadCheck = Callable[[os.stat_result], None]
#: Sees the target's status (None: it does not exist) before it is replaced.
WriteCheck = Callable[[os.stat_result | None], None]

# O_PATH (Linux) opens a folder only to walk through it, needing no read
# permission; elsewhere a plain read-only open does the same job.
_WALK = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO that takes a file's place must not hang the open.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_ATTEMPTS = 100


def swapped(path: Path, show: Show = str) -> ToolError:
    """The refusal for a symlink that appeared where the checked path had none."""
    return ToolError(
        "path_denied",
        f"{show(path)} changed while the tool used it (a symlink appeared where the "
        "checked path had none); refused, so nothing outside the allowed roots is read "
        "or written",
    )


def open_dir(
    root: Path,
    parts: Sequence[str] = (),
    *,
    create: bool = False,
    listable: bool = False,
    show: Show = str,
) -> int:
    """A descriptor on the folder ``root/parts``, reached without following a
    symlink; the caller closes it.

    ``create`` makes missing folders one by one. ``listable`` opens the last
    folder for :func:`scan`; otherwise it is only good to work relative to.
    Kinds: ``not_found``, ``not_a_directory``, ``invalid_path`` (a file where
    a folder should be, with ``create``), ``path_denied`` (a symlink).
    """
    names = _components(root, parts)
    target = Path("/", *names)
    try:
        return _walk(
            names, last=_LIST if listable else _WALK, create=create, target=target, show=show
        )
    except FileNotFoundError:
        raise ToolError("not_found", f"{show(target)} does not exist") from None


def open_parent(
    root: Path, parts: Sequence[str], *, create: bool = False, show: Show = str
) -> tuple[int, str]:
    """A descriptor on the folder holding ``root/parts`` and the name of the
    target in it (see :func:`open_dir`); the caller closes the descriptor.

    A folder missing on the way raises ``FileNotFoundError`` (unless
    ``create``), for the caller to word.
    """
    names = _components(root, parts)
    if not names:
        raise ToolError("is_directory", "/ is a directory")
    target = Path("/", *names)
    return _walk(names[:-1], last=_WALK, create=create, target=target, show=show), names[-1]


def stat_target(root: Path, parts: Sequence[str], *, show: Show = str) -> os.stat_result | None:
    """The status of ``root/parts`` itself, None when it does not exist;
    ``path_denied`` when it or a folder on the way is now a symlink."""
    names = _components(root, parts)
    if not names:
        return os.stat("/")
    try:
        dir_fd, name = open_parent(root, parts, show=show)
    except FileNotFoundError:
        return None
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(dir_fd)
    if stat.S_ISLNK(st.st_mode):
        raise swapped(Path("/", *names), show)
    return st


def read_file(
    root: Path,
    parts: Sequence[str],
    *,
    limit: int,
    check: ReadCheck | None = None,
    show: Show = str,
) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``root/parts`` (more
    than ``limit`` means it grew past the caller's limit), opened with
    ``O_NOFOLLOW`` relative to its walked folder.

    ``check`` sees the file's status before and after opening and may refuse
    it. Kinds: ``not_found``, ``path_denied`` (a symlink), ``invalid_path``
    (not a regular file) and whatever ``check`` raises; ``OSError`` otherwise.
    """
    target = Path("/", *_components(root, parts))
    try:
        dir_fd, name = open_parent(root, parts, show=show)
        try:
            fd = _open_regular(dir_fd, name, target=target, check=check, show=show)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:
        raise ToolError("not_found", f"{show(target)} does not exist") from None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit + 1)


def read_at(dir_fd: int, name: str, max_bytes: int) -> bytes | None:
    """The regular file ``name`` in the folder ``dir_fd``, opened without
    following a symlink; None when it is a symlink or anything but a regular
    file, is larger than ``max_bytes`` or cannot be read. For tools that skip
    what they cannot use (grep, .gitignore files)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = fh.read(max_bytes + 1)
        except OSError:
            return None
    return None if len(data) > max_bytes else data


def atomic_write(
    root: Path,
    parts: Sequence[str],
    data: bytes,
    *,
    check: WriteCheck | None = None,
    show: Show = str,
) -> os.stat_result | None:
    """Write ``data`` to ``root/parts`` through a new temp file in the same
    folder, renamed over the target; answers the status of the file it
    replaced (None: there was none).

    Missing folders are created one at a time, each relative to the one
    before. An existing file keeps its permission bits; a new one gets 0600.
    ``check`` sees the target's status first and may refuse the write.
    Kinds: ``path_denied`` (a symlink on the way or at the target),
    ``invalid_path`` (a file where a folder should be) and whatever ``check``
    raises; ``OSError`` otherwise, with no temp file left behind.
    """
    target = Path("/", *_components(root, parts))
    dir_fd, name = open_parent(root, parts, create=True, show=show)
    try:
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise swapped(target, show)
        if check is not None:
            check(st)
        tmp, fd = _create_temp(dir_fd, name)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if st is not None:
                    os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
                os.fsync(fh.fileno())
            # rename(2) replaces a symlink that took the target's place
            # rather than following it.
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        return st
    finally:
        os.close(dir_fd)


def scan(dir_fd: int) -> list[tuple[str, bool]]:
    """The entries of a folder opened for listing (:func:`open_dir` with
    ``listable``, :func:`open_subdir`) as ``(name, is a real folder)``, sorted
    by name; a symlink is never a folder. Entries whose type cannot be read
    are left out."""
    found: list[tuple[str, bool]] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            found.append((entry.name, is_dir))
    found.sort()
    return found


def open_subdir(dir_fd: int, name: str) -> int | None:
    """The folder ``name`` in ``dir_fd`` opened for listing, or None when it
    is no longer a real folder (a symlink took its place, it went away) or
    cannot be opened; the caller closes it."""
    try:
        return os.open(name, _LIST, dir_fd=dir_fd)
    except OSError:
        return None


# --- helpers -------------------------------------------------------------


def _components(root: Path, parts: Sequence[str]) -> list[str]:
    if not root.is_absolute():
        raise ValueError(f"root must be absolute: {root}")
    names = [*root.parts[1:], *parts]
    for name in names:
        if name in ("", ".", "..") or "/" in name:
            raise ValueError(f"not a plain path component: {name!r}")
    return names


def _walk(names: Sequence[str], *, last: int, create: bool, target: Path, show: Show) -> int:
    """Open ``/names…`` one component at a time, the last one with ``last``."""
    if not names:
        return os.open("/", last)
    fd = os.open("/", _WALK)
    at = Path("/")
    try:
        for i, name in enumerate(names):
            at = at / name
            flags = last if i == len(names) - 1 else _WALK
            next_fd = _open_folder(fd, name, flags, at=at, target=target, create=create, show=show)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_folder(
    dir_fd: int, name: str, flags: int, *, at: Path, target: Path, create: bool, show: Show
) -> int:
    made = False
    while True:
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create or made:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=dir_fd)
            made = True
        except OSError as exc:
            # O_NOFOLLOW | O_DIRECTORY: ENOTDIR for a symlink or a file,
            # ELOOP on some systems for a symlink.
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            refusal = _not_a_folder(dir_fd, name, at=at, target=target, create=create, show=show)
            raise refusal from exc


def _not_a_folder(
    dir_fd: int, name: str, *, at: Path, target: Path, create: bool, show: Show
) -> Exception:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError as exc:
        return exc
    if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        # A folder now means the link was swapped back since: still a change.
        return swapped(at, show)
    if at == target:
        return ToolError("not_a_directory", f"{show(at)} is not a folder")
    if create:
        return ToolError("invalid_path", f"{show(at)} is a file, not a folder")
    return FileNotFoundError(errno.ENOENT, "a file where a folder should be", str(at))


def _open_regular(
    dir_fd: int, name: str, *, target: Path, check: ReadCheck | None, show: Show
) -> int:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise swapped(target, show)
    # Checked before opening, so a folder or a device is never opened.
    if check is not None:
        check(st)
    if not stat.S_ISREG(st.st_mode):
        raise ToolError("invalid_path", f"{show(target)} is not a regular file")
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise swapped(target, show) from exc
        raise
    try:
        st = os.fstat(fd)
        if check is not None:
            check(st)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("invalid_path", f"{show(target)} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_temp(dir_fd: int, name: str) -> tuple[str, int]:
    for _ in range(_TEMP_ATTEMPTS):
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, os.open(tmp, _CREATE, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", name)


__all__ = [
    "ReadCheck",
    "Show",
    "WriteCheck",
    "atomic_write",
    "open_dir",
    "open_parent",
    "read_at",
    "read_file",
    "scan",
    "stat_target",
    "swapped",
]
