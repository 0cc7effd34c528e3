"""Path rails for tools that touch the persona's files.

Relative paths resolve inside the persona's workspace. Absolute paths must
land inside an allowed root: the workspace, the persona's own directory
(``<home>/personas/<name>``) or its temp directory
(``<tempdir>/coterie-<name>``) — and, for reading only, the folders of the
global skills the persona sees (``<home>/skills/<name>``, listed on
``ctx.settings.skills``). Symlinks are resolved before any check, so a
link that points outside is refused like any other escape. Other personas'
directories and ``.env`` files (secrets) are always refused.

Writes also depend on the access level: ``readonly`` writes nothing,
``workspace`` writes only inside the workspace, ``full`` writes anywhere in
the allowed roots.

A check on a path string holds only until someone changes the tree, so the
file tools take a :class:`Target` from :func:`locate` (the allowed root and
the parts below it) and do their I/O through :mod:`tools._fs`, which walks
those parts without following symlinks.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError

MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255


def workspace_path(ctx: TurnContext, raw: str) -> Path:
    """``raw`` as a real path inside the persona's workspace; ToolError otherwise."""
    workspace = ctx.settings.workspace
    if workspace is None:
        raise ToolError("unavailable", "this persona has no workspace")
    _check_raw(raw)
    root = workspace.resolve()
    candidate = Path(raw).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = _resolve(candidate, raw)
    if resolved != root and not resolved.is_relative_to(root):
        raise ToolError("path_denied", f"{raw!r} is outside the workspace ({root})")
    if is_secret(resolved):
        raise ToolError("path_denied", ".env files hold secrets and cannot be read by tools")
    return resolved


def temp_root(ctx: TurnContext) -> Path:
    """The persona's own scratch directory under the system temp dir."""
    return Path(tempfile.gettempdir()).resolve() / f"coterie-{ctx.persona}"


def allowed_roots(ctx: TurnContext) -> list[Path]:
    """Every root a path may resolve into, workspace first."""
    settings = ctx.settings
    roots: list[Path] = []
    if settings.workspace is not None:
        roots.append(settings.workspace.resolve())
    if settings.persona_dir is not None:
        roots.append(settings.persona_dir.resolve())
    roots.append(temp_root(ctx))
    return roots


def is_secret(path: Path) -> bool:
    """Whether ``path`` names a ``.env`` file (``.env``, ``.env.local``…)."""
    name = path.name
    return name == ".env" or name.startswith(".env.")


def within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


@dataclass(frozen=True)
class Target:
    """A path that passed the rails at the moment it was checked.

    ``path`` is the real (symlink-free) path, ``root`` the allowed root it is
    under (the deepest one when roots nest) and ``parts`` the components of
    ``path`` below ``root`` (empty when ``path`` is the root itself).
    """

    path: Path
    root: Path
    parts: tuple[str, ...]


def resolve_path(ctx: TurnContext, raw: str, *, write: bool) -> Path:
    """``raw`` as a real path inside the rails; ToolError otherwise.

    Kinds: ``invalid_path`` (empty, NUL byte, too long, unresolvable),
    ``path_denied`` (outside the allowed roots, another persona's directory, a
    ``.env`` file, or a write the access level forbids), ``unavailable`` (no
    workspace). Existence is not checked here. The answer is only as good as
    the moment of the check: tools that then do I/O use :func:`locate`.
    """
    return locate(ctx, raw, write=write).path


