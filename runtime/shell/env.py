"""A shell command's environment: the scrubbed allowlist, ``.env`` files, secrets."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from coterie.runtime.errors import ToolError

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Inherited from the runtime's environment when set; nothing else is.
INHERITED_ENV = ("LANG", "LC_ALL", "TERM", "TZ")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _dropped_env_key(key: str) -> bool:
    upper = key.upper()
    return upper == "PATH" or upper.startswith(("LD_", "DYLD_"))


def scrubbed_env(
    *,
    home: Path | str,
    extra: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean environment: an allowlist, then secrets, then ``extra`` (wins).

    Nothing of the runtime's own environment leaks but ``INHERITED_ENV``;
    ``extra`` may not set ``PATH``, ``LD_*`` or ``DYLD_*``.
    """
    source = os.environ if parent is None else parent
    env = {"PATH": SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
    for key in INHERITED_ENV:
        if key in source:
            env[key] = source[key]
    for key, value in (secrets or {}).items():
        env[key] = value
    for key, value in (extra or {}).items():
        if _dropped_env_key(key) or not key or "=" in key or "\x00" in key + value:
            continue
        env[key] = value
    return env


#: ``.env`` files read, by path: their stamp (modification and change times,
#: size, inode) and their values. A turn reads its persona's ``.env`` for the
#: secrets to hide, and a tool call for the ones it needs; a stat tells whether
#: the file changed since, so an edit applies to the next read and an
#: unchanged file is not read and parsed again.
_DOTENV: dict[str, tuple[tuple[int, int, int, int], dict[str, str]]] = {}
#: Files remembered at most (a process serves one persona, or an eval worker a
#: few workspaces): the oldest is forgotten first.
_DOTENV_FILES = 64
#: A file changed less than this long ago is read every time: a file's times
#: move with the kernel's coarse clock, so two writes of the same size within
#: one of its ticks leave the same stamp (git's "racily clean" files).
_DOTENV_SETTLED_NS = 2_000_000_000


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export``, quotes and ``#`` comments tolerated);
    ``{}`` when there is no such file. Read again only once the file changed."""
    key = str(path)
    try:
        st = os.stat(key)
    except (FileNotFoundError, NotADirectoryError):
        _DOTENV.pop(key, None)
        return {}
    stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    cached = _DOTENV.get(key)
    if cached is not None and cached[0] == stamp:
        return dict(cached[1])
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    values = _parse_dotenv(text)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _DOTENV_SETTLED_NS:
        _DOTENV.pop(key, None)
        return values
    if key not in _DOTENV and len(_DOTENV) >= _DOTENV_FILES:
        del _DOTENV[next(iter(_DOTENV))]
    _DOTENV[key] = (stamp, values)
    return dict(values)


def _parse_dotenv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if SECRET_NAME_RE.match(key):
            out[key] = value
    return out


#: Environment variables holding the runtime's own provider keys (plus whatever
#: a persona's model or the memory settings name in ``api_key_env``).
PROVIDER_KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EXA_API_KEY")
#: Values shorter than this are not redacted: they would mangle ordinary text
#: and hide nothing.
MIN_SECRET_CHARS = 4


def secrets_to_hide(
    persona_dir: Path | None,
    *,
    key_vars: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every value that must never be shown: all of the persona's ``.env``
    values and the runtime's provider keys, by name (for ``[redacted:NAME]``)."""
    source = os.environ if environ is None else environ
    hidden: dict[str, str] = {}
    for name in dict.fromkeys([*PROVIDER_KEY_VARS, *key_vars]):
        value = source.get(name, "")
        if len(value) >= MIN_SECRET_CHARS:
            hidden[name] = value
    if persona_dir is not None:
        for name, value in read_dotenv(persona_dir / ".env").items():
            if len(value) >= MIN_SECRET_CHARS:
                hidden[name] = value
    return hidden


#: ``${secret:NAME}`` (from a persona's ``.env``) or ``${env:NAME}`` (from the
#: runtime's own environment) inside a configured value (acp.json, mcp.json).
REFERENCE_RE = re.compile(r"\$\{(secret|env):([A-Za-z_][A-Za-z0-9_]*)\}")
#: What a configured environment may not set for a child program.
RESERVED_ENV = ("PATH", "HOME")


def check_env_entry(key: str, value: str) -> None:
    """Raise ``ValueError`` (for a pydantic validator) when ``key=value`` is not
    a settable variable with only ``${secret:…}``/``${env:…}`` references."""
    if not SECRET_NAME_RE.match(key):
        raise ValueError(f"{key!r} is not an environment variable name")
    upper = key.upper()
    if upper in RESERVED_ENV or upper.startswith(("LD_", "DYLD_")):
        raise ValueError(f"{key} cannot be set for a child program")
    check_references(key, value)


def check_references(key: str, value: str) -> None:
    """Raise ``ValueError`` when ``value`` holds a ``${…}`` other than the two kinds."""
    if "${" in REFERENCE_RE.sub("", value):
        raise ValueError(
            f"{key}: only ${{secret:NAME}} and ${{env:NAME}} may be referenced, got {value!r}"
        )


def has_secret_reference(values: Iterable[str]) -> bool:
    return any("${secret:" in v for v in values)


def fill_references(
    values: Mapping[str, str],
    *,
    persona_dir: Path | None,
    environ: Mapping[str, str] | None = None,
    what: str,
) -> dict[str, str]:
    """``values`` with every ``${secret:NAME}`` and ``${env:NAME}`` filled in.

    Secrets come from ``persona_dir/.env``, ``${env:…}`` from ``environ``
    (default ``os.environ``). A reference that is not set raises
    ``ToolError("missing_secret")`` naming it and ``what`` needs it.
    Synchronous: it reads the ``.env`` file.
    """
    source = os.environ if environ is None else environ
    needs = has_secret_reference(values.values())
    secrets = read_dotenv(persona_dir / ".env") if needs and persona_dir else {}
    missing: list[str] = []

    def fill(match: re.Match[str]) -> str:
        kind, name = match.group(1), match.group(2)
        table = secrets if kind == "secret" else source
        if name not in table:
            missing.append(f"{kind}:{name}")
            return ""
        return table[name]

    resolved = {key: REFERENCE_RE.sub(fill, value) for key, value in values.items()}
    if missing:
        raise ToolError(
            "missing_secret",
            f"{what} needs {', '.join(dict.fromkeys(missing))} "
            "(secret: from the persona's .env; env: from the runtime's environment)",
        )
    return resolved


def load_secrets(persona_dir: Path | None, names: Iterable[str], persona: str) -> dict[str, str]:
    """The named secrets from ``persona_dir/.env``; ToolError names any missing."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    bad = [n for n in wanted if not SECRET_NAME_RE.match(n)]
    if bad:
        raise ToolError("invalid_arguments", f"not a variable name: {', '.join(bad)}")
    found = read_dotenv(persona_dir / ".env") if persona_dir is not None else {}
    missing = [n for n in wanted if n not in found]
    if missing:
        raise ToolError(
            "missing_secret", f"secret not set for persona {persona}: {', '.join(missing)}"
        )
    return {n: found[n] for n in wanted}


__all__ = [
    "INHERITED_ENV",
    "MIN_SECRET_CHARS",
    "PROVIDER_KEY_VARS",
    "REFERENCE_RE",
    "RESERVED_ENV",
    "SAFE_PATH",
    "SECRET_NAME_RE",
    "check_env_entry",
    "check_references",
    "fill_references",
    "has_secret_reference",
    "load_secrets",
    "read_dotenv",
    "scrubbed_env",
    "secrets_to_hide",
]
