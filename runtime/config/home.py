"""The home directory, the runtime's time zone, and the personas under the home.

``<home>`` is ``--home``, else ``$COTERIE_HOME``, else ``~/.coterie``; a
persona lives in ``<home>/personas/<name>/`` (a valid name, holding a
``persona.yaml``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from coterie.runtime.errors import PersonaConfigError

PERSONA_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def runtime_timezone() -> ZoneInfo:
    """``$COTERIE_TIMEZONE`` (an IANA name, e.g. ``Europe/Paris``), default UTC.

    The one zone of the runtime: the ``clock`` tool and the date in every
    system prompt use it. An unknown name falls back to UTC.
    """
    name = os.environ.get("COTERIE_TIMEZONE", "UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """``--home`` beats ``$COTERIE_HOME`` beats ``~/.coterie``."""
    if home is not None:
        return Path(home).expanduser().resolve()
    env = os.environ.get("COTERIE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".coterie").resolve()


def check_persona_name(path: Path | str, name: str) -> None:
    """Raise :class:`PersonaConfigError` (about ``path``) unless ``name`` is a
    valid persona name."""
    if not PERSONA_NAME_RE.match(name):
        raise PersonaConfigError(
            str(path), [f"name {name!r}: expected lowercase letters, digits, '-' or '_'"]
        )


def persona_names(home: Path) -> list[str]:
    """Names of every persona directory under ``<home>/personas``."""
    root = home / "personas"
    try:
        entries = list(os.scandir(root))
    except OSError:  # no such directory (or not one)
        return []
    # The directory entry says what is a directory without a stat of its own.
    return sorted(
        e.name for e in entries if e.is_dir() and os.path.isfile(f"{e.path}/persona.yaml")
    )


def persona_exists(home: Path, name: str) -> bool:
    """Whether ``name`` is a persona of ``home`` (one stat, no listing)."""
    return (
        bool(PERSONA_NAME_RE.match(name)) and (home / "personas" / name / "persona.yaml").is_file()
    )


def install_personas(home: Path, source: Path, *, overwrite: bool = False) -> list[str]:
    """Copy the persona directories under ``source`` into ``<home>/personas``.

    Existing personas are left alone unless ``overwrite``. Returns the names
    that were written.
    """
    import shutil

    written = []
    for src in sorted(source.iterdir()):
        if not (src / "persona.yaml").is_file():
            continue
        dst = home / "personas" / src.name
        if dst.exists() and not overwrite:
            continue
        shutil.copytree(src, dst, dirs_exist_ok=True)
        written.append(src.name)
    return written


__all__ = [
    "PERSONA_NAME_RE",
    "check_persona_name",
    "install_personas",
    "persona_exists",
    "persona_names",
    "resolve_home",
    "runtime_timezone",
]