def locate(ctx: TurnContext, raw: str, *, write: bool) -> Target:
    """Like :func:`resolve_path`, also naming the allowed root the path is
    under and the path relative to it, for symlink-proof I/O (:mod:`tools._fs`)."""
    settings = ctx.settings
    if settings.workspace is None:
        raise ToolError("unavailable", "this persona has no workspace")
    _check_raw(raw)
    if write and settings.access == "readonly":
        raise ToolError("path_denied", "this persona has read-only access: no file writes")
    workspace = settings.workspace.resolve()
    candidate = Path(raw)
    if raw.startswith("~"):
        try:
            candidate = candidate.expanduser()
        except RuntimeError as exc:
            raise ToolError("invalid_path", f"cannot expand {raw!r}") from exc
    if not candidate.is_absolute():
        candidate = workspace / candidate
    if is_secret(candidate):
        raise ToolError("path_denied", ".env files hold secrets and cannot be used by tools")
    resolved = _resolve(candidate, raw)
    if is_secret(resolved):
        raise ToolError("path_denied", ".env files hold secrets and cannot be used by tools")
    if settings.home is not None:
        personas = (settings.home / "personas").resolve()
        if resolved.is_relative_to(personas) and resolved != personas:
            owner = resolved.relative_to(personas).parts[0]
            if owner != ctx.persona:
                raise ToolError("path_denied", f"{raw!r} belongs to another persona ({owner})")
    roots = allowed_roots(ctx)
    holding = [root for root in roots if within(resolved, root)]
    if not holding:
        skill = next((r for r in settings.skills.read_roots if within(resolved, r)), None)
        if skill is not None:
            return _in_skill(raw, resolved, skill, write=write)
        listing = ", ".join(str(r) for r in roots)
        raise ToolError("path_denied", f"{raw!r} is outside the allowed roots ({listing})")
    if write and settings.access != "full" and not within(resolved, workspace):
        raise ToolError(
            "path_denied",
            f"{raw!r} is outside the workspace ({workspace}); this persona may only "
            "write inside its workspace",
        )
    root = max(holding, key=lambda r: len(r.parts))
    return Target(path=resolved, root=root, parts=resolved.relative_to(root).parts)


def _in_skill(raw: str, resolved: Path, root: Path, *, write: bool) -> Target:
    """A path inside the folder of one of the persona's global skills: read
    only (those folders are shared by every persona)."""
    if write:
        raise ToolError(
            "path_denied",
            f"{raw!r} is in a shared skill's folder ({root}); skills under <home>/skills "
            "are read-only for personas",
        )
    return Target(path=resolved, root=root, parts=resolved.relative_to(root).parts)


def display(ctx: TurnContext, path: Path) -> str:
    """``path`` relative to the workspace when inside it, else absolute."""
    if ctx.settings.workspace is not None:
        root = ctx.settings.workspace.resolve()
        if path == root:
            return "."
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return str(path)


def _check_raw(raw: str) -> None:
    if not raw or not raw.strip():
        raise ToolError("invalid_path", "the path is empty")
    if "\x00" in raw:
        raise ToolError("invalid_path", "the path contains a NUL byte")
    if len(raw) > MAX_PATH_CHARS:
        raise ToolError("invalid_path", f"the path is longer than {MAX_PATH_CHARS} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise ToolError("invalid_path", "the path contains control characters")
    try:
        encoded = os.fsencode(raw)
    except UnicodeError as exc:
        raise ToolError("invalid_path", "the path is not valid unicode") from exc
    if any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        raise ToolError("invalid_path", f"a path component is longer than {MAX_NAME_BYTES} bytes")


_RESOLVE_ATTEMPTS = 10


def _resolve(candidate: Path, raw: str) -> Path:
    attempts = _RESOLVE_ATTEMPTS
    while True:
        attempts -= 1
        try:
            return candidate.resolve(strict=False)
        except OSError as exc:
            # realpath() reads a link it has just lstat'ed: a link swapped
            # back for a folder in between fails with EINVAL. Such a race
            # passes on another try; a path that keeps failing is refused.
            if attempts:
                continue
            raise ToolError("invalid_path", f"cannot resolve {raw!r}: {exc}") from exc
        except (RuntimeError, ValueError) as exc:
            raise ToolError("invalid_path", f"cannot resolve {raw!r}: {exc}") from exc


__all__ = [
    "Target",
    "allowed_roots",
    "display",
    "is_secret",
    "locate",
    "resolve_path",
    "temp_root",
    "within",
    "workspace_path",
]
