"""The rails an ACP agent works inside: where a path may lead, how a
permission request is answered, and which files a task changed.

- :func:`decide_permission` answers ``session/request_permission`` by the
  roster entry's policy: ``workspace`` allows once when every path the
  request touches resolves (symlinks followed) inside the workspace and is
  not a ``.env`` file, and denies everything else (commands, fetches, paths
  outside); ``deny`` denies; ``allow`` allows once.
- :func:`read_text` / :func:`write_text` back the client fs callbacks for a
  path already checked by :func:`inside_root`.
- :func:`snapshot_tree` and :func:`changed_files` compare the workspace
  before and after a task.

Blocking (file system): call these off the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import acp
from acp.schema import (
    AllowedOutcome,
    DeniedOutcome,
    FileEditToolCallContent,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from coterie.runtime.delegation.acp.records import PermissionDecision
from coterie.runtime.delegation.acp.roster import PermissionPolicy

#: fs callbacks refuse files or contents above this.
FS_MAX_BYTES = 10 * 1024 * 1024
#: Folders the changed-files snapshot does not enter.
SNAPSHOT_SKIP_DIRS = frozenset({".git", ".hg", ".svn"})
#: Keys of a tool call's raw input that name a path (Claude Code, Gemini, Codex).
PATH_KEYS = ("file_path", "path", "notebook_path", "filePath", "abs_path", "absolute_path")
#: Tool kinds the workspace policy allows without a path to check.
PATHLESS_KINDS_ALLOWED = frozenset({"think", "switch_mode"})


def inside_root(root: Path, raw: str, *, base: Path | None = None) -> Path | None:
    """``raw`` resolved (symlinks followed) if it lies inside ``root``, else ``None``.

    A relative ``raw`` is taken from ``base`` (default ``root``). ``root``
    must already be resolved. Touches the file system: call it off the loop.
    """
    if not raw or "\x00" in raw:
        return None
    path = Path(raw)
    if not path.is_absolute():
        path = (base or root) / path
    real = Path(os.path.realpath(path))
    if real == root or real.is_relative_to(root):
        return real
    return None


def request_paths(tool_call: ToolCallUpdate) -> list[str]:
    paths: list[str] = [loc.path for loc in tool_call.locations or []]
    raw = tool_call.raw_input
    if isinstance(raw, dict):
        paths.extend(str(raw[k]) for k in PATH_KEYS if isinstance(raw.get(k), str) and raw[k])
    for item in tool_call.content or []:
        if isinstance(item, FileEditToolCallContent):
            paths.append(item.path)
    return list(dict.fromkeys(paths))


def _pick_option(
    options: Iterable[PermissionOption], kinds: tuple[str, ...]
) -> PermissionOption | None:
    listed = list(options)
    for kind in kinds:
        for option in listed:
            if option.kind == kind:
                return option
    return None


def decide_permission(
    policy: PermissionPolicy,
    *,
    root: Path,
    tool_call: ToolCallUpdate,
    options: list[PermissionOption],
) -> tuple[PermissionDecision, RequestPermissionResponse]:
    """The answer to one permission request under ``policy`` (see the module docstring).

    ``root`` must be resolved. Touches the file system (symlinks): call it off
    the event loop.
    """
    paths = request_paths(tool_call)
    if policy == "allow":
        allow, reason = True, "policy allow"
    elif policy == "deny":
        allow, reason = False, "policy deny"
    elif not paths:
        allow = (tool_call.kind or "") in PATHLESS_KINDS_ALLOWED
        reason = (
            f"kind {tool_call.kind} touches no path"
            if allow
            else f"no path to check inside the workspace (kind {tool_call.kind or 'unknown'})"
        )
    else:
        outside = [p for p in paths if inside_root(root, p) is None]
        dotenv = [p for p in paths if Path(p).name == ".env"]
        allow = not outside and not dotenv
        if outside:
            reason = f"outside the workspace {root}: {', '.join(outside)}"
        elif dotenv:
            reason = f".env files are off limits: {', '.join(dotenv)}"
        else:
            reason = "every path inside the workspace"
    return answer_permission(tool_call, options, allow=allow, reason=reason)


def answer_permission(
    tool_call: ToolCallUpdate, options: list[PermissionOption], *, allow: bool, reason: str
) -> tuple[PermissionDecision, RequestPermissionResponse]:
    """The answer that allows (once) or rejects ``tool_call``, and its record."""
    paths = request_paths(tool_call)
    if allow:
        option = _pick_option(options, ("allow_once", "allow_always"))
    else:
        option = _pick_option(options, ("reject_once", "reject_always"))
    decision = PermissionDecision(
        tool_call_id=tool_call.tool_call_id,
        title=tool_call.title,
        tool_kind=tool_call.kind,
        paths=paths,
        decision="allow" if allow and option is not None else "deny",
        option_id=option.option_id if option is not None else None,
        reason=reason if option is not None or not allow else f"{reason}; no allow option offered",
    )
    if option is None:
        response = RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
    else:
        response = RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )
    return decision, response


Snapshot = dict[str, tuple[int, int, int]]


def snapshot_tree(root: Path, *, limit: int) -> tuple[Snapshot, bool]:
    """``(mtime_ns, size, inode)`` of every file under ``root`` (symlinks not
    followed, VCS folders skipped), and whether the walk was complete (false
    when ``limit`` files were reached). Blocking: call it through
    ``asyncio.to_thread``."""
    out: Snapshot = {}
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in SNAPSHOT_SKIP_DIRS:
                            stack.append(entry.path)
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if len(out) >= limit:
                    return out, False
                out[os.path.relpath(entry.path, root)] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return out, True


def changed_files(before: Snapshot, after: Snapshot) -> list[str]:
    """Paths created, modified or deleted between two snapshots."""
    keys = before.keys() | after.keys()
    return sorted(k for k in keys if before.get(k) != after.get(k))


def read_text(path: Path, line: int | None, limit: int | None) -> str:
    with open(path, "rb") as f:
        data = f.read(FS_MAX_BYTES + 1)
    if len(data) > FS_MAX_BYTES:
        raise acp.RequestError(-32602, f"{path} is larger than {FS_MAX_BYTES} bytes")
    text = data.decode("utf-8", errors="replace")
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    first = max((line or 1) - 1, 0)
    last = len(lines) if limit is None else first + limit
    return "".join(lines[first:last])


def write_text(root: Path, path: Path, content: str) -> None:
    data = content.encode("utf-8")
    if len(data) > FS_MAX_BYTES:
        raise acp.RequestError(-32602, f"content is larger than {FS_MAX_BYTES} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A parent swapped for a symlink meanwhile must not lead outside.
    if inside_root(root, str(path.parent)) is None:
        raise acp.RequestError(-32602, f"{path} is outside the workspace {root}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


__all__ = [
    "FS_MAX_BYTES",
    "Snapshot",
    "answer_permission",
    "changed_files",
    "decide_permission",
    "inside_root",
    "read_text",
    "request_paths",
    "snapshot_tree",
    "write_text",
]
